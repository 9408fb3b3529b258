"""What the drafter guesses at each position of the calibration sequences, against what the base says there:
`PositionRecord` (tree drafters: ranks of the true tokens, gate signals) and `ChainPosition` (chain drafters)."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ..compat import cache_argument
from ..decoding.drafting import StepDrafts, dynamic_selection
from ..blocks.gate import GATE_SIGNALS, gate_signal
from ..blocks.rescoring import Rescoring, lattice_rescore, repeats_a_token
from ..compat import tree_attention_ok
from ..blocks.tree import DynamicTree


@dataclass
class PositionRecord:
    """What calibration keeps of one position: true-token ranks per head (-1 beyond ``top_k``), gate signals,
    where the true path's nodes come in a dynamic tree's order of choice (-1: not drafted), the same per pair
    of rescoring weights (n-gram, LM) and, with how many nodes it drafted, per per-node budget (top_p,
    min_ratio), whether the top-1 block repeats a token (the heads' own; per pair, rescored), and which calibration
    sequence it belongs to (a sequence's records are consecutive positions, in order: `fit.walk` decodes them)."""

    ranks: list[int]
    signals: dict[str, float]
    dynamic_order: list[int] | None = None
    budgeted: dict[tuple[float, float], tuple[list[int], int]] = field(default_factory=dict)
    rescored_order: dict[tuple[float, float], list[int]] = field(default_factory=dict)
    top_block_repeats: bool = False
    rescored_block_repeats: dict[tuple[float, float], bool] = field(default_factory=dict)
    sequence: int = 0


@contextmanager
def rescorer_state(model, ids: torch.LongTensor) -> Iterator:
    """The neural rescorer's state after the base read ``ids`` ``[1, n]`` with a cache (every position but the
    last cached), valid while inside: its scorers at any position read the states this captures."""
    base = model.base
    cache = DynamicCache(config=base.config)
    with torch.no_grad(), model.rescorer.capture(base) as captured:
        base(input_ids=ids[:, :-1], **cache_argument(cache), use_cache=True)
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()  # sliding-window layers must be able to drop the scored nodes again
        state = model.rescorer.start(base, cache)
        state.observe(captured, None)
        yield state


@torch.no_grad()
def collect_positions(model, sequences: list[tuple[list[int], int]], top_k: int = 10,
                      dynamic: DynamicTree | None = None, rescorings: list[Rescoring] = (),
                      budgets: list[DynamicTree] = ()) -> list[PositionRecord]:
    """Ranks of the true future tokens among the heads' guesses, and gate signals, at every position of
    every ``(tokens, start)`` sequence from ``start`` on (e.g. the prompt length) that has all heads'
    targets. With ``dynamic``, also the order in which a dynamic tree of those settings (its ``nodes``
    the most considered) picks the true path's nodes, drafted for real at each position; likewise for each
    of ``rescorings`` (one per pair of weights) with ``model.ngram`` and ``model.rescorer``, and for each
    of ``budgets`` (dynamic trees with a per-node budget), with the number of nodes it drafted."""
    uses_lm = any(settings.lm_weight > 0 for settings in rescorings)
    index_of = model.rescorer.draft_index() if uses_lm else None
    fed = 1 + max((s.top_k * (s.depth - 1) for s in rescorings), default=0)  # nodes an LM scorer may feed
    records = []
    for number, (seq, skip) in enumerate(tqdm(sequences, desc="head ranks", unit="seq")):
        ids = torch.tensor([seq], device=model.device)
        with model.heads.capture(model.base) as captured:  # what the heads read: their state_source
            logits = model.base(input_ids=ids).logits[0]
        # what the heads read (a windowed drafter's window starts where decoding's would: the prompt's last state)
        hidden, head_logits, context = model.heads.teacher_forced(captured, ids, skip - 1)  # [len, heads, draft vocab]
        top = model.heads.token_ids(head_logits.topk(top_k, dim=-1).indices)  # [len, heads, top_k]
        signals = {name: gate_signal(name, logits, head_logits[:, 0]).tolist() for name in GATE_SIGNALS}
        if uses_lm and not tree_attention_ok(model.base, len(seq) + fed):
            raise ValueError(f"The neural rescorer scores paths under a tree mask, which this base cannot take over a "
                             f"{len(seq)}-token sequence (flash attention or a shorter sliding window).")
        with ExitStack() as stack:
            lm_state = stack.enter_context(rescorer_state(model, ids)) if uses_lm else None
            records.extend(_position_records(model, number, ids, skip, top, hidden, context, signals, dynamic,
                                             rescorings, lm_state, index_of, budgets))
    return records


def _position_records(model, sequence: int, ids: torch.LongTensor, skip: int, top: torch.Tensor, hidden: torch.Tensor,
                      context, signals: dict, dynamic: DynamicTree | None, rescorings: list[Rescoring], lm_state,
                      index_of: torch.Tensor | None, budgets: list[DynamicTree] = ()) -> list[PositionRecord]:
    """`collect_positions`' records for sequence number ``sequence``, ``ids`` ``[1, n]`` (``context(t)``: what drafting
    after ``t`` attends to; ``lm_state``: the neural rescorer's over
    all of it; ``index_of``: its `Drafter.draft_index`)."""
    records, num_heads, seq = [], model.config.num_heads, ids[0].tolist()
    for t in range(skip, len(seq) - num_heads - 1):
        ranks = []
        for k in range(num_heads):
            hit = (top[t, k] == seq[t + k + 2]).nonzero()
            ranks.append(int(hit[0, 0]) if len(hit) else -1)
        truth = seq[t + 2 : t + 2 + num_heads]
        order = None
        if dynamic is not None:
            chosen = dynamic_selection(StepDrafts(model.heads, hidden[t], seq[t + 1], context(t)), dynamic, num_heads)
            order = _true_path_order(chosen, truth)
        record = PositionRecord(ranks, {name: values[t] for name, values in signals.items()}, order,
                                top_block_repeats=repeats_a_token([seq[t + 1], *top[t, :, 0].tolist()]),
                                sequence=sequence)
        for settings in budgets:
            chosen = dynamic_selection(StepDrafts(model.heads, hidden[t], seq[t + 1], context(t)), settings, num_heads)
            record.budgeted[(settings.top_p, settings.min_ratio)] = (_true_path_order(chosen, truth), len(chosen))
        history = ids[0, : t + 2]
        scorer = model.rescorer.path_scorer(lm_state, ids[:, : t + 2], visible=t + 1) if lm_state else None
        for settings in rescorings:  # the scorer keeps what it computed for one setting for the next
            rescore = lattice_rescore(settings, history, model.ngram, scorer, index_of)
            step = StepDrafts(model.heads, hidden[t], seq[t + 1], context(t))
            chosen = dynamic_selection(step, settings, num_heads, rescore)
            key = (settings.weight, settings.lm_weight)
            record.rescored_order[key] = _true_path_order(chosen, truth)
            record.rescored_block_repeats[key] = repeats_a_token([seq[t + 1], *_top_block(chosen)])
        if scorer is not None:
            scorer.close()
        records.append(record)
    return records


def _top_block(chosen: dict[tuple[int, ...], int]) -> list[int]:
    """The tokens of the best path: from the root, each time the first-chosen (best-scored) child."""
    block, parent = [], ()
    while True:
        child = next((path for path in chosen if path[:-1] == parent), None)
        if child is None:
            return block
        block.append(chosen[child])
        parent = child


def _true_path_order(chosen: dict[tuple[int, ...], int], truth: list[int]) -> list[int]:
    """Per depth, the place in ``chosen``'s order of the node on the true path (-1 from the first miss)."""
    index = {path: i for i, path in enumerate(chosen)}
    child = {(path[:-1], token): path for path, token in chosen.items()}
    order, parent = [], ()
    for token in truth:
        parent = child.get((parent, token))
        if parent is None:
            break
        order.append(index[parent])
    return order + [-1] * (len(truth) - len(order))


@dataclass
class ChainPosition:
    """A step starting after position ``t`` of a calibration sequence, for a chain drafter: the probability
    of each depth's draft (teacher-forced: the drafts above it right) and whether it is right, with the
    gate signals there, and its calibration sequence (as `PositionRecord.sequence`)."""

    confidences: list[float]
    hits: list[bool]
    signals: dict[str, float]
    sequence: int = 0

    def drafted(self, length: int, confidence: float) -> int:
        """Tokens drafted with at most ``length`` per draft and the early exit at ``confidence``."""
        for j, value in enumerate(self.confidences[:length]):
            if value < confidence:
                return j + 1
        return min(length, len(self.confidences))

    def accepted(self, drafted: int) -> int:
        count = 0
        while count < drafted and self.hits[count]:
            count += 1
        return count


@torch.no_grad()
def collect_chain_positions(model, sequences: list[tuple[list[int], int]]) -> list[ChainPosition]:
    """Per position of every ``(tokens, start)`` sequence from ``start`` on, the chain drafter's guesses
    for the next ``num_heads`` tokens, teacher-forced over the sequence (what drafting computes while the
    drafts are right, which is all acceptance depends on)."""
    depth = model.config.num_heads
    positions = []
    for number, (seq, skip) in enumerate(tqdm(sequences, desc="chain drafts", unit="seq")):
        ids = torch.tensor([seq], device=model.device)
        with model.heads.capture(model.base) as captured:
            logits = model.base(input_ids=ids).logits[0]
        probs = torch.softmax(model.heads.forced_chain_logits(captured, seq).float(), dim=-1)
        top, index = probs.max(dim=-1)
        guesses = model.heads.token_ids(index).tolist()
        top = top.tolist()
        signals = {name: gate_signal(name, logits).tolist() for name in GATE_SIGNALS if name != "head_entropy"}
        for t in range(skip, len(seq) - depth - 1):
            # the step after position t: the verifier's token is seq[t + 1]; draft j (0-based) comes from the
            # drafter's state at t + 1 + j and is right when it is seq[t + 2 + j]
            span = range(t + 1, t + 1 + depth)
            positions.append(ChainPosition([top[p] for p in span], [guesses[p] == seq[p + 1] for p in span],
                                           {name: values[t] for name, values in signals.items()}, number))
    return positions
