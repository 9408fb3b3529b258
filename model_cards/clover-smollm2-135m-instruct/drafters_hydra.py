"""Hydra heads (Ankner et al., 2024): each head also reads the tokens drafted before its target.

Head ``k`` predicts token ``t + k + 2`` from the base's state ``h_t`` and the base's input embeddings of
the tokens at ``t + 1 .. t + k + 1``: the verifier's newest token and the guesses of heads ``0 .. k-1`` on
the same tree path. A head therefore knows what it follows ("sequentially dependent" heads), and drafting
runs depth by depth, one batched call per depth over every node of that depth (`decoding.drafting`).

Head ``k``'s first block is Hydra's grounded block, ``y = h + U [h; e_1..e_{k+1}] + SiLU(W [h; e_1..e_{k+1}] + b)``:
a linear path and a non-linear path over the concatenation, both zero-initialised here so that a fresh head
is the identity on ``h`` like every other family's (Hydra initialises its linear path as a default
``Linear``; with ``h`` carried by the residual the two are the same map at ``U = [I | 0]``). Its other
blocks are plain residual blocks. The embeddings are the base's own (frozen, never saved with the heads).
"""

from __future__ import annotations

import torch
from torch import nn

from .drafters_base import Drafter, ResidualBlock


class GroundedBlock(nn.Module):
    """``x + U [x; extra] + SiLU(W [x; extra] + b)`` with ``U``, ``W``, ``b`` zero: identity at initialisation."""

    def __init__(self, hidden_size: int, extra_size: int):
        super().__init__()
        self.extra_size = extra_size
        self.linear = nn.Linear(hidden_size + extra_size, hidden_size)
        self.skip = nn.Linear(hidden_size + extra_size, hidden_size, bias=False)
        for weight in (self.linear.weight, self.linear.bias, self.skip.weight):
            nn.init.zeros_(weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([x, extra], dim=-1)
        return x + self.skip(inputs) + self.act(self.linear(inputs))


class HydraDrafter(Drafter):
    """Head ``k`` is ``stack_k(h_t, e(x_{t+1}), ..., e(x_{t+k+1}))``."""

    drafter_type = "hydra"
    reads_tokens = True

    def make_block(self, k: int, layer: int) -> nn.Module:
        if layer == 0:
            return GroundedBlock(self.hidden_size, (k + 1) * self.hidden_size)
        return ResidualBlock(self.hidden_size)

    def head_state(self, k, hidden, tokens, previous) -> torch.Tensor:
        embedded = self.embed(tokens).flatten(-2)  # [n, (k + 1) * hidden]
        z = hidden
        for layer, block in enumerate(self.blocks[k]):
            z = block(z, embedded) if layer == 0 else block(z)
        return z
