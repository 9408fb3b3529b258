"""Medusa heads (Cai et al., ICML 2024): independent residual stacks on the base's last hidden state."""

from __future__ import annotations

import torch

from .drafters_base import Drafter


class MedusaDrafter(Drafter):
    """Head ``k`` is ``stack_k(h_t)``: it sees neither the drafted tokens nor the other heads."""

    drafter_type = "medusa"
    reads_tokens = False

    def head_state(self, k, hidden, tokens, previous) -> torch.Tensor:
        z = hidden
        for block in self.blocks[k]:
            z = block(z)
        return z
