"""Greedy output of CerberusForCausalLM.generate() is the base's, token for token, whatever the heads draft."""

from __future__ import annotations

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from helpers import (
    ARCHITECTURES,
    NEW_TOKENS,
    PROMPT_LEN,
    ForwardCounter,
    check_stats,
    fresh_model,
    gate_entropies,
    get_base,
    get_prompt,
    reference,
    install_oracle,
)
from tiny_models import tiny_model

HEAD_TYPES = ("medusa", "cerberus")


def between_threshold(arch: str) -> float:
    """A gate threshold with about a third of the entropies seen along the reference below it (so that
    an inverted gate would be caught), halfway between two neighbouring values so that no decision
    sits on the boundary."""
    ent = gate_entropies(arch, reference(arch), PROMPT_LEN).sort().values
    k = ent.shape[0] // 3
    while k < ent.shape[0] - 1 and ent[k + 1] - ent[k] < 1e-3:
        k += 1
    assert ent[k + 1] - ent[k] >= 1e-3, "entropies too close to split"
    return float(ent[k] + ent[k + 1]) / 2


def expected_draft_steps(arch: str, threshold: float, tokens_per_step: list[int], max_new_tokens: int) -> int:
    """Draft decisions the gate should make, computed independently from the base's entropies: after
    each step (except the last) it drafts iff the entropy of the distribution that produced the last
    emitted token is below the threshold and a draft still fits before max_length."""
    ent = gate_entropies(arch, reference(arch), PROMPT_LEN)
    count, emitted = 0, 0
    for emitted_now in tokens_per_step[:-1]:
        emitted += emitted_now
        room = max_new_tokens - emitted - 1
        if room > 0 and float(ent[emitted - 1]) < threshold:
            count += 1
    return count


@pytest.mark.parametrize("heads", ["untrained", "random"])
@pytest.mark.parametrize("gate", ["always", "never", "between"])
@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_equals_base(arch, head_type, gate, heads):
    threshold = {"always": None, "never": 0.0, "between": between_threshold(arch) if gate == "between" else None}[gate]
    model = fresh_model(arch, head_type, randomize=heads == "random", seed=7, gate_threshold=threshold)
    prompt = get_prompt(arch)  # (before counting: the first call per arch runs the base to pick the prompt)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS)
    expected = reference(arch)
    assert out.tolist() == expected.tolist()

    check_stats(model, NEW_TOKENS, forwards=forwards.count)
    stats = model.generation_stats
    if gate == "always":
        # Only a step with no room left before max_length may skip drafting.
        assert stats.draft_steps >= stats.gate_decisions - 1 > 0
        assert stats.drafted_tokens > 0
    elif gate == "never":
        assert stats.draft_rate == 0.0
        assert stats.draft_steps == stats.drafted_tokens == stats.accepted_draft_tokens == 0
        assert stats.tau == 1.0
        assert stats.steps == NEW_TOKENS
    else:
        assert 0.0 < stats.draft_rate < 1.0
        assert stats.draft_steps == expected_draft_steps(arch, threshold, stats.tokens_per_step, NEW_TOKENS)


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_random_heads_really_draft_random_tokens(head_type):
    """The randomised heads of the exactness test propose tokens the base rejects: their drafts differ
    from the base's continuation, so the rejection path is what makes the output exact."""
    arch = "llama"
    model = fresh_model(arch, head_type, randomize=True, seed=7)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    stats = model.generation_stats
    assert stats.drafted_tokens >= 3 * (stats.steps - 1)
    assert stats.accepted_draft_tokens < stats.drafted_tokens / 2


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_own_projection_and_deeper_heads_are_exact(arch, head_type):
    model = fresh_model(arch, head_type, randomize=True, seed=3, head_projection="own", num_layers=2, num_heads=3)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_per_call_gate_overrides_config(arch):
    prompt, expected = get_prompt(arch), reference(arch).tolist()
    never = fresh_model(arch, gate_threshold=0.0)
    assert never.generate(prompt, max_new_tokens=NEW_TOKENS, gate_threshold=None).tolist() == expected
    assert never.generation_stats.draft_rate > 0
    assert never.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == expected  # config again
    assert never.generation_stats.draft_rate == 0.0

    always = fresh_model(arch, gate_threshold=None)
    for off in (0.0, float("-inf"), -1.0):
        assert always.generate(prompt, max_new_tokens=NEW_TOKENS, gate_threshold=off).tolist() == expected
        assert always.generation_stats.draft_rate == 0.0
        assert always.generation_stats.tau == 1.0
    assert always.generate(prompt, max_new_tokens=NEW_TOKENS, gate_threshold=float("inf")).tolist() == expected
    assert always.generation_stats.draft_rate > 0


# ---------------------------------------------------------------------------------------------- oracle
def longer_reference(arch: str, extra: int = 8) -> torch.Tensor:
    return reference(arch, NEW_TOKENS + extra)


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_oracle_drafts_are_accepted_several_per_step(arch, head_type):
    """Drafts taken from the known continuation are all accepted: several tokens per forward pass, and
    still exactly the base's output."""
    model = fresh_model(arch, head_type, num_heads=4)
    oracle = install_oracle(model, [longer_reference(arch)])
    prompt = get_prompt(arch)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    assert oracle["hits"] > 0 and oracle["misses"] == 0

    check_stats(model, NEW_TOKENS, forwards=forwards.count)
    stats = model.generation_stats
    assert stats.tau > 1.5
    assert stats.accepted_draft_tokens == stats.drafted_tokens > 0
    assert max(stats.tokens_per_step) == 5  # 4 accepted drafts + the base's own token
    assert stats.head_acceptance == [1.0] * 4
    assert forwards.count < NEW_TOKENS / 2


CORRUPTIONS = {
    "first_draft_always": lambda p, k: k == 0,
    "third_draft_always": lambda p, k: k == 2,
    "odd_positions_second_draft": lambda p, k: p % 2 == 1 and k == 1,
    "every_third_position_after_first": lambda p, k: p % 3 == 0 and k >= 1,
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_corrupted_oracle_drafts_still_give_exact_output(arch, corruption):
    """Drafts that are right up to some depth and wrong after it: the right prefix is accepted, the
    rest is thrown away (cache rolled back), and the output is still exactly the base's."""
    model = fresh_model(arch, "cerberus", num_heads=4)
    oracle = install_oracle(model, [longer_reference(arch)], corrupt=CORRUPTIONS[corruption])
    prompt = get_prompt(arch)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    assert oracle["misses"] == 0
    check_stats(model, NEW_TOKENS, forwards=forwards.count)
    stats = model.generation_stats
    assert stats.accepted_draft_tokens < stats.drafted_tokens
    if corruption == "first_draft_always":
        assert stats.accepted_draft_tokens == 0
        assert stats.tau == 1.0
    else:
        assert stats.tau > 1.5
    if corruption == "third_draft_always":
        assert max(stats.tokens_per_step) == 3  # two accepted drafts + the base's token
        assert stats.head_acceptance[:2] == [1.0, 1.0]
        assert stats.head_acceptance[2] == 0.0


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_oracle_with_gate_between_is_exact(arch):
    """Accepted multi-token steps mixed with gated single-token steps (sliding-window caches included)."""
    threshold = between_threshold(arch)
    model = fresh_model(arch, "medusa", gate_threshold=threshold)
    install_oracle(model, [longer_reference(arch)])
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS)
    stats = model.generation_stats
    assert 0 < stats.draft_rate < 1
    assert stats.accepted_draft_tokens == stats.drafted_tokens > 0


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_long_generation_past_the_sliding_window_is_exact(arch):
    """Rolling the cache back must also work once sliding-window layers are full (window 16)."""
    base = get_base(arch)
    prompt = get_prompt(arch)
    expected = base.generate(prompt, max_new_tokens=60, do_sample=False)
    longer = base.generate(prompt, max_new_tokens=70, do_sample=False)
    model = fresh_model(arch, "cerberus")
    install_oracle(model, [longer], corrupt=CORRUPTIONS["odd_positions_second_draft"])
    assert model.generate(prompt, max_new_tokens=60).tolist() == expected.tolist()
    assert model.generation_stats.tau > 1.5
    plain = fresh_model(arch, "medusa", randomize=True)
    assert plain.generate(prompt, max_new_tokens=60).tolist() == expected.tolist()


# ---------------------------------------------------------------------------------------------- draft trees
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [1, 0, 0]]  # 7 nodes: 8 + 7 fits a window of 16
SLIDING_WINDOW_ARCHS = ("mistral", "gemma2")


@pytest.mark.parametrize("heads", ["untrained", "random"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tree_drafting_is_exact(arch, heads):
    model = fresh_model(arch, "cerberus", randomize=heads == "random", num_heads=3, draft_tree=TREE)
    prompt = get_prompt(arch)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS, forwards=forwards.count)


@pytest.mark.parametrize("swap_first", [False, True])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tree_accepts_oracle_branches(arch, swap_first):
    """With the right token ranked second by the first head, only the tree's rank-1 branch can be
    accepted: verification must pick that branch and keep the matching cache entries."""
    model = fresh_model(arch, "cerberus", num_heads=3, draft_tree=TREE)
    corrupt = (lambda p, k: k == 0) if swap_first else None
    oracle = install_oracle(model, [longer_reference(arch)], corrupt=corrupt)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()
    assert oracle["misses"] == 0
    check_stats(model, NEW_TOKENS)
    if swap_first and arch in SLIDING_WINDOW_ARCHS:
        # Trees are verified only while the context fits the sliding window (16); later steps verify
        # the top-1 chain, which is wrong at its first token here. The early tree steps must accept.
        assert model.generation_stats.accepted_draft_tokens > 0
    else:
        assert model.generation_stats.tau > 1.5
    # per call the tree can be switched off again
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, draft_tree=None)
    assert out.tolist() == reference(arch).tolist()
    if swap_first:
        assert model.generation_stats.accepted_draft_tokens == 0


# ---------------------------------------------------------------------------------------------- the model itself
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_forward_is_the_base_forward(arch):
    model = fresh_model(arch, randomize=True)
    ids = reference(arch)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, get_base(arch)(ids).logits)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_wrapping_leaves_base_weights_alone(arch):
    untouched = tiny_model(arch).state_dict()
    wrapped = CerberusForCausalLM.from_base(tiny_model(arch), head_type="medusa", head_projection="own").base
    after = wrapped.state_dict()
    assert after.keys() == untouched.keys()
    for name, tensor in untouched.items():
        assert torch.equal(after[name], tensor), name
