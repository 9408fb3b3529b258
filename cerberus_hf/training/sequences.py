"""What the trainers of drafters that train on whole sequences share: Kangaroo's adapter (`chain_trainer`) and EAGLE-3's
layer (`sequence_trainer`) each read the sequence before every position, so they train on batches of whole sequences
rather than on single positions of the hidden-state cache (`trainer`).

Shared here: reading the records with their held-out split and the base's teacher distribution (`load_sequences`),
one epoch's batches (`epoch_groups`: the same length-sorted groups every epoch, in an order fixed by the seed), and the
optimizer loop with its evaluations, resumable checkpoints (`checkpointing`, no pickle) and metrics (`run_training`).
A trainer supplies what its family computes: the base states its batches read, a batch, a batch's loss and an
evaluation.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..hardware import describe_device
from . import checkpointing  # its on_step_end is looked up at each step (tests replace it)
from .checkpointing import METRICS_NAME, cosine_with_warmup, earlier_run, resume_checkpoint, save_checkpoint
from .data import Record, frequent_tokens, read_records
from .hidden_cache import build_hidden_cache, record_sequence, split_record_ids


@dataclass
class SequenceData:
    """The records a sequence trainer reads, split into training and held-out members."""

    paths: list
    records: list[Record]
    sequences: list[list[int]]  # each record's prompt and answer, cut at max_seq_len
    answers: list[int]  # answer tokens kept per record
    held_out: set[str]
    train_members: list[int]
    eval_members: list[int]  # held out, with answer tokens, and the base's own answers
    teacher: dict | None  # the base's top-k distribution at every answer position (`ids`, `logprobs`, `offsets`)

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.sequences]


def heldout_members(records: Sequence[Record], answers: Sequence[int], held_out: set[str],
                    members: Sequence[int] | None = None) -> list[int]:
    """The indices (among ``members``, default all) of the records a sequence drafter is scored on: held out, with
    answer tokens left after truncation, and the base's own answers (a text record's tokens are not what decoding
    meets)."""
    chosen = range(len(records)) if members is None else members
    return [i for i in chosen if records[i].id in held_out and answers[i] > 0 and records[i].mode != "text"]


def load_sequences(base, data_path, *, cache_dir: Path, max_seq_len: int | None, distill_weight: float,
                   teacher_topk: int, eval_fraction: float, show_progress: bool, min_answer: int = 1) -> SequenceData:
    """The records of ``data_path`` (one file or several) and, with ``distill_weight > 0``, the base's top-``teacher_topk``
    distribution from the hidden-state cache; records with fewer than ``min_answer`` answer tokens are not trained on."""
    if not 0.0 <= distill_weight <= 1.0:
        raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}.")
    paths = [data_path] if isinstance(data_path, (str, os.PathLike)) else list(data_path)
    records = [r for path in paths for r in read_records(path)]
    if len({(r.id, r.mode) for r in records}) != len(records):
        raise ValueError("a (prompt id, mode) pair appears more than once; combine files whose prompt ids are distinct")
    cut = [record_sequence(r, max_seq_len) for r in records]
    sequences, answers = [ids for ids, _ in cut], [answer for _, answer in cut]
    teacher = None
    if distill_weight > 0:
        cache = build_hidden_cache(base, records, cache_dir, teacher_topk=teacher_topk, max_seq_len=max_seq_len,
                                   show_progress=show_progress)
        teacher = {"ids": cache.teacher_ids, "logprobs": cache.teacher_logprobs, "offsets": cache.record_offsets}
    held_out = split_record_ids([r.id for r in records], eval_fraction)
    train_members = [i for i, r in enumerate(records) if r.id not in held_out and answers[i] >= min_answer]
    if not train_members:
        raise ValueError(f"{data_path} has no answer positions to train on (answers too short, or all held out).")
    return SequenceData(paths, records, sequences, answers, held_out, train_members,
                        heldout_members(records, answers, held_out), teacher)


def mixed_targets(labels: torch.Tensor, teacher: dict | None, teacher_rows: list[int], distill_weight: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(target ids, target probabilities) of each label: the data token with weight ``1 - distill_weight`` and the
    base's top-k distribution at ``teacher_rows`` of ``teacher`` with ``distill_weight`` (the data token alone without
    a teacher), as `loss.projection_loss` takes them."""
    if teacher is None or distill_weight <= 0:
        return labels[:, None], torch.ones(len(labels), 1)
    index = torch.tensor(teacher_rows, dtype=torch.long)
    probs = torch.softmax(teacher["logprobs"][index].float(), dim=-1)
    return (torch.cat([labels[:, None], teacher["ids"][index].long()], dim=1),
            torch.cat([torch.full((len(labels), 1), 1.0 - distill_weight), distill_weight * probs], 1))


def group_by_tokens(members: list[int], lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Consecutive groups of ``members`` whose padded size stays within ``batch_tokens`` (one at least)."""
    groups, current, width = [], [], 0
    for i in members:
        if current and max(width, lengths[i]) * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, lengths[i])
    if current:
        groups.append(current)
    return groups


def epoch_groups(members: list[int], lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch's batches: ``members`` grouped once by length (`group_by_tokens` over them sorted, so little of a batch
    is padding), the groups then in an order fixed by ``seed`` and ``epoch``. Every epoch has the same groups, so the
    same number of steps (grouping records shuffled anew each epoch changed it, and an epoch shorter than the first
    ran out of batches)."""
    groups = group_by_tokens(sorted(members, key=lambda i: (lengths[i], i)), lengths, batch_tokens)
    order = torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return [groups[i] for i in order.tolist()]


def run_training(
    model, module: nn.Module, data: SequenceData, output_dir: Path, *,
    make_batch: Callable[[list[int]], object],
    batch_loss: Callable[[object], tuple[torch.Tensor, dict, int]],
    evaluate: Callable[[list], dict],
    describe: Callable[[dict], str],
    run_config: dict, epochs: float, lr: float, batch_tokens: int, warmup_ratio: float, seed: int,
    max_steps: int | None, max_grad_norm: float | None, save_every: int, eval_every: int, train_vocab: int | None,
    betas: tuple[float, float], accelerator, started: float, cache_time: float, desc: str, resume: bool,
    show_progress: bool,
) -> dict:
    """Train ``module`` (the drafter's trained part) with AdamW under a cosine schedule over batches of whole sequences,
    evaluate on the held-out members, save the heads (float32) and ``training_metrics.json`` in ``output_dir``, and
    return the metrics. ``batch_loss(batch)`` gives (the loss, the history entry's extra fields, the positions it
    scored); ``evaluate(batches)`` a dict with ``top1`` and ``top5`` (one number, or one per depth), which
    ``describe`` puts in words. ``run_config`` is completed with the schedule and checked on resume."""
    drafter, device = model.heads, accelerator.device
    lengths = data.lengths
    eval_groups = group_by_tokens(sorted(data.eval_members, key=lengths.__getitem__), lengths, batch_tokens)
    steps_per_epoch = len(epoch_groups(data.train_members, lengths, batch_tokens, seed, 0))
    total_steps = int(max_steps) if max_steps is not None else max(1, math.ceil(epochs * steps_per_epoch))
    run_config = {**run_config, "total_steps": total_steps, "steps_per_epoch": steps_per_epoch}
    vocab = frequent_tokens(data.records, train_vocab).to(device) if train_vocab else None

    drafter_dtype = drafter.dtype
    drafter.to(device=device, dtype=torch.float32)
    drafter.train()
    trained = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, betas=betas)
    scheduler = cosine_with_warmup(optimizer, int(round(warmup_ratio * total_steps)), total_steps)
    optimizer = accelerator.prepare(optimizer)
    state = {"run_config": run_config, "history": [], "evals": [], "step": 0, "train_time_s": 0.0}
    saved = resume_checkpoint(accelerator, output_dir, run_config, resume, module, optimizer, scheduler)
    if saved is not None:
        state = saved

    progress = tqdm(total=total_steps, initial=state["step"], unit="step", desc=desc, disable=not show_progress,
                    dynamic_ncols=True)
    train_started, time_before, eval_time, positions = time.perf_counter(), state["train_time_s"], 0.0, 0
    eval_batches: list | None = None  # made at the first evaluation: a run that resumes to its end makes them once
    epoch_cache: tuple[int, list[list[int]]] = (-1, [])

    def run_eval(step: int) -> None:
        nonlocal eval_time, eval_batches
        t0 = time.perf_counter()
        if eval_batches is None:
            eval_batches = [make_batch(g) for g in eval_groups]
        if eval_batches:
            result = {"step": step, **evaluate(eval_batches, vocab)}
            state["evals"].append(result)
            progress.write(f"step {step}: {describe(result)}")
        eval_time += time.perf_counter() - t0

    while state["step"] < total_steps:
        epoch, index = divmod(state["step"], steps_per_epoch)
        if epoch_cache[0] != epoch:
            epoch_cache = (epoch, epoch_groups(data.train_members, lengths, batch_tokens, seed, epoch))
        loss, extra, scored = batch_loss(make_batch(epoch_cache[1][index]), vocab)
        accelerator.backward(loss)
        if max_grad_norm:
            accelerator.clip_grad_norm_(trained, max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        positions += scored
        state["step"] += 1
        step = state["step"]
        entry = {"step": step, "loss": round(float(loss.detach()), 6), **extra, "lr": scheduler.get_last_lr()[0]}
        state["history"].append(entry)
        progress.set_postfix(loss=f"{entry['loss']:.3f}")
        progress.update(1)
        if eval_every and step % eval_every == 0 and step != total_steps:
            run_eval(step)
        if step % save_every == 0 or step == total_steps:
            state["train_time_s"] = time_before + time.perf_counter() - train_started - eval_time
            save_checkpoint(accelerator, output_dir, step, state, 2, module, optimizer, scheduler)
        checkpointing.on_step_end(step)
    progress.close()
    if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
        run_eval(state["step"])
    train_time = time.perf_counter() - train_started - eval_time
    drafter.eval()
    if vocab is not None:  # trained to rank these tokens only: draft among them
        model.set_draft_vocab(vocab, trained=True)
    final = state["evals"][-1] if state["evals"] else None

    def as_list(value):
        return value if isinstance(value, list) or value is None else [value]

    metrics = {
        "top1": as_list(final["top1"]) if final else None, "top5": as_list(final["top5"]) if final else None,
        "eval": final, "steps": state["step"], "epochs": round(state["step"] / steps_per_epoch, 4),
        "config": run_config,
        "data": {"path": str(data.paths[0]) if len(data.paths) == 1 else [str(p) for p in data.paths],
                 "records": len(data.records), "held_out_records": len(data.held_out),
                 "train_positions": sum(data.answers[i] for i in data.train_members),
                 "eval_positions": sum(data.answers[i] for i in data.eval_members)},
        "cost": {"wall_time_s": round(time.perf_counter() - started, 3), "cache_time_s": round(cache_time, 3),
                 "train_time_s": round(train_time, 3), "train_time_s_total": round(time_before + train_time, 3),
                 "eval_time_s": round(eval_time, 3),
                 "positions_per_s": round(positions / train_time, 1) if positions and train_time > 0 else None,
                 "device": describe_device(device)},
        "continued_from": earlier_run(run_config.get("init_from")),
        "history": state["history"], "evals": state["evals"],
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)  # in float32 whatever the base's dtype: the folder serves every dtype
    drafter.to(dtype=drafter_dtype)
    (output_dir / METRICS_NAME).write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics
