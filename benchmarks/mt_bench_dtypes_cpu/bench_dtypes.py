"""fp32 and bf16 in one interleaved run: plain generate() in both dtypes, and the shipped checkpoints decoding
in bf16 with their bf16 calibration (and Hydra in fp32 with its fp32 one), on the same MT-Bench prompts.
Speedups are against plain fp32 generate() (the bench's reference) and against plain bf16 generate(); each
output is compared with plain generate() in its own dtype. With --strict, each family also decodes in bf16 with
strict verification (generate(strict=True), its calibration's strict half). Prints the table and the per-phase
profile, writes the JSON and the plot.

    python benchmarks/mt_bench_dtypes_cpu/bench_dtypes.py [--every 4] [--max-new-tokens 128] [--lookup] [--strict]
"""

from __future__ import annotations

import argparse
import time

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.hardware import describe_device
from cerberus_hf.real_models import load_named_model
from cerberus_hf.tools.bench import (DEFAULT_PROMPTS, Method, encode_prompts, load_bench_prompts, markdown_profile,
                                     markdown_table, run_methods, save_result)

FAMILIES = ("medusa", "cerberus", "hydra", "clover")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lookup", action="store_true", help="keep each calibration's prompt lookup (default off)")
    parser.add_argument("--strict", action="store_true", help="also each family in bf16 with strict verification")
    parser.add_argument("--json", default="benchmarks/mt_bench_dtypes_cpu/mt_bench_dtypes_cpu.json")
    parser.add_argument("--plot", default="benchmarks/mt_bench_dtypes_cpu/mt_bench_dtypes_cpu.png")
    args = parser.parse_args()

    bases = {dtype: load_named_model("smollm2-135m-instruct", getattr(torch, dtype))
             for dtype in ("float32", "bfloat16")}
    tokenizer = bases["float32"][1]
    call = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    lookup = {} if args.lookup else {"prompt_lookup_num_tokens": 0}
    outputs: dict[tuple[str, int], torch.Tensor] = {}  # (method, prompt) -> output, for identity per dtype

    def plain(dtype: str):
        base = bases[dtype][0]

        def run(ids):
            out = base.generate(ids, **call)
            outputs[(f"plain generate() {dtype}", prompt_of(ids))] = out
            return out, None
        return Method(f"plain generate() {dtype}" if dtype != "float32" else "plain generate()", run)

    def drafted(family: str, dtype: str, strict: bool = False):
        model = CerberusForCausalLM.from_pretrained(f"model_cards/{family}-smollm2-135m-instruct",
                                                    base_model=bases[dtype][0])
        name = f"{family}{' strict' if strict else ''} {dtype}"  # the dtype last: identity is checked in it

        def run(ids):
            out = model.generate(ids, **call, **lookup, strict=strict, profile=True)
            outputs[(name, prompt_of(ids))] = out
            return out, model.generation_stats
        settings = model.decoding_settings(model.device, getattr(torch, dtype), strict=strict)
        return Method(name, run), settings["calibration"], settings["tree_kind"]

    prompts = load_bench_prompts(args.prompts, args.limit, args.every)
    encoded = encode_prompts(tokenizer, prompts)
    index = {ids.data_ptr(): i for i, ids in enumerate(encoded)}

    def prompt_of(ids: torch.Tensor) -> int:
        return index.get(ids.data_ptr(), -1)

    methods, calibrations = [plain("float32"), plain("bfloat16")], {}
    runs = [(f, "bfloat16", False) for f in FAMILIES] + [(f, "bfloat16", True) for f in FAMILIES if args.strict]
    for family, dtype, strict in runs + [("hydra", "float32", False)]:
        method, key, kind = drafted(family, dtype, strict)
        methods.append(method)
        calibrations[method.name] = f"{key} ({kind} tree)"
    result = run_methods(methods, encoded, torch.device("cpu"))

    same_dtype = {}  # every method after plain fp32 names its dtype last
    for method in methods[1:]:
        plain_output = f"plain generate() {method.name.split()[-1]}"
        pairs = [(outputs[(method.name, i)], outputs[(plain_output, i)]) for i in range(len(encoded))]
        same_dtype[method.name] = sum(torch.equal(a, b) for a, b in pairs) / len(pairs)
    plain_bf16 = next(r for r in result["methods"] if r["method"] == "plain generate() bfloat16")
    result.update(machine=describe_device("cpu"), n_prompts=len(prompts), max_new_tokens=args.max_new_tokens,
                  lookup=args.lookup, calibrations=calibrations, identical_to_plain_same_dtype=same_dtype,
                  date=time.strftime("%Y-%m-%d"))
    print(f"{result['machine']}, {len(prompts)} prompts, {args.max_new_tokens} new tokens, greedy, lookup "
          f"{'as calibrated' if args.lookup else 'off'}; calibrations: {calibrations}\n")
    print(markdown_table(result))
    print("\nagainst plain bf16 generate() and identity in the method's own dtype:")
    print("| method | speedup over plain bf16 | identical to plain generate() in its dtype |\n|---|---|---|")
    for row in result["methods"][1:]:
        print(f"| {row['method']} | {row['tokens_per_s'] / plain_bf16['tokens_per_s']:.2f}x | "
              f"{same_dtype.get(row['method'], 1.0):.0%} |")
    print("\nmilliseconds per decoding step, by phase:")
    print(markdown_profile(result))
    save_result(result, args.json, args.plot)


if __name__ == "__main__":
    main()
