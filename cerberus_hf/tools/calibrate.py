"""`cerberus-hf calibrate`: fit the draft tree and the gate to the heads and to the device they run on.

Three measurements, then two choices:

1. The verification cost curve: wall time of one cached forward with ``n`` query tokens, ``n = 1..64``,
   relative to ``n = 1`` (on a CPU it is far from flat; on a GPU nearly flat for dozens of tokens).
2. For calibration sequences (the base's own continuations), the rank of the true token ``t + k + 2``
   among head ``k``'s guesses at every position ``t``, and the candidate gate signals there.
3. The time the heads take to draft one step.

The dynamic tree is also tried with Clover's per-node budgets (``DYNAMIC_BUDGETS``: a node's children
within a cumulative draft probability, and not far below its most probable child), which make the tree's
size vary from step to step: each is drafted for real at every position and its expected tokens per
second is total tokens over total time, ``sum(1 + accepted) / sum(cost(size + 1) + draft time)``.

With an n-gram model (`cerberus-hf ngram`) or a small LM (`--rescorer`, a Kangaroo checkpoint) beside
the heads, a third tree kind is fitted: the dynamic tree over a wider lattice of the heads' guesses,
rescored by them (`decoding.rescoring`), drafted for real at every position for each pair of candidate
weights (the LM reads each held-out sequence once, and at each position sees only what decoding would);
the weights and size with the best expected tokens per second are kept, with the drafting time of each
combination of rescorers, and how often the heads' top-1 block repeats a token, before and after
rescoring, is reported.

The tree: a node ``(r0, ..., rd)`` is accepted at a position exactly when the true tokens' ranks there
start with that path, so the mean accepted length of a tree is the sum of its paths' empirical
frequencies. Adding paths in order of frequency gives the best tree of each size (prefixes are at
least as frequent as their extensions); the size kept maximises expected tokens per second,
``(1 + accepted) / (cost(n + 1) + draft time)``.

The gate: drafting at a position yields ``1 + accepted`` tokens for the tree's step time, not drafting
yields 1 token for a plain step. For each signal, the threshold maximising total tokens over total time
on the calibration positions is chosen; the signal kept is the one with the best such throughput. Rank
correlation and AUC (for "at least one draft accepted") are reported per signal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ..configuration_cerberus import CerberusConfig
from ..decoding.drafting import StepDrafts, dynamic_selection, static_draft
from ..decoding.gate import GATE_SIGNALS, gate_signal
from ..decoding.hardware import HardwareKey, bf16_matmul, describe_device
from ..decoding.rescoring import Rescoring, lattice_rescore, repeats_a_token
from ..decoding.strict import check_strict_support, row_invariant_rows, strict_view
from ..decoding.tree import DynamicTree, TreeSpec, tree_attention_ok
from ..errors import UserError
from ..training.data import Record, frequent_tokens, read_records
from ..training.hidden_cache import split_record_ids
from . import arguments
from ..decoding.profiling import synchronize
from ..compat import cache_argument


@dataclass
class PositionRecord:
    """What calibration keeps of one position: true-token ranks per head (-1 beyond ``top_k``), gate signals,
    where the true path's nodes come in a dynamic tree's order of choice (-1: not drafted), the same per pair
    of rescoring weights (n-gram, LM) and, with how many nodes it drafted, per per-node budget (top_p,
    min_ratio), and whether the top-1 block repeats a token (the heads' own; per pair, rescored)."""

    ranks: list[int]
    signals: dict[str, float]
    dynamic_order: list[int] | None = None
    budgeted: dict[tuple[float, float], tuple[list[int], int]] = field(default_factory=dict)
    rescored_order: dict[tuple[float, float], list[int]] = field(default_factory=dict)
    top_block_repeats: bool = False
    rescored_block_repeats: dict[tuple[float, float], bool] = field(default_factory=dict)


@torch.no_grad()
def measure_cost_curve(base, max_tokens: int = 64, context: int = 300, repeats: int = 5,
                       strict: bool = False) -> dict[int, float]:
    """Median seconds of one cached forward with ``n`` new tokens for ``n = 1..max_tokens`` after a
    ``context``-token prefix. Sizes are interleaved across repeats so drifting load hits all alike.
    ``strict``: the forwards verify as strict verification does (`decoding.strict`), one attention call per
    position."""
    device = base.device
    vocab = base.get_output_embeddings().weight.shape[0]
    limit = getattr(base.config.get_text_config(), "max_position_embeddings", None)
    if limit:
        context = max(1, min(context, limit - max_tokens - 1))
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=generator).to(device)
    cache = DynamicCache(config=base.config)
    base(input_ids=prefix, **cache_argument(cache), use_cache=True)
    verifier = strict_view(base) if strict else base
    times: dict[int, list[float]] = {n: [] for n in range(1, max_tokens + 1)}
    for _ in tqdm(range(repeats), desc="cost curve", unit="pass"):
        for n in times:
            tokens = torch.randint(0, vocab, (1, n), generator=generator).to(device)
            positions = torch.arange(context, context + n, device=device)[None]
            synchronize(device)
            start = time.perf_counter()
            verifier(input_ids=tokens, **cache_argument(cache), position_ids=positions, use_cache=True)
            synchronize(device)
            times[n].append(time.perf_counter() - start)
            cache.crop(-n)
    return {n: statistics.median(values) for n, values in times.items()}


@torch.no_grad()
def measure_draft_time(model, repeats: int = 20, dynamic: DynamicTree | Rescoring | None = None,
                       context: int = 300) -> float:
    """Median seconds for the drafter to draft one step: the chain through every head, or a dynamic tree
    (a drafter that reads its drafted tokens pays one call per depth), rescored by whichever of
    ``model.ngram`` and ``model.rescorer`` ``dynamic`` weighs when it is a `Rescoring` (the LM after a
    ``context``-token prefix, closing its scorer each time as decoding does)."""
    # a drafter reading a window pays every step for the newest state's row and for reading the window
    window = max(model.heads.context_window, 1)
    states = torch.zeros(1, window, model.config.hidden_size, device=model.device, dtype=model.dtype)
    tokens = torch.zeros(1, window, dtype=torch.long, device=model.device)
    rows = model.heads.window_rows(states, tokens)
    valid = torch.ones(1, window, dtype=torch.bool, device=model.device)
    chain = TreeSpec.chain(model.config.num_heads)
    history = torch.arange(context, device=model.device) % model.config.vocab_size
    index_of = model.rescorer.draft_index() if model.rescorer is not None else None
    values = []
    with ExitStack() as stack:
        lm_state = None
        if isinstance(dynamic, Rescoring) and dynamic.lm_weight > 0:
            lm_state = stack.enter_context(rescorer_state(model, history[None]))
        for _ in range(repeats):
            synchronize(model.device)
            start = time.perf_counter()
            newest = model.heads.window_rows(states[:, -1:], tokens[:, -1:])
            step = StepDrafts(model.heads, model.heads.read_window(torch.cat([rows[:, :-1], newest], dim=1), valid), 0)
            if dynamic is None:
                static_draft(step, chain)
            else:
                scorer = model.rescorer.path_scorer(lm_state, history[None]) if lm_state is not None else None
                rescore = (lattice_rescore(dynamic, history, model.ngram, scorer, index_of)
                           if isinstance(dynamic, Rescoring) else None)
                dynamic_selection(step, dynamic, model.config.num_heads, rescore)
                if scorer is not None:
                    scorer.close()
            synchronize(model.device)
            values.append(time.perf_counter() - start)
    return statistics.median(values)


@contextmanager
def rescorer_state(model, ids: torch.LongTensor) -> Iterator:
    """The neural rescorer's state after the base read ``ids`` ``[1, n]`` with a cache (every position but the
    last cached), valid while inside: its scorers at any position read the states this captures."""
    base = model.base
    cache = DynamicCache(config=base.config)
    with torch.no_grad(), model.rescorer.capture(base) as captured:
        base(input_ids=ids[:, :-1], **cache_argument(cache), use_cache=True)
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()  # sliding-window layers must be able to drop the scored nodes again
        state = model.rescorer.start(base, cache)
        state.observe(captured, None)
        yield state


@torch.no_grad()
def collect_positions(model, sequences: list[tuple[list[int], int]], top_k: int = 10,
                      dynamic: DynamicTree | None = None, rescorings: list[Rescoring] = (),
                      budgets: list[DynamicTree] = ()) -> list[PositionRecord]:
    """Ranks of the true future tokens among the heads' guesses, and gate signals, at every position of
    every ``(tokens, start)`` sequence from ``start`` on (e.g. the prompt length) that has all heads'
    targets. With ``dynamic``, also the order in which a dynamic tree of those settings (its ``nodes``
    the most considered) picks the true path's nodes, drafted for real at each position; likewise for each
    of ``rescorings`` (one per pair of weights) with ``model.ngram`` and ``model.rescorer``, and for each
    of ``budgets`` (dynamic trees with a per-node budget), with the number of nodes it drafted."""
    uses_lm = any(settings.lm_weight > 0 for settings in rescorings)
    index_of = model.rescorer.draft_index() if uses_lm else None
    fed = 1 + max((s.top_k * (s.depth - 1) for s in rescorings), default=0)  # nodes an LM scorer may feed
    records = []
    num_heads = model.config.num_heads
    for seq, skip in tqdm(sequences, desc="head ranks", unit="seq"):
        ids = torch.tensor([seq], device=model.device)
        with model.heads.capture(model.base) as captured:  # what the heads read: their state_source
            logits = model.base(input_ids=ids).logits[0]
        rows = torch.arange(len(seq), device=ids.device)
        # what the heads read: a windowed drafter's window starts where decoding's would (the prompt's last state)
        hidden = model.heads.heads_inputs(captured["hidden"][0], torch.cat([ids[0, 1:], ids[0, -1:]]),
                                          rows.clamp(max=max(skip - 1, 0)), rows)
        ahead = (torch.arange(len(seq))[:, None] + 1 + torch.arange(num_heads)).clamp(max=len(seq) - 1)
        head_logits = model.draft_logits(hidden, ids[0, ahead.to(ids.device)])  # [len, heads, draft vocab]
        top = model.heads.token_ids(head_logits.topk(top_k, dim=-1).indices)  # [len, heads, top_k]
        signals = {name: gate_signal(name, logits, head_logits[:, 0]).tolist() for name in GATE_SIGNALS}
        if uses_lm and not tree_attention_ok(model.base, len(seq) + fed):
            raise ValueError(f"The neural rescorer scores paths under a tree mask, which this base cannot take over a "
                             f"{len(seq)}-token sequence (flash attention or a shorter sliding window).")
        with ExitStack() as stack:
            lm_state = stack.enter_context(rescorer_state(model, ids)) if uses_lm else None
            records.extend(_position_records(model, ids, skip, top, hidden, signals, dynamic, rescorings, lm_state,
                                             index_of, budgets))
    return records


def _position_records(model, ids: torch.LongTensor, skip: int, top: torch.Tensor, hidden: torch.Tensor,
                      signals: dict, dynamic: DynamicTree | None, rescorings: list[Rescoring], lm_state,
                      index_of: torch.Tensor | None, budgets: list[DynamicTree] = ()) -> list[PositionRecord]:
    """`collect_positions`' records for one sequence ``ids`` ``[1, n]`` (``lm_state``: the neural rescorer's over
    all of it; ``index_of``: its `Drafter.draft_index`)."""
    records, num_heads, seq = [], model.config.num_heads, ids[0].tolist()
    for t in range(skip, len(seq) - num_heads - 1):
        ranks = []
        for k in range(num_heads):
            hit = (top[t, k] == seq[t + k + 2]).nonzero()
            ranks.append(int(hit[0, 0]) if len(hit) else -1)
        truth = seq[t + 2 : t + 2 + num_heads]
        order = None
        if dynamic is not None:
            chosen = dynamic_selection(StepDrafts(model.heads, hidden[t], seq[t + 1]), dynamic, num_heads)
            order = _true_path_order(chosen, truth)
        record = PositionRecord(ranks, {name: values[t] for name, values in signals.items()}, order,
                                top_block_repeats=repeats_a_token([seq[t + 1], *top[t, :, 0].tolist()]))
        for settings in budgets:
            chosen = dynamic_selection(StepDrafts(model.heads, hidden[t], seq[t + 1]), settings, num_heads)
            record.budgeted[(settings.top_p, settings.min_ratio)] = (_true_path_order(chosen, truth), len(chosen))
        history = ids[0, : t + 2]
        scorer = model.rescorer.path_scorer(lm_state, ids[:, : t + 2], visible=t + 1) if lm_state else None
        for settings in rescorings:  # the scorer keeps what it computed for one setting for the next
            rescore = lattice_rescore(settings, history, model.ngram, scorer, index_of)
            chosen = dynamic_selection(StepDrafts(model.heads, hidden[t], seq[t + 1]), settings, num_heads, rescore)
            key = (settings.weight, settings.lm_weight)
            record.rescored_order[key] = _true_path_order(chosen, truth)
            record.rescored_block_repeats[key] = repeats_a_token([seq[t + 1], *_top_block(chosen)])
        if scorer is not None:
            scorer.close()
        records.append(record)
    return records


def _top_block(chosen: dict[tuple[int, ...], int]) -> list[int]:
    """The tokens of the best path: from the root, each time the first-chosen (best-scored) child."""
    block, parent = [], ()
    while True:
        child = next((path for path in chosen if path[:-1] == parent), None)
        if child is None:
            return block
        block.append(chosen[child])
        parent = child


def _true_path_order(chosen: dict[tuple[int, ...], int], truth: list[int]) -> list[int]:
    """Per depth, the place in ``chosen``'s order of the node on the true path (-1 from the first miss)."""
    index = {path: i for i, path in enumerate(chosen)}
    child = {(path[:-1], token): path for path, token in chosen.items()}
    order, parent = [], ()
    for token in truth:
        parent = child.get((parent, token))
        if parent is None:
            break
        order.append(index[parent])
    return order + [-1] * (len(truth) - len(order))


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


RESCORING_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
RESCORING_LM_WEIGHTS = (0.25, 0.5, 1.0)
# Clover's per-node budget as (top_p, min_ratio): its own (top-p 0.95, a quarter of the top-1) and two neighbours
DYNAMIC_BUDGETS = ((0.95, 0.25), (0.8, 0.25), (0.95, 0.1))


def _uses(settings: Rescoring) -> tuple[bool, bool]:
    """Which rescorers ``settings`` weighs: (the n-gram, the LM)."""
    return settings.weight > 0, settings.lm_weight > 0


def calibrate(model, sequences: list[tuple[list[int], int]], top_k: int = 10, max_nodes: int = 63,
              repeats: int = 5, dynamic_top_k: int = 4, dynamic_max_nodes: int = 32,
              rescoring_weights: tuple[float, ...] = RESCORING_WEIGHTS, rescoring_candidates: int = 8,
              rescoring_lm_weights: tuple[float, ...] = RESCORING_LM_WEIGHTS,
              dynamic_budgets: tuple[tuple[float, float], ...] = DYNAMIC_BUDGETS, strict: bool = False) -> dict:
    """Run all measurements and choices; store the result for this device, dtype and processor in the
    model's generation config (``cerberus_calibration``, keyed as `hardware.HardwareKey`) and return the
    full report.

    Both tree kinds are fitted: the static tree from how often each rank path is right, the dynamic tree's
    size, without and with each per-node budget of ``dynamic_budgets`` ((top_p, min_ratio) pairs), by
    drafting it for real at every position (the budget is kept only if it does best); with ``model.ngram``
    or ``model.rescorer``, the rescored tree's weights and size too (each pair of an n-gram weight of ``rescoring_weights`` and an LM weight of
    0 and ``rescoring_lm_weights``, drafted for real over ``rescoring_candidates`` guesses per depth; both 0
    is the plain dynamic tree over that wider lattice). The kind with the highest expected tokens per second
    is the default (``tree_kind``); the gate is fitted to that kind; the others stay stored for the bench, as
    does the best rescored tree of each combination of rescorers (``rescoring_options``).

    ``strict`` fits everything for ``generate(strict=True)``: the cost curve of strict verification, trees no
    larger than it can verify here (`strict.row_invariant_rows`), stored beside the entry's own settings
    (under its ``"strict"`` key)."""
    if strict:
        check_strict_support(model.base)
        rows = row_invariant_rows(model.base)
        if rows < 2:
            raise ValueError(f"Strict verification can verify no draft here: the base's linear layers in "
                             f"{model.base.dtype} give a row computed in a batch other bits than alone.")
        max_nodes, dynamic_max_nodes = min(max_nodes, rows - 1), min(dynamic_max_nodes, rows - 1)
    cost = measure_cost_curve(model.base, max_tokens=max(max_nodes, dynamic_max_nodes) + 1, repeats=repeats,
                              strict=strict)
    draft_time = measure_draft_time(model)
    probe = DynamicTree(nodes=dynamic_max_nodes, depth=model.config.num_heads, top_k=dynamic_top_k)
    dynamic_time = measure_draft_time(model, dynamic=probe)
    probes = []
    if model.ngram is not None or model.rescorer is not None:
        ngram_weights = rescoring_weights if model.ngram is not None else (0.0,)
        lm_weights = (0.0, *rescoring_lm_weights) if model.rescorer is not None else (0.0,)
        probes = [Rescoring(nodes=dynamic_max_nodes, depth=probe.depth, top_k=dynamic_top_k,
                            candidates=rescoring_candidates, weight=float(w), lm_weight=float(lw))
                  for w in dict.fromkeys(ngram_weights) for lw in dict.fromkeys(lm_weights)]
    # drafting time per combination of rescorers in use: (n-gram, LM)
    rescored_times = {}
    for settings in probes:
        uses = _uses(settings)
        if uses not in rescored_times:
            rescored_times[uses] = measure_draft_time(model, dynamic=settings)
    budgets = [replace(probe, top_p=top_p, min_ratio=min_ratio) for top_p, min_ratio in dynamic_budgets]
    records = collect_positions(model, sequences, top_k=top_k, dynamic=probe, rescorings=probes, budgets=budgets)
    paths, best, table = build_tree(records, cost, draft_time, max_nodes=max_nodes)
    # a budgeted tree drafts no more than the probe, so the probe's drafting time bounds its own
    dynamic_fits = {None: fit_dynamic_tree(records, cost, dynamic_time, dynamic_max_nodes)}
    for settings in budgets:
        key = (settings.top_p, settings.min_ratio)
        dynamic_fits[key] = fit_dynamic_tree(records, cost, dynamic_time, dynamic_max_nodes, budget=key)
    budget = max(dynamic_fits, key=lambda key: dynamic_fits[key][0]["tokens_per_s"])
    dynamic_best, dynamic_table = dynamic_fits[budget]
    top_p, min_ratio = budget or (1.0, 0.0)
    dynamic = replace(probe, nodes=dynamic_best["nodes"], top_p=top_p, min_ratio=min_ratio)
    expected = {"static": best["tokens_per_s"], "dynamic": dynamic_best["tokens_per_s"]}
    rescoring, rescoring_report = None, None
    options = {}
    if probes:
        fits = {}
        for settings in probes:
            key = (settings.weight, settings.lm_weight)
            fits[key] = fit_dynamic_tree(records, cost, rescored_times[_uses(settings)], dynamic_max_nodes, key)

        def best_of(keys):
            return max(keys, key=lambda k: fits[k][0]["tokens_per_s"])

        def as_settings(key):
            return replace(probes[0], nodes=fits[key][0]["nodes"], weight=key[0], lm_weight=key[1])

        weights = best_of(fits)
        rescoring = as_settings(weights)
        expected["rescored"] = fits[weights][0]["tokens_per_s"]
        for name, uses in (("ngram", (True, False)), ("lm", (False, True)), ("ngram+lm", (True, True))):
            keys = [k for k in fits if (k[0] > 0, k[1] > 0) == uses]
            if keys:
                options[name] = as_settings(best_of(keys)).to_dict()
        rescoring_report = {
            "settings": rescoring.to_dict(),
            "draft_seconds": rescored_times[_uses(rescoring)],
            "by_weights": [
                {"weight": k[0], "lm_weight": k[1], "draft_seconds": rescored_times[(k[0] > 0, k[1] > 0)],
                 "best": fit[0], "sizes": fit[1],
                 "top_block_repeats": sum(r.rescored_block_repeats[k] for r in records) / len(records)}
                for k, fit in fits.items()
            ],
            "heads_top_block_repeats": sum(r.top_block_repeats for r in records) / len(records),
            "ngram": model.ngram and {"order": model.ngram.order, "tokens": model.ngram.tokens,
                                      "bytes": model.ngram.num_bytes()},
            "rescorer": model.rescorer and {
                "type": model.rescorer.drafter_type, "exit_layer": model.rescorer.exit_layer,
                "parameters": sum(p.numel() for p in model.rescorer.parameters())},
        }
    kind = max(expected, key=expected.get)
    if kind == "rescored":
        rescored_best = fits[(rescoring.weight, rescoring.lm_weight)][0]
        gate = fit_gate(records, dynamic_accepted(records, rescoring.nodes, (rescoring.weight, rescoring.lm_weight)),
                        rescored_best["step_seconds"], cost[1])
    elif kind == "dynamic":
        gate = fit_gate(records, dynamic_accepted(records, dynamic.nodes, budget=budget), dynamic_best["step_seconds"],
                        cost[1])
    else:
        gate = fit_gate(records, static_accepted(records, paths), cost[len(paths) + 1] + draft_time, cost[1])
    settings = {"draft_tree": paths, "dynamic_tree": dynamic.to_dict(), "tree_kind": kind, **_chosen_gate(gate)}
    if rescoring is not None:
        settings["rescoring"] = rescoring.to_dict()
        settings["rescoring_options"] = options
    stored = model.decoding_settings()
    if stored["calibration"] is not None and stored["prompt_lookup_num_tokens"] is not None:
        # not fitted here: keep what was chosen for the closest device
        settings["prompt_lookup_num_tokens"] = stored["prompt_lookup_num_tokens"]
    if strict:
        settings["strict_rows"] = rows
    key = _store(model, settings, strict=strict)
    return {
        "strict": strict,
        "device": model.device.type,
        "key": str(key),
        "machine": describe_device(model.device),
        "settings": settings,
        "expected": best,
        "tree_sizes": table,
        "dynamic_expected": dynamic_best,
        "dynamic_tree_sizes": dynamic_table,
        "dynamic_draft_seconds": dynamic_time,
        "dynamic_budgets": [{"top_p": (key or (1.0, 0.0))[0], "min_ratio": (key or (1.0, 0.0))[1], "best": fit[0],
                             "sizes": fit[1]} for key, fit in dynamic_fits.items()],  # the first: no budget
        "rescoring": rescoring_report,
        "gate": gate,
        "cost_curve_seconds": cost,
        "relative_cost": {n: t / cost[1] for n, t in cost.items()},
        "draft_seconds": draft_time,
        "rank_accuracy": rank_accuracy(records, top_k),
        "positions": len(records),
    }


@torch.no_grad()
def measure_chain_steps(model, context: int = 300, repeats: int = 5) -> dict[str, dict[int, float]]:
    """Median seconds of a chain drafter's (Kangaroo's) step parts for each draft length ``n`` up to
    ``num_heads``, after a ``context``-token prefix: ``"draft"``, drafting ``n`` tokens, and ``"verify"``, the
    base's forward over the newest token and those ``n`` as decoding runs it (from the exit layer on, the
    shallow layers' work reused). Lengths are interleaved across repeats so drifting load hits all alike."""
    base, depth, device = model.base, model.config.num_heads, model.device
    vocab = base.get_output_embeddings().weight.shape[0]
    limit = getattr(base.config.get_text_config(), "max_position_embeddings", None)
    if limit:
        context = max(1, min(context, limit - depth - 2))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, context + 1), generator=generator).to(device)
    cache = DynamicCache(config=base.config)
    times = {part: {n: [] for n in range(1, depth + 1)} for part in ("draft", "verify")}
    with model.heads.capture(base) as captured:
        base(input_ids=ids[:, :-1], **cache_argument(cache), use_cache=True)
        state = model.heads.start(base, cache)
        state.observe(captured, None)
        for _ in tqdm(range(repeats), desc="chain steps", unit="pass"):
            for n in range(1, depth + 1):
                synchronize(device)
                start = time.perf_counter()
                drafted = model.heads.draft_chain(state, ids, n, confidence=0.0)
                synchronize(device)
                middle = time.perf_counter()
                tokens = torch.cat([ids[:, -1:], torch.tensor([drafted], device=device, dtype=ids.dtype)], dim=-1)
                positions = torch.arange(context, context + n + 1, device=device)[None]
                with state.verifying(base, tokens) as verifier:
                    verifier(input_ids=tokens, **cache_argument(cache), position_ids=positions, use_cache=True)
                synchronize(device)
                times["draft"][n].append(middle - start)
                times["verify"][n].append(time.perf_counter() - middle)
                cache.crop(-(n + 1))
    return {part: {n: statistics.median(values) for n, values in by_length.items()} for part, by_length in times.items()}


@dataclass
class ChainPosition:
    """A step starting after position ``t`` of a calibration sequence, for a chain drafter: the probability
    of each depth's draft (teacher-forced: the drafts above it right) and whether it is right, with the
    gate signals there."""

    confidences: list[float]
    hits: list[bool]
    signals: dict[str, float]

    def drafted(self, length: int, confidence: float) -> int:
        """Tokens drafted with at most ``length`` per draft and the early exit at ``confidence``."""
        for j, value in enumerate(self.confidences[:length]):
            if value < confidence:
                return j + 1
        return min(length, len(self.confidences))

    def accepted(self, drafted: int) -> int:
        count = 0
        while count < drafted and self.hits[count]:
            count += 1
        return count


@torch.no_grad()
def collect_chain_positions(model, sequences: list[tuple[list[int], int]]) -> list[ChainPosition]:
    """Per position of every ``(tokens, start)`` sequence from ``start`` on, the chain drafter's guesses
    for the next ``num_heads`` tokens, teacher-forced over the sequence (what drafting computes while the
    drafts are right, which is all acceptance depends on)."""
    depth = model.config.num_heads
    positions = []
    for seq, skip in tqdm(sequences, desc="chain drafts", unit="seq"):
        ids = torch.tensor([seq], device=model.device)
        with model.heads.capture(model.base) as captured:
            logits = model.base(input_ids=ids).logits[0]
        probs = torch.softmax(model.heads.forced_chain_logits(captured, seq).float(), dim=-1)
        top, index = probs.max(dim=-1)
        guesses = model.heads.token_ids(index).tolist()
        top = top.tolist()
        signals = {name: gate_signal(name, logits).tolist() for name in GATE_SIGNALS if name != "head_entropy"}
        for t in range(skip, len(seq) - depth - 1):
            # the step after position t: the verifier's token is seq[t + 1]; draft j (0-based) comes from the
            # drafter's state at t + 1 + j and is right when it is seq[t + 2 + j]
            span = range(t + 1, t + 1 + depth)
            positions.append(ChainPosition([top[p] for p in span], [guesses[p] == seq[p + 1] for p in span],
                                           {name: values[t] for name, values in signals.items()}))
    return positions


def calibrate_chain(model, sequences: list[tuple[list[int], int]], repeats: int = 5,
                    confidences: tuple[float, ...] = tuple(i / 10 for i in range(10))) -> dict:
    """`calibrate` for a drafter that drafts its own chain (Kangaroo): the longest draft (at most
    ``num_heads``) and the early-exit confidence with the best expected tokens per second, then the gate
    (fitted at the chosen settings' mean step time), stored as `calibrate` stores the heads' settings."""
    depth = model.config.num_heads
    cost = measure_cost_curve(model.base, max_tokens=depth + 1, repeats=repeats)
    steps = measure_chain_steps(model, repeats=repeats)
    positions = collect_chain_positions(model, sequences)
    if not positions:
        raise ValueError("No calibration position: the sequences are shorter than a draft.")
    table = []
    for length in range(1, depth + 1):
        for confidence in confidences:
            drafted = [p.drafted(length, confidence) for p in positions]
            accepted = [p.accepted(n) for p, n in zip(positions, drafted)]
            seconds = sum(steps["draft"][n] + steps["verify"][n] for n in drafted)
            table.append({"length": length, "exit_confidence": confidence,
                          "drafted": sum(drafted) / len(positions),
                          "expected_tau": 1.0 + sum(accepted) / len(positions),
                          "step_seconds": seconds / len(positions),
                          "tokens_per_s": (len(positions) + sum(accepted)) / seconds, "accepted": accepted})
    best = max(table, key=lambda row: row["tokens_per_s"])
    records = [PositionRecord([], p.signals) for p in positions]
    gate = fit_gate(records, best["accepted"], best["step_seconds"], cost[1])
    settings = {"draft_tree": [[0] * (d + 1) for d in range(best["length"])], "tree_kind": "static",
                "exit_confidence": best["exit_confidence"], **_chosen_gate(gate)}
    key = _store(model, settings)
    # depth k's acceptance: how often its draft is right where every draft above it was (what chains need)
    reached = [[p for p in positions if all(p.hits[:k])] for k in range(depth)]
    hits = [sum(p.hits[k] for p in group) / len(group) if group else 0.0 for k, group in enumerate(reached)]
    return {
        "device": model.device.type, "key": str(key), "machine": describe_device(model.device), "kind": "chain",
        "settings": settings, "expected": {k: v for k, v in best.items() if k != "accepted"},
        "chains": [{k: v for k, v in row.items() if k != "accepted"} for row in table],
        "gate": gate, "cost_curve_seconds": cost, "relative_cost": {n: t / cost[1] for n, t in cost.items()},
        "chain_step_seconds": steps, "depth_acceptance": hits, "positions": len(positions),
    }


def _chosen_gate(gate: dict) -> dict:
    """The gate signal with the best modelled throughput and its threshold (None: always draft)."""
    signal = max(gate["signals"], key=lambda name: gate["signals"][name]["tokens_per_s"])
    threshold = gate["signals"][signal]["threshold"]
    return {"gate_signal": signal, "gate_threshold": None if threshold == float("inf") else threshold}


def _store(model, settings: dict, strict: bool = False) -> HardwareKey:
    """Store ``settings`` in the model's generation config under this device, dtype and processor (with
    a CPU's bf16 instructions), beside the entries for other hardware; returns the key. ``strict`` settings
    go under the entry's ``"strict"`` key, beside (not instead of) its own; either kind keeps the other."""
    key = HardwareKey.of(model.device, model.base.dtype)
    calibrated = dict(getattr(model.generation_config, "cerberus_calibration", None) or {})
    previous = calibrated.get(str(key), {})
    if strict:
        settings = {**previous, "strict": settings}
    elif "strict" in previous:
        settings["strict"] = previous["strict"]
    if model.device.type == "cpu":
        settings["bf16_matmul"] = bf16_matmul(model.device)
        settings["amx"] = settings["bf16_matmul"] == "AMX"  # what folders' code from before bf16_matmul reads
    calibrated[str(key)] = settings
    model.generation_config.cerberus_calibration = calibrated
    return key


def load_sequences(records: list[Record], limit: int | None = None, held_out_fraction: float | None = 0.05):
    """``(tokens, first answer position)`` of self-distillation records (prompt ids + answer ids).

    With ``held_out_fraction`` (training's ``eval_fraction``), only records of the held-out split are
    used, so calibration never measures heads on their own training data."""
    if held_out_fraction:
        held_out = split_record_ids([r.id for r in records], held_out_fraction)
        records = [r for r in records if r.id in held_out]
    sequences = [(list(r.input_ids + r.output_ids), len(r.input_ids) - 1) for r in records]
    return sequences[:limit] if limit else sequences


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="fit the draft tree and the gate to heads and device")
    parser.add_argument("--heads", required=True, type=arguments.heads_source, help="head checkpoint folder")
    parser.add_argument("--data", required=True, help="self-distillation JSONL; its held-out split is used")
    parser.add_argument("--held-out-fraction", type=arguments.fraction, default=0.05,
                        help="training's --eval-fraction, to select the held-out records (0: use every record)")
    parser.add_argument("--limit", type=arguments.positive_int, default=200, help="sequences to use")
    parser.add_argument("--max-nodes", type=arguments.positive_int, default=63, help="largest static tree considered")
    parser.add_argument("--top-k", type=arguments.positive_int, default=10)
    parser.add_argument("--dynamic-max-nodes", type=arguments.positive_int, default=32,
                        help="largest dynamic tree considered")
    parser.add_argument("--dynamic-top-k", type=arguments.positive_int, default=4,
                        help="children expanded per node and nodes kept per level of the dynamic tree")
    parser.add_argument("--dynamic-budgets", nargs="*", default=[f"{p}:{r}" for p, r in DYNAMIC_BUDGETS],
                        metavar="TOP_P:MIN_RATIO",
                        help="Clover per-node budgets tried for the dynamic tree (none: the plain tree only)")
    parser.add_argument("--rescoring-weights", type=float, nargs="+", default=list(RESCORING_WEIGHTS),
                        help="n-gram weights tried for the rescored tree (needs HEADS/ngram.safetensors or --ngram)")
    parser.add_argument("--rescoring-lm-weights", type=float, nargs="+", default=list(RESCORING_LM_WEIGHTS),
                        help="LM weights tried beside 0 for the rescored tree (needs HEADS/rescorer/ or --rescorer)")
    parser.add_argument("--rescorer", default=None,
                        help="Kangaroo checkpoint for this base to rescore with as a small LM (default: the folder's "
                             "rescorer/; written there with --write)")
    parser.add_argument("--rescoring-candidates", type=arguments.positive_int, default=8,
                        help="guesses per depth the rescored tree considers under each path")
    parser.add_argument("--ngram", default=None,
                        help="n-gram model file to rescore with (default: the folder's; written there with --write)")
    parser.add_argument("--repeats", type=arguments.positive_int, default=5,
                        help="timing repeats per size for the cost curve")
    parser.add_argument("--draft-vocab", type=arguments.positive_int, default=None,
                        help="draft among the N most frequent answer tokens of --data (cheaper heads; exact output)")
    parser.add_argument("--device", default="cpu", type=arguments.device)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the dtype the base and heads compute in: each dtype has its own cost curve and entry")
    parser.add_argument("--report", default=None, type=arguments.output_file, help="write the full report (JSON) here")
    parser.add_argument("--write", action="store_true", help="store the settings in the folder's generation config")
    parser.add_argument("--strict", action="store_true",
                        help="fit the settings generate(strict=True) uses: strict verification's cost curve and trees "
                             "no larger than it can verify on this machine (stored beside the entry's own)")
    # the options only trees read: a drafter that drafts chains refuses them rather than ignore them
    tree_options = ("max_nodes", "top_k", "dynamic_max_nodes", "dynamic_top_k", "dynamic_budgets",
                    "rescoring_weights", "rescoring_lm_weights", "rescoring_candidates", "ngram", "rescorer")
    parser.set_defaults(func=run_cli, tree_defaults={name: parser.get_default(name) for name in tree_options})


def run_cli(args: argparse.Namespace) -> int:
    if args.draft_vocab:
        config = CerberusConfig.from_pretrained(args.heads)  # before the model: a refusal needs no weights
        if config.draft_vocab_trained:
            raise UserError(f"{args.heads} was trained over its own {config.draft_vocab_size}-token vocabulary (train "
                            "--train-vocab); rows outside it are untrained, so it keeps drafting among those tokens: "
                            "leave out --draft-vocab")
    records = read_records(args.data)  # before the model: a bad data file fails fast
    model = _load_for_calibration(args, records)
    sequences = load_sequences(records, args.limit, args.held_out_fraction)
    if model.heads.drafts_chains:
        given = [name for name, default in args.tree_defaults.items() if getattr(args, name) != default]
        if given:
            raise UserError(f"{', '.join('--' + n.replace('_', '-') for n in given)} do(es) not apply to "
                            f"{model.config.head_type}, which drafts chains (no trees, no rescoring)")
        if args.strict:
            raise UserError(f"--strict fits trees; {model.config.head_type} drafts chains, which "
                            "generate(strict=True) verifies with the entry's own settings")
        report = calibrate_chain(model, sequences, repeats=args.repeats)
        print(format_chain_report(report))
    else:
        report = calibrate(model, sequences, top_k=args.top_k, max_nodes=args.max_nodes, repeats=args.repeats,
                           dynamic_top_k=args.dynamic_top_k, dynamic_max_nodes=args.dynamic_max_nodes,
                           rescoring_weights=tuple(args.rescoring_weights),
                           rescoring_candidates=args.rescoring_candidates,
                           rescoring_lm_weights=tuple(args.rescoring_lm_weights),
                           dynamic_budgets=parse_budgets(args.dynamic_budgets), strict=args.strict)
        print(format_report(report))
    if args.report:
        with open(args.report, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.write:
        # The folder's weights keep the precision they were stored in: a calibration in another dtype is
        # written through a fresh copy of the folder, not through the model cast to that dtype.
        stored = _load_for_calibration(args, records, cast=False)
        stored.generation_config.cerberus_calibration = model.generation_config.cerberus_calibration
        stored.save_pretrained(args.heads)
        print(f"stored in {args.heads}: generation_config.json cerberus_calibration[{report['key']!r}]"
              + (f", a {args.draft_vocab}-token draft vocabulary with the heads" if args.draft_vocab else ""))
    return 0


def _load_for_calibration(args: argparse.Namespace, records: list[Record], cast: bool = True):
    """The checkpoint of ``--heads`` with the n-gram, rescorer and draft vocabulary the options ask for; on
    ``--device`` in ``--dtype`` when ``cast``, else as stored."""
    from ..modeling_cerberus import CerberusForCausalLM

    model = CerberusForCausalLM.from_pretrained(args.heads)
    if cast:
        model = model.to(args.device, getattr(torch, args.dtype))
    if args.ngram:
        model.load_ngram(args.ngram)
    if args.rescorer:
        model.load_rescorer(args.rescorer)
    if args.draft_vocab:
        model.set_draft_vocab(frequent_tokens(records, args.draft_vocab))
    return model


def parse_budgets(values: list[str]) -> tuple[tuple[float, float], ...]:
    """``["0.95:0.25", ...]`` as (top_p, min_ratio) pairs, each checked as `DynamicTree` checks it."""
    budgets = []
    for value in values:
        top_p, colon, min_ratio = value.partition(":")
        try:
            budget = (float(top_p), float(min_ratio))
            DynamicTree(nodes=1, depth=1, top_p=budget[0], min_ratio=budget[1])
        except ValueError as error:
            raise UserError(f"--dynamic-budgets {value!r}: expected TOP_P:MIN_RATIO with 0 < TOP_P <= 1 and "
                            f"0 <= MIN_RATIO <= 1 ({error})") from None
        budgets.append(budget)
    return tuple(budgets)


def format_report(report: dict) -> str:
    """The numbers a person needs: cost curve, both tree kinds, gate comparison."""
    strict = (f" (strict verification: at most {report['settings']['strict_rows']} positions a forward)"
              if report.get("strict") else "")
    lines = [f"{report.get('machine', report['device'])}, stored as {report.get('key', report['device'])!r}{strict}; "
             f"{report['positions']} calibration positions",
             *_format_cost(report),
             f"static tree: {len(report['settings']['draft_tree'])} nodes, expected tau "
             f"{report['expected']['expected_tau']:.2f}, {report['expected']['tokens_per_s']:.1f} tokens/s (model), "
             f"{report['settings']['draft_tree']}",
             f"dynamic tree: {report['settings']['dynamic_tree']}, expected tau "
             f"{report['dynamic_expected']['expected_tau']:.2f}, {report['dynamic_expected']['tokens_per_s']:.1f} "
             f"tokens/s (model); drafting {report['draft_seconds'] * 1e3:.1f} ms (chain) / "
             f"{report['dynamic_draft_seconds'] * 1e3:.1f} ms (dynamic); default: {report['settings']['tree_kind']}",
             *_format_budgets(report),
             *_format_rescoring(report.get("rescoring")),
             *_format_gate(report)]
    return "\n".join(lines)


def _format_budgets(report: dict) -> list[str]:
    """The dynamic tree without and with each per-node budget, at its best size."""
    rows = report.get("dynamic_budgets", [])
    if len(rows) < 2:
        return []
    lines = ["| dynamic tree budget (top_p, min_ratio) | at most nodes | mean nodes | expected tau "
             "| tokens/s (model) |", "|---|---|---|---|---|"]
    for row in rows:
        best, budget = row["best"], ("none" if (row["top_p"], row["min_ratio"]) == (1.0, 0.0)
                                     else f"{row['top_p']}, {row['min_ratio']}")
        lines.append(f"| {budget} | {best['nodes']} | {best['mean_nodes']:.1f} | {best['expected_tau']:.3f} | "
                     f"{best['tokens_per_s']:.1f} |")
    return lines


def _format_cost(report: dict) -> list[str]:
    rel = report["relative_cost"]
    sizes = [n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n in rel]
    return ["cost of one forward with n new tokens, relative to n = 1:",
            "| n | " + " | ".join(str(n) for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
            "| cost | " + " | ".join(f"{rel[n]:.2f}" for n in sizes) + " |"]


def _format_gate(report: dict) -> list[str]:
    lines = ["| gate signal | threshold | draft rate | tokens/s (model) | Spearman vs accepted | AUC (accepted >= 1) |",
             "|---|---|---|---|---|---|"]
    for name, row in report["gate"]["signals"].items():
        lines.append(f"| {name} | {row['threshold']:.3f} | {row['draft_rate']:.0%} | {row['tokens_per_s']:.1f} | "
                     f"{row['spearman']:.3f} | {row['auc']:.3f} |")
    lines.append(f"always draft: {report['gate']['always_draft_tokens_per_s']:.1f} tokens/s (model); never: "
                 f"{report['gate']['never_tokens_per_s']:.1f}; chosen signal: {report['settings']['gate_signal']}")
    return lines


def format_chain_report(report: dict) -> str:
    """A chain drafter's calibration: cost curve, accuracy per depth, the best draft length per exit
    confidence, the gate."""
    best = report["expected"]
    lines = [f"{report['machine']}, stored as {report['key']!r}; {report['positions']} calibration positions",
             *_format_cost(report),
             "a step by draft length (ms): " + "; ".join(
                 f"{n}: draft {draft * 1e3:.1f} + verify {report['chain_step_seconds']['verify'][n] * 1e3:.1f}"
                 for n, draft in report["chain_step_seconds"]["draft"].items()),
             "acceptance per depth (right where the drafts above were right): "
             + " ".join(f"{v:.3f}" for v in report["depth_acceptance"]),
             "| exit confidence | best length | drafted per step | expected tau | tokens/s (model) |",
             "|---|---|---|---|---|"]
    for confidence in sorted({row["exit_confidence"] for row in report["chains"]}):
        row = max((r for r in report["chains"] if r["exit_confidence"] == confidence), key=lambda r: r["tokens_per_s"])
        lines.append(f"| {confidence:.1f} | {row['length']} | {row['drafted']:.2f} | {row['expected_tau']:.3f} | "
                     f"{row['tokens_per_s']:.1f} |")
    lines.append(f"chosen: length {best['length']}, exit confidence {best['exit_confidence']:.1f}, expected tau "
                 f"{best['expected_tau']:.3f}, {best['tokens_per_s']:.1f} tokens/s (model)")
    return "\n".join(lines + _format_gate(report))


def _format_rescoring(rescoring: dict | None) -> list[str]:
    if rescoring is None:
        return ["rescored tree: no rescorer beside the heads (cerberus-hf ngram, --rescorer)"]
    models = []
    if rescoring.get("ngram"):
        ngram = rescoring["ngram"]
        models.append(f"n-gram order {ngram['order']} over {ngram['tokens']:,} tokens, {ngram['bytes'] / 1e6:.1f} MB")
    if rescoring.get("rescorer"):
        lm = rescoring["rescorer"]
        models.append(f"LM: {lm['type']} (the base's first {lm['exit_layer']} layers, {lm['parameters']:,} parameters "
                      "of its own)")
    lines = [f"rescored tree: {rescoring['settings']}; " + "; ".join(models),
             "| n-gram weight | LM weight | nodes | expected tau | drafting ms | tokens/s (model) | "
             "top-1 block repeats a token |",
             "|---|---|---|---|---|---|---|"]
    for row in rescoring["by_weights"]:
        best = row["best"]
        lines.append(f"| {row['weight']} | {row['lm_weight']} | {best['nodes']} | {best['expected_tau']:.3f} | "
                     f"{row['draft_seconds'] * 1e3:.1f} | {best['tokens_per_s']:.1f} | {row['top_block_repeats']:.1%} |")
    lines.append(f"the heads' own top-1 block repeats a token at {rescoring['heads_top_block_repeats']:.1%} of positions")
    return lines
