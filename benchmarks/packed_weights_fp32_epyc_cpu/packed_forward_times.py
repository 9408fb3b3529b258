"""One cached forward of SmolLM2-135M-Instruct over n new tokens, through the base's own linear layers and through
packed weights (`cerberus_hf.blocks.packed`), alternating, with the largest logit difference between the two.

    python benchmarks/packed_weights_fp32_epyc_cpu/packed_forward_times.py --dtype float32 [--repeats 8] [--context 300]

Prints the median milliseconds per size for each, twice over (the machine's speed drifts between passes).
"""

from __future__ import annotations

import argparse
import time

import torch

from cerberus_hf.blocks.packed import PackedWeights, packed_view
from cerberus_hf.real_models import load_packaged_model


def forward_ms(model, n: int, repeats: int, context: int) -> tuple[float, torch.Tensor]:
    """Median ms of a forward over ``n`` new tokens after ``context`` cached ones, and the last logits."""
    generator = torch.Generator().manual_seed(n)
    prefix = torch.randint(100, 40000, (1, context), generator=generator)
    new = torch.randint(100, 40000, (1, n), generator=generator)
    times = []
    with torch.no_grad():
        cache = model(prefix, use_cache=True).past_key_values
        for _ in range(repeats):
            start = time.perf_counter()
            logits = model(new, cache=cache, use_cache=True).logits
            times.append(time.perf_counter() - start)
            cache.crop(-n)
    return sorted(times)[len(times) // 2] * 1e3, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = parser.parse_args()
    torch.set_num_threads(2)
    base, _ = load_packaged_model(dtype=getattr(torch, args.dtype))
    view = packed_view(base, PackedWeights())
    print(f"SmolLM2-135M-Instruct, {args.dtype}, {torch.get_num_threads()} threads, {args.context} cached tokens")
    print("| pass | new tokens | own linear (ms) | packed (ms) | largest logit difference |")
    print("|---|---|---|---|---|")
    for rep in (1, 2):
        for n in args.sizes:
            own, own_logits = forward_ms(base, n, args.repeats, args.context)
            packed, packed_logits = forward_ms(view, n, args.repeats, args.context)
            difference = float((own_logits.float() - packed_logits.float()).abs().max())
            print(f"| {rep} | {n} | {own:.1f} | {packed:.1f} | {difference:.1e} |", flush=True)


if __name__ == "__main__":
    main()
