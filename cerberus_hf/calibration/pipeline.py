"""`calibrate` (tree drafters) and `calibrate_chain` (chain drafters): measure, collect positions, fit, and store
the chosen settings in the model's generation config under its hardware key."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..blocks.rescoring import Rescoring
from ..blocks.strict import check_strict_support, row_invariant_rows
from ..blocks.tree import DynamicTree
from ..hardware import HardwareKey, bf16_matmul, describe_device
from ..training.data import Record
from ..training.hidden_cache import split_record_ids
from .fit import (
    build_tree,
    dynamic_accepted,
    fit_dynamic_tree,
    fit_gate,
    rank_accuracy,
    static_accepted,
    walk,
)
from .measure import measure_chain_steps, measure_cost_curve, measure_draft_time, measure_gate_time
from .positions import PositionRecord, collect_chain_positions, collect_positions

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
    or ``model.rescorer``, the rescored tree's weights and size too (each pair of an n-gram weight of
    ``rescoring_weights`` and an LM weight of 0 and ``rescoring_lm_weights``, drafted for real over
    ``rescoring_candidates`` guesses per depth; both 0 is the plain dynamic tree over that wider lattice). The kind with the highest expected tokens per second
    is the default (``tree_kind``); the gate is fitted to that kind; the others stay stored for the bench, as
    does the best rescored tree of each combination of rescorers (``rescoring_options``).

    ``strict`` fits everything for ``generate(strict=True)``: the cost curve of strict verification, trees no
    larger than it can verify here (`strict.row_invariant_rows`), stored beside the entry's own settings
    (under its ``"strict"`` key)."""
    rows = None
    if strict:
        rows = _strict_rows(model.base)
        max_nodes, dynamic_max_nodes = min(max_nodes, rows - 1), min(dynamic_max_nodes, rows - 1)
    decoding = model.decoding_view(strict)  # through packed weights where decoding uses them (`blocks.packed`)
    packed, model = decoding is not model, decoding
    probe = DynamicTree(nodes=dynamic_max_nodes, depth=model.config.num_heads, top_k=dynamic_top_k)
    probes = _rescoring_probes(model, probe, rescoring_weights, rescoring_lm_weights, rescoring_candidates)
    timings = _Timings.measure(model, max(max_nodes, dynamic_max_nodes) + 1, repeats, strict, probe, probes)
    budgets = [replace(probe, top_p=top_p, min_ratio=min_ratio) for top_p, min_ratio in dynamic_budgets]
    records = collect_positions(model, sequences, top_k=top_k, dynamic=probe, rescorings=probes, budgets=budgets)
    cost = timings.cost
    paths, best, table = build_tree(records, cost, timings.draft, max_nodes=max_nodes)
    dynamic = _DynamicFit.fit(records, timings, probe, budgets, dynamic_max_nodes)
    expected = {"static": best["tokens_per_s"], "dynamic": dynamic.best["tokens_per_s"]}
    rescored = _RescoredFit.fit(model, records, timings, probes, dynamic_max_nodes) if probes else None
    if rescored is not None:
        expected["rescored"] = rescored.best["tokens_per_s"]
    kind = max(expected, key=expected.get)
    if kind == "rescored":
        weights = (rescored.settings.weight, rescored.settings.lm_weight)
        accepted = dynamic_accepted(records, rescored.settings.nodes, weights)
        step_seconds = rescored.best["step_seconds"]
    elif kind == "dynamic":
        accepted = dynamic_accepted(records, dynamic.tree.nodes, budget=dynamic.budget)
        step_seconds = dynamic.best["step_seconds"]
    else:
        accepted, step_seconds = static_accepted(records, paths), cost[len(paths) + 1] + timings.draft
    gate = fit_gate(records, accepted, step_seconds, cost[1], timings.gates)
    settings = {"draft_tree": paths, "dynamic_tree": dynamic.tree.to_dict(), "tree_kind": kind, **_chosen_gate(gate)}
    if rescored is not None:
        settings["rescoring"] = rescored.settings.to_dict()
        settings["rescoring_options"] = rescored.options
    key = _store_fitted(model, settings, strict, rows)
    return {
        "strict": strict,
        "device": model.device.type,
        "key": str(key),
        "machine": describe_device(model.device),
        "settings": settings,
        "expected": best,
        "tree_sizes": table,
        "dynamic_expected": dynamic.best,
        "dynamic_tree_sizes": dynamic.table,
        "dynamic_draft_seconds": timings.dynamic,
        "gate_seconds": timings.gates,
        "dynamic_budgets": dynamic.by_budget(),
        "rescoring": rescored.report if rescored is not None else None,
        "gate": gate,
        "cost_curve_seconds": cost,
        "relative_cost": {n: t / cost[1] for n, t in cost.items()},
        "packed_weights": packed,
        "draft_seconds": timings.draft,
        "rank_accuracy": rank_accuracy(records, top_k),
        "positions": len(records),
    }


def _strict_rows(base) -> int:
    """How many positions a forward of strict verification computes here as each alone (`strict.row_invariant_rows`);
    raises when that is too few to verify any draft."""
    check_strict_support(base)
    rows = row_invariant_rows(base)
    if rows < 2:
        raise ValueError(f"Strict verification can verify no draft here: the base's linear layers in "
                         f"{base.dtype} give a row computed in a batch other bits than alone.")
    return rows


def _rescoring_probes(model, probe: DynamicTree, weights: tuple[float, ...], lm_weights: tuple[float, ...],
                      candidates: int) -> list[Rescoring]:
    """The rescored trees drafted for real at every position: each pair of an n-gram weight (with ``model.ngram``)
    and an LM weight, 0 included (with ``model.rescorer``); none without a rescorer."""
    if model.ngram is None and model.rescorer is None:
        return []
    ngram_weights = weights if model.ngram is not None else (0.0,)
    lm_weights = (0.0, *lm_weights) if model.rescorer is not None else (0.0,)
    return [Rescoring(nodes=probe.nodes, depth=probe.depth, top_k=probe.top_k, candidates=candidates, weight=float(w),
                      lm_weight=float(lw))
            for w in dict.fromkeys(ngram_weights) for lw in dict.fromkeys(lm_weights)]


@dataclass
class _Timings:
    """What calibration measures on the device: the verification cost curve, the drafting times and the gate's."""

    cost: dict[int, float]  # seconds of a forward over n tokens
    draft: float  # drafting the static tree's chain through every head
    dynamic: float  # drafting the dynamic probe tree
    gates: dict[str, float]  # what a gated step pays, per signal
    rescored: dict[tuple[bool, bool], float]  # drafting a rescored tree, per combination of rescorers in use

    @classmethod
    def measure(cls, model, max_tokens: int, repeats: int, strict: bool, probe: DynamicTree,
                probes: list[Rescoring]) -> _Timings:
        cost = measure_cost_curve(model.base, max_tokens=max_tokens, repeats=repeats, strict=strict)
        draft = measure_draft_time(model)
        dynamic = measure_draft_time(model, dynamic=probe)
        gates = {"head_entropy": measure_gate_time(model)}  # a gated step pays for the first head's guesses
        rescored = {}
        for settings in probes:
            if _uses(settings) not in rescored:
                rescored[_uses(settings)] = measure_draft_time(model, dynamic=settings)
        return cls(cost, draft, dynamic, gates, rescored)


@dataclass
class _DynamicFit:
    """The dynamic tree's size, fitted without and with each per-node budget; the budget kept is the best one's."""

    fits: dict  # (top_p, min_ratio), or None for no budget: (best size's row, every size's rows)
    budget: tuple[float, float] | None
    tree: DynamicTree
    best: dict
    table: list

    @classmethod
    def fit(cls, records: list[PositionRecord], timings: _Timings, probe: DynamicTree, budgets: list[DynamicTree],
            max_nodes: int) -> _DynamicFit:
        # a budgeted tree drafts no more than the probe, so the probe's drafting time bounds its own
        fits = {None: fit_dynamic_tree(records, timings.cost, timings.dynamic, max_nodes)}
        for settings in budgets:
            key = (settings.top_p, settings.min_ratio)
            fits[key] = fit_dynamic_tree(records, timings.cost, timings.dynamic, max_nodes, budget=key)
        budget = max(fits, key=lambda key: fits[key][0]["tokens_per_s"])
        best, table = fits[budget]
        top_p, min_ratio = budget or (1.0, 0.0)
        return cls(fits, budget, replace(probe, nodes=best["nodes"], top_p=top_p, min_ratio=min_ratio), best, table)

    def by_budget(self) -> list[dict]:
        """The report's rows, one per budget (the first: none)."""
        return [{"top_p": (key or (1.0, 0.0))[0], "min_ratio": (key or (1.0, 0.0))[1], "best": fit[0], "sizes": fit[1]}
                for key, fit in self.fits.items()]


@dataclass
class _RescoredFit:
    """The rescored tree's weights and size with the best expected tokens per second, and the best of each
    combination of rescorers (``options``, for the bench)."""

    settings: Rescoring
    best: dict
    options: dict[str, dict]
    report: dict

    @classmethod
    def fit(cls, model, records: list[PositionRecord], timings: _Timings, probes: list[Rescoring],
            max_nodes: int) -> _RescoredFit:
        fits = {}
        for settings in probes:
            key = (settings.weight, settings.lm_weight)
            fits[key] = fit_dynamic_tree(records, timings.cost, timings.rescored[_uses(settings)], max_nodes, key)

        def best_of(keys):
            return max(keys, key=lambda k: fits[k][0]["tokens_per_s"])

        def as_settings(key):
            return replace(probes[0], nodes=fits[key][0]["nodes"], weight=key[0], lm_weight=key[1])

        weights = best_of(fits)
        rescoring = as_settings(weights)
        options = {}
        for name, uses in (("ngram", (True, False)), ("lm", (False, True)), ("ngram+lm", (True, True))):
            keys = [k for k in fits if (k[0] > 0, k[1] > 0) == uses]
            if keys:
                options[name] = as_settings(best_of(keys)).to_dict()
        return cls(rescoring, fits[weights][0], options, _rescoring_report(model, records, timings, fits, rescoring))


def _rescoring_report(model, records: list[PositionRecord], timings: _Timings, fits: dict,
                      rescoring: Rescoring) -> dict:
    """The report's ``"rescoring"`` entry: the chosen settings, every pair of weights' fit, how often the top-1 block
    repeats a token before and after rescoring, and the rescorers."""
    return {
        "settings": rescoring.to_dict(),
        "draft_seconds": timings.rescored[_uses(rescoring)],
        "by_weights": [
            {"weight": k[0], "lm_weight": k[1], "draft_seconds": timings.rescored[(k[0] > 0, k[1] > 0)],
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


def _store_fitted(model, settings: dict, strict: bool, rows: int | None) -> HardwareKey:
    """Store what `calibrate` chose (`store_calibration`), with the lookup length chosen for the closest device
    (not fitted here) and, for strict verification, how many positions it verifies."""
    stored = model.decoding_settings()
    if stored["calibration"] is not None and stored["prompt_lookup_num_tokens"] is not None:
        settings["prompt_lookup_num_tokens"] = stored["prompt_lookup_num_tokens"]
    if strict:
        settings["strict_rows"] = rows
    return store_calibration(model, settings, strict=strict)


def calibrate_chain(model, sequences: list[tuple[list[int], int]], repeats: int = 5,
                    confidences: tuple[float, ...] = tuple(i / 10 for i in range(10))) -> dict:
    """`calibrate` for a drafter that drafts its own chain (Kangaroo): the longest draft (at most
    ``num_heads``) and the early-exit confidence with the best expected tokens per second, then the gate
    (fitted at the chosen settings' mean step time), stored as `calibrate` stores the heads' settings."""
    depth = model.config.num_heads
    decoding = model.decoding_view()
    packed, model = decoding is not model, decoding
    cost = measure_cost_curve(model.base, max_tokens=depth + 1, repeats=repeats)
    steps = measure_chain_steps(model, repeats=repeats)
    positions = collect_chain_positions(model, sequences)
    if not positions:
        raise ValueError("No calibration position: the sequences are shorter than a draft.")
    options = [(length, confidence) for length in range(1, depth + 1) for confidence in confidences]
    drafted = torch.tensor([[p.drafted(length, confidence) for p in positions] for length, confidence in options])
    accepted = torch.tensor([[p.accepted(n) for p, n in zip(positions, row)] for row in drafted.tolist()])
    step_seconds = torch.tensor([steps["draft"][n] + steps["verify"][n] for n in range(1, depth + 1)],
                                dtype=torch.float64)
    walked = walk(positions, accepted, seconds=step_seconds[drafted - 1], drafted=drafted.double())
    table = []
    for row, (length, confidence) in enumerate(options):
        taken, spent = int(walked.steps[row]), float(walked.sums["seconds"][row])
        table.append({"length": length, "exit_confidence": confidence,
                      "drafted": float(walked.sums["drafted"][row]) / taken, "expected_tau": float(walked.tau[row]),
                      "step_seconds": spent / taken, "tokens_per_s": int(walked.tokens[row]) / spent,
                      "accepted": accepted[row].tolist()})
    best = max(table, key=lambda row: row["tokens_per_s"])
    records = [PositionRecord([], p.signals, sequence=p.sequence) for p in positions]
    gate = fit_gate(records, best["accepted"], best["step_seconds"], cost[1])
    settings = {"draft_tree": [[0] * (d + 1) for d in range(best["length"])], "tree_kind": "static",
                "exit_confidence": best["exit_confidence"], **_chosen_gate(gate)}
    key = store_calibration(model, settings)
    # depth k's acceptance: how often its draft is right where every draft above it was (what chains need)
    reached = [[p for p in positions if all(p.hits[:k])] for k in range(depth)]
    hits = [sum(p.hits[k] for p in group) / len(group) if group else 0.0 for k, group in enumerate(reached)]
    return {
        "device": model.device.type, "key": str(key), "machine": describe_device(model.device), "kind": "chain",
        "settings": settings, "expected": {k: v for k, v in best.items() if k != "accepted"},
        "chains": [{k: v for k, v in row.items() if k != "accepted"} for row in table],
        "gate": gate, "cost_curve_seconds": cost, "relative_cost": {n: t / cost[1] for n, t in cost.items()},
        "packed_weights": packed, "chain_step_seconds": steps, "depth_acceptance": hits, "positions": len(positions),
    }


def _chosen_gate(gate: dict) -> dict:
    """The gate signal with the best modelled throughput and its threshold (None: always draft)."""
    signal = max(gate["signals"], key=lambda name: gate["signals"][name]["tokens_per_s"])
    threshold = gate["signals"][signal]["threshold"]
    return {"gate_signal": signal, "gate_threshold": None if threshold == float("inf") else threshold}


def store_calibration(model, settings: dict, strict: bool = False) -> HardwareKey:
    """Store ``settings`` in the model's generation config under this device, dtype, instruction class and
    processor (`hardware.HardwareKey`; a CPU's bf16 instructions recorded too, for older code), beside the entries for other hardware; returns the key. ``strict`` settings
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
