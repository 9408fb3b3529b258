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
from .data import frequent_tokens, read_records
from .evaluation import EVAL_SUBSET_SEED, evaluate_heads, position_subset
from .hidden_cache import (
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
               "exit_layer", "state_source", "adapter_kv_heads", "feature_layers")


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
        raise ValueError(f"{folder} holds other heads than this run trains ("
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
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}.")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ValueError(f"train_fraction must be in (0, 1], got {self.train_fraction}.")
        if isinstance(self.projection_dtype, str) and not isinstance(getattr(torch, self.projection_dtype, None),
                                                                     torch.dtype):
            raise ValueError(f"projection_dtype must name a torch dtype, got {self.projection_dtype!r}.")

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
    settings = settings if settings is not None else HeadTrainingSettings()
    if settings.num_threads is not None:
        torch.set_num_threads(int(settings.num_threads))
    accelerator = accelerator or Accelerator()
    projection_dtype = settings.projection_torch_dtype
    save_every = settings.checkpoint_every
    output_dir = Path(output_dir)
    if settings.batch_size < accelerator.num_processes:
        raise ValueError(f"batch_size {settings.batch_size} is smaller than the number of processes.")
    if settings.init_from is not None:  # before the cache, so that a wrong folder fails at once
        load_initial_heads(model, settings.init_from)
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
    cache = build_hidden_cache(
        model.base, records, settings.cache_dir if settings.cache_dir is not None else default_cache_dir(),
        teacher_topk=settings.teacher_topk, max_seq_len=settings.max_seq_len,
        batch_tokens=settings.cache_batch_tokens, accelerator=accelerator, show_progress=settings.show_progress,
        state_source=model.config.state_source,
    )
    cache_time = time.perf_counter() - cache_started
    held_out = split_record_ids(cache.record_ids, settings.eval_fraction)
    left_out = held_out | {r for r in cache.record_ids
                           if id_bucket(r) >= settings.eval_fraction + settings.train_fraction * (1.0 - settings.eval_fraction)}
    train_positions = cache.positions(exclude=left_out)
    is_text = cache.position_modes("text")
    eval_positions = cache.positions(record_ids=held_out)
    if not bool(is_text.all()):  # score the base's own answers, which is what decoding meets
        eval_positions = eval_positions[~is_text[eval_positions]]
    eval_positions = position_subset(eval_positions, settings.eval_max_positions, EVAL_SUBSET_SEED)
    target_weight = torch.where(is_text, settings.text_distill_weight, settings.distill_weight) if bool(is_text.any()) else settings.distill_weight
    train_eval_positions = position_subset(train_positions, settings.eval_max_positions, EVAL_SUBSET_SEED)
    if train_positions.numel() == 0:
        raise ValueError(f"{data_path} has no answer positions to train on (answers too short, or all held out).")
    remaining = cache.remaining()

    steps_per_epoch = math.ceil(train_positions.shape[0] / settings.batch_size)
    total_steps = int(settings.max_steps) if settings.max_steps is not None else max(1, math.ceil(settings.epochs * steps_per_epoch))
    warmup_steps = int(round(settings.warmup_ratio * total_steps))
    run_config = {
        "head_type": model.config.head_type, "num_heads": num_heads, "num_layers": model.config.num_layers,
        "head_projection": model.config.head_projection, "lr": settings.lr, "batch_size": settings.batch_size,
        "warmup_ratio": settings.warmup_ratio, "warmup_steps": warmup_steps, "head_weight_decay": settings.head_weight_decay,
        "distill_weight": settings.distill_weight, "text_distill_weight": settings.text_distill_weight,
        "teacher_topk": cache.teacher_topk, "seed": settings.seed,
        "projection_dtype": str(projection_dtype).replace("torch.", ""), "train_vocab": settings.train_vocab,
        "total_steps": total_steps, "steps_per_epoch": steps_per_epoch, "weight_decay": settings.weight_decay,
        "max_grad_norm": settings.max_grad_norm, "eval_fraction": settings.eval_fraction, "train_fraction": settings.train_fraction,
        "data_digest": cache.info["data_digest"],
        "base_cache_key": cache.info["key"],
        "init_from": str(settings.init_from) if settings.init_from is not None else None,
    }

    # ---- heads, optimizer, schedule (heads train in float32 whatever the base's dtype)
    heads_dtype = next(heads.parameters()).dtype
    heads.to(device=device, dtype=torch.float32)
    heads.train()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    scheduler = cosine_with_warmup(optimizer, warmup_steps, total_steps)
    trainable, optimizer_wrapped = accelerator.prepare(HeadStates(heads), optimizer)
    weight, bias = lm_head_projection(model)
    weight = weight.to(device=device, dtype=projection_dtype)
    bias = bias.to(device=device, dtype=projection_dtype) if bias is not None else None
    head_weights = torch.tensor([settings.head_weight_decay**k for k in range(num_heads)], dtype=torch.float32)
    vocab = frequent_tokens(records, settings.train_vocab).to(device) if settings.train_vocab else None

    # ---- resume (a resumed run continues the saved RNG state; a new one starts from the seed's: dropout draws from it)
    trainer_state: dict = {"run_config": run_config, "history": [], "evals": [], "train_time_s": 0.0,
                           "positions_trained": 0}
    step = 0
    # the sums behind the next history entry; checkpointed, so that an entry whose interval a resume splits still
    # averages all of its steps
    window = {"loss": 0.0, "steps": 0, **{key: torch.zeros(num_heads, dtype=torch.float64) for key in WINDOW_SUMS}}
    set_seed(settings.seed)
    saved = resume_checkpoint(accelerator, output_dir, run_config, settings.resume, heads, optimizer, scheduler)
    if saved is not None:
        trainer_state.update({k: saved[k] for k in ("history", "evals", "train_time_s", "positions_trained")})
        step = int(saved["step"])
        window.update(loss=saved["window"]["loss"], steps=saved["window"]["steps"],
                      **{key: torch.tensor(saved["window"][key], dtype=torch.float64) for key in WINDOW_SUMS})

    # ---- the loop
    is_main = accelerator.is_main_process
    progress = tqdm(total=total_steps, initial=step, unit="step", desc=f"training {model.config.head_type} heads",
                    disable=not (settings.show_progress and is_main), dynamic_ncols=True)
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
        result = evaluate_heads(model, cache, eval_positions, chunk_rows=settings.chunk_rows, accelerator=accelerator,
                                vocab=vocab)
        eval_time += time.perf_counter() - t0
        result = {"step": at_step, **result}
        trainer_state["evals"].append(result)
        if is_main:
            among = f" (among the {settings.train_vocab} train-vocabulary tokens)" if vocab is not None else ""
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
            generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + epoch)
            permutation = torch.randperm(train_positions.shape[0], generator=generator)
            permutation_epoch = epoch
        batch = train_positions[permutation[index * settings.batch_size : (index + 1) * settings.batch_size]].sort().values
        local = batch[accelerator.process_index :: accelerator.num_processes]
        rows = Rows(cache, remaining, local, num_heads, target_weight, device, heads.context_window)

        states = trainable(rows.hidden, rows.tokens, rows.next_tokens, rows.valid)
        row_losses, row_correct = head_losses(model, states, rows, weight, bias, settings.chunk_rows, vocab)
        head_rows = torch.zeros(num_heads, device=device).index_add_(0, rows.head, torch.ones_like(row_losses))
        row_weights = (head_weights.to(device) / head_rows.clamp(min=1))[rows.head]
        loss = (row_losses * row_weights).sum()
        accelerator.backward(loss)
        if settings.max_grad_norm:
            accelerator.clip_grad_norm_(heads.parameters(), settings.max_grad_norm)
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
        if step % settings.log_every == 0 or step == total_steps:
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
        if settings.eval_every and step % settings.eval_every == 0 and step != total_steps:
            run_eval(step)
        if step % save_every == 0 or step == total_steps:
            save_checkpoint(accelerator, output_dir, step, state_for_checkpoint(), settings.keep_checkpoints, heads, optimizer,
                            scheduler)
        checkpointing.on_step_end(step)
    progress.close()
    train_time = time.perf_counter() - train_started - eval_time

    # ---- final evaluation, the heads, the metrics
    final_eval = trainer_state["evals"][-1] if trainer_state["evals"] and trainer_state["evals"][-1]["step"] == step else None
    if final_eval is None:
        final_eval = run_eval(step)
        if final_eval is not None:  # keep the checkpoint's record complete
            save_checkpoint(accelerator, output_dir, step, state_for_checkpoint(), settings.keep_checkpoints, heads, optimizer,
                            scheduler)
    t0 = time.perf_counter()
    train_eval = evaluate_heads(model, cache, train_eval_positions, chunk_rows=settings.chunk_rows, accelerator=accelerator,
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
        "continued_from": earlier_run(settings.init_from),
        "history": trainer_state["history"],
        "evals": trainer_state["evals"],
    }
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(output_dir)
        (output_dir / METRICS_NAME).write_text(json.dumps(metrics, indent=1) + "\n")
    accelerator.wait_for_everyone()
    return metrics
