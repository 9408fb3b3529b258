"""`cerberus-hf card`: measure a head checkpoint and write its model card from the numbers measured.

The card (``README.md`` in the Hub's model-card format, YAML metadata first) states the base, the
training data and cost (from ``training_metrics.json``, written by training), per-head accuracy on the
held-out split, and the mean accepted tokens per step (tau) measured here on a prompt file. Nothing in it
is typed by hand: every figure comes from a file or from this run, and the command line is recorded.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .bench import load_bench_prompts, sum_per_head

TRAINING_METRICS = "training_metrics.json"
EVALUATION = "evaluation.json"


@torch.no_grad()
def evaluate_tau(model, tokenizer, prompts: list[str], max_new_tokens: int = 128, **generate_kwargs) -> dict:
    """Greedy-decode every prompt (chat template applied) and pool the decoding statistics."""
    totals = {"new_tokens": 0, "steps": 0, "draft_steps": 0, "gate_decisions": 0}
    proposed: list[list[int]] = []
    accepted: list[list[int]] = []
    for prompt in tqdm(prompts, desc="tau", unit="prompt"):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt")["input_ids"].to(model.device)
        model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
        stats = model.generation_stats
        for key in totals:
            totals[key] += getattr(stats, key)
        proposed.append(stats.proposed_per_head)
        accepted.append(stats.accepted_per_head)
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "tau": totals["new_tokens"] / totals["steps"],
        "draft_rate": totals["draft_steps"] / max(totals["gate_decisions"], 1),
        "head_acceptance": [a / p if p else 0.0 for a, p in zip(sum_per_head(accepted), sum_per_head(proposed))],
        **totals,
    }


def render_card(config, training: dict | None, evaluation: dict | None, command: str) -> str:
    """Markdown with YAML front matter, from the config and the measured numbers."""
    head_type = config.head_type
    lines = [
        "---",
        f"base_model: {config.base_model_name_or_path}",
        "library_name: cerberus-hf",
        "pipeline_tag: text-generation",
        "tags:",
        "- speculative-decoding",
        "- draft-heads",
        f"- {head_type}",
        "datasets:",
        "- self-distillation",
        "---",
        "",
        f"# {head_type.capitalize()} heads for {config.base_model_name_or_path}",
        "",
        f"{config.num_heads} {head_type} draft heads ({config.num_layers} residual layer(s) each, projecting through "
        f"the frozen base `lm_head`), made with cerberus-hf. They make `generate()` faster without "
        "changing its output: the base verifies every drafted token.",
        "",
        f"- Base: `{config.base_model_name_or_path}`"
        + (f", exactly `{config.base_model_source}`" if config.base_model_source else ""),
        f"- Shape checked on load: hidden size {config.hidden_size}, vocabulary {config.vocab_size}, "
        f"model type `{config.base_model_type}`",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        "model = AutoModelForCausalLM.from_pretrained(\"<this folder or repo>\", trust_remote_code=True)",
        "out = model.generate(input_ids, max_new_tokens=128)  # identical to the base's greedy output",
        "```",
        "",
    ]
    if training:
        data, cost, run = training.get("data", {}), training.get("cost", {}), training.get("config", {})
        lines += [
            "## Training",
            "",
            f"- Data: `{Path(data.get('path', 'n/a')).name}`, the base model's own answers (greedy, and sampled for a "
            f"share of prompts) to a prompt set written for this project (no benchmark prompts): "
            f"{data.get('records', 'n/a')} records, {data.get('held_out_records', 'n/a')} held out; "
            f"{data.get('train_positions', 'n/a')} training positions, {data.get('eval_positions', 'n/a')} held-out.",
            f"- Recipe: {training.get('epochs', 'n/a')} epoch(s), {training.get('steps', 'n/a')} steps; "
            + ", ".join(f"{k}={run[k]}" for k in ("lr", "batch_size", "warmup_ratio", "head_weight_decay",
                                                      "distill_weight", "projection_dtype", "seed") if k in run),
            f"- Cost: {cost.get('wall_time_s', 0) / 60:.1f} minutes on {cost.get('device', 'n/a')}, of which "
            f"training {cost.get('train_time_s_total', cost.get('train_time_s', 0)) / 60:.1f} min and "
            + (f"caching the base's hidden states {cost['cache_time_s'] / 60:.1f} min."
               if cost.get("cache_time_s", 0) >= 1 else
               "none for the base's hidden states (read from a cache built beforehand by "
               "`cerberus-hf train --cache-only`, shared by both head types)."),
            "",
        ]
        if training.get("top1"):
            lines += ["Held-out accuracy (the base's own next tokens):", "",
                      "| head | predicts | top-1 | top-5 |", "|---|---|---|---|"]
            for k, (top1, top5) in enumerate(zip(training["top1"], training["top5"])):
                lines.append(f"| {k} | token t+{k + 2} | {top1:.3f} | {top5:.3f} |")
            lines.append("")
    if evaluation:
        lines += ["## Decoding", "",
                  f"Greedy, {evaluation['prompts']} prompts of `{evaluation.get('prompts_file', 'n/a')}` (first turn, "
                  f"chat template), {evaluation['max_new_tokens']} new tokens, on {evaluation.get('device', 'n/a')}, "
                  f"{evaluation.get('settings', 'default settings')}:",
                  "",
                  f"- mean accepted tokens per base forward (tau): **{evaluation['tau']:.2f}** "
                  f"({evaluation['new_tokens']} tokens in {evaluation['steps']} forwards)",
                  f"- gate draft rate: {evaluation['draft_rate']:.0%}",
                  "- acceptance per head depth: "
                  + ", ".join(f"{a:.2f}" for a in evaluation["head_acceptance"]),
                  ""]
    lines += ["## Provenance", "", f"Written by `{command}` on {time.strftime('%Y-%m-%d')}.", ""]
    return "\n".join(lines)


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("card", help="measure a head checkpoint and write its model card")
    parser.add_argument("--heads", required=True, help="head checkpoint folder")
    parser.add_argument("--prompts", required=True, help="JSONL with a 'turns' list per line (e.g. MT-Bench)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--reuse-evaluation", action="store_true",
                        help=f"rewrite the card from the folder's {EVALUATION} instead of measuring again")
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from .modeling_cerberus import CerberusForCausalLM
    from .real_models import load_packaged_model

    folder = Path(args.heads)
    base, tokenizer = load_packaged_model()
    model = CerberusForCausalLM.from_pretrained(folder, base_model=base)
    if args.reuse_evaluation:
        evaluation = json.loads((folder / EVALUATION).read_text())
    else:
        prompts = load_bench_prompts(args.prompts, args.limit)
        evaluation = evaluate_tau(model, tokenizer, prompts, args.max_new_tokens)
        evaluation.update(prompts_file=Path(args.prompts).name, device=str(model.device),
                          settings=json.dumps(model.decoding_settings()), command=_command())
        (folder / EVALUATION).write_text(json.dumps(evaluation, indent=1))
    training_file = folder / TRAINING_METRICS
    training = json.loads(training_file.read_text()) if training_file.is_file() else None
    command = evaluation.get("command") or _command()
    (folder / "README.md").write_text(render_card(model.config, training, evaluation, command))
    print(f"tau {evaluation['tau']:.2f} over {evaluation['prompts']} prompts; card written to {folder / 'README.md'}")
    return 0


def _command() -> str:
    return "cerberus-hf card " + " ".join(shlex.quote(a) for a in sys.argv[2:] if a != "--reuse-evaluation")
