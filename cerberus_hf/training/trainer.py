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
run started again with the same settings continues from the last one and ends with the same weights and history
as a run that was never interrupted. No checkpoint file is a pickle and none is ever unpickled (accelerate's
``save_state`` writes pickles, which run code when loaded): a pickle in the folder makes the resume refuse it
(`resume_checkpoint`). ``accelerate`` runs the same code on several GPUs (``accelerate launch``): each process
takes its slice of every batch and gradients are averaged. A run can start from saved heads instead of fresh ones
(``init_from``): a curriculum, one data set after another, or shipped heads adapted to one's own data.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ..errors import UserError
from ..hardware import describe_device
from . import checkpointing
from .batches import HeadStates, Rows, head_losses, lm_head_projection
from .checkpointing import (
    METRICS_NAME,
    cosine_with_warmup,
    earlier_run,
    resume_checkpoint,
    save_checkpoint,
)
from .data import Record, frequent_tokens, read_records
from .evaluation import EVAL_SUBSET_SEED, evaluate_heads, position_subset
from .hidden_cache import (
    HiddenStateCache,
    build_hidden_cache,
    default_cache_dir,
    id_bucket,
    split_record_ids,
)

logger = logging.getLogger(__name__)

WINDOW_SUMS = ("head_loss", "head_hits", "head_rows")  # per-head sums of a history entry's interval

# What makes saved heads a valid start for a run: the same drafter over the same kind of base.
INIT_FIELDS = ("base_model_type", "hidden_size", "vocab_size", "head_type", "num_heads", "num_layers",
               "head_projection", "adapter_heads", "adapter_head_dim", "context_window", "prefix_layer",
               "exit_layer", "state_source", "adapter_kv_heads", "feature_layers", "intermediate_size", "rms_norm_eps",
               "rope_theta", "norm_before_residual")


def load_initial_heads(model, folder: str | os.PathLike) -> None:
    """Load the heads saved in ``folder`` into ``model.heads`` as a run's starting point.

    The folder must hold the same drafter (`INIT_FIELDS`) for the same kind of base, or this raises before
    anything is loaded. Its draft vocabulary, calibration and rescorers are not taken: they describe the earlier
    run's data, and the new run's heads get their own (a ``train_vocab`` run sets its vocabulary at the end).
    """
    from ..configuration_cerberus import CerberusConfig
    from ..loading import read_heads

    saved = CerberusConfig.from_pretrained(str(folder))
    differences = {name: (getattr(saved, name), getattr(model.config, name)) for name in INIT_FIELDS
                   if getattr(saved, name) != getattr(model.config, name)}
    if differences:
        raise UserError(f"{folder} holds other heads than this run trains ("
                        + ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in differences.items())
                        + "); give the same head type and shape options it was trained with.")
    state = read_heads(str(folder), saved, {})
    state.pop("draft_vocab", None)
    model.heads.load_state_dict(state, strict=False)  # checked above; only the draft vocabulary stays the model's
    logger.info("starting from the heads in %s", folder)


@dataclass(frozen=True)
class HeadTrainingSettings:
    """How `train_heads` trains: the recipe, the data split, the cache, evaluations and checkpoints, the process.

    ``cerberus-hf train`` fills one from its options; ``dataclasses.replace`` makes a variant. A value out of range
    raises a one-line ``ValueError`` here, before anything runs."""

    # ---- the recipe
    epochs: float = 1.0
    """Passes over the training positions (fractions allowed); ignored when ``max_steps`` is set."""
    max_steps: int | None = None
    """Total optimizer steps (overrides ``epochs``)."""
    lr: float = 1e-3
    """AdamW's peak learning rate: warmed up linearly over ``warmup_ratio`` of the steps, then a cosine to zero."""
    warmup_ratio: float = 0.05
    """Share of the steps the learning rate warms up over."""
    weight_decay: float = 0.0
    """AdamW's weight decay."""
    max_grad_norm: float | None = 1.0
    """Gradients are clipped to this norm (None or 0: not clipped)."""
    batch_size: int = 256
    """Answer positions per optimizer step (each gives up to ``num_heads`` targets), over all processes."""
    head_weight_decay: float = 0.8
    """Head ``k``'s loss weight is ``head_weight_decay ** k`` (Medusa uses 0.8)."""
    distill_weight: float = 0.0
    """Share of the target given to the base's own distribution (top ``teacher_topk``) instead of the data token;
    0 is plain cross-entropy, 1 pure distillation."""
    text_distill_weight: float = 1.0
    """The same share for ``"text"`` records (a dataset's answers, not the base's): by default their targets are the
    base's distribution alone. When the data holds the base's own answers too, held-out accuracy is measured on those
    only, since that is what decoding meets."""
    teacher_topk: int = 32
    """The base's next-token log-probabilities the cache keeps per position (for ``distill_weight``; kept by default
    so that one cache serves runs with and without it)."""
    train_vocab: int | None = None
    """Score the loss over the data's ``train_vocab`` most frequent answer tokens plus each batch's targets instead of
    the whole vocabulary (`projection_loss`). The saved heads draft among those tokens (their draft vocabulary, which
    calibrate keeps), and accuracy is scored among them, as drafting meets it; rows outside it are never trained, so
    the heads' ranking over the whole vocabulary is worse."""
    projection_dtype: str | torch.dtype = "float32"
    """Dtype of the products with the frozen ``lm_head`` in the loss (softmax and loss stay float32). bfloat16 kept
    the accuracy in a trial; whether it is faster depends on the processor (docs/training.md). The heads themselves
    always train in float32."""
    chunk_rows: int = 512
    """Rows of logits formed at once in the loss (memory: ``chunk_rows x vocab x 4`` bytes)."""
    seed: int = 0
    """Data order and dropout seed: the same seed and settings give the same weights."""

    # ---- the data and its split
    eval_fraction: float = 0.05
    """Share of record ids held out (decided by a hash of the id)."""
    train_fraction: float = 1.0
    """Share of the remaining record ids trained on, by the same hash, so smaller fractions are subsets of larger
    ones and the held-out split never changes: a data-scaling curve measured with it says how accuracy grows with
    data before anyone generates more."""
    eval_max_positions: int | None = 4096
    """Evaluate on a fixed random subset of this many held-out positions (None: all)."""
    max_seq_len: int | None = None
    """Sequences are cut to this many tokens in the cache (None: whole)."""
    cache_dir: str | os.PathLike | None = None
    """Hidden-state cache folder (default: ``$CERBERUS_HF_CACHE/hidden_states``). Entries are keyed by base and
    settings and shards by content, so runs on the same data and base (other head types, other hyperparameters)
    compute the base's states only once."""
    cache_batch_tokens: int = 4096
    """Padded tokens per forward of the base while the cache is computed."""

    # ---- where the run starts, what it reports and keeps
    init_from: str | os.PathLike | None = None
    """Saved heads (a ``save_pretrained`` folder of the same drafter, `load_initial_heads`) to start from instead of
    ``model.heads``' current weights; recorded in the run's settings, so a resumed run must name the same folder."""
    eval_every: int = 250
    """Steps between held-out evaluations (0: only at the end)."""
    log_every: int = 10
    """Steps per history entry (the mean loss and per-head top-1 over them)."""
    save_every: int | None = None
    """Steps between checkpoints (default: 100, or ``eval_every`` when smaller)."""
    keep_checkpoints: int = 2
    """Checkpoints kept in ``output_dir/checkpoints`` (the newest)."""
    resume: bool = True
    """Continue from the last checkpoint in ``output_dir`` if there is one (its settings must match); ``False``
    discards existing checkpoints."""

    # ---- the process
    num_threads: int | None = None
    """``torch.set_num_threads`` for the run (default: leave torch's setting)."""
    show_progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        for name in ("distill_weight", "text_distill_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserError(f"{name} must be in [0, 1], got {getattr(self, name)}.")
        if not 0.0 < self.train_fraction <= 1.0:
            raise UserError(f"train_fraction must be in (0, 1], got {self.train_fraction}.")
        if isinstance(self.projection_dtype, str) and not isinstance(getattr(torch, self.projection_dtype, None),
                                                                     torch.dtype):
            raise UserError(f"projection_dtype must name a torch dtype, got {self.projection_dtype!r}.")

    @property
    def projection_torch_dtype(self) -> torch.dtype:
        """``projection_dtype`` as a ``torch.dtype``."""
        dtype = self.projection_dtype
        return getattr(torch, dtype) if isinstance(dtype, str) else dtype

    @property
    def checkpoint_every(self) -> int:
        """Steps between checkpoints: ``save_every``, or its default."""
        if self.save_every is not None:
            return self.save_every
        return min(self.eval_every, 100) if self.eval_every and self.eval_every > 0 else 100


def train_heads(
    model,
    data_path: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    settings: HeadTrainingSettings | None = None,
    *,
    accelerator=None,
) -> dict:
    """Train ``model.heads`` on a frozen base from a distillation JSONL file; returns the metrics.

    Args:
        model: a `CerberusForCausalLM` (e.g. from ``CerberusForCausalLM.from_base``); its heads are trained in
            place (in float32, cast back to the base's dtype at the end), its base is only read.
        data_path: JSONL of ``{"id", "mode", "prompt", "input_ids", "output_ids", "finished"}`` records (from
            ``cerberus-hf distill``), or several, read in order as one data set.
        output_dir: receives the final heads (``model.save_pretrained``), ``training_metrics.json`` and
            ``checkpoints/`` (leave that out when publishing the folder).
        settings: the recipe and the run's options (`HeadTrainingSettings`; default: its defaults).
        accelerator: an ``accelerate.Accelerator`` (default: a new one; on a CPU under ``torchrun``, one process of
            several over gloo).

    Returns:
        ``{"eval": {"top1", "top5", "loss", ...} per head on the held-out split, "train_eval": the same on a
        subset of the training positions, "cost": {"wall_time_s", "cache_time_s", "train_time_s",
        "positions_per_s", "device", ...}, "history", "evals", "config", "data"}``, also written to
        ``output_dir/training_metrics.json``.
    """
    from accelerate import Accelerator

    started = time.perf_counter()
    settings = settings if settings is not None else HeadTrainingSettings()
    if settings.num_threads is not None:
        torch.set_num_threads(int(settings.num_threads))
    accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())  # cpu: torchrun's processes, gloo
    if settings.batch_size < accelerator.num_processes:
        raise UserError(f"batch_size {settings.batch_size} is smaller than the number of processes.")
    if settings.init_from is not None:  # before the cache, so that a wrong folder fails at once
        load_initial_heads(model, settings.init_from)
    model.base.to(accelerator.device)
    data = _prepare_data(model, data_path, settings, accelerator)
    run = _HeadRun(model, settings, data, accelerator, Path(output_dir))
    run.train()
    final_eval, train_eval = run.finish()
    metrics = run.metrics(final_eval, train_eval, started)
    if accelerator.is_main_process:
        run.output_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(run.output_dir)
        (run.output_dir / METRICS_NAME).write_text(json.dumps(metrics, indent=1) + "\n")
    accelerator.wait_for_everyone()
    return metrics


@dataclass
class _HeadData:
    """A run's data: the records, their hidden-state cache, and the cache positions trained and evaluated on."""

    paths: list
    records: list[Record]
    cache: HiddenStateCache
    cache_time: float  # seconds spent building (or finding) the cache
    held_out: set[str]  # record ids never trained on
    train_positions: torch.Tensor
    eval_positions: torch.Tensor  # held out (the base's own answers where there are others), at most a fixed subset
    train_eval_positions: torch.Tensor  # a fixed subset of the training positions
    target_weight: torch.Tensor | float  # the teacher's share of each position's target (text records: their own)
    remaining: torch.Tensor  # per position, the answer tokens of its record after the one it predicts

    def describe(self) -> dict:
        """The metrics' ``"data"`` entry."""
        cache = self.cache
        return {
            "path": str(self.paths[0]) if len(self.paths) == 1 else [str(p) for p in self.paths],
            "records": len(cache.record_ids), "text_records": sum(m == "text" for m in cache.record_modes),
            "sampled_records": sum(m == "sample" for m in cache.record_modes),
            "held_out_records": len(self.held_out),
            "positions": cache.num_positions, "train_positions": int(self.train_positions.shape[0]),
            "eval_positions": int(self.eval_positions.shape[0]), "base_agreement": cache.base_agreement(),
            "cache_folder": cache.info["folder"], "cache_shards_computed": cache.info["shards_computed"],
        }


def _prepare_data(model, data_path, settings: HeadTrainingSettings, accelerator) -> _HeadData:
    """Read the records, build their hidden-state cache (the only time the base runs), and split its positions into
    the held-out ones and, by ``train_fraction``, the ones trained on."""
    cache_started = time.perf_counter()
    paths = [data_path] if isinstance(data_path, (str, os.PathLike)) else list(data_path)
    records = [record for path in paths for record in read_records(path)]
    if len({(r.id, r.mode) for r in records}) != len(records):
        raise UserError(f"{', '.join(map(str, paths))}: a (prompt id, mode) pair appears more than once; "
                        "combine data files whose prompt ids are distinct")
    cache = build_hidden_cache(
        model.base, records, settings.cache_dir if settings.cache_dir is not None else default_cache_dir(),
        teacher_topk=settings.teacher_topk, max_seq_len=settings.max_seq_len,
        batch_tokens=settings.cache_batch_tokens, accelerator=accelerator, show_progress=settings.show_progress,
        state_source=model.config.state_source,
    )
    cache_time = time.perf_counter() - cache_started
    held_out = split_record_ids(cache.record_ids, settings.eval_fraction)
    trained_below = settings.eval_fraction + settings.train_fraction * (1.0 - settings.eval_fraction)
    train_positions = cache.positions(exclude=held_out | {r for r in cache.record_ids if id_bucket(r) >= trained_below})
    if train_positions.numel() == 0:
        raise UserError(f"{data_path} has no answer positions to train on (answers too short, or all held out).")
    is_text = cache.position_modes("text")
    eval_positions = cache.positions(record_ids=held_out)
    if not bool(is_text.all()):  # score the base's own answers, which is what decoding meets
        eval_positions = eval_positions[~is_text[eval_positions]]
    distill_weight = settings.distill_weight
    return _HeadData(
        paths, records, cache, cache_time, held_out, train_positions,
        eval_positions=position_subset(eval_positions, settings.eval_max_positions, EVAL_SUBSET_SEED),
        train_eval_positions=position_subset(train_positions, settings.eval_max_positions, EVAL_SUBSET_SEED),
        target_weight=torch.where(is_text, settings.text_distill_weight, distill_weight) if bool(is_text.any())
        else distill_weight,
        remaining=cache.remaining(),
    )


@dataclass(frozen=True)
class _Schedule:
    """How many optimizer steps a run takes, per epoch and in all, and how many of them warm the learning rate up."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int

    @classmethod
    def of(cls, train_positions: int, settings: HeadTrainingSettings) -> _Schedule:
        steps_per_epoch = math.ceil(train_positions / settings.batch_size)
        total_steps = int(settings.max_steps) if settings.max_steps is not None else \
            max(1, math.ceil(settings.epochs * steps_per_epoch))
        return cls(steps_per_epoch, total_steps, int(round(settings.warmup_ratio * total_steps)))


def _run_config(model, settings: HeadTrainingSettings, data: _HeadData, schedule: _Schedule) -> dict:
    """The run's settings as its checkpoints and metrics record them: a resume must find the same."""
    return {
        "head_type": model.config.head_type, "num_heads": model.heads.num_heads, "num_layers": model.config.num_layers,
        "head_projection": model.config.head_projection, "lr": settings.lr, "batch_size": settings.batch_size,
        "warmup_ratio": settings.warmup_ratio, "warmup_steps": schedule.warmup_steps,
        "head_weight_decay": settings.head_weight_decay,
        "distill_weight": settings.distill_weight, "text_distill_weight": settings.text_distill_weight,
        "teacher_topk": data.cache.teacher_topk, "seed": settings.seed,
        "projection_dtype": str(settings.projection_torch_dtype).replace("torch.", ""),
        "train_vocab": settings.train_vocab, "total_steps": schedule.total_steps,
        "steps_per_epoch": schedule.steps_per_epoch, "weight_decay": settings.weight_decay,
        "max_grad_norm": settings.max_grad_norm, "eval_fraction": settings.eval_fraction,
        "train_fraction": settings.train_fraction,
        "data_digest": data.cache.info["data_digest"],
        "base_cache_key": data.cache.info["key"],
        "init_from": str(settings.init_from) if settings.init_from is not None else None,
    }


@dataclass
class _Optimization:
    """What a step trains the heads with: AdamW under the schedule, the frozen ``lm_head`` the loss projects
    through, each head's loss weight and the train vocabulary."""

    trainable: torch.nn.Module  # the heads' forward, as accelerate prepared it
    optimizer: torch.optim.Optimizer  # AdamW itself, whose state checkpoints hold
    prepared: torch.optim.Optimizer  # accelerate's wrapper of it, which steps
    scheduler: torch.optim.lr_scheduler.LambdaLR
    weight: torch.Tensor
    bias: torch.Tensor | None
    head_weights: torch.Tensor  # head k's loss weight, head_weight_decay ** k
    vocab: torch.Tensor | None  # the train vocabulary (None: the whole one)

    @classmethod
    def build(cls, model, settings: HeadTrainingSettings, data: _HeadData, schedule: _Schedule,
              accelerator) -> _Optimization:
        """Move the heads to the device in float32 (whatever the base's dtype) for training, and make the rest."""
        heads, device, dtype = model.heads, accelerator.device, settings.projection_torch_dtype
        heads.to(device=device, dtype=torch.float32)
        heads.train()
        optimizer = torch.optim.AdamW(heads.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        scheduler = cosine_with_warmup(optimizer, schedule.warmup_steps, schedule.total_steps)
        trainable, prepared = accelerator.prepare(HeadStates(heads), optimizer)
        weight, bias = lm_head_projection(model)
        return cls(
            trainable, optimizer, prepared, scheduler, weight.to(device=device, dtype=dtype),
            bias.to(device=device, dtype=dtype) if bias is not None else None,
            torch.tensor([settings.head_weight_decay**k for k in range(heads.num_heads)], dtype=torch.float32),
            frequent_tokens(data.records, settings.train_vocab).to(device) if settings.train_vocab else None,
        )


class _HistoryWindow:
    """The sums behind the next history entry: the loss of each step and, per head, the rows' losses, hits and count.
    Checkpointed, so that an entry whose interval a resume splits still averages all of its steps."""

    def __init__(self, num_heads: int):
        self.loss, self.steps = 0.0, 0
        self.sums = {key: torch.zeros(num_heads, dtype=torch.float64) for key in WINDOW_SUMS}

    def add(self, loss: torch.Tensor, head: torch.Tensor, row_losses: torch.Tensor, row_correct: torch.Tensor,
            accelerator) -> None:
        """Add a step: its loss (over all processes) and this process's rows, summed per head over all processes
        (so that every process, and so the checkpoint, holds the whole window)."""
        step = torch.zeros(3, len(self.sums["head_rows"]), dtype=torch.float64).index_add_(
            1, head.cpu(), torch.stack([row_losses.detach().cpu().double(), row_correct.cpu().double(),
                                        torch.ones(head.shape[0], dtype=torch.float64)]))
        if accelerator.num_processes > 1:
            step = accelerator.reduce(step.to(accelerator.device), reduction="sum").cpu()
        self.loss += float(loss.detach())
        for key, sums in zip(WINDOW_SUMS, step):
            self.sums[key] += sums
        self.steps += 1

    def entry(self, step: int, epoch: float, lr: float) -> dict:
        """The history entry of the steps added so far; the window then starts again."""
        n = self.sums["head_rows"].clamp(min=1)
        entry = {"step": step, "epoch": epoch, "loss": round(self.loss / self.steps, 6),
                 "head_loss": [round(float(v), 5) for v in self.sums["head_loss"] / n],
                 "head_top1": [round(float(v), 5) for v in self.sums["head_hits"] / n], "lr": lr}
        self.loss, self.steps = 0.0, 0
        for sums in self.sums.values():
            sums.zero_()
        return entry

    def to_json(self) -> dict:
        return {"loss": self.loss, "steps": self.steps, **{key: self.sums[key].tolist() for key in WINDOW_SUMS}}

    def load(self, saved: dict) -> None:
        self.loss, self.steps = saved["loss"], saved["steps"]
        self.sums = {key: torch.tensor(saved[key], dtype=torch.float64) for key in WINDOW_SUMS}


class _HeadRun:
    """One call of `train_heads` once its data is ready: the optimizer loop with its history, held-out evaluations
    and checkpoints, from the seed or from the last checkpoint of ``output_dir``."""

    def __init__(self, model, settings: HeadTrainingSettings, data: _HeadData, accelerator, output_dir: Path):
        self.model, self.settings, self.data, self.accelerator = model, settings, data, accelerator
        self.output_dir, self.device, self.is_main = output_dir, accelerator.device, accelerator.is_main_process
        self.schedule = _Schedule.of(data.train_positions.shape[0], settings)
        self.run_config = _run_config(model, settings, data, self.schedule)
        self.heads_dtype = next(model.heads.parameters()).dtype
        self.opt = _Optimization.build(model, settings, data, self.schedule, accelerator)
        self.state: dict = {"run_config": self.run_config, "history": [], "evals": [], "train_time_s": 0.0,
                            "positions_trained": 0}
        self.step = 0
        self.window = _HistoryWindow(model.heads.num_heads)
        self._resume()
        self.progress = tqdm(total=self.schedule.total_steps, initial=self.step, unit="step",
                             desc=f"training {model.config.head_type} heads",
                             disable=not (settings.show_progress and self.is_main), dynamic_ncols=True)
        self.order: tuple[int, torch.Tensor] | None = None  # (epoch, its order of the training positions)
        self.train_started, self.train_time_before = time.perf_counter(), self.state["train_time_s"]
        self.positions_this_call, self.eval_time, self.train_time = 0, 0.0, 0.0

    def _resume(self) -> None:
        """Continue from the last checkpoint (weights, AdamW, schedule, RNG state, history) if there is one; a new
        run starts from the seed's RNG state (dropout draws from it)."""
        from accelerate.utils import set_seed

        set_seed(self.settings.seed)
        saved = resume_checkpoint(self.accelerator, self.output_dir, self.run_config, self.settings.resume,
                                  self.model.heads, self.opt.optimizer, self.opt.scheduler)
        if saved is not None:
            self.state.update({k: saved[k] for k in ("history", "evals", "train_time_s", "positions_trained")})
            self.step = int(saved["step"])
            self.window.load(saved["window"])

    def train(self) -> None:
        """Step to the schedule's end, evaluating every ``eval_every`` steps and checkpointing every
        ``checkpoint_every`` and at the end."""
        settings, total_steps = self.settings, self.schedule.total_steps
        while self.step < total_steps:
            self._step(self._next_batch())
            self.progress.update(1)
            if settings.eval_every and self.step % settings.eval_every == 0 and self.step != total_steps:
                self._evaluate()
            if self.step % settings.checkpoint_every == 0 or self.step == total_steps:
                self._save_checkpoint()
            checkpointing.on_step_end(self.step)
        self.progress.close()
        self.train_time = time.perf_counter() - self.train_started - self.eval_time

    def _next_batch(self) -> torch.Tensor:
        """The next step's positions (all processes'): its slice of its epoch's order, which the seed and the epoch
        number alone decide."""
        epoch, index = divmod(self.step, self.schedule.steps_per_epoch)
        if self.order is None or self.order[0] != epoch:
            generator = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + epoch)
            self.order = (epoch, torch.randperm(self.data.train_positions.shape[0], generator=generator))
        size = self.settings.batch_size
        return self.data.train_positions[self.order[1][index * size : (index + 1) * size]].sort().values

    def _step(self, batch: torch.Tensor) -> None:
        """One optimizer step on this process's share of ``batch``, added to the history's window."""
        model, opt, data, accelerator, device = self.model, self.opt, self.data, self.accelerator, self.device
        heads = model.heads
        local = batch[accelerator.process_index :: accelerator.num_processes]
        rows = Rows(data.cache, data.remaining, local, heads.num_heads, data.target_weight, device,
                    heads.context_window)
        states = opt.trainable(rows.hidden, rows.tokens, rows.next_tokens, rows.valid)
        row_losses, row_correct = head_losses(model, states, rows, opt.weight, opt.bias, self.settings.chunk_rows,
                                              opt.vocab)
        head_rows = torch.zeros(heads.num_heads, device=device).index_add_(0, rows.head, torch.ones_like(row_losses))
        scale = 1.0
        if accelerator.num_processes > 1:  # each head's mean over all processes' rows: the gradients are averaged
            head_rows, scale = accelerator.reduce(head_rows, reduction="sum"), float(accelerator.num_processes)
        row_weights = (opt.head_weights.to(device) / head_rows.clamp(min=1))[rows.head]
        loss = (row_losses * row_weights).sum() * scale
        accelerator.backward(loss)
        if accelerator.num_processes > 1:  # the step's loss over all processes, for the history
            loss = accelerator.reduce(loss.detach(), reduction="sum") / scale
        if self.settings.max_grad_norm:
            accelerator.clip_grad_norm_(heads.parameters(), self.settings.max_grad_norm)
        opt.prepared.step()
        opt.scheduler.step()
        opt.prepared.zero_grad(set_to_none=True)
        self.step += 1
        self.positions_this_call += int(batch.shape[0])
        self.state["positions_trained"] += int(batch.shape[0])
        self.window.add(loss, rows.head, row_losses, row_correct, accelerator)
        if self.step % self.settings.log_every == 0 or self.step == self.schedule.total_steps:
            entry = self.window.entry(self.step, round(self.step / self.schedule.steps_per_epoch, 4),
                                      opt.scheduler.get_last_lr()[0])
            self.state["history"].append(entry)
            self.progress.set_postfix(loss=f"{entry['loss']:.3f}",
                                      top1="/".join(f"{v:.2f}" for v in entry["head_top1"]))

    def _timed_eval(self, positions: torch.Tensor) -> dict:
        """`evaluate_heads` on ``positions``, its time counted apart from training's."""
        started = time.perf_counter()
        result = evaluate_heads(self.model, self.data.cache, positions, chunk_rows=self.settings.chunk_rows,
                                accelerator=self.accelerator, vocab=self.opt.vocab)
        self.eval_time += time.perf_counter() - started
        return result

    def _evaluate(self) -> dict | None:
        """The held-out evaluation at this step, added to the run's record and shown (None: nothing held out)."""
        if self.data.eval_positions.numel() == 0:
            return None
        result = {"step": self.step, **self._timed_eval(self.data.eval_positions)}
        self.state["evals"].append(result)
        if self.is_main:
            among = f" (among the {self.settings.train_vocab} train-vocabulary tokens)" if self.opt.vocab is not None \
                else ""
            self.progress.write(f"step {self.step}: held-out top-1{among} "
                                + " ".join(f"{v:.3f}" for v in result["top1"])
                                + " | top-5 " + " ".join(f"{v:.3f}" for v in result["top5"]))
        return result

    def _save_checkpoint(self) -> None:
        window = self.window.to_json()
        train_time = self.train_time_before + time.perf_counter() - self.train_started - self.eval_time
        save_checkpoint(self.accelerator, self.output_dir, self.step, dict(self.state, train_time_s=train_time,
                                                                           window=window),
                        self.settings.keep_checkpoints, self.model.heads, self.opt.optimizer, self.opt.scheduler)

    def finish(self) -> tuple[dict | None, dict]:
        """The held-out evaluation at the last step (unless the loop made it) and one on training positions; the
        heads then go back to their dtype, to draft among the train vocabulary when there is one."""
        evals = self.state["evals"]
        final_eval = evals[-1] if evals and evals[-1]["step"] == self.step else None
        if final_eval is None:
            final_eval = self._evaluate()
            if final_eval is not None:  # keep the checkpoint's record complete
                self._save_checkpoint()
        train_eval = self._timed_eval(self.data.train_eval_positions)
        heads = self.model.heads
        heads.to(dtype=self.heads_dtype)
        heads.eval()
        if self.opt.vocab is not None:  # trained to rank these tokens only: draft among them
            self.model.set_draft_vocab(self.opt.vocab, trained=True)
        return final_eval, train_eval

    def metrics(self, final_eval: dict | None, train_eval: dict, started: float) -> dict:
        """What `train_heads` returns and writes to ``training_metrics.json``."""
        train_time, positions = self.train_time, self.positions_this_call
        return {
            "top1": final_eval["top1"] if final_eval else None,
            "top5": final_eval["top5"] if final_eval else None,
            "eval": final_eval,
            "train_eval": train_eval,
            "steps": self.step,
            "epochs": round(self.step / self.schedule.steps_per_epoch, 4),
            "config": self.run_config,
            "data": self.data.describe(),
            "cost": {
                "wall_time_s": round(time.perf_counter() - started, 3),
                "cache_time_s": round(self.data.cache_time, 3),
                "train_time_s": round(train_time, 3),
                "train_time_s_total": round(self.train_time_before + train_time, 3),
                "eval_time_s": round(self.eval_time, 3),
                "positions_per_s": round(positions / train_time, 2) if positions and train_time > 0 else None,
                "positions_trained": self.state["positions_trained"],
                "device": describe_device(self.device),
                "num_processes": self.accelerator.num_processes,
            },
            "continued_from": earlier_run(self.settings.init_from),
            "history": self.state["history"],
            "evals": self.state["evals"],
        }
