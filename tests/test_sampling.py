"""Sampling stays lossless: the joint distribution of the first two sampled tokens matches the base's.

A tiny Llama with a 12-token vocabulary makes the exact distribution cheap to compute (12 x 12 pairs)
and a few thousand draws enough for a chi-square test; every drafter family with chain, static, dynamic
and rescored trees is checked, with heads that really get drafts accepted.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.ngram import NgramModel
from cerberus_hf.drafters import DRAFTER_CLASSES
from helpers import ANY_BASE_TYPES, VARIANTS, family_options

V = 12
DRAWS = 2500
TEMPERATURE, TOP_K = 1.3, 8


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    return model


PROMPT = torch.tensor([[1, 5, 7, 3]])


def expected_pairs(base, prompt: torch.Tensor = PROMPT) -> torch.Tensor:
    """P(t1, t2) after ``prompt`` under the base with the same warpers generate() applies."""
    warp = LogitsProcessorList([TemperatureLogitsWarper(TEMPERATURE), TopKLogitsWarper(TOP_K)])
    with torch.no_grad():
        first = torch.softmax(warp(prompt, base(prompt).logits[:, -1].float()), -1)[0]
        table = torch.zeros(V, V, dtype=torch.float64)
        for t1 in range(V):
            ids = torch.cat([prompt, torch.tensor([[t1]])], dim=1)
            second = torch.softmax(warp(ids, base(ids).logits[:, -1].float()), -1)[0]
            table[t1] = first[t1].double() * second.double()
    return table


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Statistic and its 0.999 quantile, pooling cells with expected count < 5 into one."""
    e = expected.flatten() * observed.sum()
    o = observed.flatten().double()
    small = e < 5
    e = torch.cat([e[~small], e[small].sum()[None]])
    o = torch.cat([o[~small], o[small].sum()[None]])
    keep = e > 0
    stat = float((((o - e) ** 2) / e)[keep].sum())
    return stat, float(chi2.ppf(0.999, int(keep.sum()) - 1))


def draw(model, **kwargs) -> tuple[torch.Tensor, int]:
    counts = torch.zeros(V, V)
    accepted = 0
    torch.manual_seed(0)
    for _ in range(DRAWS):
        # Three new tokens, so that the second one can come from an accepted draft (the first comes from
        # the prefill, and a step's last token is always the verifier's own).
        out = model.generate(PROMPT, max_new_tokens=3, do_sample=True, temperature=TEMPERATURE, top_k=TOP_K,
                             **kwargs)
        counts[out[0, -3], out[0, -2]] += 1
        accepted += model.generation_stats.accepted_draft_tokens
    return counts, accepted


TREES = {
    "chain": dict(draft_tree=None, dynamic_tree=None),
    "tree": dict(draft_tree=[[0], [1], [2], [3]], dynamic_tree=None),
    "dynamic": dict(dynamic_tree={"nodes": 4, "depth": 1, "top_k": 4}),
    # Clover's per-node budget: how many of the 4 guesses are verified follows the drafter's confidence
    "budgeted": dict(dynamic_tree={"nodes": 4, "depth": 1, "top_k": 4, "top_p": 0.7, "min_ratio": 0.2}),
    # an n-gram model that favours other tokens than the heads: it decides which 4 of 6 guesses are verified
    "rescored": dict(rescoring={"nodes": 4, "depth": 1, "top_k": 4, "candidates": 6, "weight": 1.0}),
    # a random small LM (Kangaroo drafter) in place of the n-gram decides which 4 of 6 guesses are verified
    "rescored_lm": dict(rescoring={"nodes": 4, "depth": 1, "top_k": 4, "candidates": 6, "weight": 0.0,
                                   "lm_weight": 1.0}),
}


# Every family and variant with every tree kind; Kangaroo drafts its own chain only (through the base's first layer
# of two). Each case costs 20-50 s (2,500 draws), so `make test` runs a diagonal of the matrix, every family once and
# every tree kind once: a token is kept only where it equals the base's own sample (`blocks.acceptance`), so what a
# case adds is the tree kind's and the family's way to the verified positions, not the drafter's guesses. A variant
# (another drafter architecture of a family) drafts along its family's way, so its cases, and the rest of the
# matrix, are marked slow (`make test-slow`, which CI runs too).
_TREE_FAMILIES = [h for h in (*ANY_BASE_TYPES, *VARIANTS)
                  if not DRAFTER_CLASSES[family_options(h)["head_type"]].drafts_chains]
FAMILY_TREES = [
    pytest.param(h, tree, id=f"{h}-{tree}", marks=() if i % len(TREES) == j and h not in VARIANTS else pytest.mark.slow)
    for i, h in enumerate(_TREE_FAMILIES) for j, tree in enumerate(TREES)
] + [pytest.param(h, "chain", id=f"{h}-chain") for h in ANY_BASE_TYPES if DRAFTER_CLASSES[h].drafts_chains]


@pytest.mark.parametrize("head_type, tree", FAMILY_TREES)
def test_sampling_matches_base_distribution(base, head_type, tree):
    options = family_options(head_type)
    extra = {"exit_layer": 1} if DRAFTER_CLASSES[options["head_type"]].drafts_chains else {}
    model = CerberusForCausalLM.from_base(base, **options, num_heads=1, **extra)
    if tree == "rescored":
        model.ngram = NgramModel.build([([t, (t * 5 + 1) % V, (t * 7 + 2) % V], 1) for t in range(V)] * 3, V, order=2)
    if tree == "rescored_lm":
        rescorer = CerberusForCausalLM.from_base(base, head_type="kangaroo", num_heads=1, exit_layer=1)
        generator = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for parameter in rescorer.heads.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        model.load_rescorer(rescorer)
    counts, accepted = draw(model, **TREES[tree])
    stat, bound = chi_square(counts, expected_pairs(base))
    assert accepted > DRAWS // 20, f"drafts were accepted only {accepted} times: the test would not test much"
    assert stat < bound, f"chi-square {stat:.1f} >= {bound:.1f}: sampled pairs do not follow the base"


# `make test` runs one family (the batched step is the same for each; every family's own way is sampled above)
@pytest.mark.parametrize("head_type", ["hydra", pytest.param("eagle3", marks=pytest.mark.slow),
                                       pytest.param("dflash", marks=pytest.mark.slow)])
def test_batched_rows_each_follow_the_base(base, head_type):
    """Rows of different lengths sampled in one batch (`decoding.batched`): each row's pairs follow the base after that
    row's own prompt, with drafts accepted in the same forwards as the other row's."""
    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=1)
    other = torch.tensor([[4, 9, 2, 6, 10, 1]])
    ids = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), PROMPT], dim=1), other])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    counts = [torch.zeros(V, V), torch.zeros(V, V)]
    accepted = 0
    torch.manual_seed(0)
    for _ in range(DRAWS // 2):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=True, temperature=TEMPERATURE,
                             top_k=TOP_K, pad_token_id=0, **TREES["tree"])
        for row in range(2):
            counts[row][out[row, -3], out[row, -2]] += 1
        accepted += model.generation_stats.accepted_draft_tokens
    assert accepted > DRAWS // 20
    for row, prompt in enumerate((PROMPT, other)):
        stat, bound = chi_square(counts[row], expected_pairs(base, prompt))
        assert stat < bound, f"row {row}: chi-square {stat:.1f} >= {bound:.1f}"


@pytest.mark.slow  # the bound's power, checked once per CI run
def test_the_check_detects_a_wrong_distribution(base):
    """The same test on plain sampling at another temperature must fail: the bound is not vacuous."""
    counts = torch.zeros(V, V)
    torch.manual_seed(0)
    for _ in range(DRAWS):
        out = base.generate(PROMPT, max_new_tokens=2, do_sample=True, temperature=TEMPERATURE * 0.5, top_k=TOP_K)
        counts[out[0, -2], out[0, -1]] += 1
    stat, bound = chi_square(counts, expected_pairs(base))
    assert stat > bound


def test_typical_acceptance_is_opt_in_and_accepts_more(base):
    model = CerberusForCausalLM.from_base(base, head_type="cerberus", num_heads=1)
    torch.manual_seed(1)
    model.generate(PROMPT, max_new_tokens=20, do_sample=True, temperature=TEMPERATURE, draft_tree=[[0], [1], [2]])
    exact = model.generation_stats.accepted_draft_tokens
    torch.manual_seed(1)
    out = model.generate(PROMPT, max_new_tokens=20, do_sample=True, temperature=TEMPERATURE,
                         draft_tree=[[0], [1], [2]], typical_acceptance=True)
    assert out.shape[1] == PROMPT.shape[1] + 20
    assert model.generation_stats.accepted_draft_tokens >= exact
