"""Sampling stays lossless: sampled tokens follow the base's distribution, by two chi-square checks.

A tiny Llama with a 12-token vocabulary makes the exact distribution cheap to compute. The pair check draws the
first two tokens after a prompt 2,500 times and compares their joint with the base's (12 x 12 pairs). The sequence
check samples long sequences and transforms every token by its own conditional distribution under the base (a
randomised probability integral transform): where each token follows the base given its prefix, the values are
independent and uniform, whatever the prefixes, so every position of every sequence counts, with drafts accepted,
rejected and cut back all along, for a generate() call per 100 tokens instead of per pair. Every drafter family
with chain, static, dynamic and rescored trees is checked, with heads that really get drafts accepted.
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
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=0, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    return model


PROMPT = torch.tensor([[1, 5, 7, 3]])


WARP = LogitsProcessorList([TemperatureLogitsWarper(TEMPERATURE), TopKLogitsWarper(TOP_K)])  # as generate() does


def expected_pairs(base, prompt: torch.Tensor = PROMPT) -> torch.Tensor:
    """P(t1, t2) after ``prompt`` under the base with the same warpers generate() applies."""
    with torch.no_grad():
        first = torch.softmax(WARP(prompt, base(prompt).logits[:, -1].float()), -1)[0]
        table = torch.zeros(V, V, dtype=torch.float64)
        for t1 in range(V):
            ids = torch.cat([prompt, torch.tensor([[t1]])], dim=1)
            second = torch.softmax(WARP(ids, base(ids).logits[:, -1].float()), -1)[0]
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


def warped(base, ids: torch.Tensor) -> torch.Tensor:
    """The distributions generate() samples the tokens of ``ids`` after its first from: ``[len - 1, V]``."""
    with torch.no_grad():
        return torch.softmax(WARP(ids, base(ids).logits[0, :-1].float()), -1)


def transforms(base, sequence: torch.Tensor, prompt_length: int, generator: torch.Generator) -> torch.Tensor:
    """The randomised probability integral transform of every token of ``sequence`` (``[1, length]``) after its
    first ``prompt_length``: ``F(t) - w p(t)`` under the base's warped distribution at the token's prefix, tokens
    ordered by their probability there (so that a distribution too sharp or too flat moves values towards one end),
    ``w`` uniform. A token that follows that distribution gives a value uniform on [0, 1] given every earlier one."""
    probs = warped(base, sequence)[prompt_length - 1:].sort(dim=-1, descending=True, stable=True)
    rank = (probs.indices == sequence[0, prompt_length:, None]).int().argmax(-1, keepdim=True)
    p = probs.values.gather(-1, rank)[:, 0]
    return probs.values.cumsum(-1).gather(-1, rank)[:, 0] - torch.rand(len(p), generator=generator) * p


SEQUENCES, LONG, BINS = 30, 100, 10  # 3,000 sampled tokens a sequence check


def long_samples(model, base, ids: torch.Tensor = PROMPT, prompts: tuple[int, ...] = (PROMPT.shape[1],),
                 calls: int = SEQUENCES, **kwargs) -> tuple[torch.Tensor, int]:
    """The transforms of every token sampled by ``calls`` calls of ``model.generate(ids, max_new_tokens=LONG)`` (a
    row of ``ids`` ends with its prompt of ``prompts[row]`` tokens), and how many drafts were accepted."""
    values, accepted = [], 0
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    for _ in range(calls):
        out = model.generate(ids, max_new_tokens=LONG, **(dict(do_sample=True, temperature=TEMPERATURE, top_k=TOP_K)
                                                           | kwargs))
        for row, length in enumerate(prompts):
            values.append(transforms(base, out[row: row + 1, ids.shape[1] - length:], length, generator))
        accepted += model.generation_stats.accepted_draft_tokens if model is not base else 0
    return torch.cat(values), accepted


def uniformity(values: torch.Tensor) -> tuple[float, float]:
    """Chi-square statistic of ``values`` over BINS equal bins of [0, 1], and its 0.999 quantile."""
    expected = len(values) / BINS
    observed = torch.histc(values.double(), BINS, 0, 1)
    return float(((observed - expected) ** 2 / expected).sum()), float(chi2.ppf(0.999, BINS - 1))


def assert_follows_the_base(model, base, check: str, **kwargs) -> None:
    """``model``'s samples (``generate(**kwargs)``) follow ``base``'s by the ``check`` named: "pairs" or "sequences"."""
    if check == "pairs":
        counts, accepted = draw(model, **kwargs)
        (stat, bound), samples = chi_square(counts, expected_pairs(base)), DRAWS
    else:
        values, accepted = long_samples(model, base, **kwargs)
        (stat, bound), samples = uniformity(values), len(values)
    assert accepted > samples // 20, f"drafts were accepted only {accepted} times: the test would not test much"
    assert stat < bound, f"{check}: chi-square {stat:.1f} >= {bound:.1f}: the samples do not follow the base"


# `make test` runs the sequence check, `make test-slow` the pair check too
CHECKS = ["sequences", pytest.param("pairs", marks=pytest.mark.slow)]


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
# of two). `make test` runs the sequence check on a diagonal of the matrix, every family once and every tree kind
# once: a token is kept only where it equals the base's own sample (`blocks.acceptance`), so what a case adds is the
# tree kind's and the family's way to the verified positions, not the drafter's guesses. `make test-slow` (CI runs it
# too) runs the sequence check on every other case, variants included (another drafter architecture of a family,
# drafting along its family's way), and the pair check (25-50 s each: 2,500 calls) on the diagonal: every case is
# checked in CI by one of the two, and every family and every tree kind by both.
_TREE_FAMILIES = [h for h in (*ANY_BASE_TYPES, *VARIANTS)
                  if not DRAFTER_CLASSES[family_options(h)["head_type"]].drafts_chains]
_CASES = [(h, tree, i % len(TREES) == j and h not in VARIANTS)
          for i, h in enumerate(_TREE_FAMILIES) for j, tree in enumerate(TREES)]
_CASES += [(h, "chain", True) for h in ANY_BASE_TYPES if DRAFTER_CLASSES[h].drafts_chains]
FAMILY_TREES = [pytest.param(h, tree, check, id=f"{h}-{tree}-{check}",
                             marks=pytest.mark.slow if check == "pairs" or not diagonal else ())
                for h, tree, diagonal in _CASES for check in ("sequences", "pairs") if check == "sequences" or diagonal]


@pytest.mark.parametrize("head_type, tree, check", FAMILY_TREES)
def test_sampling_matches_base_distribution(base, head_type, tree, check):
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
    assert_follows_the_base(model, base, check, **TREES[tree])


# `make test` runs one family (the batched step is the same for each; every family's own way is sampled above)
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("head_type", ["hydra", pytest.param("eagle3", marks=pytest.mark.slow),
                                       pytest.param("dflash", marks=pytest.mark.slow)])
def test_batched_rows_each_follow_the_base(base, head_type, check):
    """Rows of different lengths sampled in one batch (`decoding.batched`): each row's tokens follow the base after
    that row's own prompt, with drafts accepted in the same forwards as the other row's."""
    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=1)
    other = torch.tensor([[4, 9, 2, 6, 10, 1]])
    ids = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), PROMPT], dim=1), other])
    options = dict(attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]), pad_token_id=0, **TREES["tree"])
    if check == "sequences":
        assert_follows_the_base(model, base, check, ids=ids, prompts=(PROMPT.shape[1], other.shape[1]),
                                calls=SEQUENCES // 2, **options)
        return
    counts = [torch.zeros(V, V), torch.zeros(V, V)]
    accepted = 0
    torch.manual_seed(0)
    for _ in range(DRAWS // 2):
        out = model.generate(ids, max_new_tokens=3, do_sample=True, temperature=TEMPERATURE, top_k=TOP_K, **options)
        for row in range(2):
            counts[row][out[row, -3], out[row, -2]] += 1
        accepted += model.generation_stats.accepted_draft_tokens
    assert accepted > DRAWS // 20
    for row, prompt in enumerate((PROMPT, other)):
        stat, bound = chi_square(counts[row], expected_pairs(base, prompt))
        assert stat < bound, f"row {row}: chi-square {stat:.1f} >= {bound:.1f}"


@pytest.mark.slow  # the bound's power, checked once per CI run
def test_the_pair_check_detects_a_wrong_distribution(base):
    """The pair check on plain sampling at another temperature must fail: the bound is not vacuous."""
    counts = torch.zeros(V, V)
    torch.manual_seed(0)
    for _ in range(DRAWS):
        out = base.generate(PROMPT, max_new_tokens=2, do_sample=True, temperature=TEMPERATURE * 0.5, top_k=TOP_K)
        counts[out[0, -2], out[0, -1]] += 1
    stat, bound = chi_square(counts, expected_pairs(base))
    assert stat > bound


@pytest.mark.slow  # the transforms and the bound's power, checked once per CI run (the base passes in every case)
@pytest.mark.parametrize("temperature, top_k", [(TEMPERATURE, TOP_K), (TEMPERATURE * 0.5, TOP_K), (TEMPERATURE, 6)])
def test_the_sequence_check_passes_the_base_and_detects_a_wrong_distribution(base, temperature, top_k):
    """The sequence check on plain sampling: it passes the base's own samples and fails them at another temperature or
    another top-k (tokens outside the 6 likeliest never drawn): the transforms and the bound are not vacuous."""
    values, _ = long_samples(base, base, temperature=temperature, top_k=top_k)
    stat, bound = uniformity(values)
    right = temperature == TEMPERATURE and top_k == TOP_K
    assert (stat < bound) == right, f"chi-square {stat:.1f}, bound {bound:.1f}"


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
