"""Kangaroo: the base's first layers plus an adapter draft a chain, with the second early exit.

What the family matrix in test_drafters does not reach: the base's cache is left exactly as it was after
every draft (the shallow layers write into it while drafting), verification starting at the exit layer
(the shallow layers' work on the draft reused) computing what the whole forward computes, steps whose draft
is fully rejected, fully accepted or ended by the confidence exit, the adapter's cache following the
verified tokens, the untrained adapter being the base's early exit, and the errors for settings Kangaroo
cannot take.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest
import torch
from transformers import DynamicCache

from cerberus_hf.drafters.base import decoder_layers
from cerberus_hf.compat import cache_argument
from cerberus_hf.drafters.kangaroo import capture_exit_states, first_layers
from helpers import ARCHITECTURES, NEW_TOKENS, check_stats, fresh_model, get_base, get_prompt, install_oracle, reference


def _prefilled(model, arch):
    """A cache and the adapter's state after the base read the arch's prompt, as the decoding loop leaves them."""
    prompt = get_prompt(arch)
    cache = DynamicCache(config=model.base.config)
    with capture_exit_states(model.base, model.heads.exit_layer) as captured:
        model.base(input_ids=prompt[:, :-1], **cache_argument(cache), use_cache=True)
        cache.activate_past_recording()
        state = model.heads.start(model.base, cache)
        state.observe(captured, None)
    return prompt, cache, state, captured


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_drafting_leaves_the_base_cache_as_it_was(arch):
    model = fresh_model(arch, "kangaroo", randomize=True, seed=3, num_heads=4)
    prompt, cache, state, captured = _prefilled(model, arch)
    before = [(layer.keys.clone(), layer.values.clone(), layer.get_seq_length()) for layer in cache.layers]
    with capture_exit_states(model.base, 1) as fresh:
        state.captured = fresh
        drafted = model.heads.draft_chain(state, prompt, max_tokens=4, confidence=0.0)
    assert len(drafted) == 4
    for (keys, values, length), layer in zip(before, cache.layers):
        assert layer.get_seq_length() == length
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    assert state.length == prompt.shape[1] - 1 and state.past[0].shape[-2] == state.length


@contextmanager
def _shallow_layer_lengths(model):
    """Records how many positions each call of the base's first layer computes while inside (read at its first
    part with parameters: a stand-in that passes its input on computes nothing there)."""
    layer = decoder_layers(model.base)[2][0]
    part = next(m for m in layer.modules() if m is not layer and any(True for _ in m.parameters(recurse=False)))
    lengths: list[int] = []
    handle = part.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[-2]))
    try:
        yield lengths
    finally:
        handle.remove()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_verification_from_the_exit_layer_equals_the_whole_forward(arch):
    """After a draft, verifying from the exit layer on (the shallow layers' KV entries and exited states
    from drafting) gives the logits, the cache and the exited states the whole forward gives, and does not
    run the shallow layers."""
    model = fresh_model(arch, "kangaroo", randomize=True, seed=5, num_heads=4)
    with torch.no_grad():
        prompt, cache, state, captured = _prefilled(model, arch)
    with capture_exit_states(model.base, 1) as fresh, torch.no_grad():
        state.captured = fresh
        drafted = model.heads.draft_chain(state, prompt, max_tokens=4, confidence=0.0)
        assert state.shallow is not None and state.shallow.tokens == prompt[0, -1:].tolist() + drafted
        tokens = torch.tensor([prompt[0, -1:].tolist() + drafted], device=prompt.device)
        positions = torch.arange(prompt.shape[1] - 1, prompt.shape[1] + len(drafted), device=prompt.device)[None]
        whole_cache = copy.deepcopy(cache)
        whole = model.base(input_ids=tokens, **cache_argument(whole_cache), position_ids=positions, use_cache=True)
        whole_exit = fresh["exit"].clone()
        with _shallow_layer_lengths(model) as lengths, state.verifying(model.base, tokens) as verifier:
            reused = verifier(input_ids=tokens, **cache_argument(cache), position_ids=positions, use_cache=True)
    assert lengths == [] and state.shallow is None
    torch.testing.assert_close(reused.logits, whole.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fresh["exit"], whole_exit, rtol=1e-5, atol=1e-5)
    for layer, whole_layer in zip(cache.layers, whole_cache.layers):
        assert layer.get_seq_length() == whole_layer.get_seq_length()
        torch.testing.assert_close(layer.keys, whole_layer.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.values, whole_layer.values, rtol=1e-5, atol=1e-5)
    assert all("forward" not in layer.__dict__ for layer in decoder_layers(model.base)[2])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_generate_verifies_from_the_exit_layer(arch):
    """In generate(), the first layer runs one position at a time after the prefill (drafting), never over a
    draft (verification starts after it); recomputing it instead gives the same output."""
    model = fresh_model(arch, "kangaroo", randomize=True, seed=2, num_heads=3, exit_confidence=0.0)
    install_oracle(model, [reference(arch, NEW_TOKENS + 8)], corrupt=lambda p, k: (p + k) % 4 == 0)
    with _shallow_layer_lengths(model) as lengths:
        out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    assert lengths[0] == get_prompt(arch).shape[1] and set(lengths[1:]) == {1}
    assert model.generation_stats.draft_steps > 0
    model.heads.reuse_shallow_layers = False
    with _shallow_layer_lengths(model) as lengths:
        out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    assert max(lengths[1:]) > 1


def test_the_untrained_adapter_drafts_the_base_early_exit():
    """With the zero output projection, the draft is lm_head(norm(h^l)): the base's exit at layer l."""
    model = fresh_model("llama", "kangaroo", num_heads=3)
    prompt, cache, state, _ = _prefilled(model, "llama")
    with capture_exit_states(model.base, 1) as fresh:
        state.captured = fresh
        drafted = model.heads.draft_chain(state, prompt, max_tokens=1, confidence=0.0)
    with first_layers(model.base, 1) as decoder:
        hidden = decoder(input_ids=prompt, output_hidden_states=True).hidden_states[1][0, -1]
    rms = hidden * torch.rsqrt(hidden.pow(2).mean() + 1e-6)
    assert drafted == [int(model.base.get_output_embeddings()(rms).argmax())]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_draft_fully_accepted(arch):
    model = fresh_model(arch, "kangaroo", num_heads=3, exit_confidence=0.0)
    oracle = install_oracle(model, [reference(arch, NEW_TOKENS + 8)])
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS)
    assert oracle["misses"] == 0
    assert model.generation_stats.tokens_per_step == [1] + [4] * 5 + [3]  # prefill's token, full chains, the rest


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_draft_fully_rejected(arch):
    """The oracle ranks a wrong token first at every depth: nothing is accepted, output unchanged."""
    model = fresh_model(arch, "kangaroo", num_heads=3, exit_confidence=0.0)
    install_oracle(model, [reference(arch, NEW_TOKENS + 8)], corrupt=lambda p, k: True)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS)
    assert model.generation_stats.accepted_draft_tokens == 0 and model.generation_stats.drafted_tokens > 0


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_drafts_ended_by_the_confidence_exit(arch):
    """exit_confidence 1 ends every draft after its first token (no probability reaches 1 here), and a
    partly corrupted oracle mixes accepted and rejected steps; output stays the base's."""
    model = fresh_model(arch, "kangaroo", num_heads=3, randomize=True, seed=1, exit_confidence=1.0)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    stats = model.generation_stats
    assert stats.drafted_tokens == stats.draft_steps  # one token per draft
    model = fresh_model(arch, "kangaroo", num_heads=4, exit_confidence=0.5)
    install_oracle(model, [reference(arch, NEW_TOKENS + 8)], corrupt=lambda p, k: (p + k) % 3 == 0)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS)
    assert 0 < model.generation_stats.accepted_draft_tokens < model.generation_stats.drafted_tokens


def test_generate_override_of_the_exit_confidence():
    model = fresh_model("llama", "kangaroo", num_heads=4, exit_confidence=0.0)
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    full = model.generation_stats.drafted_tokens
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0, exit_confidence=1.0)
    assert out.tolist() == reference("llama").tolist()
    assert model.generation_stats.drafted_tokens == model.generation_stats.draft_steps < full


def test_settings_kangaroo_cannot_take_are_refused():
    with pytest.raises(ValueError, match="exit_layer must be between 1 and 1"):
        fresh_model("llama", "kangaroo", exit_layer=2)
    with pytest.raises(ValueError, match="drafts a chain token by token"):
        fresh_model("llama", "kangaroo", dynamic_tree={"nodes": 4, "depth": 2})
    with pytest.raises(ValueError, match="drafts a chain token by token"):
        fresh_model("llama", "kangaroo", draft_tree=[[0], [1]])
    with pytest.raises(ValueError, match="head_projection must be 'shared'"):
        fresh_model("llama", "kangaroo", head_projection="own")
    with pytest.raises(ValueError, match="exit_confidence must be a probability"):
        fresh_model("llama", "kangaroo", exit_confidence=1.5)
    model = fresh_model("llama", "kangaroo", num_heads=3)
    with pytest.raises(ValueError, match="drafts a chain token by token"):
        model.generate(get_prompt("llama"), max_new_tokens=4, dynamic_tree={"nodes": 4, "depth": 2})
    with pytest.raises(ValueError, match="use 'base_entropy' or 'base_top1'"):
        model.config.gate_signal = "head_entropy"
        model.generate(get_prompt("llama"), max_new_tokens=4, gate_threshold=1.0)


def test_adapter_size():
    """The adapter is 4 * hidden * width + 2 * hidden parameters, all the drafter trains and saves."""
    model = fresh_model("llama", "kangaroo", adapter_heads=2, adapter_head_dim=8)
    hidden = model.config.hidden_size
    assert sum(p.numel() for p in model.heads.parameters()) == 4 * hidden * 16 + 2 * hidden
    assert all(name.startswith("adapter.") for name in model.heads.state_dict())
    assert get_base("llama") is model.base
