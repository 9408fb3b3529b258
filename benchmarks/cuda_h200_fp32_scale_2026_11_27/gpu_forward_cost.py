"""What one forward of the base costs on the device against how many positions it is fed: the price of verifying a
draft, kernel time only (the torch profiler's device time, so launch overhead does not count), per dtype.

    python benchmarks/cuda_h200_fp32_scale_2026_11_27/gpu_forward_cost.py --shape llama-3.1-8b --dtypes float32 bfloat16
    python benchmarks/cuda_h200_fp32_scale_2026_11_27/gpu_forward_cost.py --shape llama-3.2-1b --layers 2 \
        --device cpu     # a dry run (CPU time)

On 2026-11-27 (H200) a compiled fp32 verification step of the 8B-shaped base fed 8 positions cost 1.95x the kernel time
of a one-position step: fp32 matrix products of a few rows run on SIMT kernels, where one row runs as a GEMV at the
memory's speed. This measures that ratio for each dtype, past a 128-token prompt.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # gpu_scale_bench lives there
from gpu_scale_bench import SHAPES, build_base  # noqa: E402


def kernel_ms(run, device: torch.device, repeats: int) -> tuple[float, float]:
    """(device-time ms, wall ms) per call of ``run``, after warm-up."""
    for _ in range(3):
        run()
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(repeats):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    if device.type == "cuda":
        busy = sum(e.self_device_time_total for e in events)
    else:
        busy = sum(e.self_cpu_time_total for e in events)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return busy / 1000 / repeats, 1000 * (time.perf_counter() - start) / repeats


def measure_dtype(args, device: torch.device, name: str) -> None:
    """One table row per fed size for one dtype (the base is built here and freed on return)."""
    base = build_base(args.shape, args.layers, args.device, getattr(torch, name))
    prompt = torch.randint(3, base.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    cache = DynamicCache(config=base.config)
    with torch.no_grad():
        base(prompt, past_key_values=cache, use_cache=True)
    one = None
    for fed in args.fed:
        tokens = prompt[:, :fed]
        positions = torch.arange(128, 128 + fed, device=device)[None]

        def run():
            with torch.no_grad():
                base(tokens, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=0)
            cache.crop(-fed)

        busy, wall = kernel_ms(run, device, args.repeats)
        one = busy if one is None else one
        print(f"| {name} | {fed} | {busy:.2f} | {busy / one:.2f} | {wall:.2f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--fed", type=int, nargs="+", default=[1, 2, 4, 5, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"{args.shape}, random weights, on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; "
          "forward past a 128-token prompt, eager, dynamic cache")
    print("| dtype | fed positions | device ms | x one position | wall ms |")
    print("|---|---|---|---|---|")
    for name in args.dtypes:
        measure_dtype(args, device, name)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
