"""`calibrate` (tree drafters) and `calibrate_chain` (chain drafters): collect the positions (the checkpoint's half,
`statistics`), measure this machine and fit (its half, `machine`), and store the chosen settings in the model's
generation config under its hardware key, the positions on the model (``calibration_statistics``)."""

from __future__ import annotations

from ..blocks.rescoring import Rescoring
from ..blocks.strict import check_strict_support, row_invariant_rows
from ..blocks.tree import DynamicTree
from ..errors import UserError
from ..hardware import HardwareKey, bf16_matmul, describe_device
from ..training.data import Record
from ..training.hidden_cache import split_record_ids
from .fit import rank_accuracy
from .machine import MeasurePlan, measure_and_fit
from .positions import collect_chain_positions, collect_positions
from .statistics import PositionStatistics

RESCORING_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


RESCORING_LM_WEIGHTS = (0.25, 0.5, 1.0)


# Clover's per-node budget as (top_p, min_ratio): its own (top-p 0.95, a quarter of the top-1) and two neighbours
DYNAMIC_BUDGETS = ((0.95, 0.25), (0.8, 0.25), (0.95, 0.1))


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
    probe = DynamicTree(nodes=dynamic_max_nodes, depth=model.config.num_heads, top_k=dynamic_top_k)
    probes = _rescoring_probes(model, probe, rescoring_weights, rescoring_lm_weights, rescoring_candidates)
    statistics = PositionStatistics([], top_k, max_nodes, probe, tuple(dynamic_budgets), tuple(probes))
    # drafted as decoding drafts (through packed weights where it packs), which the positions do not depend on
    statistics.records = collect_positions(model.decoding_view(strict, calibrate=False), sequences, top_k=top_k,
                                           dynamic=probe, rescorings=probes, budgets=statistics.budget_trees)
    if not statistics.records:
        raise UserError(f"the {len(sequences)} answer(s) calibration read are too short to draft after "
                        f"({model.config.num_heads} heads need answers longer than that): use more answers (--limit)")
    fitted = measure_and_fit(model, statistics, MeasurePlan(repeats=repeats), strict)
    key = _store_fitted(model, fitted.settings, strict, rows)
    if not strict:  # strict positions stop at the trees strict verification can verify
        model.calibration_statistics = statistics
    return {"strict": strict, "device": model.device.type, "key": str(key), "machine": describe_device(model.device),
            **fitted.report, "rank_accuracy": rank_accuracy(statistics.records, top_k),
            "positions": len(statistics.records)}


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


def _store_fitted(model, settings: dict, strict: bool, rows: int | None) -> HardwareKey:
    """Store what `calibrate` chose (`store_calibration`), with the lookup length the fit bounded by this machine's
    costs (`machine.lookup_tokens_worth`; none where the default is plain) and, for strict verification, how many
    positions it verifies."""
    if strict:
        settings["strict_rows"] = rows
    return store_calibration(model, settings, strict=strict)


def calibrate_chain(model, sequences: list[tuple[list[int], int]], repeats: int = 5) -> dict:
    """`calibrate` for a drafter that drafts its own chain (Kangaroo): the longest draft (at most
    ``num_heads``) and the early-exit confidence with the best expected tokens per second, then the gate
    (fitted at the chosen settings' mean step time; `machine.fit_chain`), stored as `calibrate` stores the heads'
    settings."""
    positions = collect_chain_positions(model.decoding_view(calibrate=False), sequences)
    if not positions:
        raise ValueError("No calibration position: the sequences are shorter than a draft.")
    statistics = PositionStatistics(positions)
    fitted = measure_and_fit(model, statistics, MeasurePlan(repeats=repeats))
    key = store_calibration(model, fitted.settings)
    model.calibration_statistics = statistics
    # depth k's acceptance: how often its draft is right where every draft above it was (what chains need)
    depth = model.config.num_heads
    reached = [[p for p in positions if all(p.hits[:k])] for k in range(depth)]
    hits = [sum(p.hits[k] for p in group) / len(group) if group else 0.0 for k, group in enumerate(reached)]
    return {"device": model.device.type, "key": str(key), "machine": describe_device(model.device), "kind": "chain",
            **fitted.report, "depth_acceptance": hits, "positions": len(positions)}


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
