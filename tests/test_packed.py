"""Linear layers through packed weights on a CPU (`blocks.packed`): the same numbers as the base's own (bit for bit
in bfloat16, within float32's rounding in float32), the base left as it was, weights changed in place packed again,
and generate() using them by default except under strict verification."""

from __future__ import annotations

import copy

import pytest
import torch

import cerberus_hf.blocks.packed as packed
import cerberus_hf.settings_selection as settings_selection
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.packed import PackedWeights, packed_view, packing_available
from cerberus_hf.errors import UserError
from cerberus_hf.hardware import bf16_kernels
from helpers import fresh_model, get_base, get_prompt, reference
from tiny_models import ARCHITECTURES, DEVICE, prompt_ids, tiny_model

pytestmark = pytest.mark.skipif(not packing_available(DEVICE, torch.float32), reason="packing needs a CPU with oneDNN")
needs_bf16_kernels = pytest.mark.skipif(not bf16_kernels(), reason="oneDNN has no bf16 kernels on this processor "
                                        "(AVX2 only, or ONEDNN_MAX_CPU_ISA below AVX-512): bf16 is never packed here")


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_packed_view_computes_as_the_base_and_leaves_it_untouched(arch):
    base = get_base(arch)
    ids = prompt_ids(3, length=12)
    before = _logits(base, ids)
    view = packed_view(base, PackedWeights())
    assert view is not base
    torch.testing.assert_close(_logits(view, ids), before, rtol=1e-5, atol=1e-5)
    assert torch.equal(_logits(base, ids), before)
    assert all("forward" not in module.__dict__ for module in base.modules())  # the base's modules are its own


@needs_bf16_kernels
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bfloat16_packed_products_are_bit_identical(arch):
    base = tiny_model(arch).to(torch.bfloat16)
    ids = prompt_ids(4, length=9)
    assert torch.equal(_logits(packed_view(base, PackedWeights()), ids), _logits(base, ids))


def test_a_weight_changed_in_place_is_packed_again():
    base = copy.deepcopy(get_base("llama"))
    weights = PackedWeights()
    ids = prompt_ids(5, length=10)
    stale = packed_view(base, weights)
    with torch.no_grad():
        base.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    expected = _logits(base, ids)
    torch.testing.assert_close(_logits(stale, ids), expected, rtol=1e-5, atol=1e-5)  # through linear until repacked
    torch.testing.assert_close(_logits(packed_view(base, weights), ids), expected, rtol=1e-5, atol=1e-5)


@needs_bf16_kernels
def test_a_base_converted_to_another_dtype_is_packed_again():
    base = copy.deepcopy(get_base("llama"))
    weights = PackedWeights()
    count = len(weights.update([base]))
    assert count == sum(isinstance(m, torch.nn.Linear) for m in base.modules())
    stale = packed_view(base, weights)
    base.to(torch.bfloat16)  # the same parameters, their data converted
    new = weights.update([base])
    assert len(new) == count and all(entry.packed.dtype == torch.bfloat16 for entry in new.values())
    ids = prompt_ids(6, length=10)
    assert torch.equal(_logits(stale, ids), _logits(base, ids))  # through linear until packed again
    assert torch.equal(_logits(packed_view(base, weights), ids), _logits(base, ids))


def test_models_on_one_base_share_one_packed_copy_dropped_with_the_last(monkeypatch):
    """Two wrappers of one base (two drafters, or a benchmark's packed peer beside them) hold one packed copy of each
    base weight, not one each: a 1.5B base in float32 would otherwise hold its weights three times over."""
    calls = []
    real = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda weight, rows: calls.append(weight.data_ptr()) or real(weight, rows))
    base = copy.deepcopy(get_base("llama"))
    weights = [m.weight.data_ptr() for m in base.modules() if isinstance(m, torch.nn.Linear)]
    first, second = PackedWeights(), PackedWeights()
    table = first.update([base])
    assert sorted(calls) == sorted(weights)
    assert all(second.update([base])[key] is entry for key, entry in table.items()) and len(calls) == len(weights)
    hydra = CerberusForCausalLM.from_base(base, head_type="hydra", num_heads=2)
    medusa = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=2)
    prompt = get_prompt("llama")
    outputs = [model.generate(prompt, max_new_tokens=16, do_sample=False) for model in (hydra, medusa)]
    assert len(calls) > len(weights) and all(calls.count(pointer) == 1 for pointer in weights)  # the heads' own only
    assert all(torch.equal(out, packed_view(base, first).generate(prompt, max_new_tokens=16, do_sample=False))
               for out in outputs)
    weight = base.model.layers[0].mlp.down_proj.weight
    del table, hydra, medusa
    first.update([])
    second.update([])
    assert id(weight) not in packed._SHARED  # the last holder let go: the packed copy is freed


def test_generate_packs_by_default_on_a_cpu_but_not_when_told_or_strict(monkeypatch):
    calls = []
    real = packed._packed_linear
    monkeypatch.setattr(packed, "_packed_linear", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    model = fresh_model("llama", "hydra", num_heads=3)
    prompt = get_prompt("llama")
    expected = reference("llama")
    assert torch.equal(model.generate(prompt, max_new_tokens=24, do_sample=False), expected)
    assert calls
    calls.clear()
    assert torch.equal(model.generate(prompt, max_new_tokens=24, do_sample=False, packed_weights=False), expected)
    assert torch.equal(model.generate(prompt, max_new_tokens=24, do_sample=False, strict=True), expected)
    assert not calls


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_one_row_as_is_runs_one_row_on_the_weight_and_several_packed(monkeypatch, arch):
    """`ONE_ROW_AS_IS`: a one-token forward's products run oneDNN on each weight as it is, a several-token forward's
    on the packed weights, and both compute as the base does."""
    layouts = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_linear_pointwise",
                        lambda x, weight, *rest: layouts.append(weight.is_mkldnn) or real(x, weight, *rest))
    base = get_base(arch)
    view = packed_view(base, PackedWeights(), one_row_as_is=True)
    for length, packed_layouts in ((1, True), (6, False)):
        ids = prompt_ids(7, length=length)
        torch.testing.assert_close(_logits(view, ids), _logits(base, ids), rtol=1e-5, atol=1e-5)
        linears = sum(isinstance(m, torch.nn.Linear) for m in base.modules())
        assert len(layouts) >= linears and not any(layouts) if length == 1 else all(layouts)
        layouts.clear()


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_generate_one_row_as_is_is_exact_and_a_wrong_value_is_refused(arch):
    model = fresh_model(arch, "hydra", num_heads=3)
    prompt = get_prompt(arch)
    out = model.generate(prompt, max_new_tokens=24, do_sample=False, packed_weights=packed.ONE_ROW_AS_IS)
    assert torch.equal(out, reference(arch))
    with pytest.raises(UserError, match="packed_weights must be True, False, 'multi-row'") as error:
        model.generate(prompt, max_new_tokens=4, packed_weights="sometimes")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("kernels", [False, True], ids=["without-bf16-kernels", "with-bf16-kernels"])
def test_bfloat16_is_packed_only_where_onednn_has_bf16_kernels(monkeypatch, kernels):
    """Each packing decision on the processor at hand: without oneDNN's bf16 kernels (forced where they exist, as on
    an AVX2-only processor) a bf16 base decodes through `linear`, said once, with the same output as unpacked."""
    if kernels and not bf16_kernels():
        pytest.skip("oneDNN has no bf16 kernels on this processor: only the decision without them can run here")
    monkeypatch.setattr(packed, "bf16_kernels", lambda: kernels)
    calls = []
    real = packed._packed_linear
    monkeypatch.setattr(packed, "_packed_linear", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    model = CerberusForCausalLM.from_base(tiny_model("llama").to(torch.bfloat16), head_type="hydra", num_heads=3)
    assert packing_available(DEVICE, torch.bfloat16) == kernels and packing_available(DEVICE, torch.float32)
    prompt = get_prompt("llama")
    said = []  # warning_once's own memory would hide the line from a second test in the session
    monkeypatch.setattr(settings_selection.logger, "warning_once", said.append)
    out = model.generate(prompt, max_new_tokens=24, do_sample=False)
    assert bool(calls) == kernels
    assert any("linear layers run unpacked: oneDNN has no bfloat16 kernels" in line for line in said) == (not kernels)
    assert torch.equal(out, model.generate(prompt, max_new_tokens=24, do_sample=False, packed_weights=False))
    if not kernels:
        with pytest.raises(ValueError, match="oneDNN has no bfloat16 kernels on this processor"):
            model.generate(prompt, max_new_tokens=4, packed_weights=True)


def test_packed_weights_are_refused_where_they_cannot_apply():
    model = fresh_model("llama", "hydra", num_heads=3)
    prompt = get_prompt("llama")
    with pytest.raises(ValueError, match="cannot be combined with strict=True"):
        model.generate(prompt, max_new_tokens=4, packed_weights=True, strict=True)
    half = fresh_model("llama", "hydra", num_heads=3)
    half.base = copy.deepcopy(half.base).to(torch.float16)
    with pytest.raises(ValueError, match="needs a CPU, float32 or bfloat16"):
        half.generate(prompt, max_new_tokens=4, packed_weights=True)


def test_a_copied_model_packs_its_own_weights():
    model = fresh_model("llama", "hydra", num_heads=3)
    model.generate(get_prompt("llama"), max_new_tokens=4, do_sample=False)
    copied = copy.deepcopy(model)
    assert copied.packed_weights is not model.packed_weights
    assert torch.equal(copied.generate(get_prompt("llama"), max_new_tokens=24, do_sample=False), reference("llama"))


@pytest.mark.parametrize("head_type", ["hydra", "eagle3", "dflash"])
def test_the_draft_vocabularys_rows_are_packed_once_and_project_as_linear_does(monkeypatch, head_type):
    """A draft vocabulary's rows of the lm_head belong to no module; the decoding view packs them once (while they
    live) and projects through them, as `linear` would within float32's rounding; output stays the base's."""
    calls = []
    real = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda weight, rows: calls.append(tuple(weight.shape)) or real(weight, rows))
    model = fresh_model("llama", head_type, randomize=True, num_heads=3)
    model.set_draft_vocab(torch.arange(0, 96, 2))
    view = model.decoding_view()
    heads = view.heads
    states = torch.randn(4, model.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(heads.project(states, 0), model.heads.project(states, 0), rtol=1e-5, atol=1e-5)
        heads.project(states, 1)
    assert calls.count((48, model.config.hidden_size)) == 1  # the rows, packed once for every head sharing them
    assert model.heads.linear is torch.nn.functional.linear  # the model itself computes as before
    assert torch.equal(model.generate(get_prompt("llama"), max_new_tokens=24, do_sample=False), reference("llama"))
