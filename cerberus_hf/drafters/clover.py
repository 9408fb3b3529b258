"""Clover heads (Xiao et al., 2024; Clover-2's public design): drafted tokens mixed into a running state.

Clover's three parts, as built here:

* **Regressive connection and attention decoder.** Depth ``k >= 1`` mixes the embedding of the token drafted
  at depth ``k - 1`` into a running state: ``s_k = s_{k-1} + gate * V e``, where ``e`` is the base's input
  embedding of that token and, per attention head, ``gate = cos(Q norm(s_{k-1}), K e)`` (Clover-2's
  ``ResAttentionBlock``: a per-position attention between the state and one token, with no output
  projection). Depth ``k``'s guess is ``lm_head(norm(FC [s_k; e]))`` through the base's frozen ``lm_head``.
* **Augmenting block.** Depth 0's state reads the sequence: every verified position ``p`` contributes
  ``u_p = mix(h_p, e(x_{p+1}))`` (the first attention decoder, over the base's state and the token that
  followed it), and an attention layer with rotary positions reads the latest ``context_window`` of them from
  the newest: ``s_0 = norm(u_t + attention(u_t; u_{t-W+1..t}))``. Its guess is ``lm_head(norm(FC s_0))``.
* **Trees.** Any tree the machinery grows: a static tree of ranks, or the dynamic (EAGLE-2) tree, whose
  per-level budget already plays the part of Clover's per-node top-p budget.

Where this differs from Clover-2's code, and why:

* Clover-2's augmenting block is two full decoder layers initialised from the base's last layer, with their
  own KV cache over the whole sequence. Here it is one attention layer of ``adapter_heads *
  adapter_head_dim`` width (Kangaroo's adapter, shared code), reading a sliding window of the newest
  ``context_window`` verified positions from the state that predicted the first new token on. Copying the
  base's last layer needs a per-architecture forward (masks, position embeddings, scaling) that transformers'
  decoders do not offer generically; a window keeps training on single positions, as the hidden-state cache
  stores them (answers only, no prompt), and lets decoding recompute the window each step instead of keeping
  a cache in step with acceptance and rollback.
* Clover-2 reads the base's state before its final norm; here the heads read what every family reads by
  default (the input of the base's ``lm_head``, after the final norm). ``state_source="final_norm_input"``
  reads the state before it, as Clover-2 does (verifier and hidden-state cache alike), but on SmolLM2 it
  learned less at every depth in the same epoch (docs/families.md), so the default stays.
* Clover-2 initialises Q and K as the identity plus noise and V as noise; here V, the attention's output
  projection and the norms start so that a fresh drafter guesses the base's own next token at every depth
  (the project's convention: untrained heads are harmless), with Q and K the identity and FC ``[I | 0]``.
* Clover-2 trains with a hidden-state regression next to the soft cross-entropy against the base, decayed
  ``0.7`` per depth; the trainer here fits every family with the same cross-entropy or distillation loss and
  per-depth decay (``--distill-weight``, ``--head-weight-decay``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..configuration_cerberus import CerberusConfig
from .base import Drafter
from .layers import AttentionAdapter


class TokenMixer(nn.Module):
    """Clover's attention decoder: ``s + gate * V e`` with ``gate = cos(Q norm(s), K e)`` per attention head.

    A fresh mixer is the identity on ``s`` (V is zero); Q and K start as the identity, so the first gates
    measure how much the state already points at the token."""

    def __init__(self, hidden_size: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.norm = nn.RMSNorm(hidden_size, eps=1e-6)
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        with torch.no_grad():
            for proj in (self.q_proj, self.k_proj):
                proj.weight.copy_(torch.eye(hidden_size))
            for tensor in (self.q_proj.bias, self.k_proj.bias, self.v_proj.weight, self.v_proj.bias):
                tensor.zero_()

    def forward(self, state: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        split = (*state.shape[:-1], -1, self.head_dim)
        q = self.q_proj(self.norm(state)).view(split)
        k = self.k_proj(embedded).view(split)
        v = self.v_proj(embedded).view(split)
        gate = nn.functional.cosine_similarity(q, k, dim=-1, eps=1e-6).unsqueeze(-1)
        return state + (gate * v).flatten(-2)


def _mixer_head_dim(hidden_size: int) -> int:
    """Width of the mixers' attention heads: 64 where it divides the hidden size (Clover-2 has 128 on a 4096-wide
    base, the base's own head width), else one head over the whole state."""
    return 64 if hidden_size % 64 == 0 else hidden_size


class CloverDrafter(Drafter):
    """Depth 0 reads the augmenting block's ``s_0``; depth ``k`` mixes the token drafted above it into ``s_k``.

    A head's state is ``[s_k; y_k]``: the running state the next depth mixes into, and the output the
    vocabulary projection reads (`readout`)."""

    drafter_type = "clover"
    reads_tokens = True

    def __init__(self, config: CerberusConfig):
        super().__init__(config)
        d = config.hidden_size
        head_dim = _mixer_head_dim(d)
        self.context_window = config.context_window
        self.first_mixer = TokenMixer(d, head_dim)
        self.augmenting = AttentionAdapter(d, config.adapter_heads, config.adapter_head_dim)
        self.mixer = TokenMixer(d, head_dim)
        self.first_fc = nn.Linear(d, d)
        self.fc = nn.Linear(2 * d, d)
        self.out_norm = nn.RMSNorm(d, eps=1e-6)
        with torch.no_grad():
            self.first_fc.weight.copy_(torch.eye(d))
            self.fc.weight.zero_()
            self.fc.weight[:, :d].copy_(torch.eye(d))
            self.first_fc.bias.zero_()
            self.fc.bias.zero_()

    def build_blocks(self, config: CerberusConfig) -> nn.ModuleList:
        return nn.ModuleList()  # no per-head blocks: every depth after the first shares the mixer and FC

    def window_rows(self, hidden: torch.Tensor, next_tokens: torch.LongTensor) -> torch.Tensor:
        return self.first_mixer(hidden, self.embed(next_tokens))

    def read_window(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(rows.shape[-2], device=rows.device)
        return self.augmenting(rows, positions, key_mask=valid, queries=1)[0][:, -1]

    def head_state(self, k, hidden, tokens, previous) -> torch.Tensor:
        if k == 0:
            state, out = hidden, self.first_fc(hidden)
        else:
            embedded = self.embed(tokens[:, k])
            state = self.mixer(previous[..., : self.hidden_size], embedded)
            out = self.fc(torch.cat([state, embedded], dim=-1))
        return torch.cat([state, self.out_norm(out)], dim=-1)

    def readout(self, k: int, state: torch.Tensor) -> torch.Tensor:
        return state[..., self.hidden_size :]
