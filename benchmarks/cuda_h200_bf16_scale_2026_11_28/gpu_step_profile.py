r"""Where a draft-verify step's time goes on a GPU, against a plain compiled step (issue 38: the loop's compiled static
cache made a step of the 8B-shaped base cost 30 ms where the compiled plain peer's costs 12 ms, 2026-11-27).

    python benchmarks/cuda_h200_bf16_scale_2026_11_28/gpu_step_profile.py --shape llama-3.1-8b \
        --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json
    python benchmarks/cuda_h200_bf16_scale_2026_11_28/gpu_step_profile.py --shape llama-3.2-1b --layers 2 \
        --device cpu --new 8    # a dry run

For the plain compiled peer, the drafted loop uncompiled and the drafted loop compiled (static cache): the wall time a
step, the loop's own phases (`generate(profile=True)`, which synchronises at each phase), and the torch profiler's
top operators by self CPU and self device time of one call. With ``--logs`` torch's recompilation, graph-break and
performance-hint logs (a CUDA graph skipped, and why) go to stderr.

The 2026-11-27 profile found a compiled step of the 8B shape spending 5.4 ms drafting (the drafter's kernels launched
one by one from Python) beside 22.5 ms verifying. ``--compile-drafter MODE`` adds a row where the drafter's
`draft_level` is compiled with ``torch.compile(mode=MODE)`` (an experiment, not the library's path: "reduce-overhead"
replays CUDA graphs, one per depth's shapes), checked against plain `generate()` like every row. A row with the
drafter's own logits (the oracle taken off) prices drafting without the oracle's lookup.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from cerberus_hf import CerberusForCausalLM
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # gpu_scale_bench lives there
from gpu_scale_bench import build_base, install_device_oracle, progress, timed, SHAPES  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--acceptance", default=None, metavar="BENCH_JSON")
    parser.add_argument("--logs", action="store_true", help="torch's recompile, graph-break and perf-hint logs")
    parser.add_argument("--robust", action="store_true", help="a base whose greedy path survives bf16 rounding")
    parser.add_argument("--skip-dynamic", action="store_true", help="leave out the uncompiled dynamic-cache row")
    parser.add_argument("--compile-drafter", default=None, metavar="MODE",
                        help="add a row with the drafter's draft_level compiled in this torch.compile mode")
    parser.add_argument("--json", default=None)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if args.logs:
        torch._logging.set_logs(recompiles=True, graph_breaks=True, perf_hints=True)
    device = torch.device(args.device)
    base = build_base(args.shape, args.layers, args.device, getattr(torch, args.dtype), robust=args.robust)
    prompts = torch.randint(3, base.config.vocab_size, (2, 128), generator=torch.Generator().manual_seed(1)).to(device)
    references = torch.cat([base.generate(prompts[i: i + 1], max_new_tokens=args.new + args.heads + 2, do_sample=False)
                            for i in range(2)])
    model = CerberusForCausalLM.from_base(base, head_type="hydra", num_heads=args.heads, gate_threshold=None)
    acceptance = None
    if args.acceptance:
        acceptance = [r for r in json.load(open(args.acceptance))["methods"] if r.get("head_acceptance")][0][
            "head_acceptance"]
    install_device_oracle(model, references, acceptance)
    progress("base, references and drafter ready")
    call = dict(max_new_tokens=args.new, do_sample=False)
    methods = {
        "plain, static cache": lambda ids, **kw: base.generate(ids, cache_implementation="static", **call),
        "drafted, dynamic cache": lambda ids, **kw: model.generate(ids, **call, **kw),
        "drafted, static cache": lambda ids, **kw: model.generate(ids, cache_implementation="static", **call, **kw),
    }
    if args.skip_dynamic:
        del methods["drafted, dynamic cache"]
    oracle_class = type(model.heads)

    def with_own_logits(ids, **kw):
        """The drafter's own (untrained) logits, the oracle taken off: what drafting costs without the bench's oracle
        (few drafts are accepted, so compare the phases a step, not the steps)."""
        model.heads.__class__ = model.heads._real_class
        try:
            return model.generate(ids, cache_implementation="static", **call, **kw)
        finally:
            model.heads.__class__ = oracle_class

    methods["drafted, static cache, the drafter's own logits"] = with_own_logits
    if args.compile_drafter:
        heads = model.heads
        eager = heads.draft_level
        compiled = torch.compile(eager, mode=args.compile_drafter, dynamic=False)

        def with_compiled_drafter(ids, **kw):
            heads.draft_level = compiled
            try:
                return model.generate(ids, cache_implementation="static", **call, **kw)
            finally:
                heads.draft_level = eager

        methods[f"drafted, static cache, drafter compiled ({args.compile_drafter})"] = with_compiled_drafter
    ids = prompts[:1]
    report = {"shape": args.shape, "dtype": args.dtype, "device": str(device), "acceptance": acceptance, "methods": {}}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    for name, run in methods.items():
        start = time.perf_counter()
        run(ids)
        run(ids)  # a second warm-up: the first may meet a bucket the second does not
        progress(f"warmed up {name} in {time.perf_counter() - start:.1f} s")
        out, seconds = timed(lambda: run(ids), device)
        drafted = name.startswith("drafted")
        steps = model.generation_stats.steps - 1 if drafted else out.shape[1] - ids.shape[1]
        same = bool((out == references[:1, : out.shape[1]]).all())
        entry = {"seconds": seconds, "new_tokens": out.shape[1] - ids.shape[1], "steps": steps,
                 "ms_per_step": 1000 * seconds / steps, "identical": same}
        if drafted:
            run(ids, profile=True)
            stats = model.generation_stats
            entry["phase_ms_per_step"] = {k: round(1000 * v / (stats.steps - 1), 2)
                                          for k, v in stats.phase_seconds.items()}
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as prof:
            run(ids)
            if device.type == "cuda":
                torch.cuda.synchronize()
        averages = prof.key_averages()
        entry["top_self_cpu"] = averages.table(sort_by="self_cpu_time_total", row_limit=args.top)
        if device.type == "cuda":
            entry["top_self_device"] = averages.table(sort_by="self_cuda_time_total", row_limit=args.top)
        report["methods"][name] = entry
        progress(f"{name}: {entry['ms_per_step']:.2f} ms a step over {steps} steps, identical {entry['identical']}"
                 + (f", phases (ms a step) {entry['phase_ms_per_step']}" if drafted else ""))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(report, handle, indent=1)
    for name, entry in report["methods"].items():
        print(f"\n## {name}: {entry['ms_per_step']:.2f} ms a step\n")
        print(entry["top_self_cpu"])
        if "top_self_device" in entry:
            print(entry["top_self_device"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
