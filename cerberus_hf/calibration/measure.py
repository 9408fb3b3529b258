"""Wall-time measurements calibration fits to: the verification cost curve, the drafting time, and a chain
drafter's step times."""

from __future__ import annotations

import copy
import statistics
import time
from contextlib import ExitStack
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ..compat import cache_argument
from ..decoding.drafting import StepDrafts, dynamic_selection, static_draft
from ..blocks.profiling import synchronize
from ..blocks.rescoring import Rescoring, lattice_rescore
from ..blocks.strict import strict_view
from ..blocks.tree import DynamicTree, TreeSpec
from .positions import rescorer_state


def measure_cost_curve(base, max_tokens: int = 64, context: int = 300, repeats: int = 5,
                       strict: bool = False, seconds: float | None = None) -> dict[int, float]:
    """Seconds of one cached forward with ``n`` new tokens for ``n = 1..max_tokens`` after a ``context``-token
    prefix: the median time at ``n = 1`` times each size's cost relative to it (`measure_cost_curves`)."""
    return measure_cost_curves([base], max_tokens, context, repeats, strict, seconds)[0]


@torch.no_grad()
def measure_cost_curves(bases: list, max_tokens: int = 64, context: int = 300, repeats: int = 5,
                        strict: bool = False, seconds: float | None = None,
                        one_token_only: int = 0) -> list[dict[int, float]]:
    """`measure_cost_curve` for each of ``bases`` (views of one base that compute differently, e.g. through packed
    weights), measured interleaved so that their curves compare.

    A shared machine's speed drifts a lot within seconds (an example in docs/calibration.md), so times taken
    seconds apart do not compare. Each forward over ``n`` tokens therefore follows one over a single token, and the
    relative cost is the median of those back-to-back ratios; the ratios are then fitted by the closest
    non-decreasing curve (`non_decreasing`), since a forward over more tokens does not cost less, and a dip left in
    would pick a tree whose cost was under-measured. Each size is timed on every base in turn. ``strict``: the
    forwards verify as strict verification does (`blocks.strict`), one attention call per position. ``seconds``:
    about how long all of it may take: the sizes timed are thinned (`budget_sizes`; the others interpolated) and the
    passes cut to what fits, at least one. The last ``one_token_only`` of ``bases`` (views that compute differently
    only for one token) are timed at one token alone, beside the others' one-token forwards: their curves hold n = 1.
    Every base runs over one cached prefix, computed once."""
    deadline = time.perf_counter() + seconds if seconds is not None else None
    limit = getattr(bases[0].config.get_text_config(), "max_position_embeddings", None)
    if limit:
        context = max(1, min(context, limit - max_tokens - 1))
    cache = _prefix_cache(bases[0], context)
    forwards = [_forward_timer(base, context, strict, cache) for base in bases]
    full = len(bases) - one_token_only  # the bases timed at every size
    singles: list[list[float]] = [[] for _ in bases]
    sizes = range(2, max_tokens + 1)
    if deadline is not None:  # what is left after the prefixes, for passes over sizes that fit it
        singles = [[forward(1) for _ in range(3)] for forward in forwards]
        medians = [statistics.median(values) for values in singles]
        single, timed = sum(medians), sum(medians[:full])
        left = deadline - time.perf_counter()
        sizes = budget_sizes(max_tokens, single, left, timed)
        repeats = max(1, min(repeats, int(left // pass_seconds(sizes, single, timed))))
    ratios: list[dict[int, list[float]]] = [{n: [] for n in sizes} for _ in bases]
    for done in tqdm(range(repeats), desc="cost curve", unit="pass"):
        if done and deadline is not None and time.perf_counter() > deadline:
            break
        for n in sizes:
            for index, (forward, own_singles, own_ratios) in enumerate(zip(forwards, singles, ratios)):
                single = forward(1)
                own_singles.append(single)
                if index < full:
                    own_ratios[n].append(forward(n) / single)
    curves = []
    for index, (own_singles, own_ratios) in enumerate(zip(singles, ratios)):
        one = statistics.median(own_singles)
        if index >= full:
            curves.append({1: one})
            continue
        measured = {1: 1.0, **{n: statistics.median(values) for n, values in own_ratios.items()}}
        curves.append({n: one * r for n, r in enumerate(non_decreasing(interpolate(measured, max_tokens)), start=1)})
    return curves


def _prefix_cache(base, context: int) -> DynamicCache:
    """The cache of ``base`` after a ``context``-token random prefix."""
    vocab = base.get_output_embeddings().weight.shape[0]
    prefix = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0)).to(base.device)
    cache = DynamicCache(config=base.config)
    base(input_ids=prefix, **cache_argument(cache), use_cache=True)
    return cache


def _forward_timer(base, context: int, strict: bool, cache: DynamicCache) -> Callable[[int], float]:
    """Seconds of one forward of ``base`` over ``n`` new random tokens after a ``context``-token random prefix (its
    ``cache``, filled once by `_prefix_cache` and shared by views of one base, cut back after each forward);
    ``strict``: verifying as strict verification does."""
    device = base.device
    vocab = base.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(1)
    verifier = strict_view(base) if strict else base

    def forward(n: int) -> float:
        tokens = torch.randint(0, vocab, (1, n), generator=generator).to(device)
        positions = torch.arange(context, context + n, device=device)[None]
        synchronize(device)
        start = time.perf_counter()
        verifier(input_ids=tokens, **cache_argument(cache), position_ids=positions, use_cache=True)
        synchronize(device)
        seconds = time.perf_counter() - start
        cache.crop(-n)
        return seconds

    return forward


# The sizes a bounded cost curve times first (`budget_sizes`): dense where trees are usually sized, sparse beyond
BUDGET_SIZES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


def pass_seconds(sizes: list[int], single: float, timed: float | None = None) -> float:
    """About how long one pass over ``sizes`` takes when one token's forward takes ``single`` seconds on every view,
    ``timed`` on those timed at every size (None: all of them): each size costs a one-token forward on every view and
    one of n tokens on each view timed at every size, taken to cost at most ``1 + n / 8`` of its one-token forward
    (the steepest CPU curve measured, docs/calibration.md, costs 1.72x at 16 tokens)."""
    timed = single if timed is None else timed
    return sum(single + timed * (1 + n / 8) for n in sizes)


def budget_sizes(max_tokens: int, single: float, seconds: float, timed: float | None = None) -> list[int]:
    """The sizes a cost curve bounded to ``seconds`` times, up to ``max_tokens`` (always timed): `BUDGET_SIZES`,
    every other one dropped (the smallest and the largest kept) while a pass (`pass_seconds`) does not fit."""
    sizes = [n for n in BUDGET_SIZES if n < max_tokens] + [max_tokens] if max_tokens > 1 else []
    while len(sizes) > 2 and pass_seconds(sizes, single, timed) > seconds:
        sizes = sizes[:-1:2] + sizes[-1:]
    return sizes


def interpolate(measured: dict[int, float], max_tokens: int) -> list[float]:
    """Values for ``1..max_tokens`` from those ``measured`` at some of them (1 among them): linear between the
    neighbours measured."""
    known = sorted(measured)
    values = []
    for n in range(1, max_tokens + 1):
        below = max(k for k in known if k <= n)
        above = min((k for k in known if k >= n), default=below)
        share = (n - below) / (above - below) if above != below else 0.0
        values.append(measured[below] + share * (measured[above] - measured[below]))
    return values


def non_decreasing(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in squares (pool adjacent violators): each run of values
    that falls is replaced by its mean."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count),
                          blocks[-1][1] + count]
    return [mean for mean, count in blocks for _ in range(count)]


@torch.no_grad()
def measure_draft_time(model, repeats: int = 20, dynamic: DynamicTree | Rescoring | None = None,
                       context: int = 300, steps: Callable[[], StepDrafts] | None = None) -> float:
    """Median seconds for the drafter to draft one step: the chain through every head, or a dynamic tree
    (a drafter that reads its drafted tokens pays one call per depth), rescored by whichever of
    ``model.ngram`` and ``model.rescorer`` ``dynamic`` weighs when it is a `Rescoring` (the LM after a
    ``context``-token prefix, closing its scorer each time as decoding does). ``steps``: `step_builder`'s for
    ``context``, shared by several measurements (built here when None)."""
    step_drafts = steps or step_builder(model, context)
    chain = TreeSpec.chain(model.config.num_heads)
    history = torch.arange(context, device=model.device) % model.config.vocab_size
    index_of = model.rescorer.draft_index() if model.rescorer is not None else None
    with ExitStack() as stack:
        lm_state = None
        if isinstance(dynamic, Rescoring) and dynamic.lm_weight > 0:
            lm_state = stack.enter_context(rescorer_state(model, history[None]))

        def draft() -> None:
            step = step_drafts()
            if dynamic is None:
                static_draft(step, chain)
                return
            scorer = model.rescorer.path_scorer(lm_state, history[None]) if lm_state is not None else None
            rescore = (lattice_rescore(dynamic, history, model.ngram, scorer, index_of)
                       if isinstance(dynamic, Rescoring) else None)
            dynamic_selection(step, dynamic, model.config.num_heads, rescore)
            if scorer is not None:
                scorer.close()

        return _median_seconds(model.device, repeats, draft)


@torch.no_grad()
def measure_gate_time(model, repeats: int = 20, context: int = 300,
                      steps: Callable[[], StepDrafts] | None = None) -> float:
    """Median seconds a head-entropy gate costs a step it keeps from drafting: what the heads read and the first
    head's guesses, which the gate needs before it can decide (a drafted step reuses them, so only gated steps pay
    this on top of a plain forward). ``steps`` as in `measure_draft_time`."""
    step_drafts = steps or step_builder(model, context)
    return _median_seconds(model.device, repeats, lambda: step_drafts().root_logits())


def _median_seconds(device: torch.device, repeats: int, work: Callable[[], object]) -> float:
    """Median wall-clock seconds of ``work()`` over ``repeats`` calls, each waiting for the device's queued work."""
    values = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        work()
        synchronize(device)
        values.append(time.perf_counter() - start)
    return statistics.median(values)


def step_builder(model, context: int = 300) -> Callable[[], StepDrafts]:
    """What makes one step's `StepDrafts` as decoding would, after ``context`` verified positions; each call makes
    the same step anew, so one builder serves every drafting and gate timing (for a drafter that keeps a state over
    the sequence, building it runs the base over the context: seconds where the dtype has no fast kernels)."""
    if model.heads.trains_on_sequences and not model.heads.drafts_chains:  # a state kept over the sequence (EAGLE-3)
        return _sequence_steps(model, context)
    return _window_steps(model)


def _window_steps(model) -> Callable[[], StepDrafts]:
    """One step's `StepDrafts` as decoding makes it for heads that read the newest state, or a window of the newest
    states: a windowed drafter pays every step for the newest state's row and for reading the window."""
    window = max(model.heads.context_window, 1)
    states = torch.zeros(1, window, model.config.hidden_size, device=model.device, dtype=model.dtype)
    tokens = torch.zeros(1, window, dtype=torch.long, device=model.device)
    rows = model.heads.window_rows(states, tokens)
    valid = torch.ones(1, window, dtype=torch.bool, device=model.device)

    def step() -> StepDrafts:
        newest = model.heads.window_rows(states[:, -1:], tokens[:, -1:])
        return StepDrafts(model.heads, model.heads.read_window(torch.cat([rows[:, :-1], newest], dim=1), valid), 0)

    return step


def _sequence_steps(model, context: int, new: int = 3) -> Callable[[], StepDrafts]:
    """One step's `StepDrafts` as decoding makes it for a drafter that keeps a state over the sequence (EAGLE-3's KV
    cache): after ``context`` verified positions, ``new`` of them verified since the last step (the drafter first
    takes them in; a copy of the state each time, so every repeat does the same work)."""
    base, heads, device = model.base, model.heads, model.device
    limit = getattr(base.config.get_text_config(), "max_position_embeddings", None)
    context = max(new + 1, min(context, limit - model.config.num_heads - 2) if limit else context)
    ids = (torch.arange(context + 1, device=device) * 7919 % model.config.vocab_size)[None]
    with heads.capture(base) as captured:
        base(input_ids=ids[:, :-1])
    state = heads.start(base, None)
    state.observe({name: value[:, :-new] for name, value in captured.items() if torch.is_tensor(value)}, None)
    newest = captured["hidden"][:, -1]  # what the loop hands heads_input: the state that predicted the newest token
    state.heads_input(ids[:, : context - new + 1], captured["hidden"][:, -new - 1])
    state.observe({name: value[:, -new:] for name, value in captured.items() if torch.is_tensor(value)},
                  list(range(new)))

    def step() -> StepDrafts:
        current = copy.copy(state)
        read = current.heads_input(ids, newest)
        return StepDrafts(heads, read, int(ids[0, -1]), current.context())

    return step


@torch.no_grad()
def measure_chain_steps(model, context: int = 300, repeats: int = 5) -> dict[str, dict[int, float]]:
    """Median seconds of a chain drafter's (Kangaroo's) step parts for each draft length ``n`` up to
    ``num_heads``, after a ``context``-token prefix: ``"draft"``, drafting ``n`` tokens, and ``"verify"``, the
    base's forward over the newest token and those ``n`` as decoding runs it (from the exit layer on, the
    shallow layers' work reused). Lengths are interleaved across repeats so drifting load hits all alike."""
    base, depth, device = model.base, model.config.num_heads, model.device
    vocab = base.get_output_embeddings().weight.shape[0]
    limit = getattr(base.config.get_text_config(), "max_position_embeddings", None)
    if limit:
        context = max(1, min(context, limit - depth - 2))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, context + 1), generator=generator).to(device)
    cache = DynamicCache(config=base.config)
    times = {part: {n: [] for n in range(1, depth + 1)} for part in ("draft", "verify")}
    with model.heads.capture(base) as captured:
        base(input_ids=ids[:, :-1], **cache_argument(cache), use_cache=True)
        state = model.heads.start(base, cache)
        state.observe(captured, None)
        for _ in tqdm(range(repeats), desc="chain steps", unit="pass"):
            for n in range(1, depth + 1):
                synchronize(device)
                start = time.perf_counter()
                drafted = model.heads.draft_chain(state, ids, n, confidence=0.0)
                synchronize(device)
                middle = time.perf_counter()
                tokens = torch.cat([ids[:, -1:], torch.tensor([drafted], device=device, dtype=ids.dtype)], dim=-1)
                positions = torch.arange(context, context + n + 1, device=device)[None]
                with state.verifying(base, tokens) as verifier:
                    verifier(input_ids=tokens, **cache_argument(cache), position_ids=positions, use_cache=True)
                synchronize(device)
                times["draft"][n].append(middle - start)
                times["verify"][n].append(time.perf_counter() - middle)
                cache.crop(-(n + 1))
    return {part: {n: statistics.median(values) for n, values in by_length.items()} for part, by_length in times.items()}
