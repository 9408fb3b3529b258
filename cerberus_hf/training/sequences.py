"""What the trainers of drafters that train on whole sequences share: Kangaroo's adapter (`chain_trainer`) and EAGLE-3's
layer (`sequence_trainer`) each read the sequence before every position, so they train on batches of whole sequences
rather than on single positions of the hidden-state cache (`trainer`).

Shared here: reading the records with their held-out split and the base's teacher distribution (`load_sequences`),
one epoch's batches (`epoch_groups`: the same length-sorted groups every epoch, in an order fixed by the seed), and the
optimizer loop with its evaluations, resumable checkpoints (`checkpointing`, no pickle) and metrics (`run_training`),
on one process or several (`torchrun`, `accelerate launch`: each takes its share of every step's sequences). A trainer
supplies what its family computes: the base states its batches read, a batch, its rows' losses per depth and an
evaluation.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import UserError
from ..hardware import describe_device
from . import checkpointing  # its on_step_end is looked up at each step (tests replace it)
from .checkpointing import METRICS_NAME, cosine_with_warmup, earlier_run, resume_checkpoint, save_checkpoint
from .data import Record, frequent_tokens, read_records
from .hidden_cache import build_hidden_cache, check_token_ids, record_sequence, split_record_ids

if TYPE_CHECKING:
    from accelerate import Accelerator


def sequence_accelerator() -> Accelerator:
    """The accelerator a sequence trainer runs under: one process, or the processes ``torchrun`` or ``accelerate
    launch`` started, among which `run_training` splits every step's sequences (docs/training.md)."""
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available())  # cpu: torchrun's processes are seen (gloo)


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
                   teacher_topk: int, eval_fraction: float, show_progress: bool, min_answer: int = 1,
                   teacher_in_step: bool = False, accelerator=None) -> SequenceData:
    """The records of ``data_path`` (one file or several) and, with ``distill_weight > 0``, the base's top-``teacher_topk``
    distribution from the hidden-state cache (its missing shards split between ``accelerator``'s processes; none with
    ``teacher_in_step``: each step computes its own, `base_features.OnlineStates`); records with fewer than
    ``min_answer`` answer tokens are not trained on."""
    if not 0.0 <= distill_weight <= 1.0:
        raise UserError(f"distill_weight must be in [0, 1], got {distill_weight}.")
    paths = [data_path] if isinstance(data_path, (str, os.PathLike)) else list(data_path)
    records = [r for path in paths for r in read_records(path)]
    check_token_ids(records, base)
    if len({(r.id, r.mode) for r in records}) != len(records):
        raise UserError("a (prompt id, mode) pair appears more than once; combine files whose prompt ids are distinct")
    cut = [record_sequence(r, max_seq_len) for r in records]
    sequences, answers = [ids for ids, _ in cut], [answer for _, answer in cut]
    teacher = None
    if distill_weight > 0 and not teacher_in_step:
        cache = build_hidden_cache(base, records, cache_dir, teacher_topk=teacher_topk, max_seq_len=max_seq_len,
                                   accelerator=accelerator, show_progress=show_progress)
        teacher = {"ids": cache.teacher_ids, "logprobs": cache.teacher_logprobs, "offsets": cache.record_offsets}
    held_out = split_record_ids([r.id for r in records], eval_fraction)
    train_members = [i for i, r in enumerate(records) if r.id not in held_out and answers[i] >= min_answer]
    if not train_members:
        raise UserError(f"{data_path} has no answer positions to train on (answers too short, or all held out).")
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


@dataclass(frozen=True)
class SequenceLoop:
    """What `run_training` needs besides the model and the data: what the drafter's family computes, and the loop's
    settings (the trainers' arguments of the same names)."""

    make_batch: Callable[[list[int]], object]  # a batch of the members given (one at least)
    # per depth, (its rows' losses, whether each row's top-1 is right) of a batch, over a vocabulary or all
    batch_loss: Callable[[object, torch.Tensor | None], list[tuple[torch.Tensor, torch.Tensor]]]
    # each depth's weight in the step's loss, a sum of the depths' mean row losses (one depth: the history's top-1 is a
    # number, not a list)
    depth_weights: tuple[float, ...]
    evaluate: Callable[[list, torch.Tensor | None], dict]  # ``top1`` and ``top5`` (a number, or one per depth)
    describe: Callable[[dict], str]  # an evaluation in words
    run_config: dict  # the family's settings; completed with the schedule and checked on resume
    desc: str  # the progress bar's
    betas: tuple[float, float]  # AdamW's
    epochs: float
    lr: float
    batch_tokens: int
    warmup_ratio: float
    seed: int
    max_steps: int | None
    max_grad_norm: float | None
    save_every: int
    eval_every: int
    train_vocab: int | None
    resume: bool
    show_progress: bool


def run_training(model, module: nn.Module, data: SequenceData, output_dir: Path, loop: SequenceLoop, *, accelerator,
                 started: float, cache_time: float) -> dict:
    """Train ``module`` (the drafter's trained part) with AdamW under a cosine schedule over batches of whole sequences,
    evaluate on the held-out members, save the heads (float32) and ``training_metrics.json`` in ``output_dir``, and
    return the metrics. ``started`` is when the trainer began and ``cache_time`` how long its base states took.

    With several processes each step's group of sequences is split between them, and the run trains the weights one
    process would (to the order of the gradients' sums): every process evaluates the whole held-out set, the main
    process alone writes checkpoints, the drafter and the metrics."""
    run = _SequenceRun(model, module, data, output_dir, loop, accelerator)
    run.train()
    return run.finish(started, cache_time)


class _SequenceRun:
    """`run_training`'s state: the schedule, AdamW, the run's record (resumed from the last checkpoint if there is
    one), its progress and its timings."""

    def __init__(self, model, module: nn.Module, data: SequenceData, output_dir: Path, loop: SequenceLoop,
                 accelerator):
        self.model, self.module, self.data, self.output_dir, self.loop = model, module, data, output_dir, loop
        self.accelerator, device, lengths = accelerator, accelerator.device, data.lengths
        self.eval_groups = group_by_tokens(sorted(data.eval_members, key=lengths.__getitem__), lengths,
                                           loop.batch_tokens)
        self.steps_per_epoch = len(epoch_groups(data.train_members, lengths, loop.batch_tokens, loop.seed, 0))
        self.total_steps = int(loop.max_steps) if loop.max_steps is not None else \
            max(1, math.ceil(loop.epochs * self.steps_per_epoch))
        self.run_config = {**loop.run_config, "total_steps": self.total_steps, "steps_per_epoch": self.steps_per_epoch}
        self.vocab = frequent_tokens(data.records, loop.train_vocab).to(device) if loop.train_vocab else None
        self._prepare_optimizer()
        if accelerator.num_processes > 1:  # every process starts from the main process's weights
            for tensor in module.state_dict().values():
                torch.distributed.broadcast(tensor, src=0)
        self.state = {"run_config": self.run_config, "history": [], "evals": [], "step": 0, "train_time_s": 0.0}
        saved = resume_checkpoint(accelerator, output_dir, self.run_config, loop.resume, module, self.optimizer,
                                  self.scheduler)
        if saved is not None:
            self.state = saved
        self.progress = tqdm(total=self.total_steps, initial=self.state["step"], unit="step", desc=loop.desc,
                             disable=not (loop.show_progress and accelerator.is_main_process), dynamic_ncols=True)
        self.train_started, self.time_before = time.perf_counter(), self.state["train_time_s"]
        self.eval_time, self.train_time, self.positions = 0.0, 0.0, 0
        self.eval_batches: list | None = None  # made at the first evaluation (a run resumed at its end: at the end)
        self.epoch_groups: tuple[int, list[list[int]]] = (-1, [])

    def _prepare_optimizer(self) -> None:
        """The drafter in float32 on the device, in training mode; AdamW over ``module``'s trained parameters under
        the warmup-and-cosine schedule."""
        drafter, loop = self.model.heads, self.loop
        self.drafter_dtype = drafter.dtype
        drafter.to(device=self.accelerator.device, dtype=torch.float32)
        drafter.train()
        self.trained = [p for p in self.module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self.trained, lr=loop.lr, betas=loop.betas)
        self.scheduler = cosine_with_warmup(optimizer, int(round(loop.warmup_ratio * self.total_steps)),
                                            self.total_steps)
        self.optimizer = self.accelerator.prepare(optimizer)

    def train(self) -> None:
        """Step to the schedule's end, evaluating every ``eval_every`` steps and at the end, checkpointing every
        ``save_every`` and at the end."""
        loop, state = self.loop, self.state
        while state["step"] < self.total_steps:
            self._step()
            step = state["step"]
            if loop.eval_every and step % loop.eval_every == 0 and step != self.total_steps:
                self._evaluate(step)
            if step % loop.save_every == 0 or step == self.total_steps:
                state["train_time_s"] = self.time_before + time.perf_counter() - self.train_started - self.eval_time
                save_checkpoint(self.accelerator, self.output_dir, step, state, 2, self.module, self.optimizer,
                                self.scheduler)
            checkpointing.on_step_end(step)
        self.progress.close()
        if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
            self._evaluate(state["step"])
        self.train_time = time.perf_counter() - self.train_started - self.eval_time

    def _step(self) -> None:
        """One optimizer step on this process's share of the next group of its epoch (`epoch_groups`), recorded in the
        history. Each depth's loss is the mean over all processes' rows and each process's loss its share of that
        mean, so the gradients are summed over the processes; a process whose share is empty (a group of fewer
        sequences than processes) adds nothing but joins the sums."""
        loop, state, accelerator = self.loop, self.state, self.accelerator
        epoch, index = divmod(state["step"], self.steps_per_epoch)
        if self.epoch_groups[0] != epoch:
            self.epoch_groups = (epoch, epoch_groups(self.data.train_members, self.data.lengths, loop.batch_tokens,
                                                     loop.seed, epoch))
        share = self.epoch_groups[1][index][accelerator.process_index :: accelerator.num_processes]
        depths = loop.batch_loss(loop.make_batch(share), self.vocab) if share else []
        rows = torch.zeros(2, len(loop.depth_weights))  # per depth: its rows, and those whose top-1 is right
        for j, (losses, correct) in enumerate(depths):
            rows[0, j], rows[1, j] = losses.numel(), correct.float().sum()
        if accelerator.num_processes > 1:
            rows = accelerator.reduce(rows.to(accelerator.device), reduction="sum").cpu()
        loss = 0.0
        for j, (losses, _) in enumerate(depths):
            if rows[0, j] > 0:
                loss = loss + loop.depth_weights[j] * (losses.sum() / float(rows[0, j]))
        if torch.is_tensor(loss):
            if loss.requires_grad:
                accelerator.backward(loss)
            loss = loss.detach()
        loss = self._sum_gradients(loss) if accelerator.num_processes > 1 else float(loss)
        if loop.max_grad_norm:
            accelerator.clip_grad_norm_(self.trained, loop.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.positions += int(rows[0].sum())
        state["step"] += 1
        top1 = [round(float(rows[1, j] / rows[0, j]), 5) for j in range(rows.shape[1]) if rows[0, j] > 0]
        entry = {"step": state["step"], "loss": round(loss, 6), "top1": top1 if len(loop.depth_weights) > 1 else top1[0],
                 "lr": self.scheduler.get_last_lr()[0]}
        state["history"].append(entry)
        self.progress.set_postfix(loss=f"{entry['loss']:.3f}")
        self.progress.update(1)

    def _sum_gradients(self, loss: torch.Tensor | float) -> float:
        """Sum the trained parameters' gradients over the processes in one all-reduce (a parameter without a gradient
        adds zeros), this process's share of the step's loss riding along; return the step's whole loss."""
        device = self.accelerator.device
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.trained]
        own = loss.float().reshape(1) if torch.is_tensor(loss) else torch.zeros(1, device=device)
        summed = self.accelerator.reduce(torch.cat([*(g.flatten() for g in grads), own.to(device)]), reduction="sum")
        for parameter, grad in zip(self.trained, summed[:-1].split([p.numel() for p in self.trained])):
            parameter.grad = grad.view_as(parameter)
        return float(summed[-1])

    def _evaluate(self, step: int) -> None:
        """The held-out evaluation at ``step``, added to the run's record and shown; its time counted apart."""
        t0 = time.perf_counter()
        if self.eval_batches is None:
            self.eval_batches = [self.loop.make_batch(g) for g in self.eval_groups]
        if self.eval_batches:
            result = {"step": step, **self.loop.evaluate(self.eval_batches, self.vocab)}
            self.state["evals"].append(result)
            if self.accelerator.is_main_process:
                self.progress.write(f"step {step}: {self.loop.describe(result)}")
        self.eval_time += time.perf_counter() - t0

    def finish(self, started: float, cache_time: float) -> dict:
        """Save the drafter (in float32 whatever the base's dtype: the folder serves every dtype, drafting among the
        train vocabulary when there is one) and the metrics; return them."""
        model, drafter = self.model, self.model.heads
        drafter.eval()
        if self.vocab is not None:  # trained to rank these tokens only: draft among them
            model.set_draft_vocab(self.vocab, trained=True)
        metrics = self._metrics(started, cache_time)
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(self.output_dir)
            (self.output_dir / METRICS_NAME).write_text(json.dumps(metrics, indent=1) + "\n")
        drafter.to(dtype=self.drafter_dtype)
        self.accelerator.wait_for_everyone()  # the folder is complete wherever the run returns
        return metrics

    def _metrics(self, started: float, cache_time: float) -> dict:
        state, data, train_time = self.state, self.data, self.train_time
        final = state["evals"][-1] if state["evals"] else None

        def as_list(value):
            return value if isinstance(value, list) or value is None else [value]

        return {
            "top1": as_list(final["top1"]) if final else None, "top5": as_list(final["top5"]) if final else None,
            "eval": final, "steps": state["step"], "epochs": round(state["step"] / self.steps_per_epoch, 4),
            "config": self.run_config,
            "data": {"path": str(data.paths[0]) if len(data.paths) == 1 else [str(p) for p in data.paths],
                     "records": len(data.records), "held_out_records": len(data.held_out),
                     "train_positions": sum(data.answers[i] for i in data.train_members),
                     "eval_positions": sum(data.answers[i] for i in data.eval_members)},
            "cost": {"wall_time_s": round(time.perf_counter() - started, 3), "cache_time_s": round(cache_time, 3),
                     "train_time_s": round(train_time, 3),
                     "train_time_s_total": round(self.time_before + train_time, 3),
                     "eval_time_s": round(self.eval_time, 3),
                     "positions_per_s": round(self.positions / train_time, 1) if self.positions and train_time > 0
                     else None,
                     "device": describe_device(self.accelerator.device),
                     "num_processes": self.accelerator.num_processes},
            "continued_from": earlier_run(self.run_config.get("init_from")),
            "history": state["history"], "evals": state["evals"],
        }
