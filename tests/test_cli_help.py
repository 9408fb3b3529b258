"""What the `cerberus-hf` command tells a user: every subcommand's ``--help`` says what it does, what each option means
and its default; every command a message suggests runs as printed (its placeholders FOLDER, DATA, BENCH.json filled
in), up to the point where it would load a model."""

from __future__ import annotations

import argparse
import json
import re
import shlex

import pytest
import torch
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

import cerberus_hf.real_models as real_models
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.ngram import NgramModel
from cerberus_hf.calibration.report import _format_rescoring
from cerberus_hf.errors import UserError
from cerberus_hf.hardware import HardwareKey, calibrate_command, note_no_entry
from cerberus_hf.real_models import PACKAGED_MODELS
from cerberus_hf.tools import distill as distill_cli
from cerberus_hf.tools import train as train_cli
from cerberus_hf.tools.arguments import HelpFormatter
from cerberus_hf.tools.cli import build_parser, main
from helpers import get_base, get_prompt, save_with_base, write_greedy_records

HINT = re.compile(r"`(cerberus-hf [^`]+)`")


def subcommands_action() -> argparse._SubParsersAction:
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))


def subparsers() -> dict[str, argparse.ArgumentParser]:
    return subcommands_action().choices


def summaries() -> dict[str, str]:
    """Each subcommand's one-line summary, as ``cerberus-hf --help`` lists it."""
    return {choice.dest: choice.help for choice in subcommands_action()._choices_actions}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]


# ---------------------------------------------------------------------------------------------- --help
@pytest.mark.parametrize("command", sorted(subparsers()))
def test_every_subcommand_says_what_it_does_and_what_each_option_means(command):
    parser = subparsers()[command]
    assert parser.description and len(parser.description) > 40, parser.description
    assert "Returns" not in parser.description  # a docstring's, not a user's
    formatter = HelpFormatter(parser.prog)
    for action in options(parser):
        assert action.help, f"{command} {action.option_strings or action.dest} has no help"
        shown = formatter._get_help_string(action)
        flag = action.nargs == 0 or action.default is argparse.SUPPRESS
        if action.option_strings and not flag and not action.required:
            assert "default" in shown, f"{command} {action.option_strings} does not show its default: {shown}"


def test_the_defaults_shown_are_the_defaults():
    text = subparsers()["calibrate"].format_help()
    assert "(default: 63)" in text and "(default: float32)" in text
    assert "(default: 0.95:0.25" in " ".join(text.split())  # a list, spaced


def test_the_command_list_says_what_each_subcommand_does():
    assert set(summaries()) == set(subparsers()) and all(summaries().values())


def test_train_lists_every_head_type_it_trains():
    assert all(head_type in summaries()["train"] for head_type in train_cli.TRAINABLE)
    assert {"eagle3", "dflash", "kangaroo"} <= set(train_cli.TRAINABLE)
    assert "EAGLE-3" in subparsers()["train"].description and "DFlash" in subparsers()["train"].description


@pytest.mark.parametrize("command, flag", [("train", "--base"), ("bench", "--base"), ("divergence", "--base"),
                                           ("distill", "--model")])
def test_the_base_option_lists_the_packaged_models(command, flag):
    action = next(a for a in subparsers()[command]._actions if flag in a.option_strings)
    assert all(name in action.help for name in PACKAGED_MODELS)


# ---------------------------------------------------------------------------------------------- hints
class Reached(Exception):
    """The command got past every check of its arguments and files, to loading a model."""


@pytest.fixture
def filled(tmp_path) -> dict[str, str]:
    """The placeholders of a hint, filled in: a saved Hydra checkpoint (FOLDER), its base's answers (DATA), a bench
    result to write (BENCH.json)."""
    return {"FOLDER": save_with_base(tmp_path / "heads", num_heads=2),
            "DATA": str(write_greedy_records(get_base("llama"), tmp_path / "data.jsonl", count=4)),
            "BENCH.json": str(tmp_path / "bench.json")}


def hints(message: str) -> list[str]:
    """The commands ``message`` suggests (in backquotes); it must suggest one."""
    commands = HINT.findall(message)
    assert commands, f"no command in {message!r}"
    return commands


def runs_as_printed(message: str, filled: dict[str, str], capsys) -> None:
    """Every command ``message`` suggests, its placeholders filled in, parses and runs to its end or to where it
    would load a model (every load is stopped there)."""
    for hint in hints(message):
        argv = [filled.get(word, word) for word in shlex.split(hint)][1:]
        build_parser().parse_args(argv)  # a hint that does not parse fails here (SystemExit)
        with pytest.MonkeyPatch.context() as patch:
            def reached(*args, **kwargs):
                raise Reached

            for module in (real_models, train_cli, distill_cli):
                patch.setattr(module, "load_named_model", reached)
            patch.setattr(real_models, "load_packaged_model", reached)
            patch.setattr(CerberusForCausalLM, "from_pretrained", reached)
            try:
                code = main(argv)
            except Reached:
                code = 0
        assert code == 0, f"`{hint}`: {capsys.readouterr().err}"


def test_the_calibration_hints_run(filled, capsys):
    """The command the warning of a machine without its own calibration suggests (`hardware.calibrate_command`)."""
    logger = logging.get_logger("cerberus_hf.hardware")
    logging.set_verbosity_warning()
    for dtype in (torch.bfloat16, torch.float32):
        wanted = HardwareKey.of("cpu", dtype)
        for folder, positions in ((None, False), (filled["FOLDER"], False), (filled["FOLDER"], True)):
            command = calibrate_command(wanted, folder, positions)
            with CaptureLogger(logger) as captured:  # (a stored key of this test's own: the warning is said once)
                note_no_entry({f"cuda/float32/sm_0/{folder}/{positions}": {}}, wanted, command)
            assert hints(captured.out) == [command]
            runs_as_printed(captured.out, filled, capsys)
    assert calibrate_command(HardwareKey("cuda", "float16"), "my heads", True) == (
        "cerberus-hf calibrate --heads 'my heads' --machine --dtype float16 --device cuda")


def test_the_hint_of_calibrate_machine_without_positions_runs(filled, capsys):
    assert main(["calibrate", "--heads", filled["FOLDER"], "--machine"]) == 2
    runs_as_printed(capsys.readouterr().err, filled, capsys)


def test_the_ngram_hints_run(filled, capsys, tmp_path, base):
    model = CerberusForCausalLM.from_base(base, num_heads=3)
    with pytest.raises(UserError) as without:
        model.generate(get_prompt("llama"), max_new_tokens=3, rescoring={"nodes": 4, "depth": 2, "weight": 0.5})
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(OSError) as unreadable:
        NgramModel.load(tmp_path / "broken.safetensors")
    no_rescorer = "\n".join(_format_rescoring(None))  # what a calibration report says of a folder without one
    for message in (str(without.value), str(unreadable.value), no_rescorer):
        runs_as_printed(message, filled, capsys)


def test_the_card_hint_runs(filled, capsys, tmp_path):
    (tmp_path / "empty_bench.json").write_text(json.dumps({}))
    assert main(["card", "--heads", filled["FOLDER"], "--bench", str(tmp_path / "empty_bench.json")]) == 2
    runs_as_printed(capsys.readouterr().err, filled, capsys)
