"""Layers that drafter families are built from, kept apart so that a family reuses another's instead of copying it."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


@lru_cache(maxsize=64)
def _inverse_frequencies(dim: int, device: torch.device, theta: float = 10000.0) -> torch.Tensor:
    """``[dim]``: each rotated pair's frequency (base ``theta``), the first half's repeated for the second, computed once
    per head width, base and device (a drafting step calls `rotary` at every depth)."""
    half = dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, device=device, dtype=torch.float32) / half))
    return torch.cat([inv_freq, inv_freq])


def rotary(positions: torch.Tensor, dim: int, dtype: torch.dtype, theta: float = 10000.0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) ``[..., T, dim]`` of the rotary position embedding (base ``theta``) at ``positions`` ``[..., T]``, for
    heads of ``dim`` (each half of the last axis the same): computed once per layer call and shared by its keys and
    queries (a drafting step's dozens of small ops cost more than its matrix products on a CPU, and on a GPU each is a
    launch)."""
    angles = positions.to(torch.float32)[..., None] * _inverse_frequencies(dim, positions.device, float(theta))
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``x`` ``[..., T, d]`` rotated by ``rotation`` (`rotary` of its positions; rotate-half layout):
    ``[a, b] -> [a cos - b sin, b cos + a sin]``, as ``x cos + [-b, a] sin`` in five operations."""
    cos, sin = rotation
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@torch.no_grad()
def init_from_fixed_seed(*projections: nn.Linear) -> None:
    """The weights of ``projections`` as torch's default Linear init draws them, from a fixed seed: a fresh layer is a
    function of its config, so a training run depends on its own seed alone (and resumes exactly)."""
    generator = torch.Generator().manual_seed(0)
    for proj in projections:
        if proj.weight.is_meta:
            continue
        bound = 1.0 / math.sqrt(proj.weight.shape[1])
        proj.weight.copy_((torch.rand(proj.weight.shape, generator=generator) * 2 - 1) * bound)


class AttentionAdapter(nn.Module):
    """``norm(x + attention(input_norm(x)))`` with its own KV cache and rotary positions, and no MLP: Kangaroo's
    adapter. A fresh one is the identity followed by the norm (its output projection is zero)."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, eps: float = 1e-6):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"adapter_head_dim must be even (rotary embeddings), got {head_dim}.")
        self.num_heads, self.head_dim = num_heads, head_dim
        width = num_heads * head_dim
        self.input_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.q_proj = nn.Linear(hidden_size, width, bias=False)
        self.k_proj = nn.Linear(hidden_size, width, bias=False)
        self.v_proj = nn.Linear(hidden_size, width, bias=False)
        self.o_proj = nn.Linear(width, hidden_size, bias=False)
        nn.init.zeros_(self.o_proj.weight)
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self._init_projections()

    def _init_projections(self) -> None:
        init_from_fixed_seed(self.q_proj, self.k_proj, self.v_proj)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(-3, -2)  # [B, heads, T, d]

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_mask: torch.Tensor | None = None, queries: int | None = None, attend: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(outputs ``[B, T, hidden]``, the keys and values of the past and these positions) for ``x``
        ``[B, T, hidden]`` at sequence ``positions`` ``[T]``, after the cached ``past`` (causal).

        ``queries``: only the last this many positions attend and are returned (outputs ``[B, queries, hidden]``;
        the others only give keys and values); ``key_mask`` ``[B, past + T]`` (bool): the keys that may be attended
        to (e.g. not padding); ``attend`` ``[T, past + T]`` (bool): the keys each position sees, in place of the
        causal mask (e.g. a tree's: the past, the position's ancestors and itself)."""
        normed = self.input_norm(x)
        cos, sin = rotary(positions, self.head_dim, x.dtype)
        k = rotate(self._heads(self.k_proj(normed)), (cos, sin))
        v = self._heads(self.v_proj(normed))
        if queries is not None:
            x, normed, cos, sin = x[:, -queries:], normed[:, -queries:], cos[-queries:], sin[-queries:]
        q = rotate(self._heads(self.q_proj(normed)), (cos, sin))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
        steps, total = x.shape[1], k.shape[-2]
        mask = attend
        if mask is None and steps > 1:  # query i sits at key index total - steps + i and sees the keys up to it
            mask = torch.ones(steps, total, dtype=torch.bool, device=x.device).tril(total - steps)
        if key_mask is not None:
            keys = key_mask[:, None, None, :]
            mask = keys if mask is None else mask & keys
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim))
        out = self.o_proj(attended.transpose(-3, -2).reshape(*x.shape[:-1], -1))
        return self.norm(x + out), (k, v)


class GatedMLP(nn.Module):
    """``down(SiLU(gate(x)) * up(x))``, the SwiGLU MLP of LLaMA-style decoder layers; ``down`` starts at zero, so a
    fresh one adds nothing to the residual stream it feeds, and ``gate`` and ``up`` from a fixed seed."""

    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, width, bias=False)
        self.up_proj = nn.Linear(hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, hidden_size, bias=False)
        nn.init.zeros_(self.down_proj.weight)
        init_from_fixed_seed(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def llama_mlp_width(hidden_size: int) -> int:
    """The SwiGLU width LLaMA derives from its hidden size: ``8 d / 3``, rounded up to a multiple of 64 (1536 for
    SmolLM2-135M's 576, its own MLP width)."""
    return math.ceil(8 * hidden_size / 3 / 64) * 64
