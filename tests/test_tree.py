"""Tree verification: exact output on every architecture, real multi-token acceptance off the top-1
path (which forces the cache to be gathered, not cropped), and tree validation errors."""

from __future__ import annotations

import pytest
import torch

from cerberus_hf import CerberusConfig
from cerberus_hf.blocks.tree import TreeSpec
from helpers import ARCHITECTURES, NEW_TOKENS, check_stats, fresh_model, get_prompt, install_oracle, reference

TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1], [0, 0, 0], [1, 0, 0]]


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("head_type", ["medusa", "cerberus"])
@pytest.mark.parametrize("gate", [None, 0.0, 3.0])
def test_tree_greedy_exact_with_random_heads(arch, head_type, gate):
    model = fresh_model(arch, head_type, randomize=True, num_heads=3)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, draft_tree=TREE, gate_threshold=gate)
    assert torch.equal(out, reference(arch))
    check_stats(model, NEW_TOKENS)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tree_accepts_second_ranked_branches(arch):
    """The oracle ranks the right token second at depth 1: only the tree's rank-1 branches can be
    accepted there, so tau > 2 proves that off-path nodes are verified and their cache rows gathered."""
    model = fresh_model(arch, "cerberus", num_heads=3)
    counters = install_oracle(model, [reference(arch)], corrupt=lambda p, k: k == 0)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, draft_tree=TREE)
    assert torch.equal(out, reference(arch))
    assert counters["hits"] > 0
    stats = model.generation_stats
    check_stats(model, NEW_TOKENS)
    if arch in ("mistral", "gemma2"):
        # Sliding-window models verify only the top-1 chain once the context passes the window.
        assert stats.tau >= 1.0
    else:
        assert stats.tau > 2.0, stats.as_dict()


def test_tree_spec_buffers():
    spec = TreeSpec.from_paths([[1], [0], [0, 0], [1, 0]])
    assert spec.paths == ((0,), (1,), (0, 0), (1, 0))
    assert spec.parents == [-1, -1, 0, 1]
    assert spec.position_offsets.tolist() == [0, 1, 1, 2, 2]
    mask = spec.ancestor_mask.int().tolist()
    assert mask[3] == [1, 1, 0, 1, 0]  # (0, 0) sees the root, (0,) and itself
    assert mask[4] == [1, 0, 1, 0, 1]  # (1, 0) sees the root, (1,) and itself
    assert not TreeSpec.from_paths([[0], [1]]).is_chain and TreeSpec.chain(3).is_chain
    assert spec.truncated(1).paths == ((0,), (1,))


@pytest.mark.parametrize("paths, message", [
    ([[0, 0]], "no parent path"),
    ([[-1]], "ranks >= 0"),
    ([], "at least one path"),
    ([[0], [0, 0], [0, 0, 0]], "only 2 heads"),
])
def test_bad_trees_are_refused(paths, message):
    with pytest.raises(ValueError, match=message):
        CerberusConfig(num_heads=2, hidden_size=8, vocab_size=16, draft_tree=paths)
