"""Train EAGLE-3's drafter (training-time test) or a DFlash block drafter on a frozen base.

The drafter's layer attends over whole sequences, so it trains on sequences, as Kangaroo's adapter does
(`chain_trainer`), not on single positions of the hidden-state cache:

1. The base runs once over every sequence ``input_ids + output_ids`` up to the highest layer the drafter reads
   (`first_layers`; the last layers and the lm_head are skipped), and the states entering its ``feature_layers``
   are kept on disk in float16 (`sequence_features`: one ``.npy`` per base, layers and data, filled batch by batch
   and resumable, read through a memory map so a large set never has to fit in memory).
2. Each batch of sequences (right-padded) is unrolled ``num_heads`` steps (`Eagle3Drafter.unrolled_outputs`; a DFlash
   drafter computes the blocks after the scored positions at once, `DFlashDrafter.unrolled_at`): step ``j`` at row
   ``c`` is drafting depth ``j`` after verified position ``c`` on the true path, and guesses the token at
   ``c + j + 2``. The rows trained are those decoding drafts from: ``c`` from the prompt's last position on, so step
   ``j`` targets answer tokens ``A[j + 1:]``.
3. Step ``j``'s loss, weighted ``step_weight_decay ** j`` (EAGLE-3: 0.8), is the cross-entropy against the data token
   mixed with the base's own top-k distribution (``distill_weight``; EAGLE-3 uses the distribution alone), through
   `loss.projection_loss` over the frozen lm_head (restricted to ``train_vocab`` tokens when set).

Held-out accuracy per depth (`evaluate_unrolled`) is step ``j``'s top-1 on the base's own answers, comparable to the
heads' per-head accuracy (head ``k`` given the true tokens above it). Runs are deterministic under a seed and
resumable (`sequences.run_training`, shared with Kangaroo's trainer; no pickle anywhere).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..drafters.eagle3 import capture_features
from ..errors import UserError
from ..files import write_atomically
from ..drafters.kangaroo import first_layers
from .base_features import CachedStates, OnlineStates, checked_feature_mode
from .data import Record
from .hidden_cache import base_fingerprint, batches_by_length, default_cache_dir, record_sequence, right_padded
from .loss import projection_loss
from .sequences import SequenceData, SequenceLoop, load_sequences, mixed_targets, run_training, sequence_accelerator

logger = logging.getLogger(__name__)


@torch.no_grad()
def sequence_features(base, records: Sequence[Record], feature_layers: list[int], cache_dir: str | os.PathLike,
                      max_seq_len: int | None, batch_tokens: int = 4096, show_progress: bool = True, accelerator=None
                      ) -> tuple[np.ndarray, list[int]]:
    """(the states entering ``feature_layers`` over every record's sequence, concatenated: a read-only float16 memory map
    ``[total tokens, len(feature_layers) * hidden]``; each record's first row). Computed once per base, layers and
    data in ``cache_dir``; a killed run resumes after the last batch it finished. With ``accelerator``'s several
    processes the main one creates the file, each process fills the missing batches of its share (every Nth batch)
    and marks them done in a file of its own, and all read the file once every process is through."""
    sequences = [record_sequence(r, max_seq_len)[0] for r in records]
    digest = hashlib.sha256(json.dumps([base_fingerprint(base), feature_layers, max_seq_len,
                                        [r.content_hash() for r in records]]).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"features-{digest}.npy"
    rank, processes = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    done_path = path.with_suffix(".done.json" if rank == 0 else f".done-{rank}.json")
    starts = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).tolist()
    width = len(feature_layers) * base.get_output_embeddings().weight.shape[1]
    batches = batches_by_length([len(ids) for ids in sequences], batch_tokens)
    if rank == 0 and not path.is_file():  # the done files of an earlier file go first: no process takes them as this one's
        for stale in path.parent.glob(f"{path.stem}.done*.json"):
            stale.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("features: %d sequences, %d tokens, %.2f GB in %s", len(sequences), starts[-1],
                    starts[-1] * width * 2 / 1e9, path)
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(starts[-1], width)).flush()
    if accelerator is not None:
        accelerator.wait_for_everyone()
    done = {b for marks in path.parent.glob(f"{path.stem}.done*.json") for b in json.loads(marks.read_text())}
    todo = [b for b in range(rank, len(batches), processes) if b not in done]
    if processes > 1:
        logger.info("features: process %d computes %d batches", rank, len(todo))
    if todo:
        _fill_features(base, feature_layers, sequences, [batches[b] for b in todo], starts, path,
                       lambda b: _mark_done(done_path, done, todo[b]), show_progress and rank == 0)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return np.load(path, mmap_mode="r"), starts[:-1]


def _mark_done(done_path: Path, done: set[int], batch: int) -> None:
    """Add ``batch`` to ``done`` and write it to this process's ``done_path`` (atomically: a kill leaves the last)."""
    done.add(batch)
    write_atomically(done_path, json.dumps(sorted(done)))


def _fill_features(base, feature_layers: list[int], sequences: list[list[int]], batches: list[list[int]],
                   starts: list[int], path: Path, finished: Callable[[int], None], show_progress: bool) -> None:
    """Run the base's first layers over ``batches`` of ``sequences`` and write their features to their rows of the
    file at ``path``, calling ``finished`` with each batch's index once its rows are on disk."""
    out = np.lib.format.open_memmap(path, mode="r+")
    pad = base.config.pad_token_id if base.config.pad_token_id is not None else 0
    device = base.get_output_embeddings().weight.device
    progress = tqdm(total=sum(len(sequences[i]) for batch in batches for i in batch), unit="tok",
                    desc=f"features (layers {feature_layers})", disable=not show_progress)
    with capture_features(base, feature_layers) as captured, first_layers(base, max(feature_layers)) as decoder:
        for b, batch in enumerate(batches):
            ids, mask = right_padded([sequences[i] for i in batch], pad)
            decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
            for row, i in enumerate(batch):
                out[starts[i] : starts[i + 1]] = captured["features"][row, : len(sequences[i])].float().cpu().numpy()
            out.flush()  # the rows are on disk before the batch is called done
            finished(b)
            progress.update(sum(len(sequences[i]) for i in batch))
    progress.close()


class UnrolledBatch:
    """A batch of sequences: padded features and tokens, and for each unrolled step its rows, columns and targets."""

    def __init__(self, members: list[int], features: np.ndarray, starts: list[int], sequences: list[list[int]],
                 answers: list[int], steps: int, teacher: dict | None, distill_weight: float, device):
        lengths = [len(sequences[i]) for i in members]
        width = max(lengths)
        self.features = torch.zeros(len(members), width, features.shape[1])
        self.tokens = torch.zeros(len(members), width + steps + 1, dtype=torch.long)
        for b, i in enumerate(members):
            self.features[b, : lengths[b]] = torch.from_numpy(np.asarray(features[starts[i] : starts[i] + lengths[b]],
                                                                         dtype=np.float32))
            self.tokens[b, : lengths[b]] = torch.tensor(sequences[i])
        self.features, self.tokens = self.features.to(device), self.tokens.to(device)
        self.targets = []  # per step: (rows, cols, target ids, target probs, labels)
        for j in range(steps):
            rows, cols, labels, teacher_rows = [], [], [], []
            for b, i in enumerate(members):
                first = lengths[b] - answers[i]  # the first answer token's position
                for a in range(j + 1, answers[i]):  # A[a] at first + a, guessed at depth j from c = first + a - j - 2
                    rows.append(b)
                    cols.append(first + a - j - 2)
                    labels.append(sequences[i][first + a])
                    if teacher is not None:
                        teacher_rows.append(int(teacher["offsets"][i]) + a)
            labels = torch.tensor(labels, dtype=torch.long)
            target_ids, target_probs = mixed_targets(labels, teacher, teacher_rows, distill_weight)
            self.targets.append(tuple(t.to(device) for t in (torch.tensor(rows, dtype=torch.long),
                                                             torch.tensor(cols, dtype=torch.long),
                                                             target_ids, target_probs, labels)))

    def outputs(self, drafter) -> list[torch.Tensor]:
        """Each step's normed outputs at its trained rows (``[rows_j, hidden]``)."""
        return drafter.unrolled_at(self.features, self.tokens, [(rows, cols) for rows, cols, *_ in self.targets])


def record_batches(base, drafter, records: Sequence[Record], cache_dir: str | os.PathLike, batch_size: int = 8
                   ) -> list[UnrolledBatch]:
    """`evaluate_unrolled`'s batches over ``records``, every one scored (none held out, no teacher): to score a
    drafter on answer files of one's own, as training scores its held-out split. The base's features are computed
    once per records in ``cache_dir``."""
    cut = [record_sequence(r, None) for r in records]
    sequences, answers = [ids for ids, _ in cut], [kept for _, kept in cut]
    features, starts = sequence_features(base, records, drafter.feature_layers, cache_dir, None, show_progress=False)
    return [UnrolledBatch(list(range(i, min(i + batch_size, len(records)))), features, starts, sequences, answers,
                          drafter.num_heads, None, 0.0, drafter.base_lm_head.weight.device)
            for i in range(0, len(records), batch_size)]


def _projection(drafter) -> tuple[torch.Tensor, torch.Tensor | None]:
    head = drafter.base_lm_head
    bias = getattr(head, "bias", None)
    return head.weight.detach().float(), None if bias is None else bias.detach().float()


@torch.no_grad()
def evaluate_unrolled(drafter, batches: list[UnrolledBatch], chunk_rows: int = 512, vocab: torch.Tensor | None = None
                      ) -> dict:
    """Held-out top-1 / top-5 per depth (unrolled step), and depth 0's mean cross-entropy over the whole vocabulary.
    With a draft vocabulary ``vocab`` the guesses are ranked among its tokens only (what drafting can propose), by
    projecting onto its rows alone (a tenth of the whole projection's cost for 4,096 of SmolLM2's 49,152 tokens), and
    no cross-entropy is given (a label outside it has no probability)."""
    was_training = drafter.training
    drafter.eval()
    weight, bias = _projection(drafter)
    if vocab is not None:
        weight, bias = weight[vocab], bias[vocab] if bias is not None else None
    steps = len(batches[0].targets) if batches else 0
    counts = torch.zeros(steps, 3, dtype=torch.float64)
    loss = 0.0
    for batch in batches:
        for j, (picked, target) in enumerate(zip(batch.outputs(drafter), batch.targets)):
            labels = target[4]
            for lo in range(0, picked.shape[0], chunk_rows):
                logits = F.linear(picked[lo : lo + chunk_rows], weight, bias).float()
                top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
                if vocab is not None:
                    top5 = vocab[top5]
                hits = top5 == labels[lo : lo + chunk_rows, None]
                counts[j] += torch.tensor([hits.shape[0], float(hits[:, 0].sum()), float(hits.any(-1).sum())],
                                          dtype=torch.float64)
                if j == 0 and vocab is None:
                    loss += float(F.cross_entropy(logits, labels[lo : lo + chunk_rows], reduction="sum"))
    drafter.train(was_training)
    n = counts[:, 0].clamp(min=1.0)
    return {"top1": [round(float(v), 6) for v in counts[:, 1] / n], "top5": [round(float(v), 6) for v in counts[:, 2] / n],
            "loss": round(loss / float(n[0]), 6) if steps and vocab is None else None,
            "positions": [int(v) for v in counts[:, 0]]}


def train_sequence_drafter(
    model,
    data_path: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    *,
    epochs: float = 1.0,
    lr: float = 5e-4,
    batch_tokens: int = 8192,
    warmup_ratio: float = 0.05,
    step_weight_decay: float = 0.8,
    distill_weight: float = 0.0,
    teacher_topk: int = 32,
    eval_every: int = 100,
    eval_fraction: float = 0.05,
    seed: int = 0,
    max_steps: int | None = None,
    max_grad_norm: float | None = 0.5,
    save_every: int = 50,
    cache_dir: str | os.PathLike | None = None,
    max_seq_len: int | None = None,
    chunk_rows: int = 512,
    num_threads: int | None = None,
    train_vocab: int | None = None,
    compute_dtype: torch.dtype | str = torch.float32,
    init_from: str | os.PathLike | None = None,
    features: str = "cache",
    resume: bool = True,
    show_progress: bool = True,
) -> dict:
    """Train ``model.heads`` (an `Eagle3Drafter` with training-time test over ``num_heads`` steps, or a `DFlashDrafter`
    on the block after every position) on a frozen base from distillation JSONL; returns the metrics, also written to
    ``output_dir/training_metrics.json``, and saves the drafter there. ``features="online"`` computes the base's
    features (and the teacher) in each step instead of caching them on disk first (`base_features`); ``batch_tokens``
    bounds the padded sequence tokens per optimizer step; ``compute_dtype`` bfloat16 runs the unrolled steps under
    autocast and the projection in bfloat16 (faster where the processor multiplies bf16 natively, docs/training.md),
    the weights and the optimizer staying float32; ``init_from`` continues from a saved drafter of the same shape with
    a fresh schedule (more updates for a run that stopped early); the rest are
    `HeadTrainingSettings` fields of the same names."""
    from .trainer import load_initial_heads

    started = time.perf_counter()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    drafter = model.heads
    compute_dtype = _checked_dtype(drafter, compute_dtype)
    checked_feature_mode(features)
    if init_from is not None:  # before the features, so that a wrong folder fails at once
        load_initial_heads(model, init_from)
    accelerator = sequence_accelerator()
    device = accelerator.device
    model.base.to(device)
    if max_seq_len is None:
        max_seq_len = getattr(model.base.config.get_text_config(), "max_position_embeddings", None)
    cache_started = time.perf_counter()
    data, source = _sequence_inputs(model, data_path, cache_dir, max_seq_len, distill_weight, teacher_topk,
                                    eval_fraction, show_progress, features, accelerator)
    cache_time = time.perf_counter() - cache_started

    def make(members: list[int]) -> UnrolledBatch:
        (rows, starts), teacher = source.take(members)
        return UnrolledBatch(members, rows, starts, data.sequences, data.answers, drafter.num_heads, teacher,
                             distill_weight, device)

    run_config = {**_drafter_shape(model), "lr": lr, "batch_tokens": batch_tokens, "warmup_ratio": warmup_ratio,
                  "step_weight_decay": step_weight_decay, "distill_weight": distill_weight,
                  "teacher_topk": teacher_topk if distill_weight > 0 else 0, "seed": seed,
                  "max_grad_norm": max_grad_norm, "eval_fraction": eval_fraction, "max_seq_len": max_seq_len,
                  "train_vocab": train_vocab, "compute_dtype": str(compute_dtype).replace("torch.", ""),
                  "init_from": str(init_from) if init_from is not None else None}
    loop = SequenceLoop(
        make_batch=make, batch_loss=_UnrolledLoss(drafter, chunk_rows, compute_dtype, device),
        depth_weights=tuple(step_weight_decay ** j for j in range(drafter.num_heads)),
        evaluate=lambda batches, vocab: evaluate_unrolled(drafter, batches, chunk_rows, vocab),
        describe=lambda result: "held-out top-1 per depth " + " ".join(f"{v:.3f}" for v in result["top1"]),
        run_config=run_config, desc=f"training the {drafter.drafter_type} drafter", betas=(0.9, 0.95), epochs=epochs,
        lr=lr, batch_tokens=batch_tokens, warmup_ratio=warmup_ratio, seed=seed, max_steps=max_steps,
        max_grad_norm=max_grad_norm, save_every=save_every, eval_every=eval_every, train_vocab=train_vocab,
        resume=resume, show_progress=show_progress)
    return run_training(model, drafter, data, Path(output_dir), loop, accelerator=accelerator, started=started,
                        cache_time=cache_time)


def _drafter_shape(model) -> dict:
    """The drafter's shape in the run's settings (a resumed run must have the same)."""
    config, drafter = model.config, model.heads
    shape = {"head_type": config.head_type, "num_heads": drafter.num_heads, "feature_layers": drafter.feature_layers,
             "adapter_heads": config.adapter_heads, "adapter_head_dim": config.adapter_head_dim,
             "adapter_kv_heads": config.adapter_kv_heads}
    if drafter.drafter_type == "dflash":
        shape.update(num_layers=len(drafter.layers), mask_token_id=drafter.mask_token_id,
                     intermediate_size=config.intermediate_size)
    return shape


def _checked_dtype(drafter, compute_dtype: torch.dtype | str) -> torch.dtype:
    """``compute_dtype`` as a ``torch.dtype``, once the run is known to be possible: ``drafter`` unrolls over
    sequences, and the dtype is float32 or bfloat16."""
    dtype = getattr(torch, compute_dtype) if isinstance(compute_dtype, str) else compute_dtype
    if dtype not in (torch.float32, torch.bfloat16):
        raise UserError(f"compute_dtype must be float32 or bfloat16, got {dtype}.")
    if not hasattr(drafter, "unrolled_outputs"):
        raise UserError(f"{drafter.drafter_type} heads do not unroll over sequences; train them with train_heads.")
    if drafter.own_projection:
        raise UserError("these EAGLE-3 heads project through an lm_head of their own (a drafter trained elsewhere); "
                        "training here fits heads that project through the base's lm_head: start from fresh heads.")
    return dtype


def _sequence_inputs(model, data_path, cache_dir: str | os.PathLike | None, max_seq_len: int | None,
                     distill_weight: float, teacher_topk: int, eval_fraction: float, show_progress: bool,
                     features: str, accelerator=None) -> tuple[SequenceData, CachedStates | OnlineStates]:
    """The records (with their held-out split) and the source of each batch's base features with each record's first
    row and of its teacher distribution: the caches in ``cache_dir`` (`sequence_features`, filled once over
    ``accelerator``'s processes), or the base in the step (``features="online"``)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    online = features == "online"
    data = load_sequences(model.base, data_path, cache_dir=cache_dir, max_seq_len=max_seq_len,
                          distill_weight=distill_weight, teacher_topk=teacher_topk, eval_fraction=eval_fraction,
                          show_progress=show_progress, min_answer=2,  # depth 0 targets the second answer token
                          teacher_in_step=online, accelerator=accelerator)
    base, layers = model.base, model.heads.feature_layers
    if online:
        return data, OnlineStates(base, data.sequences, data.answers, lambda: capture_features(base, layers),
                                  max(layers), "features", _concatenated, teacher_topk if distill_weight > 0 else 0)
    return data, CachedStates(sequence_features(model.base, data.records, layers, cache_dir, max_seq_len,
                                                show_progress=show_progress, accelerator=accelerator), data.teacher)


def _concatenated(states: dict[int, torch.Tensor]) -> tuple[np.ndarray, dict[int, int]]:
    """Records' features as `sequence_features` gives them: one float16 array of their rows, and each one's first."""
    starts = dict(zip(states, np.cumsum([0] + [len(rows) for rows in states.values()]).tolist()))
    return torch.cat(list(states.values())).numpy(), starts


class _UnrolledLoss:
    """`run_training`'s ``batch_loss``: each unrolled step's rows' losses and top-1 hits (none for a step without
    rows); `run_training` weighs step ``j``'s mean ``step_weight_decay ** j``."""

    def __init__(self, drafter, chunk_rows: int, compute_dtype: torch.dtype, device: torch.device):
        self.drafter, self.chunk_rows, self.compute_dtype = drafter, chunk_rows, compute_dtype
        self.projection, self.bias = (t.to(compute_dtype) if t is not None else None for t in _projection(drafter))
        self.autocast = torch.autocast(device.type, dtype=compute_dtype, enabled=compute_dtype != torch.float32)

    def __call__(self, batch: UnrolledBatch, vocab: torch.Tensor | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        with self.autocast:
            outputs = batch.outputs(self.drafter)
        depths = []
        for picked, (_, _, target_ids, target_probs, labels) in zip(outputs, batch.targets):
            if not labels.numel():
                depths.append((picked.new_zeros(0), labels.new_zeros(0, dtype=torch.bool)))
                continue
            depths.append(projection_loss(picked.to(self.compute_dtype), self.projection, target_ids, target_probs,
                                          labels, bias=self.bias, chunk_rows=self.chunk_rows, vocab=vocab))
        return depths
