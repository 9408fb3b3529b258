"""From positions and costs to choices: expected accepted lengths of static and dynamic trees, the best tree of
each size, the gate's threshold per signal, and the rank statistics reported beside them.

Every expectation is a `walk`: greedy decoding over each calibration sequence, where a step at a position emits the
drafts accepted there plus one token and the next step starts after them. A mean over every position would count the
easy runs, which decoding crosses in a few long steps, once per position, and so overstate tau (by how much:
docs/calibration.md)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from ..blocks.gate import GATE_SIGNALS
from .positions import PositionRecord

# Gate thresholds tried per signal: every split between distinct values up to this many, else as many quantiles
GATE_CANDIDATES = 512


@dataclass
class Walk:
    """Greedy decoding over the calibration sequences under ``P`` policies at once: per policy the tokens emitted,
    the steps taken, and the sum of each per-position value (``sums[name]``, e.g. seconds) over the steps taken."""

    tokens: torch.Tensor  # [P]
    steps: torch.Tensor  # [P]
    sums: dict[str, torch.Tensor]  # name -> [P]

    @property
    def tau(self) -> torch.Tensor:
        return self.tokens / self.steps.clamp(min=1)


def walk(records: list, accepted: torch.Tensor, **values: torch.Tensor | float) -> Walk:
    """Decode each calibration sequence as `generate()` would: start at its first position; a step at position ``t``
    emits ``1 + accepted[p, t]`` tokens and the next starts that many positions on, until the sequence's positions
    run out. ``records`` (in order, consecutive positions per ``record.sequence``) give the sequences; ``accepted``
    is ``[P, N]`` or ``[N]`` (one policy); each of ``values`` (``[P, N]``, ``[N]`` or a number per step) is summed
    over the steps taken. The first step of a sequence follows the prefill, which no policy changes and the walk
    leaves out."""
    accepted = torch.as_tensor(accepted, dtype=torch.long)
    accepted = accepted[None] if accepted.dim() == 1 else accepted
    policies, count = accepted.shape
    if count != len(records):
        raise ValueError(f"{count} accepted lengths for {len(records)} positions")
    sequence = torch.tensor([r.sequence for r in records], dtype=torch.long)
    first = torch.ones(count, dtype=torch.bool)
    first[1:] = sequence[1:] != sequence[:-1]
    starts = first.nonzero()[:, 0]
    ends = torch.cat([starts[1:], torch.tensor([count])])
    per_position = {name: torch.as_tensor(value, dtype=torch.float64).expand(policies, count)
                    for name, value in values.items()}
    cursor = starts[None].expand(policies, -1).clone()  # [P, S]
    tokens = torch.zeros(policies, dtype=torch.long)
    steps = torch.zeros(policies, dtype=torch.long)
    sums = {name: torch.zeros(policies, dtype=torch.float64) for name in values}
    while True:
        active = cursor < ends
        if not active.any():
            break
        index = torch.where(active, cursor, 0)
        emitted = 1 + accepted.gather(1, index)
        tokens += (emitted * active).sum(1)
        steps += active.sum(1)
        for name, value in per_position.items():
            sums[name] += (value.gather(1, index) * active).sum(1)
        cursor = torch.where(active, cursor + emitted, cursor)
    return Walk(tokens, steps, sums)


def accepted_by_size(places: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``[len(sizes), N]``: drafts accepted at each position by the tree of each size, given ``places`` ``[N, depth]``,
    where each depth's true node comes in the order trees grow (a tree of size ``n`` holds the first ``n``; negative:
    never). Accepted are the leading depths whose node is in: a depth counts only with every depth above it, so each
    place is taken as the largest place up to it."""
    if places.shape[1] == 0:
        return torch.zeros(len(sizes), places.shape[0], dtype=torch.long)
    never = torch.iinfo(torch.long).max
    reach = torch.where(places < 0, never, places).cummax(dim=1).values
    return (reach[None] < torch.tensor(sizes)[:, None, None]).sum(-1)


def rank_accuracy(records: list[PositionRecord], top_k: int) -> list[list[float]]:
    """``acc[k][r]``: share of positions where head ``k``'s rank-``r`` guess is the true token."""
    num_heads = len(records[0].ranks)
    counts = [[0] * top_k for _ in range(num_heads)]
    for record in records:
        for k, rank in enumerate(record.ranks):
            if rank >= 0:
                counts[k][rank] += 1
    return [[c / len(records) for c in row] for row in counts]


def accepted_length(ranks: list[int], tree: set[tuple[int, ...]]) -> int:
    """Drafts a tree gets accepted at a position whose true-token ranks are ``ranks``."""
    depth = 0
    while depth < len(ranks) and ranks[depth] >= 0 and tuple(ranks[: depth + 1]) in tree:
        depth += 1
    return depth


def path_frequencies(records: list[PositionRecord]) -> list[tuple[tuple[int, ...], float]]:
    """Every rank prefix seen, with the share of positions that start with it, most frequent first
    (ties: shorter, then lexicographic, so a prefix always precedes its extensions)."""
    counts: Counter = Counter()
    for record in records:
        for depth in range(1, len(record.ranks) + 1):
            prefix = tuple(record.ranks[:depth])
            if prefix[-1] < 0:
                break
            counts[prefix] += 1
    return sorted(((p, c / len(records)) for p, c in counts.items()), key=lambda pc: (-pc[1], len(pc[0]), pc[0]))


def build_tree(records: list[PositionRecord], cost: dict[int, float], draft_time: float, max_nodes: int = 63):
    """The tree maximising expected tokens per second (a `walk` per size), and the table of every size considered.
    Paths join the tree most frequent first."""
    ranked = path_frequencies(records)[:max_nodes]
    ranked = [p for p, _ in ranked if len(p) == 1 or any(q == p[:-1] for q, _ in ranked)]
    sizes = [n for n in range(1, len(ranked) + 1) if n + 1 in cost]
    if not sizes:
        raise ValueError("No head guess was ever right on the calibration data: there is no tree worth drafting.")
    index = {path: i for i, path in enumerate(ranked)}
    places = torch.tensor([[index.get(tuple(r.ranks[: d + 1]), -1) for d in range(len(r.ranks))] for r in records],
                          dtype=torch.long).reshape(len(records), -1)
    walked = walk(records, accepted_by_size(places, sizes))
    table = []
    for row, n in enumerate(sizes):
        step = cost[n + 1] + draft_time
        tau = float(walked.tau[row])
        table.append({"nodes": n, "expected_tau": tau, "step_seconds": step, "tokens_per_s": tau / step})
    best = max(table, key=lambda row: row["tokens_per_s"])
    paths = [list(p) for p in ranked[: best["nodes"]]]
    return paths, best, table


def static_accepted(records: list[PositionRecord], tree: list[list[int]]) -> list[int]:
    """Drafts a static tree would get accepted at each position."""
    tree_set = {tuple(p) for p in tree}
    return [accepted_length(r.ranks, tree_set) for r in records]


def _order(record: PositionRecord, weights: tuple[float, float] | None, budget: tuple[float, float] | None):
    if weights is not None:
        return record.rescored_order[weights]
    return record.dynamic_order if budget is None else record.budgeted[budget][0]


def _dynamic_places(records: list[PositionRecord], weights: tuple[float, float] | None,
                    budget: tuple[float, float] | None) -> torch.Tensor:
    return torch.tensor([_order(r, weights, budget) for r in records], dtype=torch.long).reshape(len(records), -1)


def dynamic_accepted(records: list[PositionRecord], nodes: int, weights: tuple[float, float] | None = None,
                     budget: tuple[float, float] | None = None) -> list[int]:
    """Drafts a dynamic tree of at most ``nodes`` nodes (rescored with ``weights``, or with the per-node
    ``budget`` (top_p, min_ratio), when given) would get accepted at each position (its nodes are the first
    ``nodes`` chosen, so one drafting per position serves every size)."""
    return accepted_by_size(_dynamic_places(records, weights, budget), [nodes])[0].tolist()


def fit_dynamic_tree(records: list[PositionRecord], cost: dict[int, float], draft_time: float, max_nodes: int,
                     weights: tuple[float, float] | None = None, budget: tuple[float, float] | None = None):
    """The dynamic tree size (rescored with ``weights``, or with the per-node ``budget``, when given)
    maximising expected tokens per second (a `walk` per size), and the table of every size considered. With a
    budget the tree at a position has at most ``nodes`` nodes, fewer where the budget drafted fewer: a step costs
    what its own size costs, and ``mean_nodes`` says how many a step verified on average."""
    sizes = [n for n in range(1, max_nodes + 1) if n + 1 in cost]
    if budget is None:
        drafted = torch.tensor(sizes, dtype=torch.long)[:, None].expand(-1, len(records))
    else:
        most = torch.tensor([r.budgeted[budget][1] for r in records], dtype=torch.long)
        drafted = torch.minimum(torch.tensor(sizes, dtype=torch.long)[:, None], most[None])
    seconds = torch.tensor([cost.get(n + 1, 0.0) for n in range(max(sizes) + 1)], dtype=torch.float64)[drafted]
    walked = walk(records, accepted_by_size(_dynamic_places(records, weights, budget), sizes),
                  seconds=seconds + draft_time, nodes=drafted.to(torch.float64))
    table = []
    for row, n in enumerate(sizes):
        steps, spent = int(walked.steps[row]), float(walked.sums["seconds"][row])
        table.append({"nodes": n, "mean_nodes": float(walked.sums["nodes"][row]) / steps,
                      "expected_tau": float(walked.tau[row]), "step_seconds": spent / steps,
                      "tokens_per_s": int(walked.tokens[row]) / spent})
    return max(table, key=lambda row: row["tokens_per_s"]), table


def fit_gate(records: list[PositionRecord], accepted: list[int], tree_step: float, plain_step: float,
             gate_costs: dict[str, float] | None = None) -> dict:
    """Per signal: the threshold maximising tokens per second (a `walk` per threshold, where a gated step decodes one
    token in ``plain_step`` plus what deciding cost it, ``gate_costs[signal]``: a head-entropy gate runs the first
    head first), that throughput, the share of steps drafting there, and the signal's rank correlation and AUC with
    the drafts accepted at each position when drafting (``accepted``)."""
    accepted = torch.tensor(accepted, dtype=torch.long)
    always = walk(records, accepted, seconds=tree_step)
    results = {}
    for name in (n for n in GATE_SIGNALS if n in records[0].signals):  # a chain drafter has no head_entropy
        signal = torch.tensor([r.signals[name] for r in records], dtype=torch.float64)
        distinct = torch.unique(signal)  # sorted
        splits = (distinct[1:] + distinct[:-1]) / 2  # drafting below each: every choice a threshold can make
        if len(splits) > GATE_CANDIDATES:
            splits = splits[torch.linspace(0, len(splits) - 1, GATE_CANDIDATES).round().long()]
        thresholds = torch.cat([torch.tensor([-math.inf], dtype=torch.float64), splits,
                                torch.tensor([math.inf], dtype=torch.float64)])
        drafts = signal[None] < thresholds[:, None]  # [thresholds, N]
        step = torch.tensor([float(plain_step) + (gate_costs or {}).get(name, 0.0), float(tree_step)],
                            dtype=torch.float64)  # gated, drafted
        walked = walk(records, accepted[None] * drafts, seconds=step[drafts.long()], drafted=drafts.to(torch.float64))
        throughput = walked.tokens / walked.sums["seconds"]
        best = int(torch.argmax(throughput))
        threshold = float(thresholds[best])
        results[name] = {
            "threshold": 0.0 if threshold == -math.inf else threshold,
            "tokens_per_s": float(throughput[best]),
            "draft_rate": float(walked.sums["drafted"][best] / walked.steps[best]),
            "spearman": _spearman(signal, accepted.to(torch.float64)),
            "auc": _auc(-signal, accepted >= 1),
        }
    return {"signals": results, "always_draft_tokens_per_s": float(always.tokens[0] / always.sums["seconds"][0]),
            "never_tokens_per_s": 1.0 / plain_step}


def _spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = float(rx.norm() * ry.norm())
    return float((rx * ry).sum()) / denominator if denominator else 0.0


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks, 0-based (ties share their mean rank)."""
    sorted_x, order = torch.sort(x)
    _, counts = torch.unique_consecutive(sorted_x, return_counts=True)
    ends = torch.cumsum(counts, 0)
    average = (ends - counts + ends - 1).to(torch.float64) / 2
    ranks = torch.empty(len(x), dtype=torch.float64)
    ranks[order] = torch.repeat_interleave(average, counts)
    return ranks


def _auc(score: torch.Tensor, positive: torch.Tensor) -> float:
    """Probability that a random positive scores above a random negative (Mann-Whitney)."""
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    ranks = _ranks(score)
    return float((ranks[positive].sum() + n_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
