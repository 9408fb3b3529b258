"""Calibrations keyed by device, dtype and processor: the keys, which stored entry a call uses, and that
generate() and the bench follow it."""

from __future__ import annotations

import pytest
import torch
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from cerberus_hf import CerberusForCausalLM
from cerberus_hf import hardware
from cerberus_hf.hardware import (HardwareKey, bf16_matmul, describe_device, processor_name,
                                          select_calibration, stored_bf16_matmul)
from helpers import NEW_TOKENS, fresh_model, get_prompt, reference
from tiny_models import DEVICE, tiny_model


def test_keys_round_trip_and_legacy_keys_parse():
    key = HardwareKey("cpu", "bfloat16", "Intel(R) Xeon(R) Platinum 8488C")
    assert str(key) == "cpu/bfloat16/Intel(R) Xeon(R) Platinum 8488C" and HardwareKey.parse(str(key)) == key
    assert HardwareKey.parse("cpu") == HardwareKey("cpu", None, None) and str(HardwareKey.parse("cpu")) == "cpu"
    # a processor name may itself hold a slash: only the first two separate fields
    assert HardwareKey.parse("cuda/float16/A/B").processor == "A/B"
    here = HardwareKey.of("cpu", torch.float32)
    assert here.dtype == "float32" and here.processor == processor_name("cpu") and here.processor


@pytest.mark.parametrize("flags, bf16, words", [
    ({"avx2", "amx_tile", "amx_bf16", "avx512_bf16"}, "AMX", "Some CPU (with AMX)"),
    ({"avx2", "avx512f", "avx512_bf16"}, "AVX512-BF16", "Some CPU (no AMX, with AVX512-BF16)"),
    ({"avx2"}, None, "Some CPU (no AMX)"),
])
def test_a_cpu_is_described_with_its_bf16_instructions(monkeypatch, flags, bf16, words):
    assert ("with AMX" if bf16_matmul("cpu") == "AMX" else "no AMX") in describe_device(torch.device("cpu"))
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("Some CPU", frozenset(flags)))
    assert bf16_matmul("cpu") == bf16 and bf16_matmul("meta") is None and words in describe_device("cpu")


@pytest.mark.parametrize("flags, words", [
    ({"avx2", "amx_tile", "avx512_bf16"}, None),
    ({"avx2", "avx512_bf16"}, "no AMX, only AVX512-BF16"),
    ({"avx2"}, "neither AMX nor AVX512-BF16"),
])
def test_reduced_precision_on_a_cpu_without_amx_comes_with_a_note(monkeypatch, flags, words):
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("Some CPU", frozenset(flags)))
    note = hardware.reduced_precision_note("cpu", torch.bfloat16)
    assert note is None if words is None else words in note and "float32" in note
    assert hardware.reduced_precision_note("cpu", torch.float32) is None
    assert hardware.reduced_precision_note("meta", torch.bfloat16) is None


def _entry(tree, amx=None, bf16="unset"):
    return {"draft_tree": tree} | ({} if amx is None else {"amx": amx}) | ({} if bf16 == "unset" else
                                                                          {"bf16_matmul": bf16})


def test_entries_from_before_bf16_matmul_say_only_amx():
    assert stored_bf16_matmul(_entry([[0]], amx=True)) == "AMX"
    assert stored_bf16_matmul(_entry([[0]], amx=False)) is None and stored_bf16_matmul(_entry([[0]])) is None
    assert stored_bf16_matmul(_entry([[0]], amx=False, bf16="AVX512-BF16")) == "AVX512-BF16"


@pytest.mark.parametrize("wanted, bf16, expected", [
    (HardwareKey("cpu", "bfloat16", "Xeon A"), "AMX", "cpu/bfloat16/Xeon A"),  # exact
    (HardwareKey("cpu", "bfloat16", "Xeon B"), "AMX", "cpu/bfloat16/Xeon A"),  # same dtype, same AMX: beats the name
    (HardwareKey("cpu", "bfloat16", "EPYC"), None, "cpu/bfloat16/EPYC 2"),  # same dtype, no fast bf16 like this one
    # one model name over two kinds of processor: the bf16 instructions decide
    (HardwareKey("cpu", "bfloat16", "EPYC"), "AVX512-BF16", "cpu/bfloat16/EPYC"),
    (HardwareKey("cpu", "float16", "Xeon A"), "AMX", "cpu/bfloat16/Xeon A"),  # no float16: same AMX and name first
    (HardwareKey("cpu", "float16", "Other"), None, "cpu/float32/EPYC"),  # nothing alike: float32, the general curve
    (HardwareKey("cuda", "bfloat16", "H100"), None, None),  # only other devices stored
])
def test_the_closest_entry_is_chosen(wanted, bf16, expected):
    calibrated = {
        "cpu/bfloat16/Xeon A": _entry([[0], [1]], amx=True),
        "cpu/bfloat16/EPYC 2": _entry([[0]], amx=False),
        "cpu/bfloat16/EPYC": _entry([[0], [0, 0]], amx=False, bf16="AVX512-BF16"),
        "cpu/float32/EPYC": _entry([[1]], amx=False),
        "cpu": _entry([[2]]),
    }
    key, settings = select_calibration(calibrated, wanted, bf16=bf16)
    assert key == expected and settings == (calibrated[expected] if expected else {})


def test_a_legacy_entry_serves_when_it_is_the_only_one_and_the_choice_is_logged():
    logger = logging.get_logger("cerberus_hf.hardware")
    logging.set_verbosity_warning()
    wanted = HardwareKey("cpu", "float32", "A CPU only this test has")
    with CaptureLogger(logger) as captured:
        key, settings = select_calibration({"cpu": _entry([[3]])}, wanted)
    assert key == "cpu" and settings["draft_tree"] == [[3]]
    assert f"no calibration stored for {wanted}; using the one for cpu" in captured.out
    with CaptureLogger(logger) as captured:
        assert select_calibration({str(wanted): _entry([[4]])}, wanted)[0] == str(wanted)
    assert captured.out == ""  # an exact match says nothing
    assert select_calibration(None, wanted) == (None, {}) and select_calibration({}, wanted) == (None, {})


def test_generate_uses_the_entry_for_its_dtype():
    model = fresh_model("llama", "medusa", num_heads=2)
    fp32, bf16 = HardwareKey.of(DEVICE, torch.float32), HardwareKey.of(DEVICE, torch.bfloat16)
    calibrated = {
        str(fp32): {"draft_tree": [[0], [0, 0]], "tree_kind": "static", "gate_threshold": None},
        str(bf16): {"draft_tree": [[0], [1], [2]], "tree_kind": "static", "gate_threshold": None},
    }
    model.generation_config.cerberus_calibration = calibrated
    assert model.decoding_settings()["calibration"] == str(fp32)
    assert model.decoding_settings(dtype=torch.bfloat16)["draft_tree"] == [[0], [1], [2]]
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert torch.equal(out, reference("llama"))
    stats = model.generation_stats
    assert stats.calibration == str(fp32)
    # 2 nodes a step, fewer only in the last steps, where the room before max_length cuts the depth
    assert 2 * (stats.draft_steps - 2) <= stats.drafted_tokens <= 2 * stats.draft_steps
    # the same heads on a bf16 base of their own (the shared tiny base must stay float32)
    model = CerberusForCausalLM.from_base(tiny_model("llama").to(torch.bfloat16), head_type="medusa", num_heads=2)
    model.generation_config.cerberus_calibration = calibrated
    assert model.decoding_settings()["calibration"] == str(bf16)
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert model.generation_stats.calibration == str(bf16)
    assert model.generation_stats.drafted_tokens <= 3 * model.generation_stats.draft_steps
    assert model.generation_stats.drafted_tokens > 2 * model.generation_stats.draft_steps
