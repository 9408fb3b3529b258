"""From positions and costs to choices: expected accepted lengths of static and dynamic trees, the best tree of
each size, the gate's threshold per signal, and the rank statistics reported beside them."""

from __future__ import annotations

import statistics
from collections import Counter

import torch

from ..decoding.gate import GATE_SIGNALS
from .positions import PositionRecord


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
    """The tree maximising expected tokens per second, and the table of every size considered."""
    ranked = path_frequencies(records)[:max_nodes]
    ranked = [(p, f) for p, f in ranked if len(p) == 1 or any(q == p[:-1] for q, _ in ranked)]
    table, expected = [], 1.0
    for n, (_, freq) in enumerate(ranked, start=1):
        if n + 1 not in cost:
            break
        expected += freq
        step = cost[n + 1] + draft_time
        table.append({"nodes": n, "expected_tau": expected, "step_seconds": step, "tokens_per_s": expected / step})
    if not table:
        raise ValueError("No head guess was ever right on the calibration data: there is no tree worth drafting.")
    best = max(table, key=lambda row: row["tokens_per_s"])
    paths = [list(p) for p, _ in ranked[: best["nodes"]]]
    return paths, best, table


def static_accepted(records: list[PositionRecord], tree: list[list[int]]) -> list[int]:
    """Drafts a static tree would get accepted at each position."""
    tree_set = {tuple(p) for p in tree}
    return [accepted_length(r.ranks, tree_set) for r in records]


def _order(record: PositionRecord, weights: tuple[float, float] | None, budget: tuple[float, float] | None):
    if weights is not None:
        return record.rescored_order[weights]
    return record.dynamic_order if budget is None else record.budgeted[budget][0]


def dynamic_accepted(records: list[PositionRecord], nodes: int, weights: tuple[float, float] | None = None,
                     budget: tuple[float, float] | None = None) -> list[int]:
    """Drafts a dynamic tree of at most ``nodes`` nodes (rescored with ``weights``, or with the per-node
    ``budget`` (top_p, min_ratio), when given) would get accepted at each position (its nodes are the first
    ``nodes`` chosen, so one drafting per position serves every size)."""
    accepted = []
    for record in records:
        count = 0
        for place in _order(record, weights, budget):
            if place < 0 or place >= nodes:
                break
            count += 1
        accepted.append(count)
    return accepted


def fit_dynamic_tree(records: list[PositionRecord], cost: dict[int, float], draft_time: float, max_nodes: int,
                     weights: tuple[float, float] | None = None, budget: tuple[float, float] | None = None):
    """The dynamic tree size (rescored with ``weights``, or with the per-node ``budget``, when given)
    maximising expected tokens per second, and the table of every size considered. With a budget the tree
    at a position has at most ``nodes`` nodes, fewer where the budget drafted fewer: its step time is the
    mean over positions, and ``mean_nodes`` says how many were verified on average."""
    table = []
    for n in range(1, max_nodes + 1):
        if n + 1 not in cost:
            break
        expected = 1.0 + sum(dynamic_accepted(records, n, weights, budget)) / len(records)
        sizes = [n] if budget is None else [min(n, r.budgeted[budget][1]) for r in records]
        step = statistics.fmean(cost[size + 1] for size in sizes) + draft_time
        table.append({"nodes": n, "mean_nodes": statistics.fmean(sizes), "expected_tau": expected,
                      "step_seconds": step, "tokens_per_s": expected / step})
    return max(table, key=lambda row: row["tokens_per_s"]), table


def fit_gate(records: list[PositionRecord], accepted: list[int], tree_step: float, plain_step: float) -> dict:
    """Per signal: the threshold maximising tokens per second, that throughput, rank correlation and AUC,
    given the drafts accepted at each position when drafting (``accepted``)."""
    accepted = torch.tensor(accepted, dtype=torch.float64)
    always = (accepted.sum() + len(records)) / (len(records) * tree_step)
    results = {}
    for name in (n for n in GATE_SIGNALS if n in records[0].signals):  # a chain drafter has no head_entropy
        signal = torch.tensor([r.signals[name] for r in records], dtype=torch.float64)
        order = torch.argsort(signal)
        sorted_signal = signal[order]
        # Drafting the n lowest-signal positions, n = 0..N (a threshold can only split between distinct values).
        gain = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(accepted[order], 0)])
        n = torch.arange(0, len(records) + 1, dtype=torch.float64)
        throughput = (len(records) + gain) / (n * tree_step + (len(records) - n) * plain_step)
        splittable = torch.ones(len(records) + 1, dtype=torch.bool)
        splittable[1:-1] = sorted_signal[1:] > sorted_signal[:-1]
        throughput[~splittable] = -1.0
        best = int(torch.argmax(throughput))
        if best == 0:
            threshold = 0.0
        elif best == len(records):
            threshold = float("inf")
        else:
            threshold = float((sorted_signal[best - 1] + sorted_signal[best]) / 2)
        results[name] = {
            "threshold": threshold,
            "tokens_per_s": float(throughput[best]),
            "draft_rate": float(n[best] / len(records)),
            "spearman": _spearman(signal, accepted),
            "auc": _auc(-signal, accepted >= 1),
        }
    return {"signals": results, "always_draft_tokens_per_s": float(always), "never_tokens_per_s": 1.0 / plain_step}


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
