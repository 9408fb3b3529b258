"""A batch of cache positions as the heads train on it: the (position, head) pairs with a target (`Rows`), the
heads up to their projection as one module (`HeadStates`, what DDP wraps), and their per-head losses."""

from __future__ import annotations

import torch
from torch import nn

from ..drafters.base import context_windows
from .hidden_cache import HiddenStateCache
from .loss import projection_loss


class HeadStates(nn.Module):
    """The heads up to their vocabulary projection, as one module (what DDP wraps)."""

    def __init__(self, heads: nn.Module):
        super().__init__()
        self.heads = heads

    def forward(self, hidden: torch.Tensor, tokens: torch.LongTensor, next_tokens: torch.LongTensor | None = None,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Forced states from each row's state (``[n, hidden]``), or from windows of states when the drafter
        reads one (``[n, W, hidden]`` with ``next_tokens`` and ``valid``: `Drafter.contextualize`)."""
        if next_tokens is not None:
            hidden = self.heads.contextualize(hidden, next_tokens, valid)
        return self.heads.forced_states(hidden, tokens)


class Rows:
    """The (position, head) pairs of a batch that have a target, with their targets."""

    def __init__(self, cache: HiddenStateCache, remaining: torch.Tensor, positions: torch.Tensor, num_heads: int,
                 distill_weight: float | torch.Tensor, device: torch.device, context_window: int = 0):
        batch_index, heads = [], []
        for k in range(num_heads):
            valid = torch.nonzero(remaining[positions] >= k + 1).flatten()
            batch_index.append(valid)
            heads.append(torch.full_like(valid, k))
        self.batch_index = torch.cat(batch_index)
        self.head = torch.cat(heads)
        target_pos = positions[self.batch_index] + self.head + 1
        labels = cache.tokens[target_pos]
        # the teacher's share of each target: one number, or one per cache position (text records differ)
        weight = distill_weight[target_pos] if torch.is_tensor(distill_weight) else \
            torch.full((labels.shape[0],), float(distill_weight))
        if bool((weight > 0).any()):
            if cache.teacher_ids is None:
                raise ValueError("training on the base's distribution (distill weight > 0, or text records) needs a "
                                 "hidden-state cache built with teacher_topk > 0.")
            teacher = torch.softmax(cache.teacher_logprobs[target_pos].float(), dim=-1)  # renormalised top-k
            ids = torch.cat([labels[:, None], cache.teacher_ids[target_pos].long()], dim=1)
            probs = torch.cat([(1.0 - weight)[:, None], weight[:, None] * teacher], dim=1)
        else:
            ids, probs = labels[:, None], torch.ones(labels.shape[0], 1)
        self.labels = labels.to(device)
        self.target_ids = ids.to(device)
        self.target_probs = probs.to(device)
        # the state each row's heads read, or the window of states ending at it within its record
        self.next_tokens = self.valid = None
        read = positions
        if context_window > 0:
            read, valid = context_windows(positions, cache.first_rows(positions), context_window)
            self.next_tokens, self.valid = cache.tokens[read].to(device), valid.to(device)
        self.hidden = cache.hidden[read].to(device=device, dtype=torch.float32)
        # the true tokens at t + 1 .. t + num_heads after each state (teacher forcing for drafters that read
        # them); past a record's end they are never used, since those (position, head) pairs have no target
        ahead = (positions[:, None] + torch.arange(num_heads)).clamp(max=cache.num_positions - 1)
        self.tokens = cache.tokens[ahead].to(device)
        self.batch_index = self.batch_index.to(device)
        self.head = self.head.to(device)


def lm_head_projection(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    lm_head = model.base.get_output_embeddings()
    bias = getattr(lm_head, "bias", None)
    return lm_head.weight.detach(), (bias.detach() if bias is not None else None)


def head_losses(model, states: torch.Tensor, rows: Rows, weight, bias, chunk_rows: int,
                 vocab: torch.Tensor | None = None):
    """Per-row losses and top-1 hits for the rows of a batch (``states``: ``[batch, heads, hidden]``), over the
    whole vocabulary or over ``vocab`` and the batch's targets (`projection_loss`)."""
    picked = states[rows.batch_index, rows.head]
    if not model.heads.own_projection:
        return projection_loss(picked.to(weight.dtype), weight, rows.target_ids, rows.target_probs, rows.labels, bias=bias,
                               chunk_rows=chunk_rows, vocab=vocab)
    parts_l, parts_c, order = [], [], []
    for k, proj in enumerate(model.heads.lm_heads):
        sel = torch.nonzero(rows.head == k).flatten()
        loss_k, correct_k = projection_loss(picked[sel], proj.weight, rows.target_ids[sel], rows.target_probs[sel],
                                            rows.labels[sel], chunk_rows=chunk_rows, vocab=vocab)
        parts_l.append(loss_k)
        parts_c.append(correct_k)
        order.append(sel)
    order = torch.cat(order)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.shape[0], device=order.device)
    losses, correct = torch.cat(parts_l)[inverse], torch.cat(parts_c)[inverse]
    return losses, correct
