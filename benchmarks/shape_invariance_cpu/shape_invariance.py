"""Does a position's result depend on how many positions one forward computes? The question behind exactness in
reduced precision.

Drafted decoding verifies n tokens in one forward of the base; plain generate() computes one token per forward.
The output can be bit-identical to plain generate() only where each position's logits come out the same either
way, and where they do not, the argmax can flip at a near tie. Per dtype, on this machine:

1. one linear layer of the base's shapes: each row of ``x @ W.T`` computed in a batch of M rows, against the
   same row computed alone (rows that differ bitwise, largest difference);
2. the whole base (SmolLM2-135M-Instruct), after each of the first MT-Bench prompts, over its own greedy
   continuation in that dtype: the logits at every position when the continuation is fed in chunks of n
   tokens (each chunk one cached forward, as verification feeds a draft), against feeding it one token per
   forward (as plain generate() does): positions whose logits differ bitwise, the largest difference, and
   positions whose argmax differs;
3. the same with strict verification (`cerberus_hf.blocks.strict`: each position's attention computed as a
   one-token forward computes it), in chunks no taller than the base's row-invariant height on this machine
   (`row_invariant_rows`, printed per dtype; a height of 1 leaves nothing to compare).

    python benchmarks/shape_invariance_cpu/shape_invariance.py [--prompts 8] [--tokens 32] \
        [--json benchmarks/shape_invariance_cpu/shape_invariance_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


import torch
import torch.nn.functional as F
from transformers import DynamicCache

from cerberus_hf.blocks.strict import row_invariant_rows, strict_view

from cerberus_hf.hardware import describe_device
from cerberus_hf.real_models import load_named_model
from cerberus_hf.compat import cache_argument
from cerberus_hf.tools.bench import DEFAULT_PROMPTS, encode_prompts, load_bench_prompts

DTYPES = ("float32", "bfloat16")
ROWS = (2, 4, 8, 16, 32, 64)
CHUNKS = (2, 4, 8, 16)


def linear_rows(dtype: torch.dtype, shapes: dict[str, tuple[int, int]]) -> list[dict]:
    """Per layer shape and batch size M: rows of a batched product that differ from the row computed alone."""
    generator = torch.Generator().manual_seed(0)
    results = []
    for name, (fan_in, fan_out) in shapes.items():
        weight = (torch.randn(fan_out, fan_in, generator=generator) / fan_in**0.5).to(dtype)
        x = torch.randn(max(ROWS), fan_in, generator=generator).to(dtype)
        alone = torch.cat([F.linear(x[i : i + 1], weight) for i in range(max(ROWS))])
        for rows in ROWS:
            batched = F.linear(x[:rows], weight)
            differ = (batched != alone[:rows]).any(-1)
            results.append({"layer": name, "in": fan_in, "out": fan_out, "rows": rows,
                            "rows_differing": int(differ.sum()),
                            "max_abs_diff": float((batched.float() - alone[:rows].float()).abs().max())})
    return results


@torch.no_grad()
def chunked_logits(model, prompt: torch.Tensor, continuation: torch.Tensor, chunk: int,
                   strict: bool = False) -> torch.Tensor:
    """The logits at the continuation's positions but its last (``[len - 1, vocab]``, float32: each predicts the
    next continuation token) when the continuation is fed after the prompt's prefill in cached forwards of
    ``chunk`` tokens (with strict verification's attention when ``strict``)."""
    cache = DynamicCache(config=model.config)
    model(prompt, **cache_argument(cache), use_cache=True)
    rows = []
    for start in range(0, continuation.shape[1] - 1, chunk):
        piece = continuation[:, start : min(start + chunk, continuation.shape[1] - 1)]
        out = (strict_view(model) if strict else model)(piece, **cache_argument(cache), use_cache=True)
        rows.append(out.logits[0])
    return torch.cat(rows).float()


def model_positions(model, tokenizer, prompts: list[str], tokens: int) -> list[dict]:
    """Per verification (batched, strict) and chunk size: continuation positions whose logits differ from
    one-token forwards'."""
    rows = row_invariant_rows(model)
    runs = [(strict, chunk) for strict in (False, True) for chunk in CHUNKS if not strict or chunk <= rows]
    totals = {run: {"positions": 0, "differing": 0, "argmax_flips": 0, "max_abs_diff": 0.0} for run in runs}
    for prompt in encode_prompts(tokenizer, prompts):
        generated = model.generate(prompt, max_new_tokens=tokens, do_sample=False)
        continuation = generated[:, prompt.shape[1] :]
        one_by_one = chunked_logits(model, prompt, continuation, 1)
        for strict, chunk in runs:
            logits = chunked_logits(model, prompt, continuation, chunk, strict)
            row = totals[(strict, chunk)]
            row["positions"] += logits.shape[0]
            row["differing"] += int((logits != one_by_one).any(-1).sum())
            row["argmax_flips"] += int((logits.argmax(-1) != one_by_one.argmax(-1)).sum())
            row["max_abs_diff"] = max(row["max_abs_diff"], float((logits - one_by_one).abs().max()))
    return [{"verification": "strict" if strict else "batched", "chunk": chunk, "row_invariant_rows": rows, **row}
            for (strict, chunk), row in totals.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="the first N MT-Bench prompts (every 10th question)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--json", default="benchmarks/shape_invariance_cpu/shape_invariance_cpu.json")
    args = parser.parse_args()

    machine = describe_device("cpu")
    prompts = load_bench_prompts(DEFAULT_PROMPTS, limit=args.prompts, every=10)
    result = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "prompts": len(prompts), "tokens": args.tokens, "linear": {}, "model": {}}
    for name in DTYPES:
        model, tokenizer = load_named_model("smollm2-135m-instruct", getattr(torch, name))
        config = model.config
        shapes = {"q_proj": (config.hidden_size, config.hidden_size),
                  "k_proj": (config.hidden_size, config.num_key_value_heads * config.head_dim),
                  "up_proj": (config.hidden_size, config.intermediate_size),
                  "down_proj": (config.intermediate_size, config.hidden_size),
                  "lm_head": (config.hidden_size, config.vocab_size)}
        result["linear"][name] = linear_rows(getattr(torch, name), shapes)
        result["model"][name] = model_positions(model, tokenizer, prompts, args.tokens)

    print(f"{machine}, torch {torch.__version__}\n")
    print("rows of a batched linear layer that differ bitwise from the same row computed alone (of M):\n")
    layers = list(dict.fromkeys(r["layer"] for r in result["linear"][DTYPES[0]]))
    print("| dtype | layer | " + " | ".join(f"M={m}" for m in ROWS) + " | largest difference |")
    print("|---|---|" + "---|" * (len(ROWS) + 1))
    for name in DTYPES:
        for layer in layers:
            rows = [r for r in result["linear"][name] if r["layer"] == layer]
            print(f"| {name} | {layer} | " + " | ".join(str(r["rows_differing"]) for r in rows)
                  + f" | {max(r['max_abs_diff'] for r in rows):.3g} |")
    print(f"\nSmolLM2-135M-Instruct, {len(prompts)} MT-Bench prompts x {args.tokens} greedy tokens: logits fed in chunks "
          "of n tokens against one token per forward:\n")
    print("| dtype | verification | n | positions | logits differ bitwise | argmax differs | largest logit difference |")
    print("|---|---|---|---|---|---|---|")
    for name in DTYPES:
        for row in result["model"][name]:
            print(f"| {name} | {row['verification']} | {row['chunk']} | {row['positions']} | {row['differing']} | "
                  f"{row['argmax_flips']} | {row['max_abs_diff']:.3g} |")
        print(f"| {name} | (row-invariant height of the base's linear layers: {result['model'][name][0]['row_invariant_rows']}) "
              "| | | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
