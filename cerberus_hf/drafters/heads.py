"""Draft heads: the shared residual-stack machinery, and the head types as the small part that differs.

Every head reads the base model's last hidden state ``h`` at position ``t`` (the state the base's
``lm_head`` turns into its prediction for ``t + 1``). Head ``k`` (0-based) predicts token ``t + k + 2``.

* Medusa heads are independent: ``z_k = stack_k(h)``.
* Cerberus heads pass knowledge along the heads: the first block of head ``k > 0`` reads
  ``concat(h, z_{k-1})``, so ``z_k = stack_k(h, z_{k-1})``. All heads still run in one call, with no
  token sampled between them.

Blocks compute ``x + SiLU(W [x; extra] + b)`` with ``W`` and ``b`` zero-initialised, so a fresh head is
the identity and a fresh set of heads drafts the base's own next-token guess: wrong, but harmless,
since verification decides what is kept.
"""

from __future__ import annotations

import weakref
from typing import ClassVar

import torch
from torch import nn

from ..configuration_cerberus import CerberusConfig


class ResidualBlock(nn.Module):
    """``x + SiLU(W [x; extra] + b)``; identity at initialisation."""

    def __init__(self, hidden_size: int, extra_size: int = 0):
        super().__init__()
        self.extra_size = extra_size
        self.linear = nn.Linear(hidden_size + extra_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        inputs = x if extra is None else torch.cat([x, extra], dim=-1)
        return x + self.act(self.linear(inputs))


class DraftHeads(nn.Module):
    """A stack of residual blocks per head, plus an optional vocabulary projection per head.

    Subclasses set ``head_type`` and ``sequential`` (whether head ``k`` reads head ``k - 1``'s state).
    Each head's blocks live in their own ``ModuleList`` (no block is shared between heads).
    """

    head_type: ClassVar[str]
    sequential: ClassVar[bool]

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int,
        own_projection: bool,
        draft_vocab_size: int | None = None,
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.num_heads = num_heads
        self.blocks = nn.ModuleList(
            nn.ModuleList(
                ResidualBlock(hidden_size, hidden_size if (self.sequential and k > 0 and layer == 0) else 0)
                for layer in range(num_layers)
            )
            for k in range(num_heads)
        )
        self.lm_heads = (
            nn.ModuleList(nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))
            if own_projection
            else None
        )
        # Drafting may project onto a frequency-ranked subset of the vocabulary: the projection is the
        # costly part of a head on a CPU, and verification still uses the full vocabulary.
        self.register_buffer(
            "draft_vocab", torch.zeros(draft_vocab_size, dtype=torch.long) if draft_vocab_size else None
        )
        self._draft_rows: dict[int, tuple] = {}

    @property
    def own_projection(self) -> bool:
        return self.lm_heads is not None

    def init_projections_from(self, lm_head_weight: torch.Tensor) -> None:
        """Start each own projection as a copy of the base ``lm_head`` (the Medusa-1 recipe)."""
        if self.lm_heads is None:
            return
        with torch.no_grad():
            for proj in self.lm_heads:
                proj.weight.copy_(lm_head_weight)

    def hidden_states(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-head states ``[..., num_heads, hidden_size]`` from base states ``[..., hidden_size]``."""
        states = []
        previous = None
        for stack in self.blocks:
            z = hidden
            for layer, block in enumerate(stack):
                z = block(z, previous if (layer == 0 and block.extra_size) else None)
            states.append(z)
            previous = z
        return torch.stack(states, dim=-2)

    def forward(self, hidden: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """Per-head logits ``[..., num_heads, V]`` over the draft vocabulary (``token_ids`` maps their
        indices to token ids; V is the full vocabulary when no draft vocabulary is set).
        ``base_lm_head`` is used unless heads own projections."""
        states = self.hidden_states(hidden)
        if self.lm_heads is None:
            return self._project(states, base_lm_head)
        return torch.stack([self._project(states[..., k, :], proj) for k, proj in enumerate(self.lm_heads)], dim=-2)

    def _project(self, states: torch.Tensor, projection: nn.Module) -> torch.Tensor:
        """``projection(states)``, restricted to the draft vocabulary's rows when one is set."""
        if self.draft_vocab is None:
            return projection(states)
        bias = getattr(projection, "bias", None)
        return nn.functional.linear(
            states, self._draft_rows_of(projection.weight), self._draft_rows_of(bias) if bias is not None else None
        )

    def _draft_rows_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor[draft_vocab]``, gathered once and reused while neither tensor changes: a fresh gather
        of the projection rows each decoding step costs about as much as the reduced projection itself."""
        if torch.is_grad_enabled() and tensor.requires_grad:
            return tensor[self.draft_vocab]
        key = (tensor._version, self.draft_vocab.data_ptr(), self.draft_vocab._version)
        cached = self._draft_rows.get(id(tensor))
        if cached is None or cached[0]() is not tensor or cached[1] != key:
            cached = (weakref.ref(tensor), key, tensor[self.draft_vocab])
            self._draft_rows[id(tensor)] = cached
        return cached[2]

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of indices into the logits `forward` returns."""
        return indices if self.draft_vocab is None else self.draft_vocab[indices]

    def set_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Draft over these token ids only (e.g. the most frequent ones), or over all when None."""
        self._draft_rows.clear()
        if token_ids is None:
            self.draft_vocab = None
            return
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        if token_ids.numel() == 0 or int(token_ids.min()) < 0 or int(token_ids.max()) >= self.vocab_size:
            raise ValueError(f"A draft vocabulary needs token ids in [0, {self.vocab_size}).")
        self.draft_vocab = token_ids.to(next(self.parameters()).device)


class MedusaHeads(DraftHeads):
    """Independent heads (Cai et al., 2024)."""

    head_type = "medusa"
    sequential = False


class CerberusHeads(DraftHeads):
    """Heads where head ``k`` also reads head ``k - 1``'s state (Liu et al., 2024, arXiv 2410.13344)."""

    head_type = "cerberus"
    sequential = True


HEAD_CLASSES: dict[str, type[DraftHeads]] = {cls.head_type: cls for cls in (MedusaHeads, CerberusHeads)}


def build_heads(config: CerberusConfig) -> DraftHeads:
    """The heads module a config describes, freshly initialised."""
    if config.head_type not in HEAD_CLASSES:
        raise ValueError(f"Unknown head_type {config.head_type!r}; expected one of {', '.join(HEAD_CLASSES)}.")
    if config.hidden_size is None or config.vocab_size is None:
        raise ValueError("CerberusConfig needs hidden_size and vocab_size (taken from the base) to build heads.")
    return HEAD_CLASSES[config.head_type](
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        own_projection=config.head_projection == "own",
        draft_vocab_size=config.draft_vocab_size,
    )
