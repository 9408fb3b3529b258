"""`cerberus-hf divergence`: how often, and where, output in reduced precision departs from plain generate().

In float32 drafted output equals plain greedy `generate()` token for token (the tests check it on every
architecture). In bf16 or fp16 that promise cannot be taken for granted: verifying k tokens in one
forward rounds differently from k one-token forwards, so where the base's top two logits are nearly tied
the argmax can flip, and from there the texts differ. Plain `generate()` is not shape-stable either: the
same prompt in a left-padded batch of two rounds differently again. This command measures both side by
side, per prompt and greedy:

* each method's output against plain `generate()` in the same dtype: identical or not, and the index of
  the first new token that differs;
* plain `generate()` with the prompt batched (left-padded) beside the next prompt: the base's own
  instability under a change of shape, the yardstick for the rows above;
* with ``--reference-dtype float32``, every output against plain float32 `generate()`: whether quality
  moves (identical share, and mean new tokens before the first departure);
* "drafting off" (the loop with the gate closed): the loop itself, without any verification of drafts;
* with ``--strict``, each checkpoint again with strict verification (`blocks.strict`), which is built to be
  identical to plain `generate()` in any dtype.

It prints a table, writes every per-prompt figure as JSON and plots the identical shares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import arguments

BATCHED = "plain generate(), batched with another prompt"
PLAIN = "plain generate()"
DRAFTING_OFF = "drafting off (gate closed)"


def first_difference(new: torch.Tensor, reference: torch.Tensor) -> int | None:
    """Index of the first new token where ``new`` and ``reference`` (1-D) differ, None when equal; a
    sequence that stops early differs where the other goes on."""
    n = min(len(new), len(reference))
    unequal = (new[:n] != reference[:n]).nonzero()
    if len(unequal):
        return int(unequal[0])
    return None if len(new) == len(reference) else n


def batched_continuation(base, ids: torch.Tensor, other: torch.Tensor, max_new_tokens: int, pad_id: int) -> torch.Tensor:
    """The new tokens of ``ids`` when generated in a left-padded batch beside ``other`` (cut after EOS as a
    lone call would stop)."""
    width = max(ids.shape[1], other.shape[1])
    rows, masks = [], []
    for row in (ids, other):
        pad = width - row.shape[1]
        rows.append(torch.cat([torch.full((1, pad), pad_id, dtype=row.dtype, device=row.device), row], dim=1))
        masks.append(torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, row.shape[1], dtype=torch.long)],
                               dim=1).to(row.device))
    out = base.generate(torch.cat(rows), attention_mask=torch.cat(masks), max_new_tokens=max_new_tokens,
                        do_sample=False, pad_token_id=pad_id)
    new = out[0, width:]
    eos = base.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    ends = [i for i, token in enumerate(new.tolist()) if token in eos]
    return new[: ends[0] + 1] if ends else new


def run_divergence(base, head_models: dict, encoded: list[torch.Tensor], max_new_tokens: int, pad_id: int,
                   reference_base=None, strict: bool = False) -> dict:
    """Per-prompt records and per-method summaries (see the module docstring); ``reference_base`` is the
    same base in another dtype (float32) to compare quality against; ``strict`` adds each checkpoint with
    ``generate(strict=True)``."""
    records: dict[str, list[dict]] = {PLAIN: [], BATCHED: []}
    call = {"max_new_tokens": max_new_tokens, "do_sample": False}
    for index, ids in enumerate(tqdm(encoded, desc="divergence", unit="prompt")):
        plain = base.generate(ids, **call)[0, ids.shape[1]:]
        reference = reference_base.generate(ids, **call)[0, ids.shape[1]:] if reference_base is not None else None
        outputs = {PLAIN: plain, BATCHED: batched_continuation(base, ids, encoded[(index + 1) % len(encoded)],
                                                                max_new_tokens, pad_id)}
        steps = {}
        for label, model in head_models.items():
            for strictly in ((False, True) if strict else (False,)):
                name = f"{label}, strict" if strictly else label
                outputs[name] = model.generate(ids, strict=strictly, **call)[0, ids.shape[1]:]
                steps[name] = model.generation_stats.steps
        if head_models:
            any_model = next(iter(head_models.values()))
            outputs[DRAFTING_OFF] = any_model.generate(ids, gate_threshold=float("-inf"), prompt_lookup_num_tokens=0,
                                                       **call)[0, ids.shape[1]:]
        for label, new in outputs.items():
            record = {"prompt": index, "new_tokens": len(new), "steps": steps.get(label),
                      "departs_at": first_difference(new, plain)}
            if reference is not None:
                record["departs_from_reference_at"] = first_difference(new, reference)
            records.setdefault(label, []).append(record)
    return {"methods": [summarize(label, recs) for label, recs in records.items()]}


def summarize(label: str, records: list[dict]) -> dict:
    """Identical shares and departure points of one method's records."""
    departs = [r["departs_at"] for r in records if r["departs_at"] is not None]
    drafted = all(r.get("steps") for r in records)
    row = {"method": label, "prompts": records,
           "tau": sum(r["new_tokens"] for r in records) / sum(r["steps"] for r in records) if drafted else None,
           "identical": 1 - len(departs) / len(records),
           "median_departure": float(torch.tensor(departs, dtype=torch.float).median()) if departs else None}
    if records and "departs_from_reference_at" in records[0]:
        to_reference = [r["departs_from_reference_at"] for r in records]
        row["identical_to_reference"] = sum(d is None for d in to_reference) / len(records)
        row["tokens_before_reference_departure"] = sum(
            r["new_tokens"] if d is None else d for r, d in zip(records, to_reference)) / len(records)
    return row


def markdown_table(result: dict) -> str:
    dtype, reference = result["dtype"], result.get("reference_dtype")
    header = f"| method | tau | identical to plain {dtype} generate() | median first differing new token |"
    lines = [header + (f" identical to plain {reference} | new tokens before departing from {reference} |"
                       if reference else ""),
             "|---|---|---|---|" + ("---|---|" if reference else "")]
    for row in result["methods"]:
        median = "" if row["median_departure"] is None else f"{row['median_departure']:.0f}"
        tau = "" if row["tau"] is None else f"{row['tau']:.2f}"
        line = f"| {row['method']} | {tau} | {row['identical']:.0%} | {median} |"
        if reference:
            line += f" {row['identical_to_reference']:.0%} | {row['tokens_before_reference_departure']:.1f} |"
        lines.append(line)
    return "\n".join(lines)


def save_plot(result: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["methods"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    ax.barh([r["method"] for r in rows], [r["identical"] for r in rows], label=f"identical to plain {result['dtype']}")
    if result.get("reference_dtype"):
        ax.barh([r["method"] for r in rows], [r["identical_to_reference"] for r in rows], height=0.4,
                label=f"identical to plain {result['reference_dtype']}")
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of prompts with identical greedy output ({result['n_prompts']} prompts, "
                  f"{result['max_new_tokens']} new tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("divergence", help="measure where reduced precision changes greedy output "
                                                      "(drafted and plain, against plain and against float32)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", action="append", default=[], type=arguments.heads_source,
                        help="head checkpoint folder or Hub id (repeatable)")
    parser.add_argument("--prompts", required=True, help="JSONL with a 'turns' list (or a 'prompt') per line")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"),
                        help="the reduced precision measured: every method decodes in it")
    parser.add_argument("--reference-dtype", default="float32", choices=("float32", "none"),
                        help="also compare every output with plain generate() in this dtype ('none': skip)")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=128,
                        help="new tokens each method decodes per prompt")
    parser.add_argument("--limit", type=arguments.positive_int, default=None,
                        help="use the first N prompts (default: all)")
    parser.add_argument("--every", type=arguments.positive_int, default=1, help="use every N-th prompt, before --limit")
    arguments.add_model_option(parser)
    parser.add_argument("--device", default="cpu", type=arguments.device, help="where the base and the heads run")
    parser.add_argument("--strict", action="store_true", help="also run each checkpoint with strict verification")
    parser.add_argument("--json", default=None, type=arguments.output_file, help="write every per-prompt figure here")
    parser.add_argument("--plot", default=None, type=arguments.output_file, help="save a PNG plot here")
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from ..hardware import describe_device
    from ..modeling_cerberus import CerberusForCausalLM
    from ..real_models import load_named_model
    from .bench import encode_prompts, load_bench_prompts

    prompts = load_bench_prompts(args.prompts, args.limit, args.every)  # before the models: a bad file fails fast
    base, tokenizer = load_named_model(args.base, dtype=getattr(torch, args.dtype))
    base.to(args.device)
    reference = None
    if args.reference_dtype != "none" and args.reference_dtype != args.dtype:
        reference, _ = load_named_model(args.base, dtype=getattr(torch, args.reference_dtype), with_tokenizer=False)
        reference.to(args.device)
    head_models = {}
    for path in args.heads:
        model = CerberusForCausalLM.from_pretrained(path, base_model=base)
        head_models[f"{model.config.head_type} {Path(path).name}"] = model
    encoded = encode_prompts(tokenizer, prompts, base.device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    result = run_divergence(base, head_models, encoded, args.max_new_tokens, pad_id, reference, strict=args.strict)
    result.update(dtype=args.dtype, reference_dtype=None if reference is None else args.reference_dtype,
                  n_prompts=len(prompts), max_new_tokens=args.max_new_tokens, prompts_file=args.prompts,
                  date=time.strftime("%Y-%m-%d"), machine=describe_device(base.device),
                  command="cerberus-hf " + " ".join(sys.argv[1:]),
                  calibrations={label: model.decoding_settings()["calibration"] for label, model in head_models.items()})
    print(f"{result['machine']}, {args.dtype}, greedy, {len(prompts)} prompts, {args.max_new_tokens} new tokens; "
          f"calibration used: {result['calibrations'] or 'no heads'}\n")
    print(markdown_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        save_plot(result, args.plot)
    return 0
