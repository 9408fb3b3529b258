"""A reduced draft vocabulary: output stays exact, drafts come only from the subset, and the subset is
saved with the heads."""

from __future__ import annotations

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from helpers import NEW_TOKENS, VOCAB, check_stats, fresh_model, get_base, get_prompt, reference
from tiny_models import DEVICE


@pytest.mark.parametrize("head_projection", ["shared", "own"])
def test_draft_vocab_keeps_output_exact_and_drafts_from_the_subset(head_projection):
    model = fresh_model("llama", "cerberus", randomize=True, num_heads=3, head_projection=head_projection)
    subset = torch.arange(0, VOCAB, 2)
    model.set_draft_vocab(subset)
    assert model.config.draft_vocab_size == len(subset)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    logits = model.draft_logits(hidden, _tokens(hidden, model))
    assert logits.shape == (1, 3, len(subset))
    proposals = []
    original = model._proposer

    def spy(*args, **kwargs):
        generator = original(*args, **kwargs)
        propose = generator.propose

        def recording(*a, **k):
            draft = propose(*a, **k)
            if draft is not None:
                proposals.extend(draft.tokens.tolist())
            return draft

        generator.propose = recording
        return generator

    model._proposer = spy
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, draft_tree=[[0], [1], [0, 0]])
    assert torch.equal(out, reference("llama"))
    assert proposals and all(t % 2 == 0 for t in proposals)
    check_stats(model, NEW_TOKENS)


def _tokens(hidden, model):
    """Some tokens following each state (read only by drafters that condition on drafted tokens)."""
    return torch.randint(0, VOCAB, (hidden.shape[0], model.config.num_heads),
                         generator=torch.Generator().manual_seed(1)).to(hidden.device)


def test_subset_guesses_are_the_full_guesses_restricted_to_the_subset():
    model = fresh_model("llama", "cerberus", randomize=True, num_heads=3)
    hidden = torch.randn(5, model.config.hidden_size).to(DEVICE)
    full = model.draft_logits(hidden, _tokens(hidden, model))
    subset = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:40].to(DEVICE)
    model.set_draft_vocab(subset)
    reduced = model.draft_logits(hidden, _tokens(hidden, model))
    assert torch.allclose(reduced, full[..., subset], atol=1e-5)
    top = model.heads.token_ids(reduced.topk(3, dim=-1).indices)
    expected = subset[full[..., subset].topk(3, dim=-1).indices]
    assert torch.equal(top, expected)


def test_draft_vocab_round_trips_and_is_validated(tmp_path):
    model = fresh_model("qwen2", "medusa", num_heads=2)
    model.set_draft_vocab(torch.tensor([5, 9, 3]))
    model.save_pretrained(tmp_path)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=get_base("qwen2"))
    assert loaded.heads.draft_vocab.tolist() == [5, 9, 3] and loaded.config.draft_vocab_size == 3
    with pytest.raises(ValueError, match="token ids in"):
        model.set_draft_vocab(torch.tensor([VOCAB + 1]))


@pytest.mark.parametrize("head_projection", ["shared", "own"])
def test_reused_draft_rows_follow_changes_to_the_projection_and_the_subset(head_projection):
    model = fresh_model("llama", "medusa", randomize=True, num_heads=2, head_projection=head_projection)
    hidden = torch.randn(3, model.config.hidden_size).to(DEVICE)
    model.set_draft_vocab(torch.arange(0, VOCAB, 3))
    with torch.no_grad():
        first = model.draft_logits(hidden, _tokens(hidden, model))
        assert torch.equal(model.draft_logits(hidden, _tokens(hidden, model)), first)
        # the shared projection is the session's shared base's lm_head: doubled here, halved back after (exactly)
        projections = model.heads.lm_heads or [model.base.get_output_embeddings()]
        for projection in projections:
            projection.weight.mul_(2.0)
        try:
            assert torch.allclose(model.draft_logits(hidden, _tokens(hidden, model)), 2 * first, atol=1e-5)
            model.set_draft_vocab(None)
            full = model.draft_logits(hidden, _tokens(hidden, model))
            model.set_draft_vocab(torch.arange(1, VOCAB, 3))
            assert torch.allclose(model.draft_logits(hidden, _tokens(hidden, model)), full[..., 1::3], atol=1e-5)
        finally:
            for projection in projections:
                projection.weight.div_(2.0)
