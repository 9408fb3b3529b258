"""Every drafter family on every tiny architecture, with every tree kind: greedy output is the base's.

The interface (`cerberus_hf.drafters.base.Drafter`) is checked for what decoding and training rely on:
teacher-forced states equal the states drafting computes along the same path, a family that reads its
drafted tokens really depends on them, and dynamic trees are trees of the drafter's most probable paths.
"""

from __future__ import annotations

import pytest
import torch

from cerberus_hf.configuration_cerberus import HEAD_TYPES
from cerberus_hf.decoding.drafting import (
    StepDrafts, dynamic_draft, dynamic_selection, node_budget, static_draft,
)
from cerberus_hf.blocks.rescoring import Rescoring, ngram_rescore
from cerberus_hf.blocks.tree import DynamicTree, TreeSpec
from cerberus_hf.drafters import DRAFTER_CLASSES
from cerberus_hf.drafters.base import capture_lm_head_input, capture_states
from helpers import (
    ANY_BASE_TYPES,
    ARCHITECTURES,
    NEW_TOKENS,
    VARIANTS,
    ForwardCounter,
    check_stats,
    fresh_model,
    get_base,
    get_prompt,
    install_oracle,
    reference,
    tiny_ngram,
)
from tiny_models import DEVICE

STATIC_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 6 nodes: 8 + 6 fits a window of 16
DYNAMIC = {"nodes": 6, "depth": 3, "top_k": 3}
TREE_KINDS = {
    "chain": dict(draft_tree=None, dynamic_tree=None),
    "static": dict(draft_tree=STATIC_TREE, dynamic_tree=None),
    "dynamic": dict(dynamic_tree=DYNAMIC),
    "budgeted": dict(dynamic_tree={**DYNAMIC, "top_p": 0.9, "min_ratio": 0.2}),  # Clover's per-node budget
    "rescored": dict(rescoring={**DYNAMIC, "candidates": 5, "weight": 0.5}),  # with tiny_ngram beside the heads
    # with tiny_ngram and a random Kangaroo drafter (a small LM) beside the heads
    "rescored_lm": dict(rescoring={**DYNAMIC, "candidates": 5, "weight": 0.5, "lm_weight": 1.0}),
}


# Families that guess depth by depth draft every tree kind; one that drafts its own chain (Kangaroo) drafts chains.
TREE_FAMILIES = tuple(h for h in ANY_BASE_TYPES if not DRAFTER_CLASSES[h].drafts_chains) + tuple(VARIANTS)
FAMILY_TREES = [(h, tree) for h in TREE_FAMILIES for tree in TREE_KINDS] + [
    (h, "chain") for h in ANY_BASE_TYPES if DRAFTER_CLASSES[h].drafts_chains
]


def with_tree_kind(model, tree: str, arch: str):
    """``model``, with an n-gram model (random text plus the reference continuation) for the rescored kinds,
    and a random Kangaroo drafter as the small LM for "rescored_lm"."""
    if tree.startswith("rescored"):
        model.ngram = tiny_ngram(model.config.vocab_size, sequences=[reference(arch)[0].tolist()])
    if tree == "rescored_lm":
        model.load_rescorer(fresh_model(arch, "kangaroo", randomize=True, seed=7))
    return model


def test_every_config_head_type_has_a_drafter():
    assert tuple(DRAFTER_CLASSES) == HEAD_TYPES


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_state_before_the_final_norm_is_what_the_final_norm_reads(arch):
    """``state_source="final_norm_input"`` captures the last decoder layer's output: the base's final norm
    (found here by name, independently of the library) turns it into exactly the lm_head's input."""
    base = get_base(arch)
    decoder = base.get_decoder()
    final_norm = next(getattr(decoder, name) for name in ("norm", "ln_f", "final_layernorm") if hasattr(decoder, name))
    with torch.no_grad(), capture_states(base, "final_norm_input") as captured:
        base(get_prompt(arch))
    before, after = captured["hidden"], captured["lm_head_input"]
    assert before.shape == after.shape and not torch.allclose(before, after)
    with torch.no_grad():
        torch.testing.assert_close(final_norm(before), after)
    with capture_lm_head_input(base) as default, torch.no_grad():
        base(get_prompt(arch))
    assert torch.equal(default["hidden"], after)
    with pytest.raises(ValueError, match="Unknown state source"):
        with capture_states(base, "logits"):
            pass
    with pytest.raises(ValueError, match="Kangaroo drafts from a shallow layer"):
        fresh_model(arch, "kangaroo", state_source="final_norm_input")


# heads x gate x prompt lookup: 8 settings for each architecture, family and tree kind (1,780 cases in all). `make test`
# runs 2 of the 8 for each (architecture, family, tree kind), shifted from one to the next so that every setting
# meets every architecture, family and tree kind; the other cases are marked slow (`make test-slow`; CI runs both).
SETTINGS = [(heads, gate, lookup) for heads in ("untrained", "random") for gate in ("always", "never") for lookup in (0, 3)]
GREEDY_CASES = [
    pytest.param(arch, head_type, tree, heads, gate, lookup,
                 id=f"{arch}-{head_type}-{tree}-{heads}-{gate}-{'lookup' if lookup else 'no_lookup'}",
                 marks=() if (s - a - f) % 8 in (0, 3) else pytest.mark.slow)
    for a, arch in enumerate(ARCHITECTURES) for f, (head_type, tree) in enumerate(FAMILY_TREES)
    for s, (heads, gate, lookup) in enumerate(SETTINGS)
]


@pytest.mark.parametrize("arch, head_type, tree, heads, gate, lookup", GREEDY_CASES)
def test_greedy_output_equals_base(arch, head_type, tree, heads, gate, lookup):
    model = fresh_model(arch, head_type, randomize=heads == "random", seed=5, num_heads=3,
                        gate_threshold=None if gate == "always" else 0.0)
    with_tree_kind(model, tree, arch)
    prompt = get_prompt(arch)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=lookup, **TREE_KINDS[tree])
    assert out.tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS, forwards=forwards.count)
    stats = model.generation_stats
    if gate == "never" and not lookup:
        assert stats.drafted_tokens == 0
    elif gate == "always" and not lookup:
        assert stats.drafted_tokens > 0


@pytest.mark.parametrize("head_type, tree", FAMILY_TREES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_oracle_drafts_are_accepted(arch, head_type, tree):
    """Drafts that know the continuation are accepted several per step, with every tree kind."""
    model = with_tree_kind(fresh_model(arch, head_type, num_heads=3), tree, arch)
    oracle = install_oracle(model, [reference(arch, NEW_TOKENS + 8)])
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0, **TREE_KINDS[tree])
    assert out.tolist() == reference(arch).tolist()
    assert oracle["hits"] > 0 and oracle["misses"] == 0
    check_stats(model, NEW_TOKENS)
    assert model.generation_stats.tau > 2.0


@pytest.mark.parametrize("head_type", TREE_FAMILIES)
def test_teacher_forced_states_are_the_drafted_states(head_type):
    """Training fits `forced_states`; decoding drafts depth by depth. Along a path whose tokens are the
    forced tokens, both must compute the same states and logits, or training fits the wrong thing."""
    model = fresh_model("llama", head_type, randomize=True, seed=2, num_heads=3)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    tokens = torch.tensor([[4, 9, 2]], device=DEVICE)
    forced = model.heads(hidden, tokens)[0]  # [heads, V]
    step = StepDrafts(model.heads, hidden, int(tokens[0, 0]))
    node = step.root
    for depth in range(3):
        states, logits = step.expand(depth, [node])
        torch.testing.assert_close(logits[0], forced[depth])
        if depth < 2:
            node = type(node)((*node.tokens, int(tokens[0, depth + 1])), states[0])
    if not model.heads.trains_on_sequences:  # (EAGLE-3's training path is checked in test_eagle3.py)
        torch.testing.assert_close(model.heads.forced_states(hidden, tokens)[0, 2], model.heads.readout(2, states)[0])


def test_hydra_heads_read_the_drafted_tokens_and_the_others_do_not():
    hidden = torch.randn(1, 32).to(DEVICE)
    for head_type in TREE_FAMILIES:
        model = fresh_model("llama", head_type, randomize=True, seed=4, num_heads=3)
        a = model.heads(hidden, torch.tensor([[1, 2, 3]], device=DEVICE))
        b = model.heads(hidden, torch.tensor([[1, 7, 3]], device=DEVICE))
        assert torch.equal(a[:, :1], b[:, :1])  # depth 0 reads only the verifier's token (same in both)
        assert torch.equal(a[:, 1:], b[:, 1:]) != model.heads.reads_tokens, head_type


def test_untrained_hydra_heads_are_the_identity():
    """A fresh Hydra head drafts the base's own next-token guess, like every other family's."""
    model = fresh_model("llama", "hydra", num_heads=3)
    hidden = torch.randn(2, model.config.hidden_size).to(DEVICE)
    logits = model.heads(hidden, torch.tensor([[1, 2, 3], [4, 5, 6]], device=DEVICE))
    expected = model.base.get_output_embeddings()(hidden)
    for k in range(3):
        torch.testing.assert_close(logits[:, k], expected)


@pytest.mark.parametrize("head_type", TREE_FAMILIES)
def test_dynamic_tree_is_the_most_probable_paths(head_type):
    """The chosen nodes form a tree, no more than asked; each node's score (its path's summed draft
    log-probabilities) is at least that of every expanded node left out."""
    model = fresh_model("llama", head_type, randomize=True, seed=3, num_heads=3)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    settings = DynamicTree(nodes=7, depth=3, top_k=3)
    chosen = dynamic_selection(StepDrafts(model.heads, hidden, 5), settings, max_depth=3)
    assert len(chosen) == 7
    assert all(len(p) == 1 or p[:-1] in chosen for p in chosen)

    @torch.no_grad()
    def score(path):
        tokens, total = [5], 0.0
        for depth in range(len(path)):
            logp = torch.log_softmax(model.heads(hidden, torch.tensor([tokens + [0] * (3 - len(tokens))], device=DEVICE))[0, depth], -1)
            top = logp.topk(3)
            total += float(top.values[path[depth]])
            tokens.append(int(top.indices[path[depth]]))
        return total, tokens[-1]

    chosen_scores = []
    for path, token in chosen.items():
        value, drafted = score(path)
        assert drafted == token
        chosen_scores.append(value)
    tree, tokens = dynamic_draft(StepDrafts(model.heads, hidden, 5), settings, max_depth=3)
    assert sorted(tree.paths) == sorted(chosen) and len(tokens) == 7
    assert tokens.tolist() == [chosen[p] for p in tree.paths]
    # every child of a chosen node (or of the root) that was left out scores no higher than the worst chosen
    for parent in [()] + list(chosen):
        if len(parent) == 3:
            continue
        for rank in range(3):
            child = (*parent, rank)
            if child not in chosen:
                assert score(child)[0] <= min(chosen_scores) + 1e-5
    assert dynamic_draft(StepDrafts(model.heads, hidden, 5), settings, max_depth=0) is None


@pytest.mark.parametrize("head_type", TREE_FAMILIES)
def test_a_budgeted_dynamic_tree_drafts_only_children_within_the_budget(head_type):
    """Every chosen node is, among its parent's children, within the cumulative probability top_p and at
    least min_ratio times the most probable child; the plain tree of the same size drafts more."""
    model = fresh_model("llama", head_type, randomize=True, seed=3, num_heads=3)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    budget = DynamicTree(nodes=12, depth=3, top_k=4, top_p=0.6, min_ratio=0.3)
    chosen = dynamic_selection(StepDrafts(model.heads, hidden, 5), budget, max_depth=3)
    assert 1 <= len(chosen) <= 12 and all(len(p) == 1 or p[:-1] in chosen for p in chosen)
    assert (0,) in chosen  # the most probable child of the root is always a candidate

    @torch.no_grad()
    def children_probs(parent):
        """The probabilities of the four most probable children of ``parent`` (a chosen path or the root)."""
        tokens = [5, *(chosen[parent[: d + 1]] for d in range(len(parent)))]
        logits = model.heads(hidden, torch.tensor([tokens + [0] * (3 - len(tokens))], device=DEVICE))[0, len(parent)]
        return torch.softmax(logits, -1).topk(4).values

    for path in chosen:
        probs = children_probs(path[:-1])
        rank = path[-1]
        assert float(probs[:rank].sum()) < 0.6 and float(probs[rank]) >= 0.3 * float(probs[0]) - 1e-6
    plain = dynamic_selection(StepDrafts(model.heads, hidden, 5), DynamicTree(nodes=12, depth=3, top_k=4), 3)
    assert len(plain) == 12 >= len(chosen)
    assert node_budget(torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log(), 0.75, 0.2).tolist() == [[True, True, False, False]]
    assert node_budget(torch.tensor([[0.9, 0.05]]).log(), 0.5, 0.0).tolist() == [[True, False]]


def test_static_draft_of_a_parallel_drafter_is_its_top_guesses():
    """For heads that ignore drafted tokens, node (r0, .., rd) is simply head d's rank-rd guess."""
    model = fresh_model("llama", "medusa", randomize=True, seed=1, num_heads=3)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    tree = TreeSpec.from_paths(STATIC_TREE)
    tokens = static_draft(StepDrafts(model.heads, hidden, 0), tree)
    top = model.heads(hidden, torch.zeros(1, 3, dtype=torch.long, device=DEVICE))[0].topk(2, dim=-1).indices
    assert tokens.tolist() == [int(top[len(p) - 1, p[-1]]) for p in tree.paths]


def test_dynamic_tree_settings_are_validated():
    with pytest.raises(ValueError, match="depth 5 exceeds the 3 heads"):
        fresh_model("llama", "hydra", num_heads=3, dynamic_tree={"nodes": 4, "depth": 5})
    with pytest.raises(ValueError, match="nodes must be an integer >= 1"):
        fresh_model("llama", "hydra", num_heads=3, dynamic_tree={"nodes": 0, "depth": 2})
    with pytest.raises(ValueError, match="unknown keys"):
        fresh_model("llama", "hydra", num_heads=3, dynamic_tree={"nodes": 4, "depth": 2, "width": 3})
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        fresh_model("llama", "hydra", num_heads=3, dynamic_tree={"nodes": 4, "depth": 2, "top_p": 0.0})
    with pytest.raises(ValueError, match=r"min_ratio must be in \[0, 1\]"):
        fresh_model("llama", "hydra", num_heads=3, dynamic_tree={"nodes": 4, "depth": 2, "min_ratio": 1.5})
    budgeted = fresh_model("llama", "hydra", num_heads=3, dynamic_tree={"nodes": 4, "depth": 2, "top_p": 0.9})
    assert budgeted.config.dynamic_tree == {"nodes": 4, "depth": 2, "top_k": 4, "top_p": 0.9, "min_ratio": 0.0}
    model = fresh_model("llama", "hydra", randomize=True, num_heads=3, dynamic_tree={"nodes": 4, "depth": 2})
    assert model.config.dynamic_tree == {"nodes": 4, "depth": 2, "top_k": 4}
    # the configured dynamic tree is the default: 4 nodes every drafting step (4 children of the root at
    # least); a call that names a static tree drafts that one instead (the 3-head chain: 3 nodes at most)
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    stats = model.generation_stats
    assert stats.draft_steps > 0 and stats.drafted_tokens == 4 * stats.draft_steps
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0, draft_tree=None)
    stats = model.generation_stats
    assert stats.draft_steps > 0 and stats.drafted_tokens <= 3 * stats.draft_steps


def reference_selection(step, settings, max_depth, rescore=None):
    """EAGLE-2's search written plainly, node by node on the host: each level the ``top_k`` best children (Clover's
    budget leaves some out) form the next frontier; the ``nodes`` best of everything drafted whose parent was chosen."""
    width = getattr(settings, "candidates", settings.top_k)
    budgeted = isinstance(settings, DynamicTree) and settings.budgeted
    frontier, drafted = [(0.0, (), step.root)], []  # (score, path of ranks, node); (score, path, token)
    for level in range(min(settings.depth, max_depth)):
        states, logits = step.expand(level, [node for _, _, node in frontier])
        top = torch.log_softmax(logits.float(), dim=-1).topk(min(width, logits.shape[-1]), dim=-1)
        candidates, values = step.drafter.token_ids(top.indices), top.values
        kept = node_budget(values, settings.top_p, settings.min_ratio).tolist() if budgeted else None
        if rescore is not None:
            values = values + rescore([tuple(node.tokens) for _, _, node in frontier], candidates)
        scores = (values + torch.tensor([score for score, _, _ in frontier], device=values.device)[:, None]).tolist()
        children = [(scores[r][j], (*frontier[r][1], j), int(candidates[r, j]), r)
                    for r in range(len(frontier)) for j in range(candidates.shape[1]) if kept is None or kept[r][j]]
        drafted.extend(child[:3] for child in children)
        best = sorted(children, key=lambda c: -c[0])[: settings.top_k]
        frontier = [(score, path, type(step.root)((*frontier[r][2].tokens, token), states[r]))
                    for score, path, token, r in best]
    chosen = {}
    for score, path, token in sorted(drafted, key=lambda d: (-d[0], len(d[1]))):
        if len(chosen) == settings.nodes:
            break
        if len(path) == 1 or path[:-1] in chosen:
            chosen[path] = token
    return chosen


@pytest.mark.parametrize("head_type", TREE_FAMILIES)
def test_the_search_chooses_what_a_plain_search_chooses(head_type):
    """`dynamic_selection` (what decoding and calibration run: on the device, one read a step) equals the search
    written plainly (`reference_selection`) node for node and in order: plain, with Clover's budget, and rescored by an
    n-gram, on random heads."""
    model = fresh_model("llama", head_type, randomize=True, seed=3, num_heads=4)
    ngram = tiny_ngram(model.config.vocab_size, seed=1)
    rescore = ngram_rescore(ngram, torch.tensor([3, 9, 5]), 2.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        hidden = (torch.randn(1, model.config.hidden_size, generator=generator) * 3).to(DEVICE)
        for settings, scorer in ((DynamicTree(nodes=6, depth=3, top_k=3), None),
                                 (DynamicTree(nodes=12, depth=4, top_k=4), None),
                                 (DynamicTree(nodes=10, depth=4, top_k=4, top_p=0.7, min_ratio=0.2), None),
                                 (DynamicTree(nodes=3, depth=2, top_k=1), None),
                                 (Rescoring(nodes=8, depth=3, top_k=2, candidates=5, weight=2.0), rescore)):
            with torch.no_grad():
                plain = reference_selection(StepDrafts(model.heads, hidden, 5), settings, 4, scorer)
                searched = dynamic_selection(StepDrafts(model.heads, hidden, 5), settings, 4, scorer)
            assert list(searched.items()) == list(plain.items()), settings
