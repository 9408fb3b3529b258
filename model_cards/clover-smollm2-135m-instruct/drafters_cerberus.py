"""Cerberus heads (Liu et al., 2024, arXiv 2410.13344): head ``k`` also reads head ``k - 1``'s state.

Knowledge flows along the heads while all of them still run in one pass per step: no drafted token is
fed back, so a depth's guesses are the same under every tree node.
"""

from __future__ import annotations

import torch
from torch import nn

from .drafters_base import Drafter, ResidualBlock


class CerberusDrafter(Drafter):
    """Head ``k > 0``'s first block reads ``concat(h_t, z_{k-1})``: ``z_k = stack_k(h_t, z_{k-1})``."""

    drafter_type = "cerberus"
    reads_tokens = False

    def make_block(self, k: int, layer: int) -> nn.Module:
        return ResidualBlock(self.hidden_size, self.hidden_size if (k > 0 and layer == 0) else 0)

    def head_state(self, k, hidden, tokens, previous) -> torch.Tensor:
        z = hidden
        for layer, block in enumerate(self.blocks[k]):
            z = block(z, previous if (layer == 0 and k > 0) else None)
        return z
