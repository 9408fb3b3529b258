"""Calibrations keyed by device, dtype and processor: the keys, which stored entry a call uses, and that
generate() and the bench follow it."""

from __future__ import annotations

import pytest
import torch
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from cerberus_hf import CerberusForCausalLM
from cerberus_hf import hardware
from cerberus_hf.hardware import (CPU_CLASSES, CpuInfo, HardwareKey, bf16_kernels, bf16_matmul, describe_device,
                                  instruction_class, processor_name, select_calibration, stored_class)
from helpers import NEW_TOKENS, fresh_model, get_prompt, reference
from tiny_models import DEVICE, tiny_model


def test_keys_round_trip_and_legacy_keys_parse():
    key = HardwareKey("cpu", "bfloat16", "AMX", "Intel(R) Xeon(R) Platinum 8488C (GenuineIntel family 6 model 143)")
    assert str(key) == "cpu/bfloat16/AMX/Intel(R) Xeon(R) Platinum 8488C (GenuineIntel family 6 model 143)"
    assert HardwareKey.parse(str(key)) == key
    assert HardwareKey.parse("cpu") == HardwareKey("cpu") and str(HardwareKey.parse("cpu")) == "cpu"
    # keys from before the class was keyed: the rest is the processor, a slash in it included
    assert HardwareKey.parse("cpu/float32/AMD EPYC") == HardwareKey("cpu", "float32", None, "AMD EPYC")
    assert HardwareKey.parse("cuda/float16/A/B") == HardwareKey("cuda", "float16", None, "A/B")
    assert HardwareKey.parse("cuda/bfloat16/sm_90/NVIDIA H200") == HardwareKey("cuda", "bfloat16", "sm_90", "NVIDIA H200")
    here = HardwareKey.of("cpu", torch.float32)
    assert here.dtype == "float32" and here.processor == processor_name("cpu") and here.processor
    assert here.isa == instruction_class("cpu") in CPU_CLASSES


def _cpu(flags, name="Some CPU"):
    return lambda: CpuInfo(name, "AuthenticAMD", "25", "1", frozenset(flags))


AVX512 = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.mark.parametrize("flags, capability, kernels, isa, words", [
    (AVX512 | {"amx_tile", "amx_bf16", "avx512_bf16"}, "AVX512", True, "AMX", "with AMX"),
    (AVX512 | {"avx512_bf16"}, "AVX512", True, "AVX512-BF16", "AVX512-BF16, no AMX"),
    (AVX512, "AVX512", True, "AVX512", "AVX-512, no AMX or AVX512-BF16"),
    (AVX512 | {"avx512_bf16"}, "AVX512", False, "AVX512", "AVX-512, no AMX"),  # ONEDNN_MAX_CPU_ISA below bf16
    (AVX512 | {"avx512_bf16"}, "AVX2", False, "AVX2", "AVX2 only"),  # ATEN_CPU_CAPABILITY=avx2
    ({"avx", "avx2", "fma"}, "AVX2", False, "AVX2", "AVX2 only"),  # the AVX2-only EPYC
    ({"sse4_2"}, "DEFAULT", False, "baseline", "baseline"),
])
def test_a_cpu_is_classed_by_its_flags_and_what_torch_uses(monkeypatch, flags, capability, kernels, isa, words):
    assert instruction_class("cpu") in CPU_CLASSES and instruction_class("meta") is None
    monkeypatch.setattr(hardware, "_cpuinfo", _cpu(flags))
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(hardware, "bf16_kernels", lambda: kernels)
    assert instruction_class("cpu") == isa and words in describe_device("cpu")
    assert bf16_matmul("cpu") == (isa if isa in ("AMX", "AVX512-BF16") else None) and bf16_matmul("meta") is None
    assert processor_name("cpu") == "Some CPU (AuthenticAMD family 25 model 1)"


@pytest.mark.parametrize("features, isa", [({"fp", "asimd", "sve"}, "SVE"), ({"fp", "asimd"}, "NEON")])
def test_an_arm_cpu_is_classed_by_its_features(monkeypatch, features, isa):
    monkeypatch.setattr(hardware, "_cpuinfo", _cpu(features))
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")
    assert instruction_class("cpu") == isa


def test_the_class_here_agrees_with_onednn():
    """On the processor at hand: a class with bf16 tiles or dot products is one where oneDNN has bf16 kernels."""
    assert bf16_kernels() or instruction_class("cpu") not in ("AMX", "AVX512-BF16")


@pytest.mark.parametrize("flags, words", [
    (AVX512 | {"amx_tile", "avx512_bf16"}, None),
    (AVX512 | {"avx512_bf16"}, "no AMX, only AVX512-BF16"),
    ({"avx2"}, "neither AMX nor AVX512-BF16"),
])
def test_reduced_precision_on_a_cpu_without_amx_comes_with_a_note(monkeypatch, flags, words):
    monkeypatch.setattr(hardware, "_cpuinfo", _cpu(flags))
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512" if "avx512f" in flags else "AVX2")
    monkeypatch.setattr(hardware, "bf16_kernels", lambda: "avx512f" in flags)
    note = hardware.reduced_precision_note("cpu", torch.bfloat16)
    assert note is None if words is None else words in note and "float32" in note
    assert hardware.reduced_precision_note("cpu", torch.float32) is None
    assert hardware.reduced_precision_note("meta", torch.bfloat16) is None


def _entry(tree, amx=None, bf16="unset"):
    return {"draft_tree": tree} | ({} if amx is None else {"amx": amx}) | ({} if bf16 == "unset" else
                                                                          {"bf16_matmul": bf16})


def test_entries_from_before_classes_were_keyed_have_the_class_they_recorded():
    assert stored_class("cpu/float32/Xeon", _entry([[0]], amx=True)) == "AMX"
    assert stored_class("cpu/float32/EPYC", _entry([[0]], amx=False)) is None
    assert stored_class("cpu", _entry([[0]])) is None
    assert stored_class("cpu/float32/EPYC", _entry([[0]], amx=False, bf16="AVX512-BF16")) == "AVX512-BF16"
    assert stored_class("cpu/float32/AVX2/EPYC", _entry([[0]], amx=False, bf16="AVX512-BF16")) == "AVX2"
    assert stored_class("cuda/bfloat16/NVIDIA H200", {}) is None
    assert stored_class("cuda/bfloat16/sm_90/NVIDIA H200", {}) == "sm_90"


CALIBRATED = {
    "cpu/bfloat16/AMX/Xeon A": _entry([[0], [1]]),
    "cpu/bfloat16/Xeon C": _entry([[0], [2]], amx=True),  # keyed before classes: its entry says AMX
    "cpu/bfloat16/AVX2/EPYC 2": _entry([[0]]),
    "cpu/bfloat16/EPYC": _entry([[0], [0, 0]], amx=False, bf16="AVX512-BF16"),
    "cpu/float32/AVX512-BF16/EPYC": _entry([[1]]),
    "cpu/float32/EPYC 3": _entry([[1], [2]], amx=False),  # keyed before classes, no class recorded: serves none
    "cpu": _entry([[2]]),
    "cuda/bfloat16/NVIDIA H200": _entry([[3]]),  # keyed before classes: serves the same GPU by name
    "cuda/float32/sm_90/NVIDIA H100": _entry([[4]]),
}


@pytest.mark.parametrize("wanted, expected", [
    (HardwareKey("cpu", "bfloat16", "AMX", "Xeon A"), "cpu/bfloat16/AMX/Xeon A"),  # exact
    (HardwareKey("cpu", "bfloat16", "AMX", "Xeon C"), "cpu/bfloat16/Xeon C"),  # same class, same name
    (HardwareKey("cpu", "bfloat16", "AMX", "Xeon B"), "cpu/bfloat16/AMX/Xeon A"),  # same class, a keyed one first
    (HardwareKey("cpu", "bfloat16", "AVX2", "EPYC"), "cpu/bfloat16/AVX2/EPYC 2"),  # one name over two classes
    (HardwareKey("cpu", "bfloat16", "AVX512-BF16", "EPYC"), "cpu/bfloat16/EPYC"),
    (HardwareKey("cpu", "float16", "AVX512-BF16", "Other"), "cpu/float32/AVX512-BF16/EPYC"),  # float32: general
    (HardwareKey("cpu", "float32", "AVX2", "EPYC"), "cpu/bfloat16/AVX2/EPYC 2"),  # its class, another dtype
    (HardwareKey("cpu", "float32", "AVX512", "EPYC"), None),  # no entry of this class: never another class's
    (HardwareKey("cpu", "float32", "AVX512", "EPYC 3"), None),  # an entry of unknown class serves no CPU
    (HardwareKey("cuda", "bfloat16", "sm_90", "NVIDIA H200"), "cuda/bfloat16/NVIDIA H200"),
    (HardwareKey("cuda", "bfloat16", "sm_90", "NVIDIA H100"), "cuda/float32/sm_90/NVIDIA H100"),
    (HardwareKey("cuda", "bfloat16", "sm_80", "NVIDIA A100"), None),  # another compute capability
])
def test_the_closest_entry_of_the_same_class_is_chosen(wanted, expected):
    key, settings = select_calibration(CALIBRATED, wanted)
    assert key == expected and settings == (CALIBRATED[expected] if expected else {})


def test_choosing_says_nothing_and_the_caller_says_what_decodes():
    """`select_calibration` logs nothing (first use may measure instead of the entry it found); the caller says
    what decodes, with the command that would change it."""
    logger = logging.get_logger("cerberus_hf.hardware")
    logging.set_verbosity_warning()
    wanted = HardwareKey("cpu", "float32", "AVX2", "A CPU only this test has")
    with CaptureLogger(logger) as captured:
        assert select_calibration({"cpu/float32/AVX2/Another": _entry([[3]])}, wanted)[0] == "cpu/float32/AVX2/Another"
        other = {"cpu/float32/AVX512-BF16/Another": _entry([[3]])}
        assert select_calibration(other, wanted) == (None, {})
        assert select_calibration({str(wanted): _entry([[4]])}, wanted)[0] == str(wanted)
    assert captured.out == ""
    with CaptureLogger(logger) as captured:
        hardware.note_borrowed("cpu/float32/AVX2/Another", wanted, "cerberus-hf calibrate --heads F --machine")
    assert f"decoding with the calibration fitted on cpu/float32/AVX2/Another for {wanted}." in captured.out
    assert "within 2.5%" in captured.out and "calibrate" not in captured.out.split("within")[0]  # nothing to act on
    with CaptureLogger(logger) as captured:
        hardware.note_borrowed("cpu/float32/AVX2/Another", HardwareKey("cpu", "bfloat16", "AVX2", "X"),
                               "cerberus-hf calibrate --heads F --machine --dtype bfloat16")
    assert "`cerberus-hf calibrate --heads F --machine --dtype bfloat16` fits one for bfloat16" in captured.out
    with CaptureLogger(logger) as captured:
        hardware.note_no_entry(other, wanted)
    assert "no calibration stored for cpu with AVX2" in captured.out and "config's settings" in captured.out
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
