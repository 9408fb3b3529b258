"""A KV cache whose rows write at slots of their own: the device step's base cache (`decoding.device_step`), and the
per-row buffers of drafters that keep a transformers cache of their own there (a base's MTP layers, `drafters.mtp`).
Rows of one batch that accepted different numbers of tokens keep their caches compact."""

from __future__ import annotations

import torch
from transformers import Cache
from transformers.cache_utils import StaticLayer


class RowSlotLayer(StaticLayer):
    """A static layer whose rows write at slots of their own (``slots``: ``[batch, fed]``, set by the step), so that
    rows of one batch that accepted different numbers of tokens keep their caches compact."""

    def __init__(self, max_cache_len: int, owner: "RowSlotCache"):
        super().__init__(max_cache_len)
        self.owner = owner

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.slots[:, None, :, None]
        self.keys.scatter_(2, slots.expand(-1, key_states.shape[1], -1, key_states.shape[-1]), key_states)
        self.values.scatter_(2, slots.expand(-1, value_states.shape[1], -1, value_states.shape[-1]), value_states)
        return self.keys, self.values

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Copy each row's slots ``source`` (``[batch, n]``) to its slots ``target`` in place."""
        for tensor in (self.keys, self.values):
            shape = (-1, tensor.shape[1], -1, tensor.shape[-1])
            moved = tensor.gather(2, source[:, None, :, None].expand(shape))
            tensor.scatter_(2, target[:, None, :, None].expand(shape), moved)


class RowSlotCache(Cache):
    """The base's KV cache for `DeviceStep`: ``room`` slots per row, allocated at the first forward."""

    def __init__(self, num_layers: int, room: int):
        super().__init__(layers=[RowSlotLayer(room, self) for _ in range(num_layers)])
        self.room = room
        self.slots: torch.Tensor | None = None  # where the next forward writes, per row
