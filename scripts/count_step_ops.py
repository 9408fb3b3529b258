"""Count the tensor operations a decoding step dispatches outside the base's forward, per phase and per line.

On a GPU a step of the loop is bound by the host when its kernels are launched one by one: the fifth CUDA run
(2026-11-28, bf16, 8B shape) spent 7.4 ms of kernel time in an 18.8 ms step, launching about 255 kernels a step outside
the verification's CUDA graph. Each operator the loop dispatches outside the base's forward (drafting, the gate, the
walk over the verified tree, cutting the cache) is at least one such launch, and on a CPU a few microseconds of
overhead, so their count per step is what to cut. This counts them on any device, with a dispatch mode that sees
every ATen operator (views, which launch nothing, are left out), charges each to the loop's phase
(`blocks.profiling.StepProfiler`) and to the innermost line of this library that asked for it.

    python scripts/count_step_ops.py --tiny llama --head-type hydra --max-new-tokens 48
    python scripts/count_step_ops.py --heads model_cards/eagle3-smollm2-135m-instruct --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cerberus_hf.decoding import profiling
from cerberus_hf.blocks.profiling import asking_line

from count_host_syncs import model_and_prompt  # scripts/ is on the path when run as a script


class StepOps(TorchDispatchMode):
    """Counts non-view ATen operators by the loop's current phase and, outside ``verify`` and ``prefill``, by the line
    that asked."""

    def __init__(self):
        super().__init__()
        self.phase = "other"
        self.by_phase: collections.Counter[str] = collections.Counter()
        self.by_line: collections.Counter[str] = collections.Counter()
        self.by_op: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.by_phase[self.phase] += 1
            if self.phase not in ("verify", "prefill"):
                self.by_line[f"{self.phase}: {asking_line(traceback.extract_stack()[:-1])}"] += 1
                self.by_op[f"{self.phase}: {func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def count_ops(model, input_ids: torch.Tensor, **generate_kwargs) -> dict:
    """One profiled `generate()` call under `StepOps`: operators per step by phase, and the lines and operators that
    dispatch most outside the base's forward."""
    counter = StepOps()
    original = profiling.StepProfiler.phase

    @contextmanager
    def tagged(self, name):
        outer, counter.phase = counter.phase, name
        try:
            with original(self, name):
                yield
        finally:
            counter.phase = outer

    profiling.StepProfiler.phase = tagged
    try:
        with counter:
            model.generate(input_ids, profile=True, **generate_kwargs)
    finally:
        profiling.StepProfiler.phase = original
    steps = model.generation_stats.steps
    return {"steps": steps, "tau": round(model.generation_stats.tau, 3),
            "per_step": {k: round(v / steps, 1) for k, v in sorted(counter.by_phase.items())},
            "outside_forward_per_step": round(sum(v for k, v in counter.by_phase.items()
                                                  if k not in ("verify", "prefill")) / steps, 1),
            "by_line": {k: round(v / steps, 2) for k, v in counter.by_line.most_common(25)},
            "by_op": {k: round(v / steps, 2) for k, v in counter.by_op.most_common(25)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", help="head checkpoint folder (the real base it names is loaded)")
    parser.add_argument("--tiny", help="a tiny random base of this architecture (tests/tiny_models.py) instead")
    parser.add_argument("--head-type", default="hydra", help="with --tiny: untrained heads of this family")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args(argv)
    model, input_ids = model_and_prompt(args.heads, args.tiny, args.head_type, "cpu", torch.float32)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    if args.cache == "static":
        kwargs["cache_implementation"] = "static"
    model.generate(input_ids, **kwargs)  # warm-up
    report = {"heads": args.heads or f"{args.tiny} {args.head_type}", "cache": args.cache, **count_ops(model, input_ids,
                                                                                                       **kwargs)}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"{report['heads']}: {report['steps']} steps, tau {report['tau']}; operators a step by phase "
          f"{report['per_step']}; outside the base's forward {report['outside_forward_per_step']} a step")
    for label in ("by_line", "by_op"):
        print(f"\n{label.replace('_', ' ')} (a step):")
        for key, n in report[label].items():
            print(f"  {n:7.2f}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
