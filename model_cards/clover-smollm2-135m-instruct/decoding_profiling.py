"""Where a decoding step's time goes: wall time per phase of the draft-verify loop.

The speedup of drafting is bounded by what a step spends outside the base model's forward pass, so
that share has to be measured, not guessed. `StepProfiler` splits a `generate()` call into phases:

* ``prefill``: the base's forward over the prompt;
* ``draft``: the heads, the gate and the tree's tokens (`CerberusCandidateGenerator.propose`);
* ``rescore``: the n-gram model scoring the lattice inside a rescored draft (charged here, not to ``draft``);
* ``verify``: the base's forward over the last token and the draft (or the last token alone);
* ``accept``: walking the outputs (logits processors, token choice, stopping criteria, streamer);
* ``cache``: cutting the KV cache back to the accepted branch;
* ``other``: the rest of the call (generate()'s preparation, statistics, Python glue).

On CUDA every phase boundary synchronises the device so that each phase is charged its own kernels;
that adds synchronisations, so profile separately from timing runs there. On a CPU it costs nothing.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

import torch

PHASES = ("prefill", "draft", "rescore", "verify", "accept", "cache", "other")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock timings measure it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepProfiler:
    """Accumulates wall-clock seconds per phase (see the module docstring). A phase opened inside
    another is charged its own time, and the enclosing phase only the rest."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._nested: list[float] = []  # per open phase, the seconds its inner phases took

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        synchronize(self.device)
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            synchronize(self.device)
            elapsed = time.perf_counter() - start
            self.seconds[name] += elapsed - self._nested.pop()
            if self._nested:
                self._nested[-1] += elapsed

    def close(self, total_seconds: float) -> dict[str, float]:
        """The phases with ``other`` = what of ``total_seconds`` no phase accounts for."""
        self.seconds["other"] = max(0.0, total_seconds - sum(v for k, v in self.seconds.items() if k != "other"))
        return dict(self.seconds)


def phase_timer(profiler: StepProfiler | None):
    """``profiler.phase``, or a no-op with the same call shape when not profiling."""
    if profiler is not None:
        return profiler.phase
    unprofiled = nullcontext()

    def phase(name: str) -> ContextManager[None]:
        return unprofiled

    return phase
