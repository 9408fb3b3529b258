"""A dynamic KV cache that grows in place: room reserved after the cached positions, so a step does not copy the cache.

transformers' `DynamicLayer` appends a step's keys and values with ``torch.cat``, which copies the whole layer's cache
every step: on a CPU, for SmolLM2 at a 2,000-token context, 13 of a 36 ms one-token step (at 300 tokens, 3 of 22 ms).
A `ReservedLayer` keeps its keys and values as views of the front of larger buffers and writes a step's positions
into the room after them; when the room runs out it moves to buffers a quarter larger than needed (at least
`MIN_ROOM` positions more), so each position is copied a few times over a whole generation instead of once a step.
Cutting back (`crop`) narrows the views, and the next step writes over what was cut. Whatever replaces the views with
tensors of its own (batch selection, a reset) is followed by the next step into new buffers.

The tensors a forward attends to are the same values at the same positions, only strided over the room: torch's CPU
attention gives them the same bits (`tests/test_reserved_cache.py`). `reserve_room` swaps the plain layers of a
dynamic cache for these before the loop's prefill (`static_cache.verification_for`, on a CPU); sliding-window and other
layer types are left as they are.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 256  # positions reserved beyond what a move to new buffers needs, at least


def _front_of(held: torch.Tensor, buffer: torch.Tensor | None) -> bool:
    """Whether ``held`` is the front of ``buffer`` along the position dimension (-2)."""
    return (buffer is not None and held.dim() == buffer.dim() and held.data_ptr() == buffer.data_ptr()
            and held.stride() == buffer.stride() and held.shape[:-2] == buffer.shape[:-2]
            and held.shape[-1] == buffer.shape[-1])


def _appended(held: torch.Tensor, new: torch.Tensor, buffer: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(``held`` followed by ``new`` along dimension -2, as a view of the front of a buffer; that buffer): ``buffer``
    itself where ``held`` is its front and it has the room, else a new one with room to spare."""
    length = held.shape[-2] if held.dim() == new.dim() else 0  # an initialized layer's tensors start empty and 1-D
    total = length + new.shape[-2]
    if not (length == 0 or _front_of(held, buffer)) or buffer is None or buffer.shape[-2] < total \
            or buffer.shape[:-2] != new.shape[:-2] or buffer.dtype != new.dtype or buffer.device != new.device:
        grown = new.new_empty(*new.shape[:-2], total + max(MIN_ROOM, total // 4), new.shape[-1])
        if length:
            grown[..., :length, :] = held
        buffer = grown
    buffer[..., length:total, :] = new
    return buffer[..., :total, :], buffer


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are the fronts of buffers with room after them (module docstring)."""

    key_buffer: torch.Tensor | None = None
    value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.key_buffer = _appended(self.keys, key_states, self.key_buffer)
        self.values, self.value_buffer = _appended(self.values, value_states, self.value_buffer)
        return self.keys, self.values


def reserve_room(cache: DynamicCache) -> None:
    """Make each plain layer of ``cache`` a `ReservedLayer`, keeping what it holds (its first step then moves it into
    a buffer with room); other layer types stay as they are."""
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            reserved = ReservedLayer.__new__(ReservedLayer)
            reserved.__dict__.update(layer.__dict__)
            cache.layers[index] = reserved
