"""The draft-verify decoding loop, run by `generate()` as its `custom_generate` callable.

`generate()` prepares everything as it would for plain decoding (generation config, logits processors,
stopping criteria, cache, prefill inputs) and hands over here. Each step feeds the base model the last
token plus a draft (a chain, or a tree under tree attention) in one forward pass, then walks the outputs
from the root exactly as plain decoding would: process the logits with the prefix so far, pick a token
(argmax, or a sample from the processed distribution), append it, stop if a stopping criterion fires,
and go on only while the picked token is one of the current node's drafted children. Every emitted
token is therefore chosen from the same distribution plain decoding would use at that prefix, so
greedy output is identical and sampled output is distributed as the base's. The cache is then cut back
to the accepted branch.

Greedy decoding with nothing to do on the host per token (no scores, streamer, or stopping criterion other than
generate()'s length and end-of-sequence checks, and only logits processors that work row by row on the device,
`ROW_PROCESSORS`) takes the same decisions for the whole tree at once on the device and reads the result once a step
(`_greedy_walk`); a static tree's tokens are drafted on the device too (`drafting.static_draft`), so such a step waits
on the host once, which on a GPU is what it costs.
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple

import torch
from torch import nn
from transformers import DynamicCache, GenerationConfig, StaticCache
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..compat import cache_argument, handed_cache, prefill
from ..blocks.acceptance import pick_token
from ..blocks.gate import EntropyGate
from .proposer import Proposer, Draft
from ..blocks.profiling import StepProfiler, phase_timer
from ..blocks.settings import DecodingSettings
from ..blocks.strict import strict_view
from .static_cache import verification_for
from ..blocks.transfer import to_device


def check_supported(model: nn.Module, generation_config: GenerationConfig, model_kwargs: dict) -> None:
    """Refuse what a draft-verify loop cannot do: no KV cache, a cache it cannot roll back, per-layer outputs."""
    if not generation_config.use_cache:
        raise ValueError("Speculative decoding needs the KV cache: use_cache=False is not supported.")
    cache = handed_cache(model_kwargs)
    if type(cache) not in (DynamicCache, StaticCache):
        raise ValueError(
            f"Speculative decoding needs a cache it can roll back (dynamic or static); got {type(cache).__name__}. "
            "Quantized, offloaded and sliding-window caches are not supported: drop `cache_implementation` / "
            "`cache` / `past_key_values` from the call."
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError(
            "output_attentions / output_hidden_states are not supported with draft heads: a verification "
            "step computes several positions at once. Use the base model for them."
        )


def host_stopping(stopping_criteria: StoppingCriteriaList) -> tuple[int | None, set[int]] | None:
    """(max_length, end-of-sequence ids) when every criterion is generate()'s own length or end-of-sequence check,
    which the loop can then apply on the host to tokens it has read anyway; None for any other criterion (a stop
    string, a time limit, a user's), which is called on every emitted token instead."""
    max_length, eos = None, set()
    for criterion in stopping_criteria:
        if type(criterion) is MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif type(criterion) is EosTokenCriteria:
            eos.update(criterion.eos_token_id.flatten().tolist())
        else:
            return None
    return max_length, eos


# transformers' logits processors whose output row depends only on that row's input_ids and scores, computed on the
# device with nothing kept from one call to the next: greedy decoding applies them to every fed position of a step at
# once (`_processed_scores`) and still reads the host once a step. Any other processor (a user's, no_repeat_ngram_size's
# n-gram search on the host) is called token by token along the accepted path.
ROW_PROCESSORS = (
    MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor,
    NoBadWordsLogitsProcessor, SequenceBiasLogitsProcessor, SuppressTokensLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor, ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
)


def row_view(processors: LogitsProcessorList, row: int) -> LogitsProcessorList:
    """``processors`` as they apply to row ``row`` of the call's batch walked alone, and to any number of rows that
    continue it (the nodes of one depth of its tree). Since transformers 5.24 the repetition penalty holds each row's
    count of left-padding tokens (``prompt_ignore_length``, a tensor with one entry per row of the call); the row's own
    count, read once a call as a number, serves every shape of rows."""
    out = LogitsProcessorList()
    for processor in processors:
        ignore = getattr(processor, "prompt_ignore_length", None)
        if type(processor) is RepetitionPenaltyLogitsProcessor and isinstance(ignore, torch.Tensor) and ignore.dim():
            processor = copy.copy(processor)
            processor.prompt_ignore_length = int(ignore[row])
        out.append(processor)
    return out


def _greedy_walk(step_logits: torch.Tensor, draft: Draft | None, gate: EntropyGate | None = None,
                 input_ids: torch.LongTensor | None = None, processors: LogitsProcessorList | None = None
                 ) -> tuple[list[int], list[int], list[bool] | None]:
    """Greedy acceptance of a whole tree with one read from the device: (emitted tokens, accepted nodes, and the
    ``gate``'s decision at every fed position when it reads only the base's logits, so that the next step's decision
    costs no read of its own).

    The base's choice at every fed position is its argmax (in float32, as `pick_token` takes it) after ``processors``
    (`ROW_PROCESSORS` only; ``input_ids``: the sequence so far); a node is accepted when its token is its parent
    position's choice, it is the first such child of its parent (as the walk takes the first match), and so is every
    ancestor. The emitted tokens are the root's choice and each accepted node's: exactly what the token-by-token walk
    emits, before stopping criteria."""
    return _walk_read(_walk_parts(step_logits[0], draft, gate, input_ids, processors).tolist(), draft, gate)


def _processed_scores(logits: torch.Tensor, draft: Draft | None, input_ids: torch.LongTensor,
                      processors: LogitsProcessorList) -> torch.Tensor:
    """Every fed position's scores (``[fed, V]``, float32) processed as the token-by-token walk processes them on
    reaching it: after ``input_ids`` and the drafted tokens on the path to that node. The nodes of one depth share a
    length, so each depth is one processor call over its nodes' rows (``processors``: as they apply to this one
    sequence, `row_view`)."""
    scores = logits.float()
    processed = torch.empty_like(scores)
    processed[:1] = processors(input_ids.to(scores.device), scores[:1].clone())
    if draft is not None:
        tokens = draft.tokens.to(scores.device)
        for (nodes, _, _), paths in zip(draft.tree.on(scores.device).levels, draft.tree.level_paths_on(scores.device)):
            rows = torch.cat([input_ids.to(scores.device).expand(paths.shape[0], -1), tokens[paths]], dim=1)
            processed[nodes + 1] = processors(rows, scores[nodes + 1])
    return processed


def _walk_parts(logits: torch.Tensor, draft: Draft | None, gate: EntropyGate | None,
                input_ids: torch.LongTensor | None = None, processors: LogitsProcessorList | None = None
                ) -> torch.Tensor:
    """What `_greedy_walk` reads of one sequence's fed positions (``logits`` ``[fed, V]``), in one device tensor: the
    choice at every position, whether each node is accepted, the gate's decision at every position (on the base's
    logits as they came, as the gate reads them when it decides)."""
    scores = logits.float() if processors is None else _processed_scores(logits, draft, input_ids, processors)
    choices = scores.argmax(dim=-1)  # the root's, then each node's (no node without a draft)
    parts = [choices]
    if draft is not None:
        tree = draft.tree.on(choices.device)
        match = draft.tokens.to(choices.device) == choices[tree.parent_positions]
        match &= ~(tree.earlier_siblings & match[None, :]).any(dim=-1)
        parts.append((~(tree.node_ancestors & ~match[None, :]).any(dim=-1)).long())
    if gate is not None:
        parts.append(gate.draft_rows(logits).long())
    return torch.cat(parts)


def _walk_read(packed: list[int], draft: Draft | None, gate: EntropyGate | None
               ) -> tuple[list[int], list[int], list[bool] | None]:
    """`_greedy_walk`'s result from `_walk_parts` read to the host."""
    fed = 1 + (len(draft.tokens) if draft is not None else 0)
    choices, flags, gated = packed[:fed], packed[fed: 2 * fed - 1], packed[2 * fed - 1:]
    nodes = [node for node, ok in enumerate(flags) if ok]  # an accepted chain, parents listed before children
    return [choices[0]] + [choices[node + 1] for node in nodes], nodes, [bool(d) for d in gated] if gate else None


class Walked(NamedTuple):
    """What walking one row's verification outputs decided (`Acceptance.walk`)."""

    input_ids: torch.LongTensor  # the row with the tokens it emitted
    accepted: list[int]  # the draft nodes accepted, root's child first
    finished: bool  # a stopping criterion fired
    last_token: int | None  # the newest emitted token (None where the host has not read it)
    scores: torch.Tensor | None  # the last position's processed scores (None on the one-read path)
    gated: list[bool] | None  # the gate's decision at every fed position (None: the gate decides itself)

    @property
    def kept(self) -> list[int]:
        """The fed positions the cache keeps: the root and the accepted nodes."""
        return [0] + [node + 1 for node in self.accepted]

    @property
    def last(self) -> int:
        """The fed position that predicted the newest token."""
        return self.accepted[-1] + 1 if self.accepted else 0

    def gate_decision(self) -> bool | None:
        """The gate's decision for the next step, where this walk made it."""
        return self.gated[self.last] if self.gated is not None else None


class Acceptance:
    """Turns one verification forward's logits into emitted tokens, walking the draft tree from the root (input
    position 0, the last token): each emitted token is picked from the base's prediction at the current node, then
    matched against that node's children. The call's settings are fixed here once; `walk` serves every step (and,
    in a batch, every row).

    Greedy decoding with nothing to do on the host per token (no scores, streamer or stopping criterion beyond length
    and end of sequence, and logits processors from `ROW_PROCESSORS` only) accepts the whole tree on the device and
    reads it once a step (`_greedy_walk`); a gate on the base's own logits then decides for every fed position in the
    same read."""

    def __init__(self, logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
                 generation_config: GenerationConfig, typical, streamer, gate: EntropyGate, batch: int = 1):
        self.stopping_criteria = stopping_criteria
        # the processors as they apply to each row of the call's batch (`row_view`), built once a call
        self.row_processors = [row_view(logits_processor, row) for row in range(batch)]
        self.do_sample, self.typical, self.streamer = generation_config.do_sample, typical, streamer
        want_dict = generation_config.return_dict_in_generate
        self.scores = () if (want_dict and generation_config.output_scores) else None
        self.raw_logits = () if (want_dict and generation_config.output_logits) else None
        self.host_stopping = host_stopping(stopping_criteria)
        self.one_read = (not self.do_sample and typical is None
                         and all(type(p) in ROW_PROCESSORS for p in logits_processor)
                         and self.scores is None and self.raw_logits is None and streamer is None
                         and self.host_stopping is not None)
        # a gate on the base's own logits decides for every fed position in the same read (None: it decides itself)
        self.base_gate = gate if (self.one_read and gate.signal != "head_entropy"
                                  and not (gate.always_drafts or gate.never_drafts)) else None

    def walk(self, step_logits: torch.Tensor, draft: Draft | None, input_ids: torch.LongTensor, row: int = 0
             ) -> Walked:
        """What one sequence ``[1, ...]`` emits and keeps of a verification's outputs. ``row``: the sequence's row in
        the call's batch."""
        processors = self.row_processors[row]
        if self.one_read:
            return self._emit(*_greedy_walk(step_logits, draft, self.base_gate, input_ids,
                                            processors if len(processors) else None), input_ids)
        draft_tokens = draft.tokens.tolist() if draft is not None else []
        accepted, node, last_token = [], -1, None
        while True:
            position = node + 1
            next_logits = step_logits[:, position].to(copy=True, dtype=torch.float32, device=input_ids.device)
            next_scores = processors(input_ids, next_logits)
            children = draft.tree.children[node + 1] if draft is not None else []
            next_token = pick_token(next_scores, self.do_sample, [draft_tokens[c] for c in children], self.typical)
            input_ids = torch.cat([input_ids, next_token], dim=-1)
            if self.scores is not None:
                self.scores += (next_scores,)
            if self.raw_logits is not None:
                self.raw_logits += (next_logits,)
            if self.streamer is not None:
                self.streamer.put(next_token[0].cpu())
            finished = bool(self.stopping_criteria(input_ids, next_scores).any())
            if finished or draft is None:
                break
            token = last_token = next_token.item()
            node = next((c for c in children if draft_tokens[c] == token), None)
            if node is None:
                break
            accepted.append(node)
        return Walked(input_ids, accepted, finished, last_token, next_scores, None)

    def walk_rows(self, step_logits: torch.Tensor, drafts: list[Draft | None], rows: list[torch.LongTensor],
                  batch_rows: list[int]) -> list[Walked]:
        """`walk` for every row of a batched forward (``step_logits`` ``[rows, F, V]``, row ``i`` fed its newest token
        and ``drafts[i]``; ``batch_rows[i]``: its row in the call's batch, for the processors, `row_view`): on the
        one-read path every row's decisions are read to the host together, once."""
        fed = [1 + (len(d.tokens) if d is not None else 0) for d in drafts]
        if not self.one_read:
            return [self.walk(step_logits[i: i + 1, :n], draft, row, b)
                    for i, (n, draft, row, b) in enumerate(zip(fed, drafts, rows, batch_rows))]
        views = [self.row_processors[b] for b in batch_rows]
        parts = [_walk_parts(step_logits[i, :n], draft, self.base_gate, row, view if len(view) else None)
                 for i, (n, draft, row, view) in enumerate(zip(fed, drafts, rows, views))]
        packed = torch.cat(parts).tolist()
        out, start = [], 0
        for part, draft, row in zip(parts, drafts, rows):
            out.append(self._emit(*_walk_read(packed[start: start + part.shape[0]], draft, self.base_gate), row))
            start += part.shape[0]
        return out

    def _emit(self, emitted: list[int], accepted: list[int], gated: list[bool] | None, input_ids: torch.LongTensor
              ) -> Walked:
        """`walk`'s result on the one-read path: the emitted tokens cut at generate()'s length or end-of-sequence
        stop, appended to ``input_ids``."""
        max_length, eos = self.host_stopping
        finished = False
        for count, token in enumerate(emitted, start=1):
            if token in eos or (max_length is not None and input_ids.shape[1] + count >= max_length):
                emitted, accepted, finished = emitted[:count], accepted[: count - 1], True
                break
        input_ids = torch.cat([input_ids, to_device([emitted], input_ids.device, input_ids.dtype)], dim=-1)
        return Walked(input_ids, accepted, finished, emitted[-1], None, gated)


def speculative_generate(
    model: nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    make_proposer: Callable[[GenerationConfig], Proposer] | None = None,
    settings: DecodingSettings | None = None,
    profiler: StepProfiler | None = None,
    compile_base: nn.Module | None = None,
    no_static: str | None = None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """Greedy or sampled decoding of one sequence with drafts from a `Proposer`.

    Signature and return value follow transformers' `_sample`; ``streamer`` and ``make_proposer`` (called with the
    prepared generation config, whose ``max_length`` is final only here) are bound by `CerberusForCausalLM.generate`,
    since generate() does not forward a streamer to a custom decoding callable. Of the call's ``settings``
    (`settings.DecodingSettings`), the loop reads ``typical`` (Medusa's lossy typical acceptance, opt-in) and
    ``strict_rows`` (strict verification, `strict`: at most that many positions per forward, the root included, each
    position's attention computed as a one-token forward computes it); the proposer reads the rest. ``profiler``
    collects wall time per phase. ``compile_base``: the base ``model`` is a per-call view of, whose compiled forward
    serves a static cache (`static_cache`; default ``model``); ``no_static``: why a static cache the call asked for
    cannot serve (`paths.static_refusal`; None: it can).
    """
    strict_rows = settings.strict_rows if settings is not None else None
    if input_ids.shape[0] != 1:
        raise ValueError("This loop decodes one sequence; CerberusForCausalLM.generate batches rows (`batched`).")
    check_supported(model, generation_config, model_kwargs)
    proposer = make_proposer(generation_config)
    verification = verification_for(model, compile_base or model, generation_config, model_kwargs, no_static)
    cache = verification.cache
    acceptance = Acceptance(logits_processor, stopping_criteria, generation_config,
                            settings.typical if settings is not None else None, streamer, proposer.gate)
    phase = phase_timer(profiler)
    # drafts are verified through a view of the base that attends strictly (the base itself stays as it is)
    strict_model = strict_view(model) if strict_rows is not None else model

    with proposer.capture(model) as captured:
        proposer.start(model, cache)
        with phase("prefill"):
            outputs = prefill(model, input_ids, generation_config, model_kwargs)
        getattr(cache, "activate_past_recording", lambda: None)()  # sliding-window layers must be able to roll back
        step_logits = outputs.logits[:, -1:]
        step_hidden = captured["hidden"][:, -1:]
        draft: Draft | None = None
        after_prefill = True  # the outputs being read are the prefill's: every position of it is kept
        while True:
            with phase("accept"):
                walked = acceptance.walk(step_logits, draft, input_ids)
            input_ids, kept, last = walked.input_ids, walked.kept, walked.last
            proposer.record_step(len(walked.accepted))
            if draft is not None:
                with phase("cache"):
                    verification.keep(kept)
            if walked.finished:
                break
            with phase("draft"):
                proposer.observe(captured, None if after_prefill else kept)
                after_prefill = False
                draft = proposer.propose(
                    input_ids, last_hidden_state=step_hidden[:, last], next_token_logits=step_logits[:, last],
                    last_token=walked.last_token, gate_decision=walked.gate_decision(),
                )
                draft = verification.fit(model, proposer, draft, input_ids.shape[1] - 1, strict_rows)
            with phase("verify"), proposer.verifying(
                    strict_model if draft is not None else model, input_ids, draft) as verifier:
                outputs = verification.forward(verifier, input_ids, draft, captured)
            step_logits = outputs.logits
            step_hidden = captured["hidden"]

    if streamer is not None:
        streamer.end()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=input_ids, scores=acceptance.scores, logits=acceptance.raw_logits, **cache_argument(cache)
        )
    return input_ids
