"""Train a drafter that drafts through the base itself (Kangaroo's adapter) on a frozen base.

The adapter reads the base's layer-``l`` states of whole sequences (its attention looks back over the
prompt and the answer so far), so it trains on sequences, not on independent positions as heads do:

1. The base's first ``exit_layer`` layers run once over every sequence ``input_ids + output_ids`` (a small
   share of the base's cost); the exited states are kept on disk in float16 (one file per base, exit
   layer and data, beside the hidden-state caches) and reused by later runs.
2. The adapter runs over a batch of sequences (right-padded: causal attention keeps real positions
   exact) and its output at sequence position ``p - 1 + i`` is projected through the frozen ``lm_head``
   and trained to predict answer token ``A[i]``: cross-entropy on the data token mixed with the base's own
   distribution there (``distill_weight``; Kangaroo's loss is the pure soft cross-entropy, weight 1, which
   needs the hidden-state cache's top-k teacher). Only answer tokens are targets; held-out records are
   never trained on, and held-out accuracy is measured on the base's own answers.
3. The loss goes through `trainer.projection_loss`, in row chunks, as the heads' does.

Runs are deterministic under a seed and resumable (`sequences.run_training`, shared with EAGLE-3's trainer): every
``save_every`` steps `checkpointing.save_checkpoint` writes the adapter, AdamW, the schedule and the RNG states under
``output_dir/checkpoints/step-N``, tensors in safetensors and the rest in JSON; the same command continues from the
last one. Nothing there is a pickle, so resuming from a folder of unknown origin cannot run code
(`trainer.resume_checkpoint` refuses a folder that holds one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from tqdm.auto import tqdm

from ..drafters.kangaroo import capture_exit_states, first_layers
from ..files import save_safetensors, save_safetensors_atomically
from .base_features import CachedStates, OnlineStates, checked_feature_mode
from .data import Record
from .evaluation import outside_of, top_hits
from .hidden_cache import base_fingerprint, batches_by_length, default_cache_dir, record_sequence, right_padded
from .loss import projection_loss
from .sequences import SequenceData, SequenceLoop, load_sequences, mixed_targets, run_training, sequence_accelerator

logger = logging.getLogger(__name__)



@torch.no_grad()
def exit_states(base: nn.Module, records: Sequence[Record], exit_layer: int, cache_dir: str | os.PathLike,
                max_seq_len: int | None, batch_tokens: int = 4096, show_progress: bool = True, accelerator=None
                ) -> list[torch.Tensor]:
    """The output of the base's layer ``exit_layer - 1`` over each record's sequence (``[len, hidden]``,
    float16), computed once with the first ``exit_layer`` layers only and kept in ``cache_dir``. With
    ``accelerator``'s several processes each computes every Nth batch into a part file, the main process joins the
    parts into the one file, and all read it."""
    digest = hashlib.sha256(json.dumps([base_fingerprint(base), exit_layer, max_seq_len,
                                        [r.content_hash() for r in records]]).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"exit-states-{digest}.safetensors"
    sequences = [record_sequence(r, max_seq_len)[0] for r in records]
    if path.is_file():
        return _read_states(path, sequences)
    rank, processes = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    total = sum(map(len, sequences))
    hidden = base.get_output_embeddings().weight.shape[1]
    if rank == 0:
        logger.info("exit states: %d sequences, %d tokens through %d layers, %.2f GB in %s", len(sequences), total,
                    exit_layer, total * hidden * 2 / 1e9, path)
    batches = batches_by_length([len(ids) for ids in sequences], batch_tokens)[rank::processes]
    if processes > 1:
        logger.info("exit states: process %d computes %d batches", rank, len(batches))
    out = _compute_exit_states(base, exit_layer, sequences, batches, show_progress and rank == 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    if processes == 1:
        save_safetensors_atomically({"states": torch.cat(out)}, path)
        return out
    parts = [path.with_suffix(f".part-{r}-of-{processes}") for r in range(processes)]
    save_safetensors({str(i): states for i, states in enumerate(out) if states is not None}, parts[rank])
    accelerator.wait_for_everyone()
    if rank == 0:  # every sequence is in one part
        joined = {int(i): states for part in parts for i, states in load_file(part).items()}
        save_safetensors_atomically({"states": torch.cat([joined[i] for i in range(len(sequences))])}, path)
        for part in parts:
            part.unlink()
    accelerator.wait_for_everyone()
    return _read_states(path, sequences)


def _read_states(path: Path, sequences: list[list[int]]) -> list[torch.Tensor]:
    return list(load_file(path)["states"].split([len(s) for s in sequences]))


def _compute_exit_states(base: nn.Module, exit_layer: int, sequences: list[list[int]], batches: list[list[int]],
                         show_progress: bool) -> list[torch.Tensor | None]:
    """The exited states of the sequences in ``batches`` (float16, on the CPU), None for the others."""
    out: list[torch.Tensor | None] = [None] * len(sequences)
    progress = tqdm(total=sum(len(sequences[i]) for batch in batches for i in batch), unit="tok",
                    desc=f"exit states (layer {exit_layer})", disable=not show_progress)
    pad = base.config.pad_token_id if base.config.pad_token_id is not None else 0
    device = base.get_output_embeddings().weight.device
    with capture_exit_states(base, exit_layer) as captured, first_layers(base, exit_layer) as decoder:
        for batch in batches:
            ids, mask = right_padded([sequences[i] for i in batch], pad)
            decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
            for row, i in enumerate(batch):
                out[i] = captured["exit"][row, : len(sequences[i])].to(torch.float16).cpu()
            progress.update(sum(len(sequences[i]) for i in batch))
    progress.close()
    return out


class AdapterBatch:
    """A batch of sequences: padded exited states and, per answer position, its place and target."""

    def __init__(self, members: list[int], states: list[torch.Tensor], answers: list[int],
                 records: Sequence[Record], teacher: dict | None, distill_weight: float, device):
        width = max(states[i].shape[0] for i in members)
        hidden = states[members[0]].shape[1]
        self.states = torch.zeros(len(members), width, hidden)
        rows, cols, labels, teacher_rows = [], [], [], []
        for b, i in enumerate(members):
            length, answer = states[i].shape[0], answers[i]
            self.states[b, :length] = states[i].float()
            first = length - answer - 1  # the state at p - 1 predicts the first answer token
            rows += [b] * answer
            cols += range(first, first + answer)
            labels += records[i].output_ids[:answer]
            if teacher is not None:
                offset = int(teacher["offsets"][i])
                teacher_rows += range(offset, offset + answer)
        self.rows, self.cols = torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)
        labels = torch.tensor(labels, dtype=torch.long)
        self.target_ids, self.target_probs = mixed_targets(labels, teacher, teacher_rows, distill_weight)
        self.labels = labels.to(device)
        self.target_ids, self.target_probs = self.target_ids.to(device), self.target_probs.to(device)
        self.states, self.rows, self.cols = self.states.to(device), self.rows.to(device), self.cols.to(device)

    def adapted(self, drafter) -> torch.Tensor:
        """The adapter's outputs ``[rows, hidden]`` at the batch's answer positions (teacher-forced)."""
        return drafter.adapt(self.states)[self.rows, self.cols]


def _loss(drafter, batch: AdapterBatch, chunk_rows: int, vocab: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    picked = batch.adapted(drafter)
    weight = drafter.base_lm_head.weight.detach().float()
    bias = getattr(drafter.base_lm_head, "bias", None)
    return projection_loss(picked, weight, batch.target_ids, batch.target_probs, batch.labels,
                           bias=None if bias is None else bias.detach().float(), chunk_rows=chunk_rows, vocab=vocab)


@torch.no_grad()
def evaluate_adapter(drafter, batches: list[AdapterBatch], chunk_rows: int = 512, vocab: torch.Tensor | None = None
                     ) -> dict:
    """Top-1 / top-5 accuracy and cross-entropy of the adapter's next-token guess at answer positions (the
    accuracy among ``vocab``'s tokens when given: `trainer.top_hits`)."""
    counts = torch.zeros(4, dtype=torch.float64)
    was_training = drafter.training
    drafter.eval()
    weight = drafter.base_lm_head.weight.float()
    outside = outside_of(vocab, weight.shape[0], weight.device)
    for batch in batches:
        picked = batch.adapted(drafter)
        for lo in range(0, picked.shape[0], chunk_rows):
            logits = F.linear(picked[lo : lo + chunk_rows], weight).float()
            labels = batch.labels[lo : lo + chunk_rows]
            hit1, hit5 = top_hits(logits, labels, outside)
            counts += torch.tensor([labels.shape[0], float(hit1.sum()), float(hit5.sum()),
                                    float(F.cross_entropy(logits, labels, reduction="sum"))], dtype=torch.float64)
    drafter.train(was_training)
    n = max(float(counts[0]), 1.0)
    return {"top1": round(float(counts[1]) / n, 6), "top5": round(float(counts[2]) / n, 6),
            "loss": round(float(counts[3]) / n, 6), "positions": int(counts[0])}


def train_chain_drafter(
    model,
    data_path: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_tokens: int = 8192,
    warmup_ratio: float = 0.05,
    distill_weight: float = 0.0,
    teacher_topk: int = 32,
    eval_every: int = 100,
    eval_fraction: float = 0.05,
    seed: int = 0,
    max_steps: int | None = None,
    max_grad_norm: float | None = 1.0,
    save_every: int = 50,
    cache_dir: str | os.PathLike | None = None,
    max_seq_len: int | None = None,
    chunk_rows: int = 512,
    num_threads: int | None = None,
    train_vocab: int | None = None,
    features: str = "cache",
    resume: bool = True,
    show_progress: bool = True,
) -> dict:
    """Train ``model.heads`` (a drafter with ``drafts_chains``: Kangaroo's adapter) on a frozen base from a
    distillation JSONL file; returns the metrics, also written to ``output_dir/training_metrics.json``.

    ``batch_tokens`` bounds the padded sequence tokens per optimizer step; ``distill_weight`` is the share
    of the base's own top-``teacher_topk`` distribution in the target (a hidden-state cache with the
    teacher is built for it when above 0). ``features="online"`` computes the exited states (and the teacher) in
    each step instead of caching them on disk first (`base_features`). The other arguments are the
    `HeadTrainingSettings` fields of the same names.
    """
    started = time.perf_counter()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    checked_feature_mode(features)
    accelerator = sequence_accelerator()
    drafter, device = model.heads, accelerator.device
    model.base.to(device)
    if max_seq_len is None:
        max_seq_len = getattr(model.base.config, "max_position_embeddings", None)
    cache_started = time.perf_counter()
    data, source = _chain_inputs(model, data_path, cache_dir, max_seq_len, distill_weight, teacher_topk, eval_fraction,
                                 show_progress, features, accelerator)
    cache_time = time.perf_counter() - cache_started

    def make(members: list[int]) -> AdapterBatch:
        states, teacher = source.take(members)
        return AdapterBatch(members, states, data.answers, data.records, teacher, distill_weight, device)

    run_config = {"head_type": model.config.head_type, "exit_layer": drafter.exit_layer,
                  "adapter_heads": model.config.adapter_heads, "adapter_head_dim": model.config.adapter_head_dim,
                  "lr": lr, "batch_tokens": batch_tokens, "warmup_ratio": warmup_ratio,
                  "distill_weight": distill_weight, "teacher_topk": teacher_topk if distill_weight > 0 else 0,
                  "seed": seed, "max_grad_norm": max_grad_norm, "eval_fraction": eval_fraction,
                  "max_seq_len": max_seq_len, "train_vocab": train_vocab}
    loop = SequenceLoop(
        make_batch=make, batch_loss=lambda batch, vocab: [_loss(drafter, batch, chunk_rows, vocab)], depth_weights=(1.0,),
        evaluate=lambda batches, vocab: evaluate_adapter(drafter, batches, chunk_rows, vocab),
        describe=lambda result: f"held-out top-1 {result['top1']:.3f} top-5 {result['top5']:.3f}",
        run_config=run_config, desc="training the kangaroo adapter", betas=(0.9, 0.999), epochs=epochs, lr=lr,
        batch_tokens=batch_tokens, warmup_ratio=warmup_ratio, seed=seed, max_steps=max_steps,
        max_grad_norm=max_grad_norm, save_every=save_every, eval_every=eval_every, train_vocab=train_vocab,
        resume=resume, show_progress=show_progress)
    return run_training(model, drafter.adapter, data, Path(output_dir), loop, accelerator=accelerator,
                        started=started, cache_time=cache_time)


def _chain_inputs(model, data_path, cache_dir: str | os.PathLike | None, max_seq_len: int | None,
                  distill_weight: float, teacher_topk: int, eval_fraction: float, show_progress: bool, features: str,
                  accelerator=None) -> tuple[SequenceData, CachedStates | OnlineStates]:
    """The records (with their held-out split) and the source of each batch's exited states and of its teacher
    distribution: the caches in ``cache_dir`` (`exit_states`, filled once over ``accelerator``'s processes), or the
    base in the step (``features="online"``)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    online, exit_layer = features == "online", model.heads.exit_layer
    data = load_sequences(model.base, data_path, cache_dir=cache_dir, max_seq_len=max_seq_len,
                          distill_weight=distill_weight, teacher_topk=teacher_topk, eval_fraction=eval_fraction,
                          show_progress=show_progress, teacher_in_step=online, accelerator=accelerator)
    if online:
        return data, OnlineStates(model.base, data.sequences, data.answers,
                                  lambda: capture_exit_states(model.base, exit_layer), exit_layer, "exit",
                                  lambda states: states, teacher_topk if distill_weight > 0 else 0)
    return data, CachedStates(exit_states(model.base, data.records, exit_layer, cache_dir, max_seq_len,
                                          show_progress=show_progress, accelerator=accelerator), data.teacher)
