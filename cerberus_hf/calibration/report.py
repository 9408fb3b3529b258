"""Calibration reports as text: what was measured and chosen, for a person to read."""

from __future__ import annotations

from ..blocks.ngram import NGRAM_COMMAND
from .machine import DRAFT_GAIN_MARGIN, PACKING_NAMES


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
             f"{report['dynamic_draft_seconds'] * 1e3:.1f} ms (dynamic), the first head alone "
             f"{report['gate_seconds']['head_entropy'] * 1e3:.1f} ms (what a head-entropy gate costs a gated step); "
             f"default: {report['settings']['tree_kind']}",
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
    packing = report.get("packing")
    return ["cost of one forward with n new tokens, relative to n = 1"
            + (" (packed weights):" if report.get("packed_weights") else ":"),
            "| n | " + " | ".join(str(n) for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
            "| cost | " + " | ".join(f"{rel[n]:.2f}" for n in sizes) + " |",
            *(["linear layers (tokens/s, modelled): "
               + ", ".join(f"{way} {speed:.1f}" for way, speed in packing.items())
               + f"; kept: {PACKING_NAMES[report['packed_weights']]}"] if packing else []),
            *([f"no draft is expected to beat a plain step here by {DRAFT_GAIN_MARGIN - 1:.0%} (the best modelled: "
               f"{report.get('expected_gain', 0.0):.2f}x): the default decodes plain (gate_threshold 0)"]
              if report.get("plain") else [])]


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
        return [f"rescored tree: no rescorer beside the heads (count an n-gram model with `{NGRAM_COMMAND}`, or "
                "give a Kangaroo checkpoint as --rescorer)"]
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
