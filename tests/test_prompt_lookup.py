"""Prompt lookup grafted into the heads' drafts: the n-gram search, the graft, and exact output (greedy and
sampled) on every architecture, with the copies really verified and accepted."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from cerberus_hf.decoding.proposer import Draft, with_copied
from cerberus_hf.blocks.lookup import context_continuation
from cerberus_hf.blocks.tree import CONTEXT_RANK, TreeSpec, graft_chain
from helpers import ARCHITECTURES, NEW_TOKENS, PROMPT_LEN, ForwardCounter, check_stats, fresh_model, get_base, \
    get_prompt, reference

TREE = [[0], [1], [0, 0], [1, 0]]
CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------------ the search
def test_continuation_follows_the_latest_occurrence_of_the_longest_suffix():
    seq = torch.tensor([5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6])
    assert context_continuation(seq, 3) == [1, 2, 5]  # [5, 6] last seen at 5..6
    assert context_continuation(seq, 3, max_ngram=1) == [1, 2, 5]  # [6] last seen at 6
    assert context_continuation(seq, 1) == [1]
    # a longer suffix that occurred wins over a later occurrence of a shorter one
    seq = torch.tensor([1, 2, 3, 4, 9, 3, 7, 2, 3])
    assert context_continuation(seq, 2, max_ngram=2) == [4, 9]
    assert context_continuation(seq, 2, max_ngram=1) == [7, 2]
    # the continuation stops at the end of the sequence
    assert context_continuation(torch.tensor([4, 4]), 5) == [4]


@pytest.mark.parametrize("seq", [[1, 2, 3], [7], []])
def test_no_earlier_occurrence_copies_nothing(seq):
    assert context_continuation(torch.tensor(seq, dtype=torch.long), 4) == []


def test_nothing_is_copied_when_asked_for_nothing():
    seq = torch.tensor([1, 2, 1, 2])
    assert context_continuation(seq, 0) == [] and context_continuation(seq, 3, max_ngram=0) == []


# ------------------------------------------------------------------------------------------------ the graft
def test_copies_share_the_prefix_the_tree_holds_and_hang_the_rest_below():
    tree = TreeSpec.from_paths(TREE)  # nodes (0,), (1,), (0, 0), (1, 0)
    draft = Draft(tree, torch.tensor([10, 11, 12, 13]))
    merged = with_copied(draft, [11, 13, 20, 21], CPU)  # shares (1,) and (1, 0)
    assert merged.tree.paths[:4] == tree.paths
    assert merged.tree.paths[4:] == ((1, 0, CONTEXT_RANK), (1, 0, CONTEXT_RANK, CONTEXT_RANK))
    assert merged.tokens.tolist() == [10, 11, 12, 13, 20, 21]
    assert merged.tree.parents[4:] == [3, 4]
    assert merged.tree.position_offsets.tolist() == [0, 1, 1, 2, 2, 3, 4]
    # a copy the tree holds entirely changes nothing; one with no shared prefix hangs from the root
    assert with_copied(draft, [10, 12], CPU) is draft
    fresh = with_copied(draft, [30, 31], CPU)
    assert fresh.tree.parents[4:] == [-1, 4] and fresh.tokens.tolist()[4:] == [30, 31]
    # without head drafts the copy is a plain chain (no tree mask needed)
    alone = with_copied(None, [7, 8, 9], CPU)
    assert alone.tree.is_chain and alone.tokens.tolist() == [7, 8, 9] and alone.top_chain().tokens.tolist() == [7, 8, 9]
    assert not merged.tree.is_chain and merged.top_chain().tokens.tolist() == [10, 12]


def test_grafted_nodes_see_their_ancestors_only():
    grafted = graft_chain(TreeSpec.from_paths(TREE), (0,), 2)
    mask = grafted.ancestor_mask
    # node 4 = (0, -1): root, node 0, itself; node 5 = (0, -1, -1): also node 4
    assert mask[5].nonzero().flatten().tolist() == [0, 1, 5]
    assert mask[6].nonzero().flatten().tolist() == [0, 1, 5, 6]
    with pytest.raises(ValueError, match="no such node"):
        graft_chain(TreeSpec.from_paths(TREE), (2,), 1)
    with pytest.raises(ValueError, match="at least one"):
        graft_chain(None, (), 0)


# ------------------------------------------------------------------------------------------------ exactness
def repeating_prompt(arch: str) -> torch.Tensor:
    """The reference (prompt + greedy continuation) followed by the prompt again: the base tends to
    continue as it did the first time, so copies get accepted."""
    ref = reference(arch)
    return torch.cat([ref, ref[:, :PROMPT_LEN]], dim=1)


@pytest.mark.parametrize("gate", [None, 0.0])
@pytest.mark.parametrize("tree", [None, TREE])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_with_prompt_lookup_equals_base(arch, tree, gate):
    prompt = repeating_prompt(arch)
    expected = get_base(arch).generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    model = fresh_model(arch, "cerberus", randomize=True, num_heads=3, draft_tree=tree, gate_threshold=gate)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=5)
    assert out.tolist() == expected.tolist()
    check_stats(model, expected.shape[1] - prompt.shape[1], forwards=forwards.count)
    stats = model.generation_stats
    assert stats.context_steps > 0
    if gate == 0.0:  # the heads never draft: every accepted token was copied
        assert stats.draft_steps == 0 and stats.drafted_tokens > 0


def simulated_steps(sequence: list[int], prompt_len: int, num_tokens: int) -> list[int]:
    """Tokens each step should emit when only copies are drafted: the copied tokens that match the
    base's own continuation, plus one (replayed from the final output, independently of the loop). The
    prefill step drafts nothing."""
    steps, length = [1], prompt_len + 1
    while length < len(sequence):
        room = len(sequence) - length - 1
        copied = context_continuation(torch.tensor(sequence[:length]), min(num_tokens, room)) if room > 0 else []
        matched = 0
        while matched < len(copied) and copied[matched] == sequence[length + matched]:
            matched += 1
        steps.append(matched + 1)
        length += matched + 1
    return steps


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_copies_are_accepted_exactly_where_they_are_right(arch):
    """Heads off, so every accepted token is a copy: the steps must emit what replaying the search on
    the base's own output says, so copies that match are verified and accepted, the others not."""
    prompt = repeating_prompt(arch)
    expected = get_base(arch).generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    model = fresh_model(arch, "cerberus", gate_threshold=0.0)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=5, eos_token_id=None)
    assert out.tolist() == expected.tolist()
    steps = simulated_steps(expected[0].tolist(), prompt.shape[1], 5)
    assert model.generation_stats.tokens_per_step == steps
    assert max(steps) > 1  # on every tiny base some copies are right, so acceptance is exercised


def test_lookup_setting_comes_from_the_call_the_generation_config_or_the_heads_config():
    arch = "llama"
    prompt = repeating_prompt(arch)
    expected = get_base(arch).generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    model = fresh_model(arch, "cerberus", gate_threshold=0.0)
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == expected.tolist()
    assert model.generation_stats.context_steps == 0  # off by default
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, prompt_lookup_num_tokens=4,
                              max_matching_ngram_size=3)
    assert model.generate(prompt, generation_config=config).tolist() == expected.tolist()
    assert model.generation_stats.context_steps > 0
    assert config.prompt_lookup_num_tokens == 4  # the caller's config is not modified
    model.generation_config.prompt_lookup_num_tokens = 4  # the model's own generation defaults
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == expected.tolist()
    assert model.generation_stats.context_steps > 0
    model.generation_config.prompt_lookup_num_tokens = None
    model.config.prompt_lookup_num_tokens = 4  # the heads' config
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == expected.tolist()
    assert model.generation_stats.context_steps > 0
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0).tolist() == expected.tolist()
    assert model.generation_stats.context_steps == 0  # 0 switches it off per call


def test_lookup_length_and_ngram_size_fall_back_to_the_config_each_on_its_own(monkeypatch):
    from cerberus_hf.decoding import proposer

    seen = []

    def spy(sequence, num_tokens, max_ngram):
        seen.append((num_tokens, max_ngram))
        return []

    monkeypatch.setattr(proposer, "context_continuation", spy)
    model = fresh_model("llama", "cerberus", gate_threshold=0.0, prompt_lookup_num_tokens=4, max_matching_ngram_size=3)
    prompt = get_prompt("llama")
    for call, expected in (({}, (4, 3)), ({"prompt_lookup_num_tokens": 2}, (2, 3)),
                           ({"max_matching_ngram_size": 1}, (4, 1))):
        seen.clear()
        model.generate(prompt, max_new_tokens=12, **call)
        # the length is capped by the room left before max_length, so look at the first step
        assert seen[0] == expected and {ngram for _, ngram in seen} == {expected[1]}, call


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_sampling_with_prompt_lookup_draws_what_the_base_draws(arch):
    """Copies only decide how far a step may go; each token is still one draw from the base's
    distribution, so a seed gives the base's own samples."""
    prompt = repeating_prompt(arch)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=True, temperature=0.7, top_p=0.95, eos_token_id=None)
    torch.manual_seed(99)
    expected = get_base(arch).generate(prompt, **kwargs)
    model = fresh_model(arch, "cerberus", randomize=True, num_heads=3, draft_tree=TREE)
    torch.manual_seed(99)
    assert model.generate(prompt, prompt_lookup_num_tokens=5, **kwargs).tolist() == expected.tolist()
    assert model.generation_stats.context_steps > 0


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_bad_lookup_settings_in_the_config_are_refused(value):
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        fresh_model("llama", "cerberus", prompt_lookup_num_tokens=value)
