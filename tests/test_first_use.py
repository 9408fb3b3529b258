"""Calibration split in two: the positions travel with a checkpoint (`calibration.statistics`), the machine's costs are
measured where it decodes, on first use where no stored entry serves it (`calibration.first_use`), bounded in time,
kept in the user's cache and never slower than plain decoding by default (`calibration.machine`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

import pytest
import torch
from huggingface_hub import constants
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from cerberus_hf import CerberusForCausalLM, hardware
from cerberus_hf.blocks.packed import packing_available
from cerberus_hf.calibration import calibrate, calibrate_chain, first_use, format_report, machine, measure
from cerberus_hf.calibration.first_use import ENVIRONMENT_SWITCH, FIRST_USE_SECONDS, CalibrationCache, checkpoint_hash
from cerberus_hf.calibration.statistics import POSITIONS_NAME, PositionStatistics
from cerberus_hf.errors import UserError
from helpers import NEW_TOKENS, PROMPT_LEN, fresh_model, get_base, get_prompt, install_oracle, reference
from tiny_models import DEVICE, tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURED = " (measured here)"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A Hugging Face home of the test's own, and first use as the environment leaves it by default; the process
    remembers no entry yet (a passed test's folder is removed, and the next test's may take its name)."""
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(CalibrationCache, "_remembered", {})
    monkeypatch.delenv(ENVIRONMENT_SWITCH, raising=False)
    return tmp_path / "hf_home"


@pytest.fixture
def measurements(monkeypatch):
    """How many times first use measured the machine."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return measure_and_fit(*args, **kwargs)

    measure_and_fit = first_use.measure_and_fit
    monkeypatch.setattr(first_use, "measure_and_fit", counted)
    return calls


def sequences(arch: str = "llama") -> list[tuple[list[int], int]]:
    return [(reference(arch)[0].tolist(), PROMPT_LEN - 1)]


def with_positions(model: CerberusForCausalLM, **options) -> CerberusForCausalLM:
    """``model`` after a quick calibration, its positions kept and its stored entries dropped: what a folder that
    carries positions but no entry for this machine loads as."""
    options = {"max_nodes": 6, "dynamic_max_nodes": 6, "repeats": 1, "dynamic_budgets": ((0.9, 0.2),), **options}
    (calibrate_chain(model, sequences(), repeats=1) if model.heads.drafts_chains
     else calibrate(model, sequences(), **options))
    assert model.calibration_statistics is not None
    model.generation_config.cerberus_calibration = None
    return model


def oracle_model(base=None, **options) -> CerberusForCausalLM:
    """Medusa heads that know the reference continuation (drafting pays), with positions."""
    model = (CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=3) if base is not None
             else fresh_model("llama", "medusa", num_heads=3))
    install_oracle(model, [reference("llama")])
    return with_positions(model, **options)


# ------------------------------------------------------------------------------------------------ the positions
@pytest.mark.parametrize("head_type", ["cerberus", "kangaroo"])
def test_positions_round_trip_through_the_folder(tmp_path, hf_home, head_type):
    model = fresh_model("llama", head_type, randomize=True, num_heads=3)
    if head_type == "cerberus":
        from helpers import tiny_ngram

        model.ngram = tiny_ngram(model.config.vocab_size, sequences=[reference("llama")[0].tolist()])
    statistics = with_positions(model, rescoring_weights=(0.0, 0.5)).calibration_statistics
    model.save_pretrained(tmp_path)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=get_base("llama")).calibration_statistics
    assert loaded == statistics and loaded.chains == (head_type == "kangaroo")
    if head_type == "cerberus":
        assert len(loaded.rescorings) == 2 and loaded.budgets == ((0.9, 0.2),)
        assert all(len(record.rescored_order) == 2 and record.budgeted for record in loaded.records)
    assert loaded.to_bytes() == statistics.to_bytes()  # the same bytes: what the checkpoint's hash reads
    assert (tmp_path / POSITIONS_NAME).read_bytes()[:8] != b"\x80\x04\x95"  # safetensors, not a pickle


def test_a_malformed_positions_file_is_refused_in_one_line(tmp_path, hf_home):
    model = with_positions(fresh_model("llama", "medusa", randomize=True, num_heads=3))
    model.save_pretrained(tmp_path / "three")
    fresh_model("llama", "medusa", num_heads=2).save_pretrained(tmp_path / "two")
    os.replace(tmp_path / "three" / POSITIONS_NAME, tmp_path / "two" / POSITIONS_NAME)  # 3 heads' positions
    (tmp_path / "three" / POSITIONS_NAME).write_bytes(b"not a safetensors file")
    for folder, reason in (("three", "not calibration positions"), ("two", "of 2 heads")):
        with pytest.raises(ValueError, match=reason) as error:
            CerberusForCausalLM.from_pretrained(tmp_path / folder, base_model=get_base("llama"))
        assert POSITIONS_NAME in str(error.value) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------ first use
def test_a_malformed_option_is_refused_before_first_use_measures(hf_home, measurements):
    with pytest.raises(UserError, match="dynamic_tree is missing 'depth'"):
        oracle_model().generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, dynamic_tree={"nodes": 4})
    assert measurements == []


def test_first_use_calibrates_once_and_every_later_call_and_model_reuses_it(tmp_path, hf_home, measurements):
    model = oracle_model()
    logger = logging.get_logger("cerberus_hf.calibration.first_use")
    with CaptureLogger(logger) as captured:
        out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, reference("llama"))  # greedy output stays plain generate()'s
    key = hardware.HardwareKey.of(DEVICE, torch.float32)
    assert model.generation_stats.calibration == f"{key}{MEASURED}" and model.generation_stats.draft_steps > 0
    cache = CalibrationCache(checkpoint_hash(model))
    assert cache.path.parent == hf_home / "cerberus_hf" / "calibration" and len(measurements) == 1
    assert captured.out.count("cerberus-hf: calibrated this machine") == 1 and str(cache.path) in captured.out
    entry = json.loads(cache.path.read_text())["entries"][CalibrationCache.label(key)]
    assert entry["seconds"] > 0 and entry["settings"]["tree_kind"] in ("static", "dynamic")
    assert [p.name for p in cache.path.parent.iterdir() if not p.name.endswith(".lock")] == [cache.path.name]
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    model.save_pretrained(tmp_path / "heads")  # another instance of the same heads and positions
    again = CerberusForCausalLM.from_pretrained(tmp_path / "heads", base_model=get_base("llama"))
    CalibrationCache._remembered.clear()  # as a new process would start: it reads the file
    assert again.decoding_settings()["calibration"] == f"{key}{MEASURED}"
    assert again.decoding_settings()["draft_tree"] == entry["settings"]["draft_tree"] and len(measurements) == 1


def test_an_entry_fitted_on_another_processor_of_the_class_serves_and_is_named(hf_home, measurements):
    """A stored entry of this instruction class and dtype fitted on another processor serves without measuring here
    (it decoded within 2.5% of a measured one, docs/calibration.md); one line names it, and none says "no calibration
    stored" (what the warning said before, even after an entry had been measured here)."""
    model = oracle_model()
    here = hardware.HardwareKey.of(DEVICE, torch.float32)
    borrowed = str(hardware.HardwareKey(here.device, here.dtype, here.isa, "Another processor of this class"))
    model.generation_config.cerberus_calibration = {borrowed: {"draft_tree": [[0]], "tree_kind": "static",
                                                               "gate_threshold": None}}
    logger = logging.get_logger("cerberus_hf.hardware")
    with CaptureLogger(logger) as captured:
        assert model.decoding_settings()["calibration"] == borrowed and measurements == []
    assert f"decoding with the calibration fitted on {borrowed}" in captured.out
    assert "no calibration stored" not in captured.out


def test_a_chain_drafter_calibrates_on_first_use_too(hf_home, measurements):
    model = fresh_model("llama", "kangaroo", num_heads=3)
    install_oracle(model, [reference("llama")])
    with_positions(model)
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, reference("llama")) and len(measurements) == 1
    settings = model.decoding_settings()
    assert settings["calibration"].endswith(MEASURED) and settings["exit_confidence"] is not None
    assert all(set(path) == {0} for path in settings["draft_tree"])  # a chain


def test_threads_calling_at_once_measure_once(hf_home, measurements):
    model = oracle_model()
    start, outputs = threading.Barrier(3), []

    def decode():
        start.wait()
        outputs.append(model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS))

    threads = [threading.Thread(target=decode) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(measurements) == 1 and len(outputs) == 3
    assert all(torch.equal(out, reference("llama")) for out in outputs)


@pytest.mark.slow  # the file lock's path runs in every first use (the threads' test); this adds a second process
def test_processes_starting_at_once_measure_once(tmp_path, hf_home):
    base = get_base("llama")
    base.save_pretrained(tmp_path / "base")
    model = fresh_model("llama", "hydra", randomize=True, num_heads=3, base_model_name_or_path=str(tmp_path / "base"))
    with_positions(model).save_pretrained(tmp_path / "heads")
    script = ("import sys, torch; from cerberus_hf import CerberusForCausalLM\n"
              "model = CerberusForCausalLM.from_pretrained(sys.argv[1]); torch.set_num_threads(1)\n"
              f"out = model.generate(torch.tensor([{get_prompt('llama')[0].tolist()}]), max_new_tokens=8)\n"
              "print(model.generation_stats.calibration, out.tolist())\n")
    env = {**os.environ, "HF_HOME": str(hf_home), "PYTHONPATH": ROOT, "TRANSFORMERS_VERBOSITY": "warning"}
    env.pop(ENVIRONMENT_SWITCH, None)
    runs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "heads")], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), results
    assert sum(err.count("cerberus-hf: calibrated this machine") for _, err in results) == 1
    assert len({out for out, _ in results}) == 1 and MEASURED in results[0][0]
    files = list((hf_home / "cerberus_hf" / "calibration").glob("*.json"))
    assert len(files) == 1 and len(json.loads(files[0].read_text())["entries"]) == 1


def test_calibrate_false_and_the_environment_keep_the_configs_settings(hf_home, measurements, monkeypatch):
    model = oracle_model()
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, calibrate=False)
    assert model.generation_stats.calibration is None and not measurements and not hf_home.exists()
    monkeypatch.setenv(ENVIRONMENT_SWITCH, "0")
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert model.generation_stats.calibration is None and not measurements and torch.equal(out, reference("llama"))
    assert model.decoding_settings()["calibration"] is None
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, calibrate=True)  # the call's word wins
    assert model.generation_stats.calibration.endswith(MEASURED) and len(measurements) == 1
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, calibrate=False)  # nor is the cache read
    assert model.generation_stats.calibration is None


def test_without_positions_or_with_an_entry_for_this_machine_nothing_is_measured(hf_home, measurements):
    model = fresh_model("llama", "medusa", num_heads=3)
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert model.generation_stats.calibration is None and not hf_home.exists()
    model = oracle_model()
    key = str(hardware.HardwareKey.of(DEVICE, torch.float32))
    model.generation_config.cerberus_calibration = {key: {"draft_tree": [[0]]}}
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert model.generation_stats.calibration == key and not measurements


def test_entries_are_keyed_by_hardware_checkpoint_and_torch_version(hf_home, measurements, monkeypatch):
    model = oracle_model()
    model.decoding_settings()
    first = checkpoint_hash(model)
    monkeypatch.setattr(hardware, "processor_name", lambda device: "Another processor of the same class")
    assert model.decoding_settings()["calibration"].endswith(MEASURED) and len(measurements) == 2
    monkeypatch.setattr(torch, "__version__", "99.0")
    model.decoding_settings()
    assert len(measurements) == 3 and checkpoint_hash(model) == first
    entries = json.loads(CalibrationCache(first).path.read_text())["entries"]
    assert len(entries) == 3 and sum(label.endswith("| torch 99.0") for label in entries) == 1
    with torch.no_grad():
        next(model.heads.parameters()).add_(1.0)  # other heads: another checkpoint
    assert checkpoint_hash(model) != first
    model.decoding_settings()
    assert len(measurements) == 4 and len(list(CalibrationCache(first).path.parent.glob("*.json"))) == 2


# ------------------------------------------------------------------------------------------------ bounds and choices
@contextmanager
def fake_clock(base, seconds) -> Iterator[list[int]]:
    """Inside, every forward of ``base`` (or of a view of it) takes ``seconds(module, n)`` on the clock measurements
    read, and nothing else takes any time; yields the token counts forwarded."""
    clock, sizes = [0.0], []

    def advance(module, args, kwargs):
        n = kwargs["input_ids"].shape[1]
        clock[0] += seconds(module, n)
        sizes.append(n)

    handle = base.register_forward_pre_hook(advance, with_kwargs=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure.time, "perf_counter", lambda: clock[0])  # the time module: every reader's clock
        try:
            yield sizes
        finally:
            handle.remove()


def test_first_use_stays_within_its_bound_on_a_slow_machine(hf_home):
    """Each forward of n tokens takes 0.2 (1 + n / 10) s: the full plan's cost curve up to 64 tokens alone would take
    about 6 minutes a way of running the linear layers; first use measures fewer sizes and passes and stays within
    `FIRST_USE_SECONDS`."""
    base = tiny_model("llama")
    model = oracle_model(base, max_nodes=63, dynamic_max_nodes=32)
    with fake_clock(base, lambda module, n: 0.2 * (1 + n / 10)) as sizes:
        model.generate(get_prompt("llama"), max_new_tokens=4)
    entry = json.loads(CalibrationCache(checkpoint_hash(model)).path.read_text())["entries"]
    (seconds,) = [value["seconds"] for value in entry.values()]
    assert 5 < seconds <= FIRST_USE_SECONDS
    assert 64 in sizes and len(set(sizes)) <= 7  # the prefix, one token and at most 5 of the 63 sizes


@pytest.mark.parametrize("first", [True, False], ids=["first use", "calibrate"])
def test_where_no_tree_pays_the_default_is_plain_decoding(hf_home, first):
    """A forward of n > 1 tokens costs 1.5 n times one token's, and the heads are right at half the positions: no tree
    is expected to beat a plain step, so the entry (first use's and the full calibration's) decodes plain."""
    base = tiny_model("llama")
    model = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=3)
    install_oracle(model, [reference("llama")], corrupt=lambda p, k: (p + k) % 2 == 0)
    logger = logging.get_logger("cerberus_hf.calibration.machine")
    with fake_clock(base, lambda module, n: 0.01 * (1 if n == 1 else 1.5 * n)), CaptureLogger(logger) as captured:
        report = calibrate(model, sequences(), max_nodes=6, dynamic_max_nodes=6, repeats=1, dynamic_budgets=())
        if first:
            model.generation_config.cerberus_calibration = None
        settings = model.decoding_settings()
    assert report["plain"] and report["settings"]["gate_threshold"] == 0.0 and "decodes plain" in format_report(report)
    assert captured.out.count("no draft is expected to beat a plain step") == 1 + first
    assert settings["gate_threshold"] == 0.0 and settings["prompt_lookup_num_tokens"] == 0
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, reference("llama")) and model.generation_stats.draft_steps == 0
    assert model.generation_stats.calibration.endswith(MEASURED) == first


def test_copied_tokens_are_kept_as_far_as_their_positions_verify_cheaply():
    """Prompt lookup's copied tokens have no positions of their own: they are bounded by what their extra positions
    cost, at most half a one-token forward on a gated step (the root alone) and on a drafted one (3 positions)."""
    flat = {n: 1.0 + 0.02 * (n - 1) for n in range(1, 10)}
    steep = {n: 1.0 + 0.4 * (n - 1) for n in range(1, 10)}
    first_step = {1: 1.0, **{n: 1.55 + 0.1 * (n - 2) for n in range(2, 10)}}
    late_step = {1: 1.0, 2: 1.05, 3: 1.1, **{n: 1.1 + 0.4 * (n - 3) for n in range(4, 10)}}
    assert machine.lookup_tokens_worth(flat, 3, 5) == 5
    assert machine.lookup_tokens_worth(steep, 3, 5) == 1
    assert machine.lookup_tokens_worth(first_step, 3, 5) == 0  # a gated step's one copied token costs 0.55
    assert machine.lookup_tokens_worth(late_step, 1, 5) == 3
    assert machine.lookup_tokens_worth(late_step, 3, 5) == 1  # on a drafted step the second costs 0.8
    assert machine.lookup_tokens_worth(flat, 3, 0) == 0


@pytest.mark.parametrize("per_position, kept", [(0.02, 5), (0.4, 1)], ids=["cheap positions", "costly positions"])
def test_first_use_fits_the_copied_tokens_to_this_machine(hf_home, per_position, kept):
    """Heads with 5 copied tokens configured: first use keeps all five where a position costs 2% of a step, one
    where each costs 40% (bf16 without bf16 kernels: five made decoding 0.72x plain there), and decodes as plain."""
    base = tiny_model("llama")
    model = oracle_model(base)
    model.config.prompt_lookup_num_tokens = 5
    with fake_clock(base, lambda module, n: 0.01 * (1 + per_position * (n - 1))):
        settings = model.decoding_settings()
    assert settings["gate_threshold"] != 0.0 and settings["prompt_lookup_num_tokens"] == kept
    assert torch.equal(model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS), reference("llama"))


@pytest.mark.parametrize("fit", [None, machine.FIT_VERSION - 1, machine.FIT_VERSION],
                         ids=["unversioned", "older", "current"])
def test_an_entry_of_an_older_fit_is_measured_again(hf_home, measurements, fit):
    """A first-use entry written by an older fit (before the copied tokens were bounded, before the gain margin) may
    hold settings this version would not choose: it is measured again, and one of the current fit is read back."""
    model = oracle_model()
    model.generate(get_prompt("llama"), max_new_tokens=4)
    cache = CalibrationCache(checkpoint_hash(model))
    data = json.loads(cache.path.read_text())
    for entry in data["entries"].values():
        assert entry["fit"] == machine.FIT_VERSION
        if fit is None:
            del entry["fit"]
        else:
            entry["fit"] = fit
    cache.path.write_text(json.dumps(data))
    CalibrationCache._remembered.clear()
    model.generate(get_prompt("llama"), max_new_tokens=4)
    assert len(measurements) == (1 if fit == machine.FIT_VERSION else 2)
    assert all(entry.get("fit") == machine.FIT_VERSION
               for entry in json.loads(cache.path.read_text())["entries"].values())


@pytest.mark.parametrize("gain, plain", [(0.9, True), (1.05, True), (1.2, False)])
def test_drafting_is_the_default_only_where_it_is_expected_to_gain_the_margin(gain, plain):
    """The fit leaves out the loop's own work per step, so a modelled gain under `DRAFT_GAIN_MARGIN` (10%) is no
    gain: the entry decodes plain, without copied tokens, and says the modelled gain in its report."""
    settings = {"gate_signal": "head_entropy", "gate_threshold": 2.0, "prompt_lookup_num_tokens": 5}
    fitted = machine.Fitted(dict(settings), tokens_per_s=10.0 * gain, plain_tokens_per_s=10.0, report={})
    machine.plain_by_default(fitted, "test machine")
    assert fitted.report["plain"] is plain and fitted.report["expected_gain"] == pytest.approx(gain)
    assert fitted.settings == ({**settings, "gate_threshold": 0.0, "prompt_lookup_num_tokens": 0} if plain else settings)
    assert fitted.tokens_per_s == pytest.approx(10.0 if plain else 10.0 * gain)


def _linear_way(view, layer) -> str:
    """How ``view`` (the base or a view of it) computes ``layer``: "unpacked", "packed" or "one row as it is"."""
    linear = view.model.layers[0].mlp.down_proj  # a view through packed weights has a view of it in its place
    return "unpacked" if linear is layer else "one row as it is" if linear.forward.keywords["one_row_as_is"] else "packed"


@pytest.mark.skipif(not packing_available(DEVICE, torch.float32), reason="this CPU and torch pack no float32 weights")
@pytest.mark.parametrize("packed_cost, one_row_cost, expected", [
    (2.0, 2.0, False), (0.5, 0.5, None), (0.5, 0.4, "multi-row"), (0.5, 0.49, None)])
def test_packing_is_kept_only_where_it_pays(hf_home, packed_cost, one_row_cost, expected):
    """Where forwards through packed weights (a view of the base) cost twice what the base's own cost, the entry
    keeps the unpacked layers, and decoding honours it; where packing is the faster, the entry says nothing, unless
    a one-token forward with one row through the weights as they are costs `ONE_ROW_MARGIN` less than packed (4/5
    of it: kept; 49/50: within the margin, not)."""
    base = tiny_model("llama")
    model = oracle_model(base)
    layer = base.model.layers[0].mlp.down_proj
    factor = {"unpacked": lambda n: 1.0, "packed": lambda n: packed_cost,
              "one row as it is": lambda n: one_row_cost if n == 1 else packed_cost}
    timed = []

    def seconds(view, n: int) -> float:
        timed.append((_linear_way(view, layer), n))
        return 0.01 * (1 + n / 10) * factor[timed[-1][0]](n)

    with fake_clock(base, seconds):
        settings = model.decoding_settings()
    assert settings["packed_weights"] == expected and type(settings["packed_weights"]) is type(expected)
    # the third way timed at one token only: its several-row forwards are the packed ones, timed at every size
    assert {n for way, n in timed if way == "one row as it is"} == {1} and len({n for _, n in timed}) > 2
    way = {False: "unpacked", None: "packed", "multi-row": "one row as it is"}[expected]
    assert _linear_way(model.decoding_view().base, layer) == way
    assert torch.equal(model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS), reference("llama"))


# ------------------------------------------------------------------------------------------------ the command
def test_calibrate_writes_the_positions_and_machine_fits_this_machine_to_them(tmp_path, hf_home, capsys):
    import argparse

    from cerberus_hf.tools import calibrate as calibrate_tool

    base = get_base("llama")
    base.save_pretrained(tmp_path / "base")
    fresh_model("llama", "hydra", randomize=True, num_heads=3, base_model_name_or_path=str(tmp_path / "base")
                ).save_pretrained(tmp_path / "heads")
    sequence = reference("llama")[0].tolist()
    (tmp_path / "data.jsonl").write_text(json.dumps({
        "id": "a", "mode": "greedy", "prompt": "p", "input_ids": sequence[:PROMPT_LEN],
        "output_ids": sequence[PROMPT_LEN:], "finished": True}) + "\n")
    parser = argparse.ArgumentParser()
    calibrate_tool.add_cli(parser.add_subparsers(dest="command"))

    def run(*options):
        args = parser.parse_args(["calibrate", "--heads", str(tmp_path / "heads"), "--repeats", "1", *options])
        return args.func(args)

    with pytest.raises(UserError, match=f"no {POSITIONS_NAME}"):
        run("--machine")
    with pytest.raises(UserError, match="give one of them"):
        run("--data", str(tmp_path / "data.jsonl"), "--prompts", "packaged")
    assert run("--data", str(tmp_path / "data.jsonl"), "--held-out-fraction", "0", "--max-nodes", "6",
               "--dynamic-max-nodes", "6", "--dynamic-budgets", "--write") == 0
    statistics = PositionStatistics.load(tmp_path / "heads" / POSITIONS_NAME, num_heads=3, chains=False)
    assert len(statistics.records) == len(sequence) - PROMPT_LEN - 3
    with pytest.raises(UserError, match="do.es. not apply to --machine"):
        run("--machine", "--data", str(tmp_path / "data.jsonl"))
    capsys.readouterr()
    assert run("--machine") == 0
    assert "stored in " + str(hf_home) in capsys.readouterr().out
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "heads")
    assert loaded.decoding_settings()["calibration"] == str(hardware.HardwareKey.of("cpu", torch.float32))
    loaded.generation_config.cerberus_calibration = None  # the entry --write stored aside: the cache's is used
    assert loaded.decoding_settings()["calibration"].endswith(MEASURED)
