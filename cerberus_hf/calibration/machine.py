"""The half of a calibration that belongs to the machine: what verifying n tokens, drafting and the gate cost here,
and the settings fitted from those costs and a checkpoint's `PositionStatistics`.

`measure_and_fit` measures the model as decoding runs it: on a CPU that packs the dtype's weights (`blocks.packed`),
with packed weights, with packed weights but one row through the weight as it is, and through the base's own linear
layers, and keeps whichever fits the faster settings (``"packed_weights"`` in the entry where that is not packed:
``"multi-row"`` or ``False``; `decoding_view` honours it). Where no tree is expected to beat a plain step by
`DRAFT_GAIN_MARGIN`, the default is plain decoding (`plain_by_default`), and prompt lookup copies only as many
tokens as verify cheaply here (`lookup_tokens_worth`). `calibrate` runs it with every repeat a person asked for;
first use (`calibration.first_use`) with a `MeasurePlan` bounded in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers.utils import logging

from ..blocks.packed import ONE_ROW_AS_IS, packing_available
from ..blocks.rescoring import Rescoring
from ..blocks.settings import resolve_settings, stored_settings
from ..blocks.tree import DynamicTree
from .fit import build_tree, dynamic_accepted, fit_dynamic_tree, fit_gate, static_accepted, walk
from .measure import measure_chain_steps, measure_cost_curves, measure_draft_time, measure_gate_time, step_builder
from .positions import PositionRecord
from .statistics import PositionStatistics

logger = logging.get_logger(__name__)
EXIT_CONFIDENCES = tuple(i / 10 for i in range(10))  # a chain drafter's early exits tried
# The most the copied tokens (prompt lookup) of one step may add to its verification, as a share of a one-token
# forward. Copied tokens come with no statistics of their own (the calibration positions hold ranks, not text), so
# they are bounded by cost alone: cheap rows (AVX-512 or AMX in fp32, a GPU) take all the configured ones, rows that
# each cost a third of a step (bf16 without bf16 kernels) one or none, where five made decoding 0.72x plain.
LOOKUP_COST_BUDGET = 0.5
# The modelled gain over a plain step below which the default decodes plain. The fit models a step as its forward, its
# drafting and its gate, not the loop's own work (acceptance, committing the cache, Python), which takes a few percent
# of a small base's step: bf16 fits on an AVX2-only CPU expecting 1.05-1.09x decoded at 0.96-1.00x plain `generate()`.
DRAFT_GAIN_MARGIN = 1.1
# A one-row product through the weight as it is is kept where a one-token forward is at least this much faster that
# way than packed; a smaller difference is within a measurement's noise (`one_row_curve`).
ONE_ROW_MARGIN = 0.97
PACKING_NAMES = {True: "packed", ONE_ROW_AS_IS: "packed, one row as it is", False: "unpacked"}  # in the report
# Raised when a fit would choose otherwise from the same measurements: a first-use entry of an older fit is measured
# again (`first_use.CalibrationCache`). 2: copied tokens bounded by cost, `DRAFT_GAIN_MARGIN`; 3: `ONE_ROW_AS_IS`.
FIT_VERSION = 3


@dataclass(frozen=True)
class MeasurePlan:
    """How much to measure: passes over the cost curve's sizes (and a chain drafter's step lengths), repeats of each
    drafting and gate timing, and about how many seconds all of it may take (None: as long as the repeats take;
    else fewer sizes and passes, `measure.measure_cost_curve`)."""

    repeats: int = 5
    draft_repeats: int = 20
    seconds: float | None = None


@dataclass
class Fitted:
    """What a fit chose for one way of running the model: the entry's settings, the modelled tokens per second with
    them and with plain decoding, the measured costs and the fit's report (`calibrate`'s)."""

    settings: dict
    tokens_per_s: float
    plain_tokens_per_s: float
    report: dict


def _uses(settings: Rescoring) -> tuple[bool, bool]:
    """Which rescorers ``settings`` weighs: (the n-gram, the LM)."""
    return settings.weight > 0, settings.lm_weight > 0


@dataclass
class Timings:
    """What calibration measures on the device: the verification cost curve, the drafting times and the gate's."""

    cost: dict[int, float]  # seconds of a forward over n tokens
    draft: float  # drafting the static tree's chain through every head
    dynamic: float  # drafting the dynamic probe tree
    gates: dict[str, float]  # what a gated step pays, per signal
    rescored: dict[tuple[bool, bool], float]  # drafting a rescored tree, per combination of rescorers in use

    @classmethod
    def measure(cls, model, cost: dict[int, float], plan: MeasurePlan, probe: DynamicTree,
                probes: list[Rescoring]) -> Timings:
        """The drafting and gate timings of ``model`` beside its measured ``cost`` curve."""
        steps = step_builder(model)  # one step's drafting inputs, built once for every timing below
        draft = measure_draft_time(model, repeats=plan.draft_repeats, steps=steps)
        dynamic = measure_draft_time(model, repeats=plan.draft_repeats, dynamic=probe, steps=steps)
        # a gated step pays for the first head's guesses
        gates = {"head_entropy": measure_gate_time(model, repeats=plan.draft_repeats, steps=steps)}
        rescored = {}
        for settings in probes:
            if _uses(settings) not in rescored:
                rescored[_uses(settings)] = measure_draft_time(model, repeats=plan.draft_repeats, dynamic=settings,
                                                               steps=steps)
        return cls(cost, draft, dynamic, gates, rescored)


def measure_and_fit(model, statistics: PositionStatistics, plan: MeasurePlan, strict: bool = False) -> Fitted:
    """The settings fitted to ``statistics`` and this machine's costs for ``model`` (`fit_tree` or `fit_chain`):
    measured on each way decoding may run its linear layers here (packed, packed but one row as it is, and unpacked
    on a CPU that packs this dtype; strict verification never packs; their cost curves interleaved, so that they
    compare), the faster kept (``"packed_weights"`` in the entry where that is not packed), and plain decoding by
    default where no tree pays (`plain_by_default`). The cost curves take most of a bounded ``plan``: drafting
    timings take milliseconds."""
    packable = not strict and packing_available(model.device, model.base.dtype)
    packings = [True, False, ONE_ROW_AS_IS] if packable else [False]  # the last timed at one token only
    views = dict(zip(packings, (model.decoding_view(strict, packed_weights=packing) for packing in packings)))
    longest = model.config.num_heads if statistics.chains else max(statistics.max_nodes, statistics.probe.nodes)
    lookup = model.config.prompt_lookup_num_tokens or 0
    costs = dict(zip(packings, measure_cost_curves(
        [view.base for view in views.values()], max_tokens=longest + 1 + lookup, repeats=plan.repeats, strict=strict,
        seconds=plan.seconds * 0.8 if plan.seconds is not None else None, one_token_only=1 if packable else 0)))
    if packable:  # first where it is kept: a step that drafts nothing is cheaper that way, whatever the fit models
        one_row = one_row_curve(costs.pop(ONE_ROW_AS_IS), costs[True])
        costs = {ONE_ROW_AS_IS: one_row, **costs} if one_row is not None else costs
    fits = {}
    for packing, cost in costs.items():
        fits[packing] = (fit_chain if statistics.chains else fit_tree)(views[packing], statistics, cost, plan)
        fits[packing].report["packed_weights"] = packing
    packing = max(fits, key=lambda p: fits[p].tokens_per_s)
    fitted = fits[packing]
    if packable:
        fitted.report["packing"] = {PACKING_NAMES[p]: fits[p].tokens_per_s for p in fits}
        if packing is not True:
            fitted.settings["packed_weights"] = packing
    plain_by_default(fitted, f"{model.device.type} in {str(model.base.dtype).removeprefix('torch.')}")
    if not fitted.report["plain"]:
        cost = costs[packing]
        # the positions a drafted step of the fitted settings verifies, before copied tokens are grafted
        heads = model.config.num_heads
        drafted = resolve_settings(stored_settings(fitted.settings, model.config), heads, lookup_tokens=0)
        rows = drafted.most_positions(heads)
        fitted.settings["prompt_lookup_num_tokens"] = lookup_tokens_worth(cost, rows, lookup)
        fitted.report["lookup_tokens"] = {"configured": lookup, "kept": fitted.settings["prompt_lookup_num_tokens"]}
    return fitted


def one_row_curve(as_is: dict[int, float], packed: dict[int, float]) -> dict[int, float] | None:
    """The cost curve of packed weights with one row through the weight as it is (`blocks.packed.ONE_ROW_AS_IS`):
    the ``packed`` curve with the one-token forward measured that way (``as_is``, timed at one token only: its
    forwards over several rows are the packed ones), where that is `ONE_ROW_MARGIN` faster; else None."""
    return {**packed, 1: as_is[1]} if as_is[1] < ONE_ROW_MARGIN * packed[1] else None


def lookup_tokens_worth(cost: dict[int, float], rows: int, configured: int) -> int:
    """How many of the ``configured`` copied tokens of prompt lookup a step may graft under the verification ``cost``
    curve (seconds by positions): the most whose extra positions cost at most `LOOKUP_COST_BUDGET` of a one-token
    forward, on a step the gate keeps from drafting (the root alone) and on a drafted one (``rows`` positions)."""
    tokens = configured
    while tokens and max(cost[n + tokens] - cost[n] for n in (1, rows)) > LOOKUP_COST_BUDGET * cost[1]:
        tokens -= 1
    return tokens


def plain_by_default(fitted: Fitted, where: str) -> None:
    """Where drafting is not expected to gain `DRAFT_GAIN_MARGIN` over a plain step (a gate fitted never to draft
    models at most a plain step's speed, so this covers it too), make the entry plain decoding: gate threshold 0, no
    prompt lookup either (it drafts whatever the gate says), and say so. The report keeps the modelled gain
    (``"expected_gain"``)."""
    settings = fitted.settings
    gain = fitted.tokens_per_s / fitted.plain_tokens_per_s
    fitted.report["expected_gain"] = gain
    fitted.report["plain"] = gain < DRAFT_GAIN_MARGIN
    if fitted.report["plain"]:
        settings["gate_threshold"] = 0.0
        settings["prompt_lookup_num_tokens"] = 0
        fitted.tokens_per_s = fitted.plain_tokens_per_s
        logger.warning(f"cerberus-hf: on this {where}, no draft is expected to beat a plain step "
                       f"({fitted.plain_tokens_per_s:.1f} tokens/s) by {DRAFT_GAIN_MARGIN - 1:.0%} (the best "
                       f"modelled: {gain:.2f}x): the default decodes plain (gate_threshold 0).")


def fit_tree(model, statistics: PositionStatistics, cost: dict[int, float], plan: MeasurePlan) -> Fitted:
    """A tree drafter's settings for its verification ``cost`` curve: measure drafting here (`Timings`), fit the
    static, dynamic (with each per-node budget) and rescored trees to the records, take the kind with the highest
    expected tokens per second as the default, then fit the gate to it. Rescored trees whose rescorers ``model``
    lacks are left out."""
    records, probe, max_nodes = statistics.records, statistics.probe, statistics.max_nodes
    probes = [settings for settings in statistics.rescorings if model.has_rescorers(settings)]
    timings = Timings.measure(model, cost, plan, probe, probes)
    paths, best, table = build_tree(records, cost, timings.draft, max_nodes=max_nodes)
    dynamic = _DynamicFit.fit(records, timings, probe, statistics.budget_trees, probe.nodes)
    expected = {"static": best["tokens_per_s"], "dynamic": dynamic.best["tokens_per_s"]}
    rescored = _RescoredFit.fit(model, records, timings, probes, probe.nodes) if probes else None
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
    report = {"settings": settings, "expected": best, "tree_sizes": table, "dynamic_expected": dynamic.best,
              "dynamic_tree_sizes": dynamic.table, "dynamic_draft_seconds": timings.dynamic,
              "gate_seconds": timings.gates, "dynamic_budgets": dynamic.by_budget(),
              "rescoring": rescored.report if rescored is not None else None, "gate": gate,
              "cost_curve_seconds": cost, "relative_cost": {n: t / cost[1] for n, t in cost.items()},
              "draft_seconds": timings.draft}
    return Fitted(settings, _gate_tokens_per_s(gate, settings), 1.0 / cost[1], report)


def fit_chain(model, statistics: PositionStatistics, cost: dict[int, float], plan: MeasurePlan) -> Fitted:
    """A chain drafter's (Kangaroo's) settings for its verification ``cost`` curve: measure its steps here, then
    take the longest draft (at most ``num_heads``) and the early-exit confidence with the best expected tokens per
    second, and fit the gate (at the chosen settings' mean step time). Confidences tried: `EXIT_CONFIDENCES`."""
    depth, positions = model.config.num_heads, statistics.records
    steps = measure_chain_steps(model, repeats=plan.repeats)
    options = [(length, confidence) for length in range(1, depth + 1) for confidence in EXIT_CONFIDENCES]
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
    report = {"settings": settings, "expected": {k: v for k, v in best.items() if k != "accepted"},
              "chains": [{k: v for k, v in row.items() if k != "accepted"} for row in table], "gate": gate,
              "cost_curve_seconds": cost, "relative_cost": {n: t / cost[1] for n, t in cost.items()},
              "chain_step_seconds": steps}
    return Fitted(settings, _gate_tokens_per_s(gate, settings), 1.0 / cost[1], report)


def _chosen_gate(gate: dict) -> dict:
    """The gate signal with the best modelled throughput and its threshold (None: always draft)."""
    signal = max(gate["signals"], key=lambda name: gate["signals"][name]["tokens_per_s"])
    threshold = gate["signals"][signal]["threshold"]
    return {"gate_signal": signal, "gate_threshold": None if threshold == float("inf") else threshold}


def _gate_tokens_per_s(gate: dict, settings: dict) -> float:
    """The modelled tokens per second of the chosen gate (plain steps included where it keeps from drafting)."""
    return gate["signals"][settings["gate_signal"]]["tokens_per_s"]


@dataclass
class _DynamicFit:
    """The dynamic tree's size, fitted without and with each per-node budget; the budget kept is the best one's."""

    fits: dict  # (top_p, min_ratio), or None for no budget: (best size's row, every size's rows)
    budget: tuple[float, float] | None
    tree: DynamicTree
    best: dict
    table: list

    @classmethod
    def fit(cls, records: list[PositionRecord], timings: Timings, probe: DynamicTree, budgets: list[DynamicTree],
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
    def fit(cls, model, records: list[PositionRecord], timings: Timings, probes: list[Rescoring],
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


def _rescoring_report(model, records: list[PositionRecord], timings: Timings, fits: dict,
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
