"""`CerberusCandidateGenerator`: the verifier's last hidden state in, draft tokens out.

It follows transformers' `CandidateGenerator` contract (`get_candidates` returns the input ids with the
candidates appended; `update_candidate_strategy` hears how many were accepted), so the decoding loop
treats it like any other drafter. The entropy gate lives here: a step the gate rejects gets no
candidates, and the loop decodes a single token.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.generation.candidate_generator import CandidateGenerator

from .gate import EntropyGate
from .heads import DraftHeads
from .stats import GenerationStats


class CerberusCandidateGenerator(CandidateGenerator):
    """Drafts a chain of tokens from draft heads, one token per head (each head's top-1).

    Args:
        heads: the draft heads.
        base_lm_head: the base model's output projection (used by heads without their own).
        gate: decides per step whether to draft at all.
        max_length: total length the sequence may reach; drafts never run past it.
        stats: where per-step figures are recorded.
    """

    requires_model_outputs = True

    def __init__(
        self,
        heads: DraftHeads,
        base_lm_head: nn.Module,
        gate: EntropyGate,
        max_length: int,
        stats: GenerationStats,
    ):
        self.heads = heads
        self.base_lm_head = base_lm_head
        self.gate = gate
        self.max_length = max_length
        self.stats = stats
        self._last_drafted = 0

    @torch.no_grad()
    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        last_hidden_state: torch.Tensor | None = None,
        next_token_logits: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.LongTensor, None]:
        """Append up to ``num_heads`` drafts to ``input_ids`` (batch size 1).

        ``last_hidden_state`` ([1, hidden]) is the verifier's state at the position that predicted the
        last token of ``input_ids``; ``next_token_logits`` ([1, vocab]) the raw prediction made from it,
        which the gate reads. A verification step emits the accepted drafts plus one token, so at most
        ``max_length - len - 1`` drafts fit.
        """
        room = self.max_length - input_ids.shape[1] - 1
        drafting = room > 0 and self.gate.should_draft(next_token_logits)
        self.stats.record_gate(drafting)
        if not drafting:
            self._last_drafted = 0
            return input_ids, None
        logits = self.heads(last_hidden_state.to(self.heads_dtype), self.base_lm_head)  # [1, heads, vocab]
        drafts = logits[:, :room].argmax(dim=-1).to(input_ids.dtype)
        self._last_drafted = drafts.shape[1]
        return torch.cat([input_ids, drafts], dim=1), None

    @property
    def heads_dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor | None, num_matches: int):
        """Record how the last proposal fared (the chain is fixed; nothing adapts yet)."""
        self.stats.record_step(emitted=num_matches + 1, drafted=self._last_drafted)
        self._last_drafted = 0
