"""`cerberus-hf card`: measure a head checkpoint and write its model card from the numbers measured.

The card (``README.md`` in the Hub's model-card format, YAML metadata first) states the base, the
training data and cost (from ``training_metrics.json``, written by training), per-head accuracy on the
held-out split, and the mean accepted tokens per step (tau): measured here on a prompt file, or taken
with the speedups from a `cerberus-hf bench` JSON (``--bench``) that ran this checkpoint. Nothing in it is
typed by hand: every figure comes from a file or from this run, and the command lines are recorded.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData
from tqdm.auto import tqdm
from transformers import GenerationConfig

from ..errors import UserError
from . import arguments
from .bench import encode_prompts, load_bench_prompts, sum_per_head
from ..blocks.lookup import DEFAULT_MAX_NGRAM

TRAINING_METRICS = "training_metrics.json"
EVALUATION = "evaluation.json"


@torch.no_grad()
def evaluate_tau(model, tokenizer, prompts: list[str], max_new_tokens: int = 128, **generate_kwargs) -> dict:
    """Greedy-decode every prompt (chat template applied) and pool the decoding statistics."""
    totals = {"new_tokens": 0, "steps": 0, "draft_steps": 0, "gate_decisions": 0}
    proposed: list[list[int]] = []
    accepted: list[list[int]] = []
    for ids in tqdm(encode_prompts(tokenizer, prompts, model.device), desc="tau", unit="prompt"):
        model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
        stats = model.generation_stats
        for key in totals:
            totals[key] += getattr(stats, key)
        proposed.append(stats.proposed_per_head)
        accepted.append(stats.accepted_per_head)
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "runs": [{
            "configuration": "default settings",
            "tau": totals["new_tokens"] / totals["steps"],
            "draft_rate": totals["draft_steps"] / max(totals["gate_decisions"], 1),
            "head_acceptance": [a / p if p else 0.0 for a, p in zip(sum_per_head(accepted), sum_per_head(proposed))],
            **totals,
        }],
    }


def evaluation_from_bench(bench: dict, label: str) -> dict:
    """This checkpoint's rows of a `cerberus-hf bench` result (methods named ``label`` or ``label (...)``),
    without the per-prompt records, with the run's metadata."""
    if not isinstance(bench, dict) or not isinstance(bench.get("methods"), list) or not bench["methods"]:
        raise UserError("The bench result has no 'methods' rows: expected the file `cerberus-hf bench --heads FOLDER "
                        "--json BENCH.json` writes.")
    runs = []
    for row in bench["methods"]:
        if row["method"] == label or row["method"].startswith(label + " ("):
            configuration = row["method"][len(label):].strip(" ()") or "default settings"
            runs.append({"configuration": configuration, **{k: v for k, v in row.items() if k not in ("prompts", "method")}})
    if not runs:
        raise UserError(f"The bench result has no rows for {label!r}; it ran {[r['method'] for r in bench['methods']]}.")
    plain = bench["methods"][0]
    return {
        "prompts": bench.get("n_prompts"),
        "max_new_tokens": bench.get("max_new_tokens"),
        "prompts_file": Path(bench.get("prompts_file", "n/a")).name,
        "device": bench.get("device"),
        "dtype": bench.get("dtype"),
        "machine": bench.get("machine"),
        "date": bench.get("date"),
        "command": bench.get("command"),
        "plain_tokens_per_s": plain["tokens_per_s"],
        "runs": runs,
    }


# What a family's heads read besides the base's last hidden state, for the card's first sentence.
HEAD_READS = {
    "cerberus": "; head k also reads head k-1's state",
    "hydra": "; head k also reads the base's embeddings of the tokens drafted before it",
}


def _gate_text(settings: dict) -> str:
    threshold = settings.get("gate_threshold")
    if threshold is None:
        return ", no gate"
    if threshold <= 0:  # nothing is below 0: calibration found that drafting never pays there
        return ", gate never drafts (calibration found that drafting does not pay on this hardware)"
    return f", gate drafts while {settings.get('gate_signal')} < {threshold:.3f}"


def _cost_text(cost: dict) -> str:
    """The run's cost. A run resumed from a checkpoint reports the last process's wall time, which is not the run's:
    then the training time summed over its processes is what the card states."""
    device, wall = cost.get("device", "n/a"), cost.get("wall_time_s", 0)
    last, total = cost.get("train_time_s", 0), cost.get("train_time_s_total", cost.get("train_time_s", 0))
    if total > last + 1:
        return (f"- Cost: training {total / 60:.1f} min on {device}, over several processes (resumed from checkpoints; "
                f"the last ran {wall / 60:.1f} minutes), and ")
    return f"- Cost: {wall / 60:.1f} minutes on {device}, of which training {total / 60:.1f} min and "


def _continued_text(training: dict) -> list[str]:
    """A run that started from saved heads (``init_from``): the earlier runs behind them, and the whole."""
    earlier, runs = training.get("continued_from"), []
    while earlier:
        runs.append(earlier)
        earlier = earlier.get("continued_from")
    if not runs:
        return []
    minutes = [r["train_time_s"] / 60 for r in runs if r.get("train_time_s") is not None]
    cost = training.get("cost", {})
    total_minutes = cost.get("train_time_s_total", cost.get("train_time_s", 0)) / 60 + sum(minutes)
    parts = "; ".join(f"{r.get('steps', 'n/a')} steps ({r.get('epochs', 'n/a')} epoch(s)"
                      + (f", {r['train_time_s'] / 60:.1f} min" if r.get("train_time_s") is not None else "") + ")"
                      for r in reversed(runs))
    steps = training.get("steps", 0) + sum(r.get("steps") or 0 for r in runs)
    epochs = training.get("epochs", 0) + sum(r.get("epochs") or 0 for r in runs)
    return [f"- Continued from earlier training: {parts}, then this run; {steps} steps ({epochs:.2f} epochs) and "
            f"{total_minutes:.1f} min of training in all."]


def _cache_text(config, cost: dict) -> str:
    """What the run spent on the base's states, which earlier runs may have cached."""
    states = {"kangaroo": f"the base's layer-{config.exit_layer} states",
              "eagle3": f"the base's states entering layers {config.feature_layers}"}.get(config.head_type,
                                                                                          "the base's hidden states")
    if cost.get("cache_time_s", 0) >= 30:  # below that the run only read states an earlier run had written
        return f"caching {states} {cost['cache_time_s'] / 60:.1f} min."
    if config.head_type in ("kangaroo", "eagle3"):
        return f"none for {states} (read from the file an earlier run with the same base, layers and data wrote)."
    return (f"none for {states} (read from a cache built beforehand by `cerberus-hf train --data DATA --cache-only`, "
            "shared by every head type).")


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _title_and_summary(config) -> list[str]:
    """The card's title and first paragraph, which say what the drafter is made of."""
    head_type = config.head_type
    if head_type == "kangaroo":
        width = config.adapter_heads * config.adapter_head_dim
        return [f"# Kangaroo adapter for {config.base_model_name_or_path}", "",
                f"A Kangaroo self-drafter made with cerberus-hf: the base's first {config.exit_layer} layers, an "
                f"adapter (one attention layer, {config.adapter_heads} heads of {config.adapter_head_dim}, width "
                f"{width}, with its own KV cache) and the frozen base `lm_head`. It drafts a chain token by token, up "
                f"to {config.num_heads} tokens, ending early after a token drafted with probability below the exit "
                "confidence. It makes `generate()` faster without changing its output: the base verifies every "
                "drafted token."]
    if head_type == "eagle3":
        kv = config.adapter_kv_heads or config.adapter_heads
        return [f"# EAGLE-3 drafter for {config.base_model_name_or_path}", "",
                f"An EAGLE-3-class drafter made with cerberus-hf: the base's states entering layers "
                f"{config.feature_layers} fused by one linear map, one decoder layer (attention {config.adapter_heads} "
                f"heads of {config.adapter_head_dim}, {kv} key/value heads, with its own KV cache over the verified "
                "tokens; a SwiGLU MLP) run autoregressively over its own outputs, and the frozen base `lm_head`. It was "
                f"trained with training-time test over {config.num_heads} drafting steps and drafts up to "
                f"{config.num_heads} deep, as a chain or a tree. It makes `generate()` faster without changing its "
                "output: the base verifies every drafted token."]
    if head_type == "clover":
        width = config.adapter_heads * config.adapter_head_dim
        return [f"# Clover heads for {config.base_model_name_or_path}", "",
                f"{config.num_heads} Clover draft depths made with cerberus-hf. An augmenting block (one attention layer, "
                f"{config.adapter_heads} heads of {config.adapter_head_dim}, width {width}) reads the newest "
                f"{config.context_window} verified states, each mixed with the token that followed it; each later depth "
                "mixes the token drafted above it into a running state (Clover's regressive connection and attention "
                "decoder), and every depth projects through the frozen base `lm_head`. They make `generate()` faster "
                "without changing its output: the base verifies every drafted token."]
    prefix = ""
    if config.prefix_layer:
        prefix = (f" A prefix layer (Hydra++: one decoder layer, attention {config.adapter_heads} heads of "
                  f"{config.adapter_head_dim} and a SwiGLU MLP) reads the newest {config.context_window} verified "
                  "states and the heads read its output in place of the base's newest state.")
    return [f"# {head_type.capitalize()} heads for {config.base_model_name_or_path}", "",
            f"{config.num_heads} {head_type} draft heads ({config.num_layers} residual layer(s) each, projecting through "
            f"the frozen base `lm_head`{HEAD_READS.get(head_type, '')}), made with cerberus-hf.{prefix} They make "
            "`generate()` faster without changing its output: the base verifies every drafted token."]


def _settings_text(config, settings: dict) -> str:
    """One calibration's trees and gate in words: the default kind first, the others fitted beside it."""
    tree, dynamic = settings.get("draft_tree"), settings.get("dynamic_tree")
    static_text = f"static tree of {len(tree)} nodes `{tree}`" if tree else "chain"
    if config.head_type == "kangaroo":
        static_text = (f"drafts of up to {len(tree) if tree else config.num_heads} tokens, exit confidence "
                       f"{settings.get('exit_confidence', config.exit_confidence)}")
    dynamic_text = (f"dynamic tree of {dynamic['nodes']} nodes, {dynamic['depth']} deep, top-{dynamic['top_k']} "
                    "per level" if dynamic else None)
    if dynamic and "top_p" in dynamic:  # Clover's per-node budget
        dynamic_text += (f", each node's children within probability {dynamic['top_p']} and at least "
                         f"{dynamic['min_ratio']} times the most probable one")
    rescoring = settings.get("rescoring")
    rescored_text = (f"rescored tree of {rescoring['nodes']} nodes chosen among {rescoring['candidates']} guesses "
                     f"per depth with n-gram weight {rescoring['weight']}" if rescoring else None)
    texts = {"static": static_text, "dynamic": dynamic_text, "rescored": rescored_text}
    kind = settings.get("tree_kind") if texts.get(settings.get("tree_kind")) else "static"
    others = [text for name, text in texts.items() if name != kind and text]
    return texts[kind] + (f" (also fitted: {'; '.join(others)})" if others else "") + _gate_text(settings)


def card_data(config) -> ModelCardData:
    """The card's metadata, the fields the Hub reads (base model, library, task, tags, data), as huggingface_hub's
    ``ModelCardData``, which writes them as YAML the Hub parses (quoting a name where YAML needs it)."""
    return ModelCardData(base_model=config.base_model_name_or_path, library_name="cerberus-hf",
                         pipeline_tag="text-generation", tags=["speculative-decoding", "draft-heads", config.head_type],
                         datasets=["self-distillation"])


def _summary_lines(config, calibration: dict | None) -> list[str]:
    """The title, what the drafter is made of, the base it checks on load, its calibrations and how to load it."""
    lines = [
        *_title_and_summary(config),
        "",
        f"- Base: `{config.base_model_name_or_path}`"
        + (f", exactly `{config.base_model_source}`" if config.base_model_source else ""),
        f"- Shape checked on load: hidden size {config.hidden_size}, vocabulary {config.vocab_size}, "
        f"model type `{config.base_model_type}`",
    ]
    if config.draft_vocab_size:
        lines.append(f"- Drafting among the {config.draft_vocab_size} most frequent answer tokens of the training data "
                     f"(verification always uses all {config.vocab_size}, so output is unchanged)")
    for device, settings in (calibration or {}).items():
        lines.append(f"- Calibrated for `{device}` (used by default on the closest hardware): "
                     + _settings_text(config, settings))
        if "strict" in settings:
            lines.append(f"  - with `generate(strict=True)` (output bit-identical to plain `generate()` in this dtype; "
                         f"at most {settings['strict'].get('strict_rows')} positions a verification): "
                         + _settings_text(config, settings["strict"]))
    if config.prompt_lookup_num_tokens:
        lines.append(f"- Prompt lookup on by default: up to {config.prompt_lookup_num_tokens} tokens copied from the "
                     f"context after a repeated {config.max_matching_ngram_size or DEFAULT_MAX_NGRAM}-gram are grafted "
                     "into each draft (`generate(prompt_lookup_num_tokens=0)` switches it off)")
    return lines + [
        "",
        "The code that runs the heads is the `cerberus-hf` package's (`pip install cerberus-hf`); this repository "
        "holds stub modules that import it, and tokenizes with the base's own tokenizer.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        "model = AutoModelForCausalLM.from_pretrained(\"<this folder or repo>\", trust_remote_code=True)",
        "out = model.generate(input_ids, max_new_tokens=128)  # identical to the base's greedy output",
        "",
        "# or, with the base loaded already, transformers' custom_generate convention:",
        "out = base.generate(input_ids, max_new_tokens=128, custom_generate=\"<this folder or repo>\", trust_remote_code=True)",
        "```",
        "",
    ]


def _answer_modes(data: dict) -> str:
    """How the answers were decoded, from the count of sampled records (metrics before it was counted: both)."""
    sampled = data.get("sampled_records")
    if sampled is None:
        return "greedy, and sampled for a share of prompts"
    return f"greedy; {sampled} of the records sampled" if sampled else "greedy"


def _training_lines(config, training: dict) -> list[str]:
    """The ``## Training`` section: data, recipe, cost, earlier runs, and held-out accuracy per head."""
    data, cost, run = training.get("data", {}), training.get("cost", {}), training.get("config", {})
    lines = [
        "## Training",
        "",
        f"- Data: `{', '.join(Path(p).name for p in _as_list(data.get('path', 'n/a')))}`, the base model's own answers "
        f"({_answer_modes(data)}) to those files' prompts, none of them an MT-Bench question: "
        f"{data.get('records', 'n/a')} records, {data.get('held_out_records', 'n/a')} held out; "
        f"{data.get('train_positions', 'n/a')} training positions, {data.get('eval_positions', 'n/a')} held-out.",
        f"- Recipe: {training.get('epochs', 'n/a')} epoch(s), {training.get('steps', 'n/a')} steps; "
        + ", ".join(f"{k}={run[k]}" for k in ("lr", "batch_size", "batch_tokens", "warmup_ratio",
                                                  "head_weight_decay", "step_weight_decay", "distill_weight",
                                                  "projection_dtype",
                                                  "seed") if k in run),
        _cost_text(cost) + _cache_text(config, cost),
        *_continued_text(training),
        "",
    ]
    if training.get("top1"):
        lines += ["Held-out accuracy (the base's own next tokens):", "",
                  "| head | predicts | top-1 | top-5 |", "|---|---|---|---|"]
        rows = [(k if config.head_type != "eagle3" else f"depth {k}", f"token t+{k + 2}")
                for k in range(len(training["top1"]))]
        if config.head_type == "kangaroo":  # one adapter: the next token, from layer l's states up to it
            rows = [("adapter", f"the next token, from layer {config.exit_layer}")]
        for (name, predicts), top1, top5 in zip(rows, training["top1"], training["top5"]):
            lines.append(f"| {name} | {predicts} | {top1:.3f} | {top5:.3f} |")
        lines.append("")
    return lines


def _decoding_lines(evaluation: dict) -> list[str]:
    """The ``## Decoding`` section: how tau and the speedups were measured, one table row per configuration."""
    dtype = evaluation.get("dtype")
    reduced = dtype not in (None, "float32")  # greedy output is then compared with plain generate() in that dtype
    lines = ["## Decoding", "",
             "Greedy" + (f" in {dtype}" if reduced else "")
             + f", {evaluation['prompts']} prompts of `{evaluation.get('prompts_file', 'n/a')}` (first turn, "
             f"chat template), {evaluation['max_new_tokens']} new tokens, on {evaluation.get('device', 'n/a')}"
             + (f" ({evaluation['machine']})" if evaluation.get("machine") else "")
             + (f", plain generate() at {evaluation['plain_tokens_per_s']:.1f} tokens/s"
                if evaluation.get("plain_tokens_per_s") else "")
             + ". tau is the mean number of tokens per base forward pass (plain decoding: 1)."
             + (f" \"Identical to greedy\" compares with plain `generate()` in {dtype}, whose batched verification "
                "may round a near-tie differently; `generate(strict=True)` is identical." if reduced else ""),
             "",
             "| configuration | tau | gate draft rate | speedup vs plain generate() | identical to greedy | "
             "acceptance per head depth |",
             "|---|---|---|---|---|---|"]
    for run in evaluation["runs"]:
        lines.append(
            f"| {run['configuration']} | {run['tau']:.2f} | {run['draft_rate']:.0%} | "
            + (f"{run['speedup']:.2f}x" if run.get("speedup") is not None else "n/a") + " | "
            + (f"{run['identical']:.0%}" if run.get("identical") is not None else "n/a") + " | "
            + ", ".join(f"{a:.2f}" for a in run["head_acceptance"]) + " |")
    lines.append("")
    if evaluation.get("command"):
        lines += [f"Measured by `{evaluation['command']}`" + (f" on {evaluation['date']}" if evaluation.get("date")
                                                               else "") + ".", ""]
    return lines


def render_card(
    config, training: dict | None, evaluation: dict | None, command: str, calibration: dict | None = None
) -> str:
    """The README.md: huggingface_hub's ``ModelCard``, its metadata from `card_data`, its Markdown from the config,
    the stored calibration (the generation config's ``cerberus_calibration``) and the measured numbers."""
    lines = ["", *_summary_lines(config, calibration)]
    if training:
        lines += _training_lines(config, training)
    if evaluation:
        lines += _decoding_lines(evaluation)
    lines += ["## Provenance", "", f"Card written by `{command}` on {time.strftime('%Y-%m-%d')}.", ""]
    return str(ModelCard(f"---\n{card_data(config).to_yaml()}\n---\n" + "\n".join(lines)))


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("card", help="measure a head checkpoint and write its model card",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True, type=arguments.heads_folder, help="head checkpoint folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="measure tau here on this JSONL (a 'turns' list per line, e.g. MT-Bench)")
    source.add_argument("--bench", help="take tau and speedups from this `cerberus-hf bench --json` result")
    source.add_argument("--reuse-evaluation", action="store_true",
                        help=f"rewrite the card from the folder's {EVALUATION} instead of measuring again")
    parser.add_argument("--bench-label", help="the --bench rows to read, when the checkpoint was benched from another "
                                              "folder (default: 'HEAD_TYPE FOLDER_NAME', as bench names its rows)")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=128,
                        help="new tokens decoded per prompt where tau is measured (--prompts)")
    parser.add_argument("--limit", type=arguments.positive_int, default=None,
                        help="use the first N prompts of --prompts (default: all)")
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from ..configuration_cerberus import CerberusConfig

    folder = Path(args.heads)
    config = CerberusConfig.from_pretrained(folder)
    if args.reuse_evaluation:
        evaluation = _read_json(folder / EVALUATION)
    elif args.bench:
        label = args.bench_label or f"{config.head_type} {folder.name}"
        evaluation = evaluation_from_bench(_read_json(Path(args.bench)), label)
    else:
        from ..modeling_cerberus import CerberusForCausalLM
        from ..real_models import load_named_model

        prompts = load_bench_prompts(args.prompts, args.limit)  # before the models: a bad file fails fast
        base, tokenizer = load_named_model(config.base_model_source or config.base_model_name_or_path)
        model = CerberusForCausalLM.from_pretrained(folder, base_model=base)
        evaluation = evaluate_tau(model, tokenizer, prompts, args.max_new_tokens)
        evaluation.update(prompts_file=Path(args.prompts).name, device=str(model.device), date=time.strftime("%Y-%m-%d"),
                          settings=model.decoding_settings(calibrate=False), command=_command())
    (folder / EVALUATION).write_text(json.dumps(evaluation, indent=1))
    training_file = folder / TRAINING_METRICS
    training = _read_json(training_file) if training_file.is_file() else None
    calibration = getattr(GenerationConfig.from_pretrained(folder), "cerberus_calibration", None)
    (folder / "README.md").write_text(render_card(config, training, evaluation, _command(), calibration))
    taus = ", ".join(f"{run['configuration']}: {run['tau']:.2f}" for run in evaluation["runs"])
    print(f"tau ({taus}) over {evaluation['prompts']} prompts; card written to {folder / 'README.md'}")
    return 0


def _read_json(path: Path) -> dict:
    """A JSON file's object; a missing or malformed file is a one-line error naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not JSON ({getattr(error, 'msg', error)})") from None


def _command() -> str:
    return "cerberus-hf " + " ".join(shlex.quote(a) for a in sys.argv[1:])  # card, or make-heads running it
