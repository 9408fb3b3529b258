"""Host values onto the device without making the host wait.

``torch.tensor(values, device="cuda")`` and indexing a CUDA tensor with a Python list copy from pageable host memory,
and such a copy waits for every kernel already queued: on a GPU such copies were most of the loop's host
synchronisations per step (counted in docs/cuda.md). A draft-verify step is launch-bound on a GPU, so each wait
costs about a kernel launch queue's worth of time. `to_device` stages the values in pinned memory and copies them
asynchronously, which waits for nothing; the loop uses it wherever it must send values it computed on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: Sequence | torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None
              ) -> torch.Tensor:
    """``values`` (Python numbers, nested sequences of them, or a CPU tensor) as a tensor on ``device``; on CUDA through
    a pinned buffer and a non-blocking copy (the caching host allocator keeps the buffer until the copy has run)."""
    device = torch.device(device)
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def positions_index(positions: list[int], device: torch.device | str) -> slice | torch.Tensor:
    """An index selecting ``positions`` (a step's accepted positions, in order) along a dimension: a slice where they
    are a prefix, as a chain's always are (no copy at all), else a tensor on ``device`` (`to_device`)."""
    if positions == list(range(len(positions))):
        return slice(0, len(positions))
    return to_device(positions, device, torch.long)
