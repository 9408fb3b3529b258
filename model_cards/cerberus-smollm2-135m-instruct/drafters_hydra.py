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

Hydra++'s prefix layer (``prefix_layer=True``): one decoder layer (attention with rotary positions, then a SwiGLU
MLP, then a norm) reads the base's verified states and its output ``p_t`` replaces ``h_t`` as what every head
reads, so the heads see the sequence and not only its newest state. Hydra++ runs it over the whole sequence with
its own KV cache; here it reads a sliding window of the newest ``context_window`` verified states (from the state
that predicted the first new token on), through the window machinery Clover's augmenting block uses: training
keeps drawing single answer positions from the hidden-state cache, and decoding recomputes the window's keys each
step instead of keeping a cache in step with acceptance and rollback. Its attention is ``adapter_heads *
adapter_head_dim`` wide (Hydra++ copies the base's attention shape: 9 heads of 64 on SmolLM2-135M) and its MLP
LLaMA's width for the hidden size. A fresh prefix layer is the identity up to scale (its attention and MLP outputs
start at zero), so fresh heads still guess the base's own next token.
"""

from __future__ import annotations

import torch
from torch import nn

from .configuration_cerberus import CerberusConfig
from .drafters_base import Drafter, ResidualBlock
from .drafters_layers import AttentionAdapter, GatedMLP, llama_mlp_width


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


class PrefixLayer(nn.Module):
    """``norm(a + MLP(a))`` with ``a = attention(window)`` at the window's newest position: a decoder layer over
    the base's states (the attention's own norms stand in for the layer's input norms)."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int):
        super().__init__()
        self.attention = AttentionAdapter(hidden_size, num_heads, head_dim)
        self.mlp = GatedMLP(hidden_size, llama_mlp_width(hidden_size))
        self.norm = nn.RMSNorm(hidden_size, eps=1e-6)

    def forward(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` from windows ``[n, W, hidden]`` (oldest first) of which ``valid`` ``[n, W]`` belong."""
        positions = torch.arange(rows.shape[-2], device=rows.device)
        attended = self.attention(rows, positions, key_mask=valid, queries=1)[0][:, -1]
        return self.norm(attended + self.mlp(attended))


class HydraDrafter(Drafter):
    """Head ``k`` is ``stack_k(h_t, e(x_{t+1}), ..., e(x_{t+k+1}))``, with ``p_t`` in place of ``h_t`` when the
    prefix layer is on."""

    drafter_type = "hydra"
    reads_tokens = True

    def __init__(self, config: CerberusConfig):
        super().__init__(config)
        if config.prefix_layer:
            self.context_window = config.context_window
            self.prefix = PrefixLayer(config.hidden_size, config.adapter_heads, config.adapter_head_dim)

    def read_window(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        # without the prefix layer the heads read h_t alone (what calibration's drafting time measures too)
        return self.prefix(rows, valid) if self.context_window > 0 else super().read_window(rows, valid)

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
