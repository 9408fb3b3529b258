"""Train draft heads (Medusa, Cerberus, Hydra, Clover) on a frozen base, from the base's own answers
(``cerberus-hf distill``).

Recipe (Medusa-1, Cai et al. 2024, with the heads projecting through the frozen base ``lm_head``):

1. The base runs once over every training sequence ``input_ids + output_ids``; its last hidden states at
   the answer positions are cached on disk in float16 with the answer tokens and the base's top-k
   next-token log-probabilities (`hidden_cache`). Nothing later runs the base again.
2. Head ``k`` reading the state at position ``t`` is trained to predict token ``t + k + 2`` with
   cross-entropy, weighted ``head_weight_decay ** k``; with ``distill_weight = a`` the target is the
   mixture ``(1 - a) * one_hot(token) + a * p_base`` where ``p_base`` is the base's own distribution for
   that token (``softmax(lm_head(h_{t+k+1}))``, kept as its top-k, renormalised). Only answer tokens are
   targets; held-out records (a fixed share of record ids) are never trained on.
3. The loss over the 49k-word vocabulary dominates the cost. It is computed in row chunks by a fused
   function that returns the loss and the gradient of the heads' states together, so at most
   ``chunk_rows x vocab`` logits exist at a time and no logits are kept for the backward pass.

Runs are deterministic under a seed (the data order is drawn from the seed and the epoch number alone, dropout
from the seeded global RNG) and resumable: every ``save_every`` steps `save_checkpoint` writes the heads, AdamW's
moments and every process's RNG state in safetensors, and the run's settings, history, AdamW's hyper-parameters, the
schedule and Python's and NumPy's RNG states in JSON, atomically under ``output_dir/checkpoints/step-N``; a killed
run started again with the same arguments continues from the last one and ends with the same weights and history
as a run that was never interrupted. No checkpoint file is a pickle and none is ever unpickled (accelerate's
``save_state`` writes pickles, which run code when loaded): a pickle in the folder makes the resume refuse it
(`resume_checkpoint`). ``accelerate`` runs the same code on several GPUs (``accelerate launch``): each process
takes its slice of every batch and gradients are averaged. A run can start from saved heads instead of fresh ones
(``init_from``): a curriculum, one data set after another, or shipped heads adapted to one's own data.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn
from tqdm.auto import tqdm

from .data import frequent_tokens, read_records
from ..drafters.base import context_windows
from .hidden_cache import HiddenStateCache, build_hidden_cache, id_bucket, split_record_ids
from ..configuration_cerberus import HEAD_TYPES, STATE_SOURCES
from ..decoding.hardware import describe_device
from ..real_models import load_named_model

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
METRICS_NAME = "training_metrics.json"
STATE_NAME = "trainer_state.json"
EVAL_SUBSET_SEED = 1234  # the held-out subset must not depend on the training seed
WINDOW_SUMS = ("head_loss", "head_hits", "head_rows")  # per-head sums of a history entry's interval


# --------------------------------------------------------------------------------------------------------
# The loss: soft cross-entropy through a large frozen projection, in chunks
# --------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------
# Batches from the cache
# --------------------------------------------------------------------------------------------------------


class _HeadStates(nn.Module):
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


class _Rows:
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


def _projection(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    lm_head = model.base.get_output_embeddings()
    bias = getattr(lm_head, "bias", None)
    return lm_head.weight.detach(), (bias.detach() if bias is not None else None)


def _head_losses(model, states: torch.Tensor, rows: _Rows, weight, bias, chunk_rows: int,
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


# --------------------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------------------


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
    weight, bias = _projection(model)
    outside = outside_of(vocab, weight.shape[0], device)
    remaining = cache.remaining()
    total_positions = int(positions.shape[0])
    if accelerator is not None and accelerator.num_processes > 1:
        positions = positions[accelerator.process_index :: accelerator.num_processes]
    counts = torch.zeros(4, num_heads, dtype=torch.float64)  # rows, top1, top5, loss sum
    was_training = heads.training
    heads.eval()
    head_states = _HeadStates(heads)
    for start in range(0, positions.shape[0], batch_size):
        batch = positions[start : start + batch_size]
        rows = _Rows(cache, remaining, batch, num_heads, 0.0, device, heads.context_window)
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


def _subset(positions: torch.Tensor, limit: int | None, seed: int) -> torch.Tensor:
    if limit is None or positions.shape[0] <= limit:
        return positions
    order = torch.randperm(positions.shape[0], generator=torch.Generator().manual_seed(seed))[:limit]
    return positions[order.sort().values]


# --------------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------------


# What a checkpoint folder holds. Tensors go in safetensors and everything else in JSON, and resuming reads
# nothing else: a pickle (what torch.save and accelerate's save_state write) runs code when it is loaded, and a run
# folder is easily copied from elsewhere, so a planted one must never be opened.
WEIGHTS_NAME = "weights.safetensors"  # the trained module's state_dict
OPTIMIZER_NAME = "optimizer_state.safetensors"  # the optimizer's per-parameter tensors, as "<param index>.<name>"
RNG_TENSORS_NAME = "rng_state_{}.safetensors"  # per process: torch's CPU generator, and CUDA's when there is CUDA
RNG_JSON_NAME = "rng_state_{}.json"  # per process: Python's and NumPy's generators
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth", ".ckpt")


def _checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    folder = output_dir / CHECKPOINTS_DIR
    found = []
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith("step-") and (path / STATE_NAME).is_file():
                try:
                    found.append((int(path.name[5:]), path))
                except ValueError:
                    continue
    return sorted(found)


def is_pickle_file(path: Path) -> bool:
    """Whether ``path`` is, or is named as, a pickle: a pickle-format suffix, a pickle protocol 2-5 header
    (``\\x80`` and the protocol number), or a zip archive (``torch.save``'s format, a pickle inside).

    A safetensors file starts with its header's length (8 bytes, little-endian) and then ``{``: a header of 640
    bytes (0x0280) also begins ``\\x80\\x02``, so a file laid out that way is not taken for a pickle.
    """
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    with path.open("rb") as handle:
        head = handle.read(9)
    if head[:4] == b"PK\x03\x04":
        return True
    if len(head) < 2 or head[0] != 0x80 or not 2 <= head[1] <= 5:
        return False
    safetensors_header = len(head) == 9 and head[8:9] == b"{" and \
        int.from_bytes(head[:8], "little") + 8 <= path.stat().st_size
    return not safetensors_header


def refuse_pickles(folder: Path) -> None:
    """Raise if anything in ``folder`` is a pickle (`is_pickle_file`), before any of it is read."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and is_pickle_file(path):
            raise ValueError(
                f"{path} is a pickle; cerberus-hf never unpickles files (they can run code), so checkpoints written "
                "by cerberus-hf before it kept its own safetensors and JSON files (through accelerate's save_state) "
                "cannot be resumed safely. Delete it or start a fresh run (resume=False, --no-resume).")


def _rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """This process's generators: torch's as tensors, Python's and NumPy's as JSON-able lists."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda.{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    version, key, gauss = random.getstate()
    kind, np_key, position, has_gauss, cached_gauss = np.random.get_state()
    return tensors, {"python": [version, list(key), gauss],
                     "numpy": [kind, np_key.tolist(), int(position), int(has_gauss), float(cached_gauss)]}


def _set_rng_state(tensors: dict[str, torch.Tensor], saved: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda.{i}"] for i in range(len(tensors)) if f"cuda.{i}" in tensors]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    version, key, gauss = saved["python"]
    random.setstate((version, tuple(key), gauss))
    kind, np_key, position, has_gauss, cached_gauss = saved["numpy"]
    np.random.set_state((kind, np.array(np_key, dtype=np.uint32), position, has_gauss, cached_gauss))


def _optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The optimizer's state_dict as flat tensors (``"<param index>.<name>"``: AdamW's ``exp_avg``, ``exp_avg_sq``
    and ``step``) and JSON (the param groups' hyper-parameters, and any state that is not a tensor)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_files(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], saved: dict) -> None:
    state: dict[int, dict] = {}
    for key, value in [*tensors.items(), *saved["scalars"].items()]:
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    # JSON has no tuples: the hyper-parameters given as pairs (AdamW's betas) come back as lists
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
              for group in saved["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _scheduler_state(scheduler) -> dict:
    """The schedule's state_dict without ``lr_lambdas``: the functions come from the code and the run's arguments
    (checked equal on resume), never from the file."""
    state = scheduler.state_dict()
    state.pop("lr_lambdas", None)
    return state


def _load_scheduler_state(scheduler, state: dict) -> None:
    if hasattr(scheduler, "lr_lambdas"):  # LambdaLR's load_state_dict takes one entry per function; None: left as is
        state = dict(state, lr_lambdas=[None] * len(scheduler.lr_lambdas))
    scheduler.load_state_dict(state)


def save_checkpoint(accelerator, output_dir: Path, step: int, state: dict, keep: int, module: nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler) -> Path:
    """``checkpoints/step-N``: ``module``'s weights and ``optimizer``'s tensors in safetensors (`WEIGHTS_NAME`,
    `OPTIMIZER_NAME`), every process's RNG state (`RNG_TENSORS_NAME`, `RNG_JSON_NAME`), and ``state`` with the
    optimizer's hyper-parameters and ``scheduler``'s state in JSON (`STATE_NAME`): no pickle, so resuming never
    runs code from the folder. Written under a temporary name and renamed, so a run killed while saving leaves the
    previous checkpoints complete; only the newest ``keep`` are kept."""
    folder = output_dir / CHECKPOINTS_DIR
    final, tmp = folder / f"step-{step:08d}", folder / f".tmp-step-{step:08d}"
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".tmp-step-*"):  # left by a run killed while saving
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    rng_tensors, rng_json = _rng_state()
    save_file(rng_tensors, str(tmp / RNG_TENSORS_NAME.format(accelerator.process_index)))
    (tmp / RNG_JSON_NAME.format(accelerator.process_index)).write_text(json.dumps(rng_json) + "\n")
    if accelerator.is_main_process:
        save_model(module, str(tmp / WEIGHTS_NAME), force_contiguous=True)
        optimizer_tensors, optimizer_json = _optimizer_to_files(optimizer)
        save_file(optimizer_tensors, str(tmp / OPTIMIZER_NAME))
        payload = dict(state, step=step, optimizer=optimizer_json, scheduler=_scheduler_state(scheduler))
        (tmp / STATE_NAME).write_text(json.dumps(payload, indent=1) + "\n")
    accelerator.wait_for_everyone()  # every process's RNG files are in before the folder is renamed
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in _checkpoint_dirs(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def resume_checkpoint(accelerator, output_dir: Path, run_config: dict, resume: bool, module: nn.Module,
                      optimizer: torch.optim.Optimizer, scheduler) -> dict | None:
    """The ``state`` of the newest complete checkpoint in ``output_dir`` (`save_checkpoint`), after loading its
    weights into ``module``, its state into ``optimizer`` and ``scheduler`` and this process's RNG state; None if
    there is none (or ``resume`` is False: the checkpoints are removed unread).

    Refused: a folder holding a pickle (`refuse_pickles`, first: accelerate's checkpoints, those of cerberus-hf
    before this format, are such folders), a checkpoint written with other ``run_config`` settings (not silently
    continued), and one without this format's files."""
    checkpoints = _checkpoint_dirs(output_dir)
    if checkpoints and not resume:
        if accelerator.is_main_process:
            shutil.rmtree(output_dir / CHECKPOINTS_DIR, ignore_errors=True)
        accelerator.wait_for_everyone()
        return None
    if not checkpoints:
        return None
    path = checkpoints[-1][1]
    refuse_pickles(path)
    saved = json.loads((path / STATE_NAME).read_text())
    differences = {k: (saved["run_config"].get(k), v) for k, v in run_config.items() if saved["run_config"].get(k) != v}
    if differences:
        raise ValueError(
            f"{path} was written by a run with other settings or data "
            f"({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in differences.items())}). "
            "Resume with the same arguments, pass resume=False (--no-resume) to start over, or use another "
            "output directory."
        )
    if not (path / OPTIMIZER_NAME).is_file():
        raise ValueError(f"{path} has no {OPTIMIZER_NAME}: it was written by an older cerberus-hf, whose checkpoints "
                         "this one cannot resume; pass resume=False (--no-resume) to start over, or use another "
                         "output directory.")
    load_model(module, str(path / WEIGHTS_NAME))
    _optimizer_from_files(optimizer, load_file(str(path / OPTIMIZER_NAME)), saved["optimizer"])
    _load_scheduler_state(scheduler, saved["scheduler"])
    rng = path / RNG_TENSORS_NAME.format(accelerator.process_index)
    if rng.is_file():
        rng_json = path / RNG_JSON_NAME.format(accelerator.process_index)
        _set_rng_state(load_file(str(rng)), json.loads(rng_json.read_text()))
    else:  # saved by fewer processes: this one keeps the seed's generators (the run was not exact anyway)
        logger.warning("%s has no RNG state for process %d", path, accelerator.process_index)
    logger.info("resuming from %s (step %d of %d)", path, saved["step"], run_config["total_steps"])
    return saved


def _cosine_with_warmup(optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


# --------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """Where hidden-state caches go unless told: ``$CERBERUS_HF_CACHE/hidden_states``."""
    from ..real_models import cache_dir

    return cache_dir() / "hidden_states"


def _on_step_end(step: int) -> None:
    """Called after every optimizer step (and its checkpoint); a hook for tests that simulate a kill."""


# What makes saved heads a valid start for a run: the same drafter over the same kind of base.
INIT_FIELDS = ("base_model_type", "hidden_size", "vocab_size", "head_type", "num_heads", "num_layers",
               "head_projection", "adapter_heads", "adapter_head_dim", "context_window", "prefix_layer",
               "exit_layer", "state_source")


def load_initial_heads(model, folder: str | os.PathLike) -> None:
    """Load the heads saved in ``folder`` into ``model.heads`` as a run's starting point.

    The folder must hold the same drafter (`INIT_FIELDS`) for the same kind of base, or this raises before
    anything is loaded. Its draft vocabulary, calibration and rescorers are not taken: they describe the earlier
    run's data, and the new run's heads get their own (a ``train_vocab`` run sets its vocabulary at the end).
    """
    from ..configuration_cerberus import CerberusConfig
    from ..modeling_cerberus import _read_heads

    saved = CerberusConfig.from_pretrained(str(folder))
    differences = {name: (getattr(saved, name), getattr(model.config, name)) for name in INIT_FIELDS
                   if getattr(saved, name) != getattr(model.config, name)}
    if differences:
        raise ValueError(f"{folder} holds other heads than this run trains ("
                         + ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in differences.items())
                         + "); give the same head type and shape options it was trained with.")
    state = _read_heads(str(folder), saved, {})
    state.pop("draft_vocab", None)
    model.heads.load_state_dict(state, strict=False)  # checked above; only the draft vocabulary stays the model's
    logger.info("starting from the heads in %s", folder)


def train_heads(
    model,
    data_path: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 256,
    warmup_ratio: float = 0.05,
    head_weight_decay: float = 0.8,
    distill_weight: float = 0.0,
    text_distill_weight: float = 1.0,
    eval_every: int = 250,
    seed: int = 0,
    max_steps: int | None = None,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    save_every: int | None = None,
    keep_checkpoints: int = 2,
    eval_fraction: float = 0.05,
    train_fraction: float = 1.0,
    eval_max_positions: int | None = 4096,
    teacher_topk: int = 32,
    cache_dir: str | os.PathLike | None = None,
    max_seq_len: int | None = None,
    cache_batch_tokens: int = 4096,
    chunk_rows: int = 512,
    projection_dtype: torch.dtype | str = torch.float32,
    train_vocab: int | None = None,
    init_from: str | os.PathLike | None = None,
    log_every: int = 10,
    num_threads: int | None = None,
    resume: bool = True,
    accelerator=None,
    show_progress: bool = True,
) -> dict:
    """Train ``model.heads`` on a frozen base from a distillation JSONL file; returns the metrics.

    Args:
        model: a `CerberusForCausalLM` (e.g. from ``CerberusForCausalLM.from_base``); its heads are trained in
            place (in float32, cast back to the base's dtype at the end), its base is only read.
        data_path: JSONL of ``{"id", "mode", "prompt", "input_ids", "output_ids", "finished"}`` records (from
            ``cerberus-hf distill``), or several, read in order as one data set.
        output_dir: receives the final heads (``model.save_pretrained``), ``training_metrics.json`` and
            ``checkpoints/`` (leave that out when publishing the folder).
        epochs: passes over the training positions (fractions allowed); ignored when ``max_steps`` is set.
        lr: AdamW peak learning rate; the schedule warms up linearly over ``warmup_ratio`` of the steps,
            then decays along a cosine to zero.
        batch_size: answer positions per optimizer step (each gives up to ``num_heads`` targets), over all
            processes.
        head_weight_decay: head ``k``'s loss weight is ``head_weight_decay ** k`` (Medusa uses 0.8).
        distill_weight: share of the target given to the base's own distribution (top ``teacher_topk``)
            instead of the data token; 0 is plain cross-entropy, 1 pure distillation.
        text_distill_weight: the same share for ``"text"`` records (a dataset's answers, not the base's): by
            default their targets are the base's own distribution alone. When the data holds the base's own
            answers too, held-out accuracy is measured on those only, since that is what decoding meets.
        eval_every: steps between held-out evaluations (0: only at the end).
        seed: data order seed; the same seed and arguments give the same weights.
        max_steps: total optimizer steps (overrides ``epochs``).
        save_every: steps between checkpoints (default: 100, or ``eval_every`` when smaller).
        eval_fraction: share of record ids held out (decided by a hash of the id).
        train_fraction: share of the remaining record ids trained on, by the same hash, so smaller fractions
            are subsets of larger ones and the held-out split never changes: a data-scaling curve measured
            with it says how accuracy grows with data before anyone generates more.
        eval_max_positions: evaluate on a fixed random subset of this many held-out positions (None: all).
        teacher_topk: how many of the base's next-token log-probabilities the cache keeps per position
            (for ``distill_weight``; kept by default so that one cache serves runs with and without it).
        cache_dir: hidden-state cache folder (default: ``$CERBERUS_HF_CACHE/hidden_states``). Entries are
            keyed by base and settings and shards by content, so runs on the same data and base (Medusa and
            Cerberus heads, other hyperparameters) compute the base's states only once.
        chunk_rows: rows of logits formed at once in the loss (memory: ``chunk_rows x vocab x 4`` bytes).
        projection_dtype: dtype of the matrix products with the frozen ``lm_head`` in the loss (softmax and
            loss stay float32). ``torch.bfloat16`` was 1.4-1.7x faster on a 2-core AVX2 CPU without native
            bf16, with the same accuracy in a trial; the heads themselves always train in float32.
        train_vocab: score the loss over the data's ``train_vocab`` most frequent answer tokens plus each batch's
            targets instead of the whole vocabulary (`projection_loss`). The saved heads draft among those tokens
            (their draft vocabulary, which calibrate keeps), and accuracy is scored among them, as drafting meets
            it; rows outside it are never trained, so the heads' ranking over the whole vocabulary is worse.
        init_from: saved heads (a ``save_pretrained`` folder of the same drafter, `load_initial_heads`) to start
            from instead of ``model.heads``' current weights; recorded in the run's settings, so a resumed run
            must name the same folder.
        num_threads: ``torch.set_num_threads`` for the run (default: leave torch's setting).
        resume: continue from the last checkpoint in ``output_dir`` if there is one (its settings must
            match); ``False`` discards existing checkpoints.
        accelerator: an ``accelerate.Accelerator`` (default: a new one; single process on a CPU).

    Returns:
        ``{"eval": {"top1", "top5", "loss", ...} per head on the held-out split, "train_eval": the same on a
        subset of the training positions, "cost": {"wall_time_s", "cache_time_s", "train_time_s",
        "positions_per_s", "device", ...}, "history", "evals", "config", "data"}``, also written to
        ``output_dir/training_metrics.json``.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    started = time.perf_counter()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    accelerator = accelerator or Accelerator()
    if isinstance(projection_dtype, str):
        projection_dtype = getattr(torch, projection_dtype)
    output_dir = Path(output_dir)
    if not 0.0 <= distill_weight <= 1.0:
        raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}.")
    if batch_size < accelerator.num_processes:
        raise ValueError(f"batch_size {batch_size} is smaller than the number of processes.")
    if save_every is None:
        save_every = min(eval_every, 100) if eval_every and eval_every > 0 else 100
    if init_from is not None:  # before the cache, so that a wrong folder fails at once
        load_initial_heads(model, init_from)
    heads = model.heads
    num_heads = heads.num_heads
    device = accelerator.device
    model.base.to(device)

    # ---- the hidden-state cache (the only time the base runs)
    cache_started = time.perf_counter()
    paths = [data_path] if isinstance(data_path, (str, os.PathLike)) else list(data_path)
    records = [record for path in paths for record in read_records(path)]
    repeated = {(r.id, r.mode) for r in records}
    if len(repeated) != len(records):
        raise ValueError(f"{', '.join(map(str, paths))}: a (prompt id, mode) pair appears more than once; "
                         "combine data files whose prompt ids are distinct")
    if not 0.0 <= text_distill_weight <= 1.0:
        raise ValueError(f"text_distill_weight must be in [0, 1], got {text_distill_weight}.")
    cache = build_hidden_cache(
        model.base, records, cache_dir if cache_dir is not None else default_cache_dir(),
        teacher_topk=teacher_topk, max_seq_len=max_seq_len,
        batch_tokens=cache_batch_tokens, accelerator=accelerator, show_progress=show_progress,
        state_source=model.config.state_source,
    )
    cache_time = time.perf_counter() - cache_started
    if not 0.0 < train_fraction <= 1.0:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}.")
    held_out = split_record_ids(cache.record_ids, eval_fraction)
    left_out = held_out | {r for r in cache.record_ids
                           if id_bucket(r) >= eval_fraction + train_fraction * (1.0 - eval_fraction)}
    train_positions = cache.positions(exclude=left_out)
    is_text = cache.position_modes("text")
    eval_positions = cache.positions(record_ids=held_out)
    if not bool(is_text.all()):  # score the base's own answers, which is what decoding meets
        eval_positions = eval_positions[~is_text[eval_positions]]
    eval_positions = _subset(eval_positions, eval_max_positions, EVAL_SUBSET_SEED)
    target_weight = torch.where(is_text, text_distill_weight, distill_weight) if bool(is_text.any()) else distill_weight
    train_eval_positions = _subset(train_positions, eval_max_positions, EVAL_SUBSET_SEED)
    if train_positions.numel() == 0:
        raise ValueError(f"{data_path} has no answer positions to train on (answers too short, or all held out).")
    remaining = cache.remaining()

    steps_per_epoch = math.ceil(train_positions.shape[0] / batch_size)
    total_steps = int(max_steps) if max_steps is not None else max(1, math.ceil(epochs * steps_per_epoch))
    warmup_steps = int(round(warmup_ratio * total_steps))
    run_config = {
        "head_type": model.config.head_type, "num_heads": num_heads, "num_layers": model.config.num_layers,
        "head_projection": model.config.head_projection, "lr": lr, "batch_size": batch_size,
        "warmup_ratio": warmup_ratio, "warmup_steps": warmup_steps, "head_weight_decay": head_weight_decay,
        "distill_weight": distill_weight, "text_distill_weight": text_distill_weight,
        "teacher_topk": cache.teacher_topk, "seed": seed,
        "projection_dtype": str(projection_dtype).replace("torch.", ""), "train_vocab": train_vocab,
        "total_steps": total_steps, "steps_per_epoch": steps_per_epoch, "weight_decay": weight_decay,
        "max_grad_norm": max_grad_norm, "eval_fraction": eval_fraction, "train_fraction": train_fraction,
        "data_digest": cache.info["data_digest"],
        "base_cache_key": cache.info["key"],
        "init_from": str(init_from) if init_from is not None else None,
    }

    # ---- heads, optimizer, schedule (heads train in float32 whatever the base's dtype)
    heads_dtype = next(heads.parameters()).dtype
    heads.to(device=device, dtype=torch.float32)
    heads.train()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = _cosine_with_warmup(optimizer, warmup_steps, total_steps)
    trainable, optimizer_wrapped = accelerator.prepare(_HeadStates(heads), optimizer)
    weight, bias = _projection(model)
    weight = weight.to(device=device, dtype=projection_dtype)
    bias = bias.to(device=device, dtype=projection_dtype) if bias is not None else None
    head_weights = torch.tensor([head_weight_decay**k for k in range(num_heads)], dtype=torch.float32)
    vocab = frequent_tokens(records, train_vocab).to(device) if train_vocab else None

    # ---- resume (a resumed run continues the saved RNG state; a new one starts from the seed's: dropout draws from it)
    trainer_state: dict = {"run_config": run_config, "history": [], "evals": [], "train_time_s": 0.0,
                           "positions_trained": 0}
    step = 0
    # the sums behind the next history entry; checkpointed, so that an entry whose interval a resume splits still
    # averages all of its steps
    window = {"loss": 0.0, "steps": 0, **{key: torch.zeros(num_heads, dtype=torch.float64) for key in WINDOW_SUMS}}
    set_seed(seed)
    saved = resume_checkpoint(accelerator, output_dir, run_config, resume, heads, optimizer, scheduler)
    if saved is not None:
        trainer_state.update({k: saved[k] for k in ("history", "evals", "train_time_s", "positions_trained")})
        step = int(saved["step"])
        window.update(loss=saved["window"]["loss"], steps=saved["window"]["steps"],
                      **{key: torch.tensor(saved["window"][key], dtype=torch.float64) for key in WINDOW_SUMS})

    # ---- the loop
    is_main = accelerator.is_main_process
    progress = tqdm(total=total_steps, initial=step, unit="step", desc=f"training {model.config.head_type} heads",
                    disable=not (show_progress and is_main), dynamic_ncols=True)
    permutation_epoch, permutation = -1, None
    train_started = time.perf_counter()
    train_time_before = trainer_state["train_time_s"]
    positions_this_call = 0
    eval_time = 0.0

    def run_eval(at_step: int) -> dict | None:
        nonlocal eval_time
        if eval_positions.numel() == 0:
            return None
        t0 = time.perf_counter()
        result = evaluate_heads(model, cache, eval_positions, chunk_rows=chunk_rows, accelerator=accelerator,
                                vocab=vocab)
        eval_time += time.perf_counter() - t0
        result = {"step": at_step, **result}
        trainer_state["evals"].append(result)
        if is_main:
            among = f" (among the {train_vocab} train-vocabulary tokens)" if vocab is not None else ""
            progress.write(f"step {at_step}: held-out top-1{among} " + " ".join(f"{v:.3f}" for v in result["top1"])
                           + " | top-5 " + " ".join(f"{v:.3f}" for v in result["top5"]))
        return result

    def state_for_checkpoint() -> dict:
        sums = {"loss": window["loss"], "steps": window["steps"], **{key: window[key].tolist() for key in WINDOW_SUMS}}
        return dict(trainer_state, train_time_s=train_time_before + time.perf_counter() - train_started - eval_time,
                    window=sums)

    while step < total_steps:
        epoch, index = divmod(step, steps_per_epoch)
        if epoch != permutation_epoch:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            permutation = torch.randperm(train_positions.shape[0], generator=generator)
            permutation_epoch = epoch
        batch = train_positions[permutation[index * batch_size : (index + 1) * batch_size]].sort().values
        local = batch[accelerator.process_index :: accelerator.num_processes]
        rows = _Rows(cache, remaining, local, num_heads, target_weight, device, heads.context_window)

        states = trainable(rows.hidden, rows.tokens, rows.next_tokens, rows.valid)
        row_losses, row_correct = _head_losses(model, states, rows, weight, bias, chunk_rows, vocab)
        head_rows = torch.zeros(num_heads, device=device).index_add_(0, rows.head, torch.ones_like(row_losses))
        row_weights = (head_weights.to(device) / head_rows.clamp(min=1))[rows.head]
        loss = (row_losses * row_weights).sum()
        accelerator.backward(loss)
        if max_grad_norm:
            accelerator.clip_grad_norm_(heads.parameters(), max_grad_norm)
        optimizer_wrapped.step()
        scheduler.step()
        optimizer_wrapped.zero_grad(set_to_none=True)
        step += 1
        positions_this_call += int(batch.shape[0])
        trainer_state["positions_trained"] += int(batch.shape[0])

        head_cpu = rows.head.cpu()
        window["loss"] += float(loss.detach())
        window["head_loss"].index_add_(0, head_cpu, row_losses.detach().cpu().double())
        window["head_hits"].index_add_(0, head_cpu, row_correct.cpu().double())
        window["head_rows"].index_add_(0, head_cpu, torch.ones(head_cpu.shape[0], dtype=torch.float64))
        window["steps"] += 1
        if step % log_every == 0 or step == total_steps:
            n = window["head_rows"].clamp(min=1)
            entry = {"step": step, "epoch": round(step / steps_per_epoch, 4),
                     "loss": round(window["loss"] / window["steps"], 6),
                     "head_loss": [round(float(v), 5) for v in window["head_loss"] / n],
                     "head_top1": [round(float(v), 5) for v in window["head_hits"] / n],
                     "lr": scheduler.get_last_lr()[0]}
            trainer_state["history"].append(entry)
            progress.set_postfix(loss=f"{entry['loss']:.3f}", top1="/".join(f"{v:.2f}" for v in entry["head_top1"]))
            window.update(loss=0.0, steps=0)
            for key in WINDOW_SUMS:
                window[key].zero_()
        progress.update(1)
        if eval_every and step % eval_every == 0 and step != total_steps:
            run_eval(step)
        if step % save_every == 0 or step == total_steps:
            save_checkpoint(accelerator, output_dir, step, state_for_checkpoint(), keep_checkpoints, heads, optimizer,
                            scheduler)
        _on_step_end(step)
    progress.close()
    train_time = time.perf_counter() - train_started - eval_time

    # ---- final evaluation, the heads, the metrics
    final_eval = trainer_state["evals"][-1] if trainer_state["evals"] and trainer_state["evals"][-1]["step"] == step else None
    if final_eval is None:
        final_eval = run_eval(step)
        if final_eval is not None:  # keep the checkpoint's record complete
            save_checkpoint(accelerator, output_dir, step, state_for_checkpoint(), keep_checkpoints, heads, optimizer,
                            scheduler)
    t0 = time.perf_counter()
    train_eval = evaluate_heads(model, cache, train_eval_positions, chunk_rows=chunk_rows, accelerator=accelerator,
                                vocab=vocab)
    eval_time += time.perf_counter() - t0
    heads.to(dtype=heads_dtype)
    heads.eval()
    if vocab is not None:  # trained to rank these tokens only: draft among them
        model.set_draft_vocab(vocab, trained=True)
    total_train_time = train_time_before + train_time
    metrics = {
        "top1": final_eval["top1"] if final_eval else None,
        "top5": final_eval["top5"] if final_eval else None,
        "eval": final_eval,
        "train_eval": train_eval,
        "steps": step,
        "epochs": round(step / steps_per_epoch, 4),
        "config": run_config,
        "data": {
            "path": str(paths[0]) if len(paths) == 1 else [str(p) for p in paths],
            "records": len(cache.record_ids), "text_records": sum(m == "text" for m in cache.record_modes),
            "held_out_records": len(held_out),
            "positions": cache.num_positions, "train_positions": int(train_positions.shape[0]),
            "eval_positions": int(eval_positions.shape[0]), "base_agreement": cache.base_agreement(),
            "cache_folder": cache.info["folder"], "cache_shards_computed": cache.info["shards_computed"],
        },
        "cost": {
            "wall_time_s": round(time.perf_counter() - started, 3),
            "cache_time_s": round(cache_time, 3),
            "train_time_s": round(train_time, 3),
            "train_time_s_total": round(total_train_time, 3),
            "eval_time_s": round(eval_time, 3),
            "positions_per_s": round(positions_this_call / train_time, 2) if positions_this_call and train_time > 0 else None,
            "positions_trained": trainer_state["positions_trained"],
            "device": describe_device(device),
            "num_processes": accelerator.num_processes,
        },
        "history": trainer_state["history"],
        "evals": trainer_state["evals"],
    }
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(output_dir)
        (output_dir / METRICS_NAME).write_text(json.dumps(metrics, indent=1) + "\n")
    accelerator.wait_for_everyone()
    return metrics


# --------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------


def add_cli(subparsers):
    """Register the ``train`` subcommand; returns its parser."""
    parser = subparsers.add_parser(
        "train", help="train draft heads (Medusa, Cerberus, Hydra, Clover) or a Kangaroo adapter on a frozen base",
        description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    from ..tools.arguments import set_types  # bad counts and sizes: one-line errors while parsing

    set_types(parser, model_source=("base",), positive_float=("epochs", "lr"), non_negative_int=("teacher_topk",),
              positive_int=("num_heads", "num_layers", "batch_size", "max_steps", "eval_every", "save_every",
                            "num_threads", "train_vocab", "exit_layer", "batch_tokens", "adapter_heads",
                            "adapter_head_dim", "context_window"))
    # the options only some head types read: the others refuse them rather than ignore them
    heads = tuple(h for h in HEAD_TYPES if h != "kangaroo")
    only = {"batch_size": heads, "head_weight_decay": heads, "text_distill_weight": heads, "train_fraction": heads,
            "projection_dtype": heads, "num_layers": ("medusa", "cerberus", "hydra"),
            "exit_layer": ("kangaroo",), "batch_tokens": ("kangaroo",), "adapter_heads": ("kangaroo", "clover", "hydra"),
            "adapter_head_dim": ("kangaroo", "clover", "hydra"), "context_window": ("clover", "hydra"),
            "prefix_layer": ("hydra",), "head_dropout": heads, "state_source": heads, "init_from": heads}
    parser.set_defaults(func=run_cli, only_for={name: (types, parser.get_default(name)) for name, types in only.items()})
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", default="smollm2-135m-instruct",
                        help="packaged model name (see real_models.PACKAGED_MODELS) or a from_pretrained path/id")
    parser.add_argument("--head-type", default="cerberus", choices=HEAD_TYPES)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--data", required=True, action="append",
                        help="distillation JSONL (from `cerberus-hf distill`); repeat to train on several as one set")
    parser.add_argument("--output", default=None, help="folder for the heads, metrics and checkpoints")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=256, help="answer positions per step")
    parser.add_argument("--max-steps", type=int, default=None, help="total steps (overrides --epochs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distill-weight", type=float, default=0.0,
                        help="share of the target given to the base's own distribution (0..1)")
    parser.add_argument("--text-distill-weight", type=float, default=1.0,
                        help="the same share for 'text' records (a dataset's answers; default: the base's distribution "
                             "only). Held-out accuracy is then measured on the base's own answers")
    parser.add_argument("--head-weight-decay", type=float, default=0.8, help="head k's loss weight is this ** k")
    parser.add_argument("--warmup-ratio", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--save-every", type=int, default=None)
    parser.add_argument("--eval-fraction", type=float, default=0.05)
    parser.add_argument("--train-fraction", type=float, default=1.0,
                        help="share of the training records used (nested subsets; for data-scaling curves)")
    parser.add_argument("--cache-dir", default=None,
                        help="hidden-state cache folder, shared between runs (default: $CERBERUS_HF_CACHE/hidden_states)")
    parser.add_argument("--teacher-topk", type=int, default=32,
                        help="base log-probabilities kept per cached position, for --distill-weight (0: none)")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--projection-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="dtype of the products with the frozen lm_head in the loss (bfloat16: faster)")
    parser.add_argument("--train-vocab", type=int, default=None, metavar="N",
                        help="score the loss over the data's N most frequent answer tokens and each batch's targets "
                             "instead of the whole vocabulary (about N/vocab of the projection's cost); the heads "
                             "then draft among those N tokens")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype the base is loaded in")
    parser.add_argument("--init-from", default=None, metavar="FOLDER",
                        help="start from the heads saved in FOLDER (same head type and shape options) instead of fresh "
                             "ones: train on one data set, then another, or adapt shipped heads to your data")
    parser.add_argument("--no-resume", action="store_true", help="discard checkpoints in --output and start over")
    parser.add_argument("--cache-only", action="store_true",
                        help="only compute the hidden-state cache (e.g. while distillation data is still being written)")
    parser.add_argument("--no-progress", action="store_true")
    kangaroo = parser.add_argument_group("kangaroo", "the adapter on the base's first layers (--head-type kangaroo; "
                                         "--num-heads is the longest draft)")
    kangaroo.add_argument("--exit-layer", type=int, default=2, help="base layers the drafter runs before the adapter")
    kangaroo.add_argument("--batch-tokens", type=int, default=8192, help="padded sequence tokens per step")
    parser.add_argument("--state-source", default="lm_head_input", choices=STATE_SOURCES,
                        help="which of the base's last states the heads read: the lm_head's input (after the final "
                             "norm) or the last decoder layer's output (before it, as Clover-2 reads it); each has "
                             "a hidden-state cache of its own")
    parser.add_argument("--head-dropout", type=float, default=0.0,
                        help="dropout on what the heads read and project, in training (Hydra++: 0.2)")
    adapter = parser.add_argument_group("adapter", "Kangaroo's adapter, Clover's augmenting block and Hydra++'s prefix "
                                        "layer (--head-type kangaroo, clover, or hydra with --prefix-layer)")
    adapter.add_argument("--adapter-heads", type=int, default=2)
    adapter.add_argument("--adapter-head-dim", type=int, default=32)
    adapter.add_argument("--context-window", type=int, default=16,
                         help="Clover and Hydra++: how many of the newest verified states the augmenting block or "
                              "the prefix layer reads")
    adapter.add_argument("--prefix-layer", action="store_true",
                         help="Hydra: Hydra++'s prefix layer (a decoder layer over the base's states) before the heads")


def run_cli(args: argparse.Namespace) -> int:
    """Run the ``train`` subcommand from parsed arguments."""
    from ..modeling_cerberus import CerberusForCausalLM

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.output is None and not args.cache_only:
        raise SystemExit("cerberus-hf train: --output is required (unless --cache-only)")
    base = load_named_model(args.base, getattr(torch, args.dtype), with_tokenizer=False)[0]
    if args.cache_only:
        started = time.perf_counter()
        records = [record for path in args.data for record in read_records(path)]
        cache = build_hidden_cache(base, records, args.cache_dir if args.cache_dir is not None else default_cache_dir(),
                                   teacher_topk=args.teacher_topk, show_progress=not args.no_progress,
                                   state_source=args.state_source)
        print(f"{cache.info['folder']}: {len(cache.record_ids)} records, {cache.num_positions} answer positions, "
              f"{cache.info['shards_computed']} of {cache.info['shards']} shards computed in "
              f"{time.perf_counter() - started:.0f} s; base top-1 = data token at {cache.base_agreement()}")
        return 0
    _refuse_options_of_other_head_types(args)
    if args.head_type == "kangaroo":
        return _run_chain_cli(args, base)
    shape = {name: getattr(args, name) for name in ("num_layers", "adapter_heads", "adapter_head_dim", "context_window",
                                                    "prefix_layer", "head_dropout", "state_source")
             if args.head_type in args.only_for[name][0]}  # the drafter's shape options that apply to this head type
    model = CerberusForCausalLM.from_base(base, head_type=args.head_type, num_heads=args.num_heads, **shape)
    metrics = train_heads(
        model, args.data if len(args.data) > 1 else args.data[0], args.output, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size,
        warmup_ratio=args.warmup_ratio, head_weight_decay=args.head_weight_decay, distill_weight=args.distill_weight,
        text_distill_weight=args.text_distill_weight,
        eval_every=args.eval_every, save_every=args.save_every, seed=args.seed, max_steps=args.max_steps,
        eval_fraction=args.eval_fraction, train_fraction=args.train_fraction, cache_dir=args.cache_dir,
        num_threads=args.num_threads,
        projection_dtype=args.projection_dtype, teacher_topk=args.teacher_topk, train_vocab=args.train_vocab,
        init_from=args.init_from, resume=not args.no_resume, show_progress=not args.no_progress,
    )
    cost = metrics["cost"]
    if metrics["eval"] is not None:
        print("held-out top-1 per head: " + " ".join(f"{v:.3f}" for v in metrics["top1"]))
        print("held-out top-5 per head: " + " ".join(f"{v:.3f}" for v in metrics["top5"]))
    if cost["positions_per_s"] is None:  # its last checkpoint was the final step: only evaluated and saved again
        print(f"the run was already complete: {metrics['steps']} steps ({metrics['epochs']} epochs), nothing left to "
              f"train ({cost['wall_time_s']:.0f} s on {cost['device']})")
    else:
        print(f"{metrics['steps']} steps ({metrics['epochs']} epochs) in {cost['wall_time_s']:.0f} s "
              f"(cache {cost['cache_time_s']:.0f} s, training {cost['train_time_s']:.0f} s, "
              f"{cost['positions_per_s']} positions/s) on {cost['device']}")
    print(f"heads saved to {args.output}")
    return 0


def _refuse_options_of_other_head_types(args: argparse.Namespace) -> None:
    given = [name for name, (types, default) in args.only_for.items()
             if args.head_type not in types and getattr(args, name) != default]
    if args.head_type == "hydra" and not args.prefix_layer:  # Hydra reads the attention's shape for its prefix only
        prefix = [name for name in ("adapter_heads", "adapter_head_dim", "context_window")
                  if getattr(args, name) != args.only_for[name][1]]
        if prefix:
            raise SystemExit(f"cerberus-hf train: {', '.join('--' + n.replace('_', '-') for n in prefix)} shape(s) "
                             "Hydra's prefix layer: add --prefix-layer")
    if given:
        raise SystemExit(f"cerberus-hf train: {', '.join('--' + n.replace('_', '-') for n in given)} do(es) not "
                         f"apply to --head-type {args.head_type}")


def _run_chain_cli(args: argparse.Namespace, base) -> int:
    """``cerberus-hf train --head-type kangaroo``: the adapter, trained on whole sequences (`chain_trainer`)."""
    from ..modeling_cerberus import CerberusForCausalLM
    from .chain_trainer import train_chain_drafter

    model = CerberusForCausalLM.from_base(base, head_type=args.head_type, num_heads=args.num_heads,
                                          exit_layer=args.exit_layer, adapter_heads=args.adapter_heads,
                                          adapter_head_dim=args.adapter_head_dim)
    metrics = train_chain_drafter(
        model, args.data, args.output, epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens,
        warmup_ratio=args.warmup_ratio, distill_weight=args.distill_weight, teacher_topk=args.teacher_topk,
        eval_every=args.eval_every, save_every=args.save_every or 50, eval_fraction=args.eval_fraction,
        seed=args.seed, max_steps=args.max_steps, cache_dir=args.cache_dir, num_threads=args.num_threads,
        train_vocab=args.train_vocab, resume=not args.no_resume, show_progress=not args.no_progress,
    )
    cost = metrics["cost"]
    if metrics["eval"] is not None:
        print(f"held-out top-1 {metrics['eval']['top1']:.3f}, top-5 {metrics['eval']['top5']:.3f} "
              f"({metrics['eval']['positions']} answer positions)")
    print(f"{metrics['steps']} steps ({metrics['epochs']} epochs) in {cost['wall_time_s']:.0f} s (exit states "
          f"{cost['cache_time_s']:.0f} s, training {cost['train_time_s']:.0f} s) on {cost['device']}")
    print(f"adapter saved to {args.output}")
    return 0
