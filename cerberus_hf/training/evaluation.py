"""Held-out accuracy of draft heads over a hidden-state cache: per-head top-1 and top-k of the base's own next
tokens, on a fixed subset of held-out positions (`EVAL_SUBSET_SEED`, independent of the training seed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .batches import HeadStates, Rows, lm_head_projection
from .hidden_cache import HiddenStateCache

EVAL_SUBSET_SEED = 1234  # the held-out subset must not depend on the training seed


@torch.no_grad()
def evaluate_heads(
    model,
    cache: HiddenStateCache,
    positions: torch.Tensor,
    *,
    batch_size: int = 512,
    chunk_rows: int = 512,
    accelerator=None,
    vocab: torch.Tensor | None = None,
) -> dict:
    """Per-head top-1 / top-5 accuracy and cross-entropy against the data's tokens at ``positions``.

    Head ``k`` at cache row ``i`` is scored against ``tokens[i + k + 1]`` wherever that token exists.
    With several processes each scores its share and the counts are summed. With ``vocab`` (a draft
    vocabulary) the top-1 / top-5 are taken among those tokens only, as drafting with it proposes them, and a
    target outside it is a miss; the cross-entropy stays over the whole vocabulary.
    """
    heads = model.heads
    num_heads = heads.num_heads
    device = next(heads.parameters()).device
    weight, bias = lm_head_projection(model)
    outside = outside_of(vocab, weight.shape[0], device)
    remaining = cache.remaining()
    total_positions = int(positions.shape[0])
    if accelerator is not None and accelerator.num_processes > 1:
        positions = positions[accelerator.process_index :: accelerator.num_processes]
    counts = torch.zeros(4, num_heads, dtype=torch.float64)  # rows, top1, top5, loss sum
    was_training = heads.training
    heads.eval()
    head_states = HeadStates(heads)
    for start in range(0, positions.shape[0], batch_size):
        batch = positions[start : start + batch_size]
        rows = Rows(cache, remaining, batch, num_heads, 0.0, device, heads.context_window)
        states = head_states(rows.hidden.to(heads.dtype), rows.tokens, rows.next_tokens, rows.valid)
        picked = states[rows.batch_index, rows.head]
        for lo in range(0, picked.shape[0], chunk_rows):
            hi = min(lo + chunk_rows, picked.shape[0])
            x, head = picked[lo:hi], rows.head[lo:hi]
            if heads.own_projection:
                logits = torch.empty(hi - lo, weight.shape[0], dtype=x.dtype, device=x.device)
                for k, proj in enumerate(heads.lm_heads):
                    sel = torch.nonzero(head == k).flatten()
                    logits[sel] = proj(x[sel])
            else:
                logits = F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
            logits = logits.float()
            labels = rows.labels[lo:hi]
            loss = F.cross_entropy(logits, labels, reduction="none")
            hit1, hit5 = top_hits(logits, labels, outside)
            head_cpu = head.cpu()
            counts[0].index_add_(0, head_cpu, torch.ones(hi - lo, dtype=torch.float64))
            counts[1].index_add_(0, head_cpu, hit1.cpu().double())
            counts[2].index_add_(0, head_cpu, hit5.cpu().double())
            counts[3].index_add_(0, head_cpu, loss.cpu().double())
    heads.train(was_training)
    if accelerator is not None and accelerator.num_processes > 1:
        counts = accelerator.reduce(counts.to(accelerator.device), reduction="sum").cpu()
    n = counts[0].clamp(min=1)
    return {
        "top1": [round(float(v), 6) for v in counts[1] / n],
        "top5": [round(float(v), 6) for v in counts[2] / n],
        "loss": [round(float(v), 6) for v in counts[3] / n],
        "rows": [int(v) for v in counts[0]],
        "positions": total_positions,
    }


def outside_of(vocab: torch.Tensor | None, size: int, device: torch.device) -> torch.Tensor | None:
    """A ``[size]`` mask of the token ids not in ``vocab`` (None without one), for `top_hits`."""
    if vocab is None:
        return None
    outside = torch.ones(size, dtype=torch.bool, device=device)
    outside[vocab.to(device)] = False
    return outside


def top_hits(logits: torch.Tensor, labels: torch.Tensor,
             outside: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, whether ``labels`` is the top-1 and among the top-5 of ``logits``, ranking only the tokens not
    ``outside`` when a mask is given (a draft vocabulary: what drafting with it can propose)."""
    if outside is not None:
        logits = logits.masked_fill(outside, float("-inf"))
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    hit1, hit5 = top5[:, 0] == labels, (top5 == labels[:, None]).any(-1)
    if outside is not None:  # fewer than five tokens inside: the top five reach masked ones
        inside = ~outside[labels]
        hit1, hit5 = hit1 & inside, hit5 & inside
    return hit1, hit5


def position_subset(positions: torch.Tensor, limit: int | None, seed: int) -> torch.Tensor:
    if limit is None or positions.shape[0] <= limit:
        return positions
    order = torch.randperm(positions.shape[0], generator=torch.Generator().manual_seed(seed))[:limit]
    return positions[order.sort().values]
