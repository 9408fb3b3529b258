"""What one verification forward costs at each compiled step size: the base's eager forward over a dynamic cache (the
default path) against its compiled forward over a static cache (``generate(cache_implementation="static")``), after a
300-token context, at the bucket sizes the static path pads to (`decoding.static_cache.BUCKETS`).

    python benchmarks/static_cache_compile_amx_cpu/compiled_cost_curve.py --dtype bfloat16   # SmolLM2-135M (PyPI), CPU
    python benchmarks/static_cache_compile_amx_cpu/compiled_cost_curve.py --dtype bfloat16 --device cuda

Compiled as `generate()` compiles: the base's ``get_compiled_call`` with transformers' `CompileConfig` (on a CPU
``mode=None`` and ``_compile_all_devices``, since CUDA graphs do not apply). Sizes are interleaved over the repeats;
the median of each is printed. Calibration (`calibration.measure.measure_cost_curve`) measures the dynamic path.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import CompileConfig, DynamicCache, StaticCache

from cerberus_hf.compat import cache_argument
from cerberus_hf.blocks.profiling import synchronize
from cerberus_hf.decoding.static_cache import BUCKETS, ROOM_MULTIPLE
from cerberus_hf.real_models import load_packaged_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    model, _ = load_packaged_model(dtype=dtype)
    model.to(device)
    config = CompileConfig(mode=None if device.type == "cpu" else "reduce-overhead")
    config._compile_all_devices = True
    compiled = model.get_compiled_call(config)
    room = -(-(args.context + BUCKETS[-1]) // ROOM_MULTIPLE) * ROOM_MULTIPLE
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.config.vocab_size, (1, args.context), generator=generator).to(device)
    blocked = torch.finfo(dtype).min
    with torch.inference_mode():
        dynamic = DynamicCache(config=model.config)
        model(input_ids=prefix, **cache_argument(dynamic))
        static = StaticCache(config=model.config, max_cache_len=room)
        model(input_ids=prefix, **cache_argument(static))
        masks = {}
        for n in BUCKETS:  # the past visible, the fed block causal, the free slots hidden
            mask = torch.zeros(1, 1, n, room, dtype=dtype)
            mask[..., args.context + n:] = blocked
            mask[0, 0, :, args.context: args.context + n].masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1),
                                                                       blocked)
            masks[n] = mask.to(device)

        def step(n: int, which: str) -> float:
            tokens = torch.randint(0, model.config.vocab_size, (1, n), generator=generator).to(device)
            positions = torch.arange(args.context, args.context + n, device=device)[None]
            synchronize(device)
            start = time.perf_counter()
            if which == "eager":
                model(input_ids=tokens, position_ids=positions, **cache_argument(dynamic))
            else:
                compiled(input_ids=tokens, position_ids=positions, attention_mask=masks[n], **cache_argument(static))
            synchronize(device)
            elapsed = time.perf_counter() - start
            (dynamic if which == "eager" else static).crop(-n)
            return elapsed

        start = time.perf_counter()
        for n in BUCKETS:
            step(n, "compiled"), step(n, "compiled")
        print(f"compiling every size: {time.perf_counter() - start:.0f} s")
        times = {(which, n): [] for which in ("eager", "compiled") for n in BUCKETS}
        for _ in range(args.repeats):
            for n in BUCKETS:
                for which in ("eager", "compiled"):
                    times[(which, n)].append(step(n, which))
    median = {key: 1000 * statistics.median(values) for key, values in times.items()}
    print(f"\n{args.dtype} on {device}, context {args.context}, median of {args.repeats}\n")
    print("| positions fed | eager, dynamic cache (ms) | relative | compiled, static cache (ms) | relative |")
    print("|---|---|---|---|---|")
    for n in BUCKETS:
        eager, fast = median[("eager", n)], median[("compiled", n)]
        print(f"| {n} | {eager:.1f} | {eager / median[('eager', 1)]:.2f} | {fast:.1f} | "
              f"{fast / median[('compiled', 1)]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
