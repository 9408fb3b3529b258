"""Batched speculative decoding: every row of a left-padded batch drafted, then verified in one forward.

`generate()` prefills the padded batch as it would for plain decoding and hands over here. Each step every live row
feeds its newest token and its own draft (a chain or a tree, of its own size); the rows are padded to the widest and
verified together, under one 4D mask that gives each row its own past and its own tree. Each row is then walked
exactly as the single-sequence loop walks it (`loop.Acceptance`), so it advances by its own accepted length and its
tokens are those plain decoding picks at each of its prefixes.

The base's KV cache stays one ``[batch, heads, slots, dim]`` tensor per layer. A step appends the widest row's fed
positions; each row's accepted branch is moved to the front of its fed slots and the cache is cut after the longest
branch, so a row that kept fewer leaves empty slots, which the mask hides from then on, as it hides left padding.
Nothing is recomputed, and positions are each row's own token count. A row that finishes leaves the batch (its cache
rows are dropped); the others go on.

Each row keeps its own drafter state and proposer (tree, gate, prompt lookup); each depth's guesses for
every row are drafted in one call of the drafter (`proposer.propose_together`), and the verification
forward is shared.

What it needs (`paths.batch_refusal`): attention that takes a 4D mask (not flash attention), no sliding-window layers
(a window counts slots, and a row's empty slots would count), a drafter that guesses depth by depth (not Kangaroo,
whose chain runs through the base's own cache, nor its neural rescorer), and no strict verification. Elsewhere
`CerberusForCausalLM.generate` decodes the rows one at a time, as before.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Callable

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..compat import prefill
from ..blocks.batching import pad_batch, pad_token_id
from .proposer import Proposer, Draft, propose_together
from .loop import Acceptance, check_supported
from ..blocks.profiling import StepProfiler, phase_timer
from ..blocks.settings import DecodingSettings
from .static_cache import verification_for
from ..blocks.tree import TreeSpec
from .verification import RowsVerification


def shared_budget(settings: DecodingSettings, rows: int) -> DecodingSettings:
    """The stored tree sized for ``rows`` rows verified together. Calibration sizes a tree for one row, weighing its
    nodes against what verifying them costs at batch size 1; a batch feeds every row's tree to the same forward, whose
    cost grows with all of them. So the rows share the calibrated tree's width: each drafts about ``(nodes + 1) / rows
    - 1`` nodes (at least one), as a dynamic tree that small, or the top-1 chain of a static tree."""
    if rows <= 1 or settings.rescoring is not None:
        return settings
    if settings.dynamic is not None:
        nodes = max(1, round((settings.dynamic.nodes + 1) / rows) - 1)
        tree = settings.dynamic
        return replace(settings, dynamic=replace(tree, nodes=nodes, depth=min(tree.depth, nodes),
                                                 top_k=min(tree.top_k, nodes)))
    if settings.tree is None:  # the chain of every head (the proposer's default)
        return settings
    nodes = max(1, round((len(settings.tree) + 1) / rows) - 1)
    return replace(settings, tree=TreeSpec.chain(min(settings.tree.depth, nodes)))


def _row_view(captured: dict, index: int, length: int | None = None) -> dict:
    """What the base's latest forward computed for batch row ``index`` (``[1, positions, ...]``), at most its last
    ``length`` positions (the prefill's left padding is not the row's; a state the prefill computed at its last
    position only stays as it is)."""
    return {name: value[index: index + 1, -length:] if length is not None else value[index: index + 1]
            for name, value in captured.items() if isinstance(value, torch.Tensor)}


def _with_max_length(config: GenerationConfig, max_length: int) -> GenerationConfig:
    config = copy.copy(config)
    config.max_length = max_length
    return config


def batched_speculative_generate(
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
    """Greedy or sampled decoding of a left-padded batch (``input_ids`` ``[B, width]`` with generate()'s
    ``attention_mask``), every row verified in one forward a step; arguments and result as `loop.speculative_generate`
    (a streamer, scores and logits take one sequence and are refused by `CerberusForCausalLM.generate`). Rows equal
    what plain batched `generate()` returns for them: left padding kept, finished rows padded with the pad id."""
    check_supported(model, generation_config, model_kwargs)
    batch, width = input_ids.shape
    mask = model_kwargs.get("attention_mask")
    pads = (width - mask.sum(-1)).tolist() if mask is not None else [0] * batch
    # each row's proposer counts its length limit without the row's padding (drafts never run past it)
    proposers = [make_proposer(_with_max_length(generation_config, generation_config.max_length - p)) for p in pads]
    cache = verification_for(model, compile_base or model, generation_config, model_kwargs,
                             no_static).cache  # a dynamic cache (rows are selected from it)
    verification = RowsVerification(cache, mask.bool() if mask is not None else torch.ones_like(input_ids).bool())
    acceptance = Acceptance(logits_processor, stopping_criteria, generation_config,
                            settings.typical if settings is not None else None, None, proposers[0].gate, batch=batch)
    pad = pad_token_id(generation_config) or 0
    phase = phase_timer(profiler)
    # stopping criteria and logits processors see a row with its padding, as in batched generate(); drafting without
    sequences = [input_ids[b: b + 1] for b in range(batch)]
    live = list(range(batch))  # the rows still decoding, in the cache's batch order
    drafts: list[Draft | None] = [None] * batch

    with proposers[0].capture(model) as captured:
        for proposer in proposers:
            proposer.start(model, cache)
        with phase("prefill"):
            outputs = prefill(model, input_ids, generation_config, model_kwargs)
        # what the forward computed, kept apart: drafting a row may run the base's lm_head, whose hook records anew
        step_captured = dict(captured)
        step_logits = outputs.logits[:, -1:]
        after_prefill = True
        while True:
            with phase("accept"):
                walked = acceptance.walk_rows(step_logits, [drafts[row] for row in live], [sequences[row] for row in live],
                                              live)
                for row, walk in zip(live, walked):
                    sequences[row] = walk.input_ids
                    proposers[row].record_step(len(walk.accepted))
            with phase("cache"):
                if not after_prefill:
                    verification.keep([walk.kept for walk in walked])
            if all(walk.finished for walk in walked):
                break
            with phase("draft"):
                prompts = [width - row_pad for row_pad in pads] if after_prefill else None
                _draft_rows(proposers, drafts, sequences, pads, live, walked, step_captured, step_logits, prompts)
                after_prefill = False
            if any(walk.finished for walk in walked):
                with phase("cache"):
                    staying = [i for i, walk in enumerate(walked) if not walk.finished]
                    verification.drop(staying)
                    live = [live[i] for i in staying]
            with phase("verify"):
                rows = [sequences[row] for row in live]
                outputs = verification.forward(model, rows, [drafts[row] for row in live],
                                               [r.shape[1] - pads[row] for r, row in zip(rows, live)], pad)
            step_captured = dict(captured)
            step_logits = outputs.logits

    # padded as batched generate() pads: the prompts as given, each row's new tokens, the pad id after a row's end
    out = pad_batch(input_ids, [input_ids[b: b + 1, pads[b]:] for b in range(batch)],
                    [sequence[:, pads[b]:] for b, sequence in enumerate(sequences)], generation_config)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=out)
    return out


def _draft_rows(proposers: list[Proposer], drafts: list[Draft | None], sequences: list[torch.LongTensor],
                pads: list[int], live: list[int], walked: list, captured: dict, logits: torch.Tensor,
                prompts: list[int] | None) -> None:
    """The next draft of every live row that goes on (``drafts[row]``), each depth's guesses for all of them in one
    call of the drafter: each row's proposer first observes what the last forward computed for it (``captured``,
    ``logits``: the cache's batch order, ``live``); after the prefill, over its ``prompts[row]`` unpadded positions."""
    drafting = [i for i, walk in enumerate(walked) if not walk.finished]
    for i in drafting:
        proposers[live[i]].observe(_row_view(captured, i, prompts[live[i]]) if prompts is not None else
                                   _row_view(captured, i), None if prompts is not None else walked[i].kept)
    proposed = propose_together(
        [proposers[live[i]] for i in drafting], [sequences[live[i]][:, pads[live[i]]:] for i in drafting],
        [captured["hidden"][i: i + 1, walked[i].last] for i in drafting],
        [logits[i: i + 1, walked[i].last] for i in drafting], [walked[i].last_token for i in drafting],
        [walked[i].gate_decision() for i in drafting])
    for i, draft in zip(drafting, proposed):
        drafts[live[i]] = draft
