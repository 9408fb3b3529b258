"""Where a decoding step's time goes: wall time per phase of the draft-verify loop.

The speedup of drafting is bounded by what a step spends outside the base model's forward pass, so
that share has to be measured, not guessed. `StepProfiler` splits a `generate()` call into phases:

* ``prefill``: the base's forward over the prompt;
* ``draft``: the heads, the gate and the tree's tokens (`Proposer.propose`);
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


# Tensor operations that make the host wait for a device's values: a value read back (item, tolist, bool, int,
# float, numpy, a copy to the CPU), or an output whose shape depends on the values (nonzero, masked selection,
# unique, boolean-mask indexing). On CUDA each is a synchronisation; on a CPU they cost nothing but are counted the
# same, so a test can bound what a GPU would pay without one. `HostReads` also counts the copies of host values that
# wait for the device's queue (`transfer.to_device` does not): a tensor built from Python values on a named device,
# ``new_tensor``, and indexing with a Python list.
_VALUE_READS = {
    torch.Tensor.item: "item", torch.Tensor.tolist: "tolist", torch.Tensor.__bool__: "bool",
    torch.Tensor.__int__: "int", torch.Tensor.__float__: "float", torch.Tensor.__index__: "index",
    torch.Tensor.numpy: "numpy", torch.Tensor.cpu: "cpu",
}
_SHAPE_FROM_VALUES = {
    torch.nonzero: "nonzero", torch.Tensor.nonzero: "nonzero", torch.argwhere: "nonzero",
    torch.Tensor.argwhere: "nonzero", torch.masked_select: "masked_select", torch.Tensor.masked_select: "masked_select",
    torch.unique: "unique", torch.Tensor.unique: "unique", torch.unique_consecutive: "unique",
}


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the operations that would synchronise a GPU (`_VALUE_READS`, `_SHAPE_FROM_VALUES`, indexing by a
    boolean tensor, and the host copies that wait: ``host_copy``, ``list_index``), by kind and by the innermost
    cerberus_hf (else transformers) line that asked, while active. Works on any device: on a CPU nothing waits, but
    the count is what a GPU would pay. Not seen: ``.to(device)`` of a tensor the code built on the host (on a CPU it
    cannot be told from a no-op)."""

    def __init__(self, where: bool = True):
        super().__init__()
        self.by_kind: dict[str, int] = {}
        self.by_line: dict[str, int] = {}
        self._where = where

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def _kind(self, func, args, kwargs) -> str | None:
        kind = _VALUE_READS.get(func) or _SHAPE_FROM_VALUES.get(func)
        if kind is not None:
            return kind
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                return "bool_index"
            if any(isinstance(i, list) for i in index):  # the list goes to the device as an index tensor first
                return "list_index"
        if func is torch.Tensor.new_tensor or (
            func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor)
            and kwargs.get("device") is not None and not kwargs.get("pin_memory")
        ):
            return "host_copy"
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self._kind(func, args, kwargs)
        if kind is not None:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            if self._where:
                line = asking_line()
                self.by_line[line] = self.by_line.get(line, 0) + 1
        return func(*args, **kwargs)


def asking_line(stack: list | None = None) -> str:
    """``file:line (function)`` of the innermost frame of ``stack`` (a `traceback.extract_stack`; the caller's stack
    when None) in cerberus_hf, else in transformers, else the innermost: the line that asked for a read."""
    import traceback

    if stack is None:
        stack = traceback.extract_stack()[:-2]  # without this function and HostReads.__torch_function__
    for package in ("cerberus_hf", "transformers"):
        for frame in reversed(stack):
            if f"/{package}/" in frame.filename:
                return f"{frame.filename.split(f'/{package}/')[-1]}:{frame.lineno} ({frame.name})"
    frame = stack[-1]
    return f"{frame.filename}:{frame.lineno} ({frame.name})"
