"""What Kangaroo's verification from the exit layer saves on this machine: a Kangaroo checkpoint decoding
MT-Bench prompts with the shallow layers' work on each draft reused and recomputed, for several draft
lengths, interleaved with plain generate() in one run (gate and prompt lookup off). Prints the bench's
table and per-phase profile; writes the JSON and the plot.

    python benchmarks/kangaroo_reuse_cpu/kangaroo_reuse.py [--heads FOLDER] [--every 4] [--lengths 1 2 4] \
        [--exit-confidence 0.0]
"""

from __future__ import annotations

import argparse
import time

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.hardware import describe_device
from cerberus_hf.real_models import load_named_model
from cerberus_hf.tools.bench import (DEFAULT_PROMPTS, Method, build_methods, encode_prompts, load_bench_prompts,
                                     markdown_profile, markdown_table, run_methods, save_result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="model_cards/kangaroo-smollm2-135m-instruct")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--exit-confidence", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default="benchmarks/kangaroo_reuse_cpu/kangaroo_reuse_cpu.json")
    parser.add_argument("--plot", default="benchmarks/kangaroo_reuse_cpu/kangaroo_reuse_cpu.png")
    args = parser.parse_args()

    base, tokenizer = load_named_model("smollm2-135m-instruct", torch.float32)
    model = CerberusForCausalLM.from_pretrained(args.heads, base_model=base)
    methods = build_methods(base, {}, args.max_new_tokens)[:1]  # plain generate()
    for length in args.lengths:
        for reuse in (True, False):
            def run(ids, length=length, reuse=reuse):
                model.heads.reuse_shallow_layers = reuse
                out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, gate_threshold=None,
                                     prompt_lookup_num_tokens=0, draft_tree=[[0] * (d + 1) for d in range(length)],
                                     exit_confidence=args.exit_confidence, profile=True)
                return out, model.generation_stats

            label = "verify from the exit layer" if reuse else "recompute the shallow layers"
            methods.append(Method(f"kangaroo chain {length}, {label}", run))
    prompts = load_bench_prompts(args.prompts, args.limit, args.every)
    result = run_methods(methods, encode_prompts(tokenizer, prompts), base.device)
    result.update(machine=describe_device(base.device), n_prompts=len(prompts), max_new_tokens=args.max_new_tokens,
                  exit_confidence=args.exit_confidence, date=time.strftime("%Y-%m-%d"), heads=args.heads)
    print(f"{result['machine']}, float32, {len(prompts)} prompts, exit confidence {args.exit_confidence}\n")
    print(markdown_table(result))
    print("\nmilliseconds per decoding step, by phase:")
    print(markdown_profile(result))
    save_result(result, args.json, args.plot)


if __name__ == "__main__":
    main()
