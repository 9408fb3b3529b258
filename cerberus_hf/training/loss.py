"""The heads' loss: soft cross-entropy through the large frozen vocabulary projection, in row chunks, by a fused
function that returns the loss and the gradient of the heads' states together, so that at most ``chunk_rows x vocab``
logits exist at a time and none is kept for the backward pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _ChunkedProjectionLoss(torch.autograd.Function):
    """Per-row ``logsumexp(z) - sum_j q_j z[ids_j]`` with ``z = states @ weight.T (+ bias)``.

    ``q`` is a sparse target distribution per row (ids and probabilities), so one call covers hard labels,
    distillation to the base's top-k, and any mixture. Rows are processed ``chunk_rows`` at a time. When
    the projection is frozen, the gradient of the states (``(softmax(z) - q) @ weight`` per row) is formed
    in the same pass and scaled by the incoming per-row gradient in backward; a trainable projection is
    recomputed chunk by chunk in backward instead. Also returns, per row, whether the top-1 logit is
    ``labels`` (not differentiable).
    """

    @staticmethod
    def forward(ctx, states, weight, bias, target_ids, target_probs, labels, chunk_rows):
        rows = states.shape[0]
        losses = torch.empty(rows, dtype=torch.float32, device=states.device)
        correct = torch.empty(rows, dtype=torch.bool, device=states.device)
        need_states = ctx.needs_input_grad[0]
        need_projection = ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[2])
        grad_states = torch.empty_like(states) if need_states and not need_projection else None
        for start in range(0, rows, chunk_rows):
            end = min(start + chunk_rows, rows)
            logits = F.linear(states[start:end], weight, bias).float()
            lse = torch.logsumexp(logits, dim=-1)
            ids, probs = target_ids[start:end], target_probs[start:end]
            losses[start:end] = lse - (probs.to(logits.dtype) * logits.gather(1, ids)).sum(-1)
            correct[start:end] = logits.argmax(-1) == labels[start:end]
            if grad_states is not None:
                logits.sub_(lse[:, None]).exp_().scatter_add_(1, ids, -probs.to(logits.dtype))  # softmax - q
                grad_states[start:end] = (logits.to(weight.dtype) @ weight).to(states.dtype)
        ctx.mark_non_differentiable(correct)
        ctx.chunk_rows = chunk_rows
        ctx.recompute = need_projection
        if need_projection:
            ctx.save_for_backward(states, weight, bias, target_ids, target_probs)
        elif grad_states is not None:
            ctx.save_for_backward(grad_states)
        return losses, correct

    @staticmethod
    def backward(ctx, grad_losses, _grad_correct):
        if not ctx.recompute:
            if not ctx.saved_tensors:
                return (None,) * 7
            (grad_states,) = ctx.saved_tensors
            return grad_states * grad_losses[:, None].to(grad_states.dtype), None, None, None, None, None, None
        states, weight, bias, target_ids, target_probs = ctx.saved_tensors
        grad_states = torch.empty_like(states) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if bias is not None else None
        for start in range(0, states.shape[0], ctx.chunk_rows):
            end = min(start + ctx.chunk_rows, states.shape[0])
            x = states[start:end]
            logits = F.linear(x, weight, bias).float()
            lse = torch.logsumexp(logits, dim=-1)
            delta = logits.sub_(lse[:, None]).exp_()
            delta.scatter_add_(1, target_ids[start:end], -target_probs[start:end].to(delta.dtype))
            delta.mul_(grad_losses[start:end, None].float())
            if grad_states is not None:
                grad_states[start:end] = (delta.to(weight.dtype) @ weight).to(states.dtype)
            grad_weight += delta.T @ x.float()
            if grad_bias is not None:
                grad_bias += delta.sum(0)
        grad_weight = grad_weight.to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None and ctx.needs_input_grad[2] else None
        return grad_states, grad_weight, grad_bias, None, None, None, None


def projection_loss(
    states: torch.Tensor,
    weight: torch.Tensor,
    target_ids: torch.Tensor,
    target_probs: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_rows: int = 512,
    vocab: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row soft cross-entropy, per-row top-1 == label) of ``states`` projected by ``weight``.

    ``target_ids`` / ``target_probs`` ``[rows, m]`` give each row's target distribution (probabilities
    summing to one; repeated ids add up). Differentiable in ``states`` and, if they require grad,
    ``weight`` / ``bias``; memory stays at ``chunk_rows x vocab`` logits.

    ``vocab`` (token ids) restricts the softmax to those rows of the projection plus every id the targets
    name. The product with the full ``lm_head`` is most of a step's arithmetic, and a drafter that drafts
    among a few thousand frequent tokens (``draft_vocab_size``) never proposes the others, so scoring them
    buys little: with 4,096 of SmolLM2's 49,152 rows the step's projection costs about a tenth. The loss
    and the top-1 are then those of the restricted softmax.
    """
    if vocab is not None:
        scored = torch.unique(torch.cat([vocab.to(target_ids.device), target_ids.flatten(), labels]))  # sorted
        weight = weight[scored]
        bias = bias[scored] if bias is not None else None
        target_ids = torch.searchsorted(scored, target_ids.contiguous())
        labels = torch.searchsorted(scored, labels.contiguous())
    return _ChunkedProjectionLoss.apply(states, weight, bias, target_ids, target_probs, labels, int(chunk_rows))
