"""The frozen base's last hidden states over the training data, computed once and kept on disk.

Training draft heads never needs the base's gradients, only its last hidden state (the input of its
``lm_head``) at every answer position. Running the base once over every training sequence and keeping
those states makes every later epoch, head type and hyperparameter trial cost only the heads and the
vocabulary projection, which is what makes head training fit on a CPU.

What is kept
------------
For a record with prompt ids ``P`` (length ``p``) and answer ids ``A`` (length ``n``), the base reads the
sequence ``P + A``. Position ``i`` of the record's cache rows (``0 <= i < n``) holds

* ``hidden[i]``: the base's last hidden state at sequence position ``p - 1 + i`` (float16), the state
  from which the base predicts ``A[i]`` (the lm_head's input, or with ``state_source="final_norm_input"``
  the last decoder layer's output before the final norm, in a cache of its own); at inference this is
  the state the heads read after the base has produced everything before ``A[i]``;
* ``tokens[i] = A[i]``;
* ``teacher_ids[i]`` / ``teacher_logprobs[i]``: the base's top-``k`` next-token log-probabilities at that
  state, i.e. its distribution for ``A[i]`` (for distillation; computed from the float32 state).

So head ``k`` (0-based) reading ``hidden[i]`` targets ``tokens[i + k + 1]`` (the token ``k + 2`` ahead of
the state's sequence position) and the base's own distribution for that token is ``teacher[i + k + 1]``;
both exist while ``i + k + 1 < n``.

Layout and resuming
-------------------
``<cache_dir>/<key>/shard-<index>-<content hash>.safetensors``, where ``key`` names the base (config and
a weight checksum) and the cache settings, and each shard covers a run of consecutive records (about
``shard_tokens`` tokens). A shard's name carries the hash of the records it covers, so shards already
written are reused, a file that keeps growing (records appended) only adds shards, and a changed record
only recomputes its own shard. Shards are written to a temporary name and renamed, so a killed run never
leaves a half-written shard behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from ..blocks.packed import packed_model
from ..drafters.base import capture_states
from ..errors import UserError
from ..files import save_safetensors_atomically, write_atomically
from .answer_states import load_states, states_folder
from .data import Record, read_records

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


# --------------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------------


def id_bucket(record_id: str) -> float:
    """A fixed pseudo-random number in [0, 1) for a record id (the held-out split is ``bucket < fraction``).

    It depends on the id alone, so the split does not change when records are reordered or appended, and
    the greedy and sampled answers to one prompt (same id) always fall on the same side.
    """
    digest = hashlib.sha256(f"cerberus-hf-split:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_record_ids(record_ids: Iterable[str], eval_fraction: float) -> set[str]:
    """The held-out ids: those whose bucket falls below ``eval_fraction``; at least one id when there are
    two or more distinct ids and ``eval_fraction > 0`` (the lowest bucket), never all of them."""
    ids = sorted(set(record_ids), key=id_bucket)
    if eval_fraction <= 0 or len(ids) < 2:
        return set()
    held_out = {i for i in ids if id_bucket(i) < eval_fraction}
    if not held_out:
        held_out = {ids[0]}
    if len(held_out) == len(ids):
        held_out.discard(ids[-1])
    return held_out


# --------------------------------------------------------------------------------------------------------
# Base identity and the base's last hidden state
# --------------------------------------------------------------------------------------------------------


def base_fingerprint(base: nn.Module) -> dict:
    """What identifies the hidden states a base produces: its type, shape and a checksum of its weights."""
    with torch.no_grad():
        total = 0.0
        squares = 0.0
        count = 0
        for p in base.parameters():
            data = p.detach().double()
            total += float(data.sum())
            squares += float((data * data).sum())
            count += p.numel()
    lm_weight = base.get_output_embeddings().weight
    return {
        "name_or_path": str(getattr(base, "name_or_path", "") or ""),
        "model_type": getattr(base.config, "model_type", None),
        "dtype": str(lm_weight.dtype).replace("torch.", ""),
        "vocab_size": int(lm_weight.shape[0]),
        "hidden_size": int(lm_weight.shape[1]),
        "parameters": count,
        "checksum": f"{total:.9e}/{squares:.9e}",
    }


def _decoder(base: nn.Module) -> nn.Module | None:
    get = getattr(base, "get_decoder", None)
    try:
        return get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None


def base_states(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_decoder: bool,
                state_source: str = "lm_head_input") -> tuple[torch.Tensor, torch.Tensor]:
    """(the state the drafter reads, named by ``state_source``; the lm_head's input), each
    ``[batch, seq, hidden]``: for the default source both are the lm_head's input, the base's last hidden
    state exactly as its ``lm_head`` reads it.

    With ``use_decoder`` the backbone alone is run (``base.get_decoder()``, whose ``last_hidden_state`` is
    the lm_head input for Llama-style models: the final norm is applied inside it), which skips the
    vocabulary projection over every position. Otherwise the full model runs and the states are recorded
    with `capture_states`.
    """
    with capture_states(base, state_source) as captured:
        if use_decoder:
            last = _decoder(base)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
            captured.setdefault("hidden", last)  # the lm_head did not run: its input is the decoder's output
            captured["lm_head_input"] = last
        else:
            base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return captured["hidden"], captured["lm_head_input"]


@torch.no_grad()
def decoder_output_is_lm_head_input(base: nn.Module, input_ids: torch.Tensor) -> bool:
    """Whether the backbone's ``last_hidden_state`` equals what the ``lm_head`` reads (checked on one row)."""
    decoder = _decoder(base)
    if decoder is None:
        return False
    row = input_ids[:1, :64]
    mask = torch.ones_like(row)
    try:
        fast = base_states(base, row, mask, use_decoder=True)[1]
    except Exception:  # noqa: BLE001 - any failure just means the backbone path is not usable
        return False
    exact = base_states(base, row, mask, use_decoder=False)[1]
    return fast.shape == exact.shape and torch.allclose(fast, exact, rtol=1e-4, atol=1e-4 * float(exact.abs().max()))


def _teacher_logits(base: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The base's next-token logits from lm_head inputs, with its final soft-capping where it has one."""
    logits = base.get_output_embeddings()(hidden).float()
    cap = getattr(base.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def teacher_topk_rows(base: nn.Module, head_input: torch.Tensor, teacher_topk: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids ``[rows, k]`` int32, log-probabilities ``[rows, k]`` float16), on the CPU: the base's top-``teacher_topk``
    next-token distribution at each of the lm_head inputs ``head_input`` ``[rows, hidden]``, computed in chunks of
    1,024 rows (the cache's teacher, and the one the sequence trainers compute in the step)."""
    ids_parts, logp_parts = [], []
    for chunk in head_input.split(1024):
        logp = torch.log_softmax(_teacher_logits(base, chunk), dim=-1)
        top = logp.topk(teacher_topk, dim=-1)
        ids_parts.append(top.indices.to(torch.int32).cpu())
        logp_parts.append(top.values.to(torch.float16).cpu())
    empty = (0, teacher_topk)
    return (torch.cat(ids_parts) if ids_parts else torch.zeros(empty, dtype=torch.int32),
            torch.cat(logp_parts) if logp_parts else torch.zeros(empty, dtype=torch.float16))


# --------------------------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------------------------


@dataclass
class ShardPlan:
    index: int
    records: list[int]  # indices into the record list
    tokens: int  # sequence tokens the base reads for this shard
    record_hashes: list[str]  # each record's `Record.content_hash`, in ``records`` order

    @functools.cached_property
    def digest(self) -> str:
        """The shard's content: the digest of its records' content hashes."""
        return hashlib.sha256("".join(self.record_hashes).encode()).hexdigest()

    @property
    def filename(self) -> str:
        """Named by content alone, so a run over another combination of files finds the shards it shares."""
        return f"shard-{self.digest[:32]}.safetensors"


def record_sequence(record: Record, max_seq_len: int | None) -> tuple[list[int], int]:
    """(the ids the base reads, number of answer tokens kept) for a record, cut to ``max_seq_len``."""
    ids = list(record.input_ids) + list(record.output_ids)
    if max_seq_len is not None:
        ids = ids[:max_seq_len]
    prompt = max(1, len(record.input_ids))  # a state to read needs at least one token before the answer
    return ids, max(0, len(ids) - prompt)


def plan_shards(records: Sequence[Record], shard_tokens: int, max_seq_len: int | None) -> list[ShardPlan]:
    """Consecutive records grouped into shards of about ``shard_tokens`` tokens on average, in file order.

    Whether a record closes its shard depends on that record alone (its content hash, against a threshold
    of its length over ``shard_tokens``), not on what came before it. So a run of records is cut the same way
    wherever it appears: training on file A, then on B, then on A and B together (or on B then A) computes
    only the shards that straddle a file boundary again, not the whole of the second file.
    """
    plans: list[ShardPlan] = []
    current: list[int] = []
    hashes: list[str] = []
    tokens = 0
    for index, record in enumerate(records):
        digest = record.content_hash()
        current.append(index)
        hashes.append(digest)
        length = len(record_sequence(record, max_seq_len)[0])
        tokens += length
        if int(digest[:15], 16) / 16**15 < length / shard_tokens:
            plans.append(_make_plan(len(plans), current, hashes, tokens))
            current, hashes, tokens = [], [], 0
    if current:
        plans.append(_make_plan(len(plans), current, hashes, tokens))
    return plans


def _make_plan(index: int, members: list[int], hashes: list[str], tokens: int) -> ShardPlan:
    """A shard of ``members`` (record indices) whose content hashes are ``hashes``."""
    return ShardPlan(index=index, records=list(members), tokens=tokens, record_hashes=list(hashes))


def batches_by_length(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Rows grouped longest first so that each padded batch holds at most ``batch_tokens`` tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def right_padded(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of ``rows`` padded on the right: under causal attention every real
    position computes exactly what it would alone."""
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    return input_ids, mask


@torch.no_grad()
def _compute_shard(
    base: nn.Module,
    records: Sequence[Record],
    plan: ShardPlan,
    *,
    teacher_topk: int,
    max_seq_len: int | None,
    batch_tokens: int,
    use_decoder: bool,
    pad_token_id: int,
    progress: tqdm | None,
    state_source: str = "lm_head_input",
    kept: Path | None = None,
) -> dict[str, torch.Tensor]:
    """The shard of ``plan``'s records: the base run over them, except those whose states distilling kept in the
    folder ``kept`` (`answer_states`; where the cache keeps the lm_head's input), whose teacher, where one is kept,
    comes from the kept float16 state through the lm_head alone."""
    lm_head = base.get_output_embeddings().weight
    sequences = [record_sequence(records[i], max_seq_len) for i in plan.records]
    per_record: list[dict[str, torch.Tensor] | None] = [None] * len(sequences)
    if kept is not None and state_source == "lm_head_input":
        for i, (ids, answer) in enumerate(sequences):
            states = load_states(kept, plan.record_hashes[i], answer, lm_head.shape[1])
            if states is None:
                continue
            entry = per_record[i] = {"hidden": states, "tokens": torch.tensor(ids[len(ids) - answer:],
                                                                              dtype=torch.int32)}
            if teacher_topk:
                entry["teacher_ids"], entry["teacher_logprobs"] = teacher_topk_rows(
                    base, states.to(device=lm_head.device, dtype=lm_head.dtype), teacher_topk)
            if progress is not None:
                progress.update(len(ids))
    left = [i for i, entry in enumerate(per_record) if entry is None]
    for batch in batches_by_length([len(sequences[i][0]) for i in left], batch_tokens):
        batch = [left[b] for b in batch]
        input_ids, mask = right_padded([sequences[i][0] for i in batch], pad_token_id)
        hidden, head_input = base_states(base, input_ids.to(lm_head.device), mask.to(lm_head.device), use_decoder,
                                         state_source)
        for row, i in enumerate(batch):
            ids, answer = sequences[i]
            start = len(ids) - answer - 1  # state at p - 1 predicts the first answer token
            states = hidden[row, start : start + answer]
            half = states.to(torch.float16).cpu()
            if not bool(torch.isfinite(half).all()):
                raise ValueError(f"Record {records[plan.records[i]].id!r}: the base's hidden states overflow float16.")
            entry = {
                "hidden": half,
                "tokens": torch.tensor(ids[len(ids) - answer :], dtype=torch.int32),
            }
            if teacher_topk:
                entry["teacher_ids"], entry["teacher_logprobs"] = teacher_topk_rows(
                    base, head_input[row, start : start + answer], teacher_topk)
            per_record[i] = entry
        if progress is not None:
            progress.update(sum(len(sequences[i][0]) for i in batch))
    shard = {key: torch.cat([entry[key] for entry in per_record]) for key in per_record[0]}
    shard["record_lengths"] = torch.tensor([answer for _, answer in sequences], dtype=torch.int32)
    return shard


# --------------------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------------------


@dataclass
class HiddenStateCache:
    """All cached positions of a data file, in record order (see the module docstring for the layout).

    ``record_offsets[r] : record_offsets[r + 1]`` are the rows of record ``r``.
    """

    hidden: torch.Tensor  # [N, hidden] float16
    tokens: torch.Tensor  # [N] int64
    teacher_ids: torch.Tensor | None  # [N, k] int32
    teacher_logprobs: torch.Tensor | None  # [N, k] float16
    record_ids: list[str]
    record_offsets: torch.Tensor  # [R + 1] int64
    record_modes: list[str] = field(default_factory=list)  # who wrote each answer: "greedy", "sample", "text"
    info: dict = field(default_factory=dict)

    @property
    def num_positions(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def teacher_topk(self) -> int:
        return 0 if self.teacher_ids is None else int(self.teacher_ids.shape[1])

    def remaining(self) -> torch.Tensor:
        """For every row, how many answer tokens of its record come after the one it predicts."""
        lengths = self.record_offsets[1:] - self.record_offsets[:-1]
        ends = torch.repeat_interleave(self.record_offsets[1:], lengths)
        return ends - torch.arange(self.num_positions) - 1

    def first_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The index of the first row of each of ``rows``' records (where a drafter's window of states starts)."""
        return self.record_offsets[torch.searchsorted(self.record_offsets, rows, right=True) - 1]

    def position_modes(self, mode: str) -> torch.Tensor:
        """``[N]`` bool: which positions belong to records of ``mode``."""
        lengths = self.record_offsets[1:] - self.record_offsets[:-1]
        return torch.repeat_interleave(torch.tensor([m == mode for m in self.record_modes], dtype=torch.bool), lengths)

    def positions(self, record_ids: set[str] | None = None, exclude: set[str] | None = None) -> torch.Tensor:
        """Rows usable for head training (at least one token ahead) of the selected records, ascending."""
        keep = torch.tensor(
            [(record_ids is None or r in record_ids) and (exclude is None or r not in exclude) for r in self.record_ids],
            dtype=torch.bool,
        )
        lengths = self.record_offsets[1:] - self.record_offsets[:-1]
        row_keep = torch.repeat_interleave(keep, lengths)
        return torch.nonzero(row_keep & (self.remaining() >= 1)).flatten()

    def base_agreement(self) -> float | None:
        """Share of answer tokens that are the base's own top-1 at their position (about 1 for greedy data
        the base generated itself; much lower means the data came from another model or another dtype)."""
        if self.teacher_ids is None or self.num_positions == 0:
            return None
        return float((self.teacher_ids[:, 0].long() == self.tokens).float().mean())


def cache_key(fingerprint: dict, teacher_topk: int, max_seq_len: int | None,
              state_source: str = "lm_head_input") -> str:
    settings = {"format": CACHE_FORMAT_VERSION, "base": fingerprint, "teacher_topk": teacher_topk,
                "max_seq_len": max_seq_len}
    if state_source != "lm_head_input":  # the default stays out, so caches written before the option keep their key
        settings["state_source"] = state_source
    payload = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_token_ids(records: Sequence[Record], base: nn.Module) -> None:
    """Refuse records holding a token id ``base`` has no embedding for (data written with another tokenizer)
    before the base runs over them: one line naming the record, not an IndexError from inside the embedding."""
    vocab = base.get_input_embeddings().num_embeddings
    for record in records:
        ids = (*record.input_ids, *record.output_ids)
        low, high = min(ids, default=0), max(ids, default=0)
        if low < 0 or high >= vocab:
            raise UserError(f"record {record.id!r} holds token id {low if low < 0 else high}, outside the base's "
                            f"vocabulary [0, {vocab}): was the data written with another tokenizer?")


def build_hidden_cache(
    base: nn.Module,
    data: str | os.PathLike | Sequence[Record],
    cache_dir: str | os.PathLike,
    *,
    teacher_topk: int = 32,
    max_seq_len: int | None = None,
    batch_tokens: int = 4096,
    shard_tokens: int = 16384,
    accelerator=None,
    show_progress: bool = True,
    state_source: str = "lm_head_input",
) -> HiddenStateCache:
    """Run the frozen ``base`` once over every record (shards already on disk are skipped) and load the cache.

    Args:
        base: the base causal LM (any device; it is run in eval mode without gradients).
        data: a distillation JSONL path, or records.
        cache_dir: where shards go; a sub-folder per base and settings keeps different caches apart, so one
            folder can be shared by several training runs (e.g. Medusa and Cerberus heads on the same data). The
            states distilling kept there for a record (`answer_states`) are taken instead of running the base.
        teacher_topk: how many of the base's top next-token log-probabilities to keep per position (for
            distillation; 0 keeps none).
        max_seq_len: cut sequences to this many tokens (default: the base's ``max_position_embeddings``).
        batch_tokens: padded tokens per base forward pass.
        shard_tokens: sequence tokens per shard on average (the unit of resuming; see `plan_shards`).
        accelerator: an ``accelerate.Accelerator``; with several processes each computes its share of the
            missing shards.
        state_source: which of the base's last states is kept as ``hidden`` (`STATE_SOURCES`; the
            drafter's ``state_source``): the lm_head's input, or the last decoder layer's output before the
            final norm. The teacher's log-probabilities always come from the lm_head's input.
    """
    records = read_records(data) if isinstance(data, (str, os.PathLike)) else list(data)
    check_token_ids(records, base)
    if max_seq_len is None:
        max_seq_len = getattr(base.config, "max_position_embeddings", None)
    vocab = base.get_output_embeddings().weight.shape[0]
    teacher_topk = min(int(teacher_topk), vocab)
    fingerprint = base_fingerprint(base)
    key = cache_key(fingerprint, teacher_topk, max_seq_len, state_source)
    folder = Path(cache_dir) / key
    plans = plan_shards(records, shard_tokens, max_seq_len)
    missing = [plan for plan in plans if not (folder / plan.filename).is_file()]
    if accelerator is not None:  # every process lists the missing shards before any is written: they share one list
        accelerator.wait_for_everyone()
    is_main = accelerator is None or accelerator.is_main_process
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        manifest = folder / MANIFEST_NAME
        if is_main and not manifest.is_file():
            layout = {"format": CACHE_FORMAT_VERSION, "base": fingerprint, "teacher_topk": teacher_topk,
                      "max_seq_len": max_seq_len, "state_source": state_source,
                      "layout": "see cerberus_hf/training/hidden_cache.py"}
            write_atomically(manifest, json.dumps(layout, indent=2, sort_keys=True) + "\n")
        if is_main:
            _check_room(base, records, missing, folder, teacher_topk, len(plans))
        if accelerator is not None and accelerator.num_processes > 1:
            missing = missing[accelerator.process_index :: accelerator.num_processes]
            logger.info("hidden-state cache: process %d computes %d shards", accelerator.process_index, len(missing))
        kept = states_folder(cache_dir, fingerprint)
        _fill_shards(base, records, missing, folder, teacher_topk=teacher_topk, max_seq_len=max_seq_len,
                     batch_tokens=batch_tokens, show_progress=show_progress and is_main, state_source=state_source,
                     kept=kept if kept.is_dir() else None)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    cache = load_hidden_cache(folder, plans, records)
    cache.info.update({"key": key, "folder": str(folder), "base": fingerprint, "teacher_topk": teacher_topk,
                       "max_seq_len": max_seq_len, "state_source": state_source, "shards": len(plans),
                       "shards_computed": len(missing),
                       "data_digest": hashlib.sha256("".join(p.digest for p in plans).encode()).hexdigest()})
    return cache


def _check_room(base, records, missing, folder: Path, teacher_topk: int, num_plans: int) -> None:
    """Say what the missing shards will cost on disk before computing them, and refuse when it does not fit."""
    positions = sum(len(records[i].output_ids) for plan in missing for i in plan.records)
    need = positions * cache_bytes_per_token(base.get_output_embeddings().weight.shape[1], teacher_topk)
    free = shutil.disk_usage(folder).free
    logger.info("hidden-state cache %s: %d of %d shards to compute, %d sequence tokens, %d answer positions, "
                "%.2f GB on disk (%.1f GB free); the time estimate follows the first shard",
                folder, len(missing), num_plans, sum(plan.tokens for plan in missing), positions, need / 1e9, free / 1e9)
    if need > free:
        raise RuntimeError(f"the hidden-state cache needs {need / 1e9:.2f} GB in {folder} but {free / 1e9:.2f} GB are "
                           "free; pass another --cache-dir")


def _fill_shards(base, records, plans, folder: Path, *, teacher_topk, max_seq_len, batch_tokens, show_progress,
                 state_source, kept: Path | None):
    if not plans:
        return
    was_training = base.training
    base.eval()
    model = packed_model(base)
    sample = torch.tensor([list(record_sequence(records[plans[0].records[0]], max_seq_len)[0])])
    use_decoder = decoder_output_is_lm_head_input(model, sample.to(base.get_output_embeddings().weight.device))
    if not use_decoder:
        logger.info("%s: the backbone output is not the lm_head input; caching through the full model",
                    type(base).__name__)
    pad = base.config.pad_token_id if getattr(base.config, "pad_token_id", None) is not None else 0
    total = sum(plan.tokens for plan in plans)
    progress = tqdm(total=total, unit="tok", desc="caching hidden states", disable=not show_progress,
                    dynamic_ncols=True)
    started = time.perf_counter()
    try:
        for number, plan in enumerate(plans):
            shard = _compute_shard(model, records, plan, teacher_topk=teacher_topk, max_seq_len=max_seq_len,
                                   batch_tokens=batch_tokens, use_decoder=use_decoder, pad_token_id=int(pad),
                                   progress=progress, state_source=state_source, kept=kept)
            metadata = {"format": str(CACHE_FORMAT_VERSION), "digest": plan.digest,
                        "record_ids": json.dumps([records[i].id for i in plan.records])}
            save_safetensors_atomically({k: v.contiguous() for k, v in shard.items()}, folder / plan.filename,
                                        metadata=metadata)
            if number == 0 and len(plans) > 1:
                rate = plan.tokens / (time.perf_counter() - started)
                logger.info("hidden-state cache: %.0f sequence tokens/s; the other %d shards take about %.0f min",
                            rate, len(plans) - 1, (total - plan.tokens) / rate / 60)
    finally:
        progress.close()
        base.train(was_training)


def load_hidden_cache(folder: str | os.PathLike, plans: list[ShardPlan], records: Sequence[Record]) -> HiddenStateCache:
    """Concatenate the shards of ``plans`` (all must exist) into one in-memory cache."""
    folder = Path(folder)
    parts: dict[str, list[torch.Tensor]] = {}
    record_ids: list[str] = []
    record_modes: list[str] = []
    for plan in plans:
        path = folder / plan.filename
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            if metadata.get("digest") != plan.digest:
                raise OSError(f"{path} does not hold the records it is named for; delete it and run again.")
            for name in f.keys():
                parts.setdefault(name, []).append(f.get_tensor(name))
        record_ids.extend(records[i].id for i in plan.records)
        record_modes.extend(records[i].mode for i in plan.records)
    lengths = torch.cat(parts.pop("record_lengths")).long()
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    teacher_ids = torch.cat(parts["teacher_ids"]) if "teacher_ids" in parts else None
    teacher_logprobs = torch.cat(parts["teacher_logprobs"]) if "teacher_logprobs" in parts else None
    return HiddenStateCache(
        hidden=torch.cat(parts["hidden"]),
        tokens=torch.cat(parts["tokens"]).long(),
        teacher_ids=teacher_ids,
        teacher_logprobs=teacher_logprobs,
        record_ids=record_ids,
        record_offsets=offsets,
        record_modes=record_modes,
    )


def cache_bytes_per_token(hidden_size: int, teacher_topk: int) -> int:
    """Disk and memory use of one cached position."""
    return 2 * hidden_size + 4 + teacher_topk * (4 + 2)


def default_cache_dir() -> Path:
    """Where hidden-state caches go unless told: ``$CERBERUS_HF_CACHE/hidden_states``."""
    from ..real_models import cache_dir

    return cache_dir() / "hidden_states"


__all__ = [
    "HiddenStateCache",
    "build_hidden_cache",
    "cache_bytes_per_token",
    "decoder_output_is_lm_head_input",
    "id_bucket",
    "base_states",
    "load_hidden_cache",
    "split_record_ids",
]
