"""Every user error of the `cerberus-hf` command is one line on stderr, ``cerberus-hf <command>: error: ...``,
with exit status 2 and no traceback; ``--debug`` (or CERBERUS_HF_DEBUG=1) shows the traceback; a bug keeps
its traceback. Each case fails before any model is loaded (models are refused outright here)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import huggingface_hub
import pytest
import torch

import cerberus_hf.checkpoint as checkpoint
import cerberus_hf.real_models as real_models
from cerberus_hf import CerberusConfig
from cerberus_hf.errors import UserError
from cerberus_hf.tools import ngram
from cerberus_hf.tools.cli import build_parser, main
from cerberus_hf.tools import distill as distill_cli
from cerberus_hf.tools import train as train_cli
from cerberus_hf.training.data import MT_BENCH_QUESTIONS
from helpers import save_with_base

LOAD_NAMED_MODEL = real_models.load_named_model

@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Every case below must be refused before a base model is loaded."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the error was found")

    for module in (real_models, distill_cli, train_cli):
        monkeypatch.setattr(module, "load_named_model", refuse)
    monkeypatch.setattr(real_models, "load_packaged_model", refuse)
    monkeypatch.delenv("CERBERUS_HF_DEBUG", raising=False)


def run(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse's own exit
        code = stop.code
    return code, capsys.readouterr().err


def one_line_error(capsys, *argv: str) -> str:
    """The error line ``argv`` gives: asserts status 2, exactly one line on stderr, no traceback."""
    code, err = run(capsys, *argv)
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"cerberus-hf {argv[0]}: error: "), err
    return err.strip()


@pytest.fixture
def heads(tmp_path) -> str:
    """A head checkpoint folder with only its config (enough for the commands that fail before weights)."""
    CerberusConfig(hidden_size=32, vocab_size=96).save_pretrained(tmp_path / "heads")
    return str(tmp_path / "heads")


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------------- paths
@pytest.mark.parametrize("argv", [["ngram", "--data", "d.jsonl", "--heads"], ["bench", "--heads"],
                                  ["calibrate", "--data", "d.jsonl", "--heads"], ["demo", "--heads"]],
                         ids=["ngram", "bench", "calibrate", "demo"])
def test_missing_heads_path(capsys, tmp_path, argv):
    missing = str(tmp_path / "no_such_heads")
    line = one_line_error(capsys, *argv, missing)
    assert line.endswith(f"--heads: no folder or Hub id {missing}")
    assert "Repo id" not in line


@pytest.mark.parametrize("command", [["bench", "--limit", "1"],
                                     ["divergence", "--prompts", str(MT_BENCH_QUESTIONS)]],
                         ids=["bench", "divergence"])
def test_base_folder_without_tokenizer(capsys, tmp_path, monkeypatch, command):
    """A base saved without its tokenizer is named, with the line that adds one, before its weights are read."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setattr(real_models, "load_named_model", LOAD_NAMED_MODEL)
    line = one_line_error(capsys, *command, "--base", str(tmp_path / "base"))
    assert line.endswith(f"{tmp_path / 'base'} has no tokenizer transformers can load; this command needs the base's "
                         f"tokenizer beside its weights: tokenizer.save_pretrained('{tmp_path / 'base'}')")


def test_base_that_is_no_folder_packaged_base_or_readable_hub_model(capsys, tmp_path, monkeypatch):
    """A mistyped base is named as such, not blamed on its tokenizer; a packaged model's Hub id gets the packaged
    name."""
    monkeypatch.setattr(real_models, "load_named_model", LOAD_NAMED_MODEL)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # nothing cached under a made-up id
    line = one_line_error(capsys, "bench", "--base", "nobody-here/no-such-model")
    assert line.endswith("error: no base 'nobody-here/no-such-model': not a folder, not a packaged base "
                         f"({', '.join(real_models.PACKAGED_MODELS)}), and no Hub model of that name could be read "
                         "(none exists, or this machine is offline and has not cached it)")

    def unreadable(*args, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(checkpoint, "resolve_file", unreadable)
    line = one_line_error(capsys, "make-heads", "--base", "HuggingFaceTB/SmolLM2-135M-Instruct", "--output",
                          str(tmp_path / "made"))
    assert line.endswith("not cached it); a 4-bit GGUF copy of it is packaged as 'smollm2-135m-instruct'")


def test_make_heads_refuses_a_mistyped_prompt_source_before_loading_the_base(capsys, tmp_path):
    line = one_line_error(capsys, "make-heads", "--base", "smollm2-135m-instruct", "--output", str(tmp_path / "made"),
                          "--prompts", "packaged", "--prompts", str(tmp_path / "no_such_prompts.jsonl"))
    assert line.endswith(f"error: no file {tmp_path / 'no_such_prompts.jsonl'}")


def test_missing_model_path(capsys, tmp_path):
    missing = str(tmp_path / "no_such_model")
    line = one_line_error(capsys, "distill", "--model", missing, "--output", str(tmp_path / "out.jsonl"))
    assert line.endswith(f"--model: no folder or Hub id {missing}")


def test_folder_without_config(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    line = one_line_error(capsys, "ngram", "--heads", str(tmp_path / "empty"), "--data", "d.jsonl")
    assert line.endswith(f"no config.json in {tmp_path / 'empty'}")
    line = one_line_error(capsys, "train", "--base", str(tmp_path / "empty"), "--data", "d.jsonl", "--output", "o")
    assert line.endswith(f"--base: no config.json in {tmp_path / 'empty'}")


def test_missing_data_file(capsys, tmp_path, heads):
    missing = str(tmp_path / "no_such_data.jsonl")
    line = one_line_error(capsys, "ngram", "--heads", heads, "--data", missing)
    assert line == f"cerberus-hf ngram: error: no file {missing}"


def test_data_line_that_is_not_a_record(capsys, tmp_path, heads):
    data = write(tmp_path / "data.jsonl", '{"input_ids": [1], "output_ids": [2]}\n7\n{"input_ids": [1]}\n')
    line = one_line_error(capsys, "calibrate", "--heads", heads, "--data", data)
    assert f"{data}:2 has no input_ids or output_ids" in line


def test_output_folder_that_does_not_exist(capsys, tmp_path):
    line = one_line_error(capsys, "bench", "--json", str(tmp_path / "no_such_folder" / "result.json"))
    assert line.endswith(f"--json: no folder {tmp_path / 'no_such_folder'} to write result.json in")


# ---------------------------------------------------------------------------------------------- prompt files
@pytest.mark.parametrize("command", ["bench", "divergence", "distill"])
def test_prompts_file_that_is_not_jsonl(capsys, tmp_path, command):
    prompts = write(tmp_path / "prompts.jsonl", '{"prompt": "a"}\n\n{"prompt": "b"}\nnot json\n')
    line = one_line_error(capsys, command, "--prompts", prompts, *(["--output", str(tmp_path / "o.jsonl")]
                                                                   if command == "distill" else []))
    assert line.endswith(f"{prompts} line 4: not JSON (Expecting value)")


@pytest.mark.parametrize("command", ["bench", "divergence"])
def test_prompt_that_is_not_a_string(capsys, tmp_path, command):
    prompts = write(tmp_path / "prompts.jsonl", '{"prompt": "a"}\n{"prompt": 5}\n')
    line = one_line_error(capsys, command, "--prompts", prompts)
    assert line.endswith(f"{prompts} line 2: 'prompt' must be a string, got int")


def test_prompt_that_is_not_a_string_in_distill(capsys, tmp_path):
    prompts = write(tmp_path / "prompts.jsonl", '{"prompt": "a"}\n{"prompt": 5}\n')
    line = one_line_error(capsys, "distill", "--prompts", prompts, "--output", str(tmp_path / "o.jsonl"))
    assert line.endswith(f"{prompts} line 2: 'prompt' must be a string or a list, got int")


def test_distill_engine_vllm_where_vllm_does_not_import(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as where it is not installed (test_distill_vllm.py: where it is)
    line = one_line_error(capsys, "distill", "--engine", "vllm", "--output", str(tmp_path / "o.jsonl"))
    assert "engine 'vllm' needs vLLM, which does not import here" in line and "make engines-venv" in line
    assert not (tmp_path / "o.jsonl").exists()


def test_prompt_in_card(capsys, tmp_path, heads):
    prompts = write(tmp_path / "prompts.jsonl", '{"turns": "one turn, not a list"}\n')
    line = one_line_error(capsys, "card", "--heads", heads, "--prompts", prompts)
    assert line.endswith(f"{prompts} line 1: 'turns' must be a list of strings, got str")


@pytest.mark.parametrize("text", ["", "\n\n"], ids=["empty", "blank"])
def test_prompts_file_without_prompts(capsys, tmp_path, text):
    prompts = write(tmp_path / "prompts.jsonl", text)
    assert one_line_error(capsys, "bench", "--prompts", prompts).endswith(f"{prompts} holds no prompts")
    line = one_line_error(capsys, "distill", "--prompts", prompts, "--output", str(tmp_path / "o.jsonl"))
    assert line.endswith(f"{prompts} holds no prompts")


def test_missing_prompts_file(capsys, tmp_path):
    missing = str(tmp_path / "no_such_prompts.jsonl")
    assert one_line_error(capsys, "bench", "--prompts", missing) == f"cerberus-hf bench: error: no file {missing}"


def test_bench_result_that_is_not_json(capsys, tmp_path, heads):
    result = write(tmp_path / "bench.json", "{not json")
    line = one_line_error(capsys, "card", "--heads", heads, "--bench", result)
    assert line.startswith(f"cerberus-hf card: error: {result} is not JSON (")


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("argv, option", [
    (["demo", "--prompts", "0"], "--prompts"),
    (["demo", "--max-new-tokens", "-3"], "--max-new-tokens"),
    (["bench", "--limit", "0"], "--limit"),
    (["divergence", "--prompts", "p.jsonl", "--every", "0"], "--every"),
    (["distill", "--output", "o.jsonl", "--batch-size", "0"], "--batch-size"),
    (["train", "--data", "d.jsonl", "--output", "o", "--max-steps", "0"], "--max-steps"),
    (["train", "--data", "d.jsonl", "--output", "o", "--epochs", "0"], "--epochs"),
    (["calibrate", "--heads", "h", "--data", "d.jsonl", "--top-k", "1.5"], "--top-k"),
])
def test_counts_must_be_positive(capsys, argv, option):
    line = one_line_error(capsys, *argv)
    assert f"argument {option}: must be " in line and repr(argv[-1]) in line


def test_gate_threshold_must_be_a_number(capsys):
    assert "argument --gate-threshold: must be a number" in one_line_error(capsys, "demo", "--gate-threshold", "high")


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_heads_for_another_packaged_base_name_the_base_to_pass(capsys, command):
    """Heads made for another packaged base than ``--base`` are refused before the base loads, naming the right one."""
    from cerberus_hf.tools.demo import MODEL_CARDS

    heads = str(MODEL_CARDS / "hydra-qwen2.5-coder-1.5b-instruct")
    line = one_line_error(capsys, command, "--heads", heads)
    assert line.endswith("holds heads for Qwen/Qwen2.5-Coder-1.5B-Instruct, not smollm2-135m-instruct: pass --base "
                         "qwen2.5-coder-1.5b-instruct"), line


@pytest.mark.parametrize("command", ["bench", "divergence", "calibrate"])
def test_cuda_device_without_cuda(capsys, monkeypatch, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    extra = {"bench": [], "divergence": ["--prompts", "p.jsonl"], "calibrate": ["--heads", "h", "--data", "d"]}
    line = one_line_error(capsys, command, *extra[command], "--device", "cuda")
    assert line.endswith("argument --device: device cuda is not available here (torch.cuda.is_available() is False)")


def test_unknown_device(capsys):
    assert "unknown device 'gpu'" in one_line_error(capsys, "bench", "--device", "gpu")


def test_subcommand_refusals_are_one_line_too(capsys, tmp_path):
    """Refusals a subcommand raises itself, whichever way it raises them."""
    prompts = write(tmp_path / "prompts.jsonl", '{"prompt": "a"}\n')
    line = one_line_error(capsys, "bench", "--prompts", prompts, "--resume")
    assert line == ("cerberus-hf bench: error: --resume continues the run checkpointed beside --json; give the same "
                    "--json path")
    line = one_line_error(capsys, "bench", "--prompts", prompts, "--variants", "beam")
    assert "Unknown variants ['beam']" in line
    line = one_line_error(capsys, "train", "--data", "d.jsonl")  # a SystemExit("cerberus-hf train: ...")
    assert line == "cerberus-hf train: error: --output is required (unless --cache-only)"


def test_train_leaves_the_process_group_of_torchrun(capsys, tmp_path):
    """A `train` process leaves its process group before it exits, however the command ended: an interpreter that
    exits inside a gloo group aborts now and then (SIGABRT after the run finished)."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        line = one_line_error(capsys, "train", "--data", "d.jsonl")
    finally:
        left = not torch.distributed.is_initialized()
        if not left:
            torch.distributed.destroy_process_group()
    assert line.endswith("--output is required (unless --cache-only)") and left


# ---------------------------------------------------------------------------------------------- --debug, bugs
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers are set in the main thread only")
def test_a_sigterm_unwinds_the_command_through_its_finally_blocks(monkeypatch):
    """A SIGTERM (kill, a scheduler's stop) ends a command as Ctrl-C does, with status 143, after its finally blocks
    (make-heads writes its state there); the handler is the caller's again afterwards."""
    from cerberus_hf.tools import make_heads

    unwound, before = [], signal.getsignal(signal.SIGTERM)

    def run(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises in here
        finally:
            unwound.append(True)

    monkeypatch.setattr(make_heads, "run_cli", run)
    with pytest.raises(SystemExit) as stop:
        main(["make-heads", "--base", "b", "--head-type", "hydra", "--output", "o"])
    assert stop.value.code == 143 and unwound == [True] and signal.getsignal(signal.SIGTERM) is before


def test_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    prompts = write(tmp_path / "prompts.jsonl", "not json\n")
    with pytest.raises(UserError, match="line 1: not JSON"):
        main(["--debug", "bench", "--prompts", prompts])
    with pytest.raises(UserError, match="line 1: not JSON"):
        main(["bench", "--prompts", prompts, "--debug"])
    monkeypatch.setenv("CERBERUS_HF_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="no file"):
        main(["bench", "--prompts", str(tmp_path / "missing.jsonl")])
    monkeypatch.setenv("CERBERUS_HF_DEBUG", "0")
    assert run(capsys, "bench", "--prompts", prompts)[0] == 2


def test_debug_shows_the_traceback_of_a_subcommand_exit(capsys):
    with pytest.raises(SystemExit, match="--output is required"):
        main(["--debug", "train", "--data", "d.jsonl"])
    assert "Traceback" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback(tmp_path, heads, monkeypatch):
    """Only user errors are shortened: an exception that is not one propagates as it is."""
    data = write(tmp_path / "data.jsonl", json.dumps({"input_ids": [1, 2], "output_ids": [3, 4]}) + "\n")

    def bug(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(ngram, "build_ngram", bug)
    with pytest.raises(KeyError, match="a bug"):
        main(["ngram", "--heads", heads, "--data", data])


# ---------------------------------------------------------------------------------------------- every subcommand
def wrong_input(command: str, tmp_path, heads: str) -> list[str]:
    """One wrong input of ``command``: an argument, a file or a checkpoint it must refuse in one line."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "llama"}))
    cases = {
        "demo": lambda: ["--max-new-tokens", "0"],
        "distill": lambda: ["--output", str(tmp_path / "o.jsonl"), "--sample-fraction", "2"],
        "train": lambda: ["--data", "d.jsonl", "--output", "o", "--eval-fraction", "2"],
        "calibrate": lambda: ["--heads", heads, "--data", "d.jsonl", "--dynamic-budgets", "2:0"],
        "ngram": lambda: ["--heads", heads, "--data", write(tmp_path / "records.jsonl", json.dumps(
            {"id": "a", "input_ids": [1, 2], "output_ids": [500, 3, 4]}) + "\n")],  # a token outside the vocabulary
        "card": lambda: ["--heads", heads, "--reuse-evaluation"],
        "bench": lambda: ["--prompts", write(tmp_path / "p.jsonl", "[]\n")],
        "divergence": lambda: ["--prompts", str(tmp_path / "missing.jsonl")],
        "refresh-folder": lambda: [str(foreign)],
        "export": lambda: ["--format", "speculators", save_with_base(tmp_path / "hydra", num_heads=2),
                           str(tmp_path / "out")],
        "make-heads": lambda: ["--base", str(tmp_path / "no_such_base"), "--output", str(tmp_path / "made")],
    }
    return cases[command]()


def subcommands() -> list[str]:
    parser = build_parser()
    return sorted(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_refuses_wrong_input_in_one_line(capsys, tmp_path, heads, command):
    """Each subcommand, given wrong input, prints one line ``cerberus-hf COMMAND: error: ...`` and exits with status
    2, without a traceback (a subcommand added without a case here fails: `wrong_input` raises KeyError)."""
    argv = wrong_input(command, tmp_path, heads)
    capsys.readouterr()  # what preparing the case printed
    one_line_error(capsys, command, *argv)
