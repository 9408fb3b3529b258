"""`Proposer`: the drafter's state for one call: the verifier's state in, a draft tree out, from any `Drafter`.

The decoding loop asks it for each step's draft tree (`propose`; a chain is the tree with one path per depth) and
tells it what was accepted (`record_step`). The tree is a fixed tree of ranks, one grown each step from the drafter's
confidence (`drafting`), or one grown from the drafter's confidence rescored by an n-gram model, a small neural LM or
both (`rescoring`). The entropy gate lives here: a step the gate rejects gets no head draft, and the loop decodes a
single token. With prompt lookup on, tokens copied from the context are grafted into the draft (gate or not: a
repeated n-gram is its own evidence).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator

import torch

from ..compat import tree_attention_ok
from ..drafters.base import Drafter
from .drafting import (
    Levels, StepDrafts, chosen_tree, dynamic_draft, prime_roots, run_together, search_levels, static_levels,
)
from ..blocks.lookup import context_continuation
from ..blocks.ngram import NGRAM_COMMAND, NgramModel
from ..blocks.profiling import phase_timer
from ..blocks.rescoring import Rescoring, lattice_rescore
from ..blocks.settings import DecodingSettings
from ..blocks.stats import GenerationStats
from ..blocks.transfer import to_device
from ..blocks.tree import TreeSpec, graft_chain


@dataclass
class Draft:
    """Draft tokens laid out as ``tree``: ``tokens[i]`` is node ``i``'s token."""

    tree: TreeSpec
    tokens: torch.LongTensor  # [len(tree)]

    def top_chain(self) -> "Draft | None":
        """The draft's first path (the heads' top-1 chain, else the copied chain) as a chain."""
        nodes = self.tree.first_path
        return Draft(TreeSpec.chain(len(nodes)), self.tokens[nodes]) if nodes else None

    def first_nodes(self, count: int) -> "Draft | None":
        """The draft's first ``count`` nodes (None for none). Every tree lists parents before children, so
        the nodes kept still hang from the root."""
        if count >= len(self.tree):
            return self
        return Draft(TreeSpec(self.tree.paths[:count]), self.tokens[:count]) if count > 0 else None


def with_copied(draft: Draft | None, copied: list[int], device: torch.device) -> Draft:
    """``draft`` (None: no head draft) with the chain ``copied`` merged in: its prefix that the tree
    already holds is shared, the rest hangs below as new nodes (tokens on ``device``)."""
    tree, tokens = (draft.tree, draft.tokens.tolist()) if draft is not None else (None, [])
    node, below, shared = -1, (), 0
    while tree is not None and shared < len(copied):
        node = next((c for c in tree.children[node + 1] if tokens[c] == copied[shared]), None)
        if node is None:
            break
        below, shared = tree.paths[node], shared + 1
    if shared == len(copied):
        return draft
    rest = copied[shared:]
    return Draft(graft_chain(tree, below, len(rest)), to_device(tokens + rest, device, torch.long))


class Proposer:
    """The drafter's state for one call, drafting each step: node ``(r0, ..., rd)`` of a static tree is depth
    ``d``'s rank-``rd`` guess under node ``(r0, ..., r(d-1))``; a dynamic tree is grown anew each step.

    Args:
        drafter: the drafter (its family does not matter here).
        settings: the call's `DecodingSettings`: the gate; the static tree (a chain of all heads when None and
            no dynamic tree is given), or the dynamic (EAGLE-2) tree grown per step instead, or the tree grown
            from the drafter's guesses rescored by ``ngram`` and ``rescorer``; prompt lookup; a chain drafter's
            exit confidence.
        max_length: total length the sequence may reach; drafts never run past it.
        stats: where per-step figures are recorded.
        ngram: the n-gram model rescoring reads (needed when its ``weight`` is above 0).
        rescorer: the neural rescorer rescoring reads (a drafter that scores paths, `Drafter.path_scorer`;
            needed when its ``lm_weight`` is above 0). Where the base cannot attend under a tree mask (flash
            attention, a sequence past a sliding window) it sits the step out, as tree verification does.
        phase: the profiler's phase timer (`profiling.phase_timer`), which charges the rescorers' scoring to
            the ``rescore`` phase.
    """


    def __init__(
        self,
        drafter: Drafter,
        settings: DecodingSettings,
        max_length: int,
        stats: GenerationStats,
        ngram: NgramModel | None = None,
        rescorer: Drafter | None = None,
        phase: Callable[[str], ContextManager[None]] = phase_timer(None),
    ):
        gate, tree, rescoring = settings.gate, settings.tree, settings.rescoring
        dynamic = None if rescoring is not None else settings.dynamic
        self.drafter = drafter
        self.gate = gate
        self.tree = tree if tree is not None else TreeSpec.chain(drafter.num_heads)
        if self.tree.depth > drafter.num_heads:
            raise ValueError(f"The draft tree is {self.tree.depth} deep but there are only {drafter.num_heads} heads.")
        if dynamic is not None and dynamic.depth > drafter.num_heads:
            raise ValueError(f"The dynamic tree is {dynamic.depth} deep but there are only {drafter.num_heads} heads.")
        if rescoring is not None and rescoring.weight > 0 and ngram is None:
            raise ValueError(f"Lattice rescoring with an n-gram weight needs an n-gram model: build one with "
                             f"`{NGRAM_COMMAND}`.")
        if rescoring is not None and rescoring.lm_weight > 0 and rescorer is None:
            raise ValueError("Lattice rescoring with an lm_weight needs a neural rescorer beside the heads "
                             "(model.load_rescorer(folder of a Kangaroo checkpoint for this base)).")
        if rescoring is not None and rescoring.depth > drafter.num_heads:
            raise ValueError(f"The rescored tree is {rescoring.depth} deep but there are only {drafter.num_heads} heads.")
        if drafter.drafts_chains:
            if dynamic is not None or rescoring is not None or not self.tree.is_chain:
                raise ValueError(f"{drafter.drafter_type} drafts a chain token by token: pass no draft_tree other "
                                 "than a chain, no dynamic_tree and no rescoring.")
            if gate.needs_heads:
                raise ValueError(f"The {gate.signal!r} gate reads parallel heads' first guess, which "
                                 f"{drafter.drafter_type} does not make: use 'base_entropy' or 'base_top1'.")
        self.exit_confidence = settings.exit_confidence
        self.dynamic = rescoring if rescoring is not None else dynamic
        self.ngram = ngram if rescoring is not None and rescoring.weight > 0 else None
        self.rescorer = rescorer if rescoring is not None and rescoring.lm_weight > 0 else None
        self.rescorer_state = None
        self._draft_index: torch.Tensor | None = None
        self._model = None
        self.max_length = max_length
        self.stats = stats
        self.lookup_tokens = settings.lookup_tokens
        self.lookup_ngram = settings.lookup_ngram
        self.phase = phase
        self._last: Draft | None = None
        self.state = None

    @contextmanager
    def capture(self, model) -> Iterator[dict]:
        """The drafter's `Drafter.capture` on ``model``; with a neural rescorer, what it reads goes to
        ``captured["rescorer"]``."""
        with ExitStack() as stack:
            captured = stack.enter_context(self.drafter.capture(model))
            if self.rescorer is not None:
                captured["rescorer"] = stack.enter_context(self.rescorer.capture(model))
            yield captured

    def start(self, model, cache) -> None:
        """Begin a sequence decoded by ``model`` with ``cache`` (the drafter's state for it starts empty, and
        the neural rescorer's)."""
        self.state = self.drafter.start(model, cache)
        if self.rescorer is not None:
            self._model = model
            self.rescorer_state = self.rescorer.start(model, cache)
            self._draft_index = self.rescorer.draft_index()

    def observe(self, captured: dict, keep: list[int] | None) -> None:
        """The base's latest forward and which of its input positions were kept (`SequenceState.observe`)."""
        self.state.observe(captured, keep)
        if self.rescorer_state is not None:
            self.rescorer_state.observe(captured["rescorer"], keep)

    def verifying(self, model, input_ids: torch.LongTensor, draft: Draft | None) -> ContextManager:
        """Entered around the verification forward of ``draft`` after ``input_ids``, giving the model to run it
        with: the drafter's `SequenceState.verifying` of ``model`` over the tokens that forward reads (None for a
        tree)."""
        if draft is None:
            return self.state.verifying(model, input_ids[:, -1:])
        if not draft.tree.is_chain:
            return self.state.verifying(model, None)
        return self.state.verifying(model, torch.cat([input_ids[:, -1:], draft.tokens[None]], dim=-1))

    @torch.no_grad()
    def propose(
        self, input_ids: torch.LongTensor, last_hidden_state: torch.Tensor, next_token_logits: torch.Tensor,
        last_token: int | None = None, gate_decision: bool | None = None,
    ) -> Draft | None:
        """A draft following ``input_ids`` (batch size 1), or None when the gate or the length says no.

        ``last_hidden_state`` ([1, hidden]) is the verifier's state at the position that predicted the
        last token of ``input_ids``; ``next_token_logits`` ([1, vocab]) the raw prediction made from it,
        which the gate reads. A verification step emits the accepted drafts plus one token, so drafts
        are at most ``max_length - len - 1`` deep. ``last_token``: the last token of ``input_ids`` when the caller
        has it on the host already (it is read from the device otherwise); ``gate_decision``: the gate's decision when
        the caller took it already from the same logits (`EntropyGate.draft_rows`).
        """
        return propose_together([self], [input_ids], [last_hidden_state], [next_token_logits], [last_token],
                                [gate_decision])[0]

    def _plan(self, input_ids: torch.LongTensor, last_hidden_state: torch.Tensor, last_token: int | None) -> "_Plan":
        """What a step may draft: the room before ``max_length``, the static tree that fits, and (when the gate reads
        the heads) what the heads read."""
        room = self.max_length - input_ids.shape[1] - 1
        static = self.tree.truncated(room) if self.dynamic is None else None
        can_draft = room > 0 and (self.dynamic is not None or static is not None)
        # what the heads read (a windowed drafter's window included) is computed only on steps that read them
        step = self._step_drafts(input_ids, last_hidden_state, last_token) if can_draft and self.gate.needs_heads \
            else None
        return _Plan(input_ids, room, static, can_draft, step)

    def _search(self, plan: "_Plan") -> Levels | None:
        """The draft's search as `drafting.Levels`, for the kinds a batch can run in lockstep (a static tree, a
        dynamic tree searched on the device); None for the others (`_draft`)."""
        if self.drafter.drafts_chains or isinstance(self.dynamic, Rescoring):
            return None
        if self.dynamic is not None:
            return search_levels(plan.step, self.dynamic, plan.room)
        return static_levels(plan.step, plan.static)

    def _draft(self, plan: "_Plan", searched) -> Draft | None:
        """The step's draft from the search's result (``searched``), or drafted here for the other kinds."""
        input_ids = plan.input_ids
        if self.drafter.drafts_chains:
            chain = self.drafter.draft_chain(self.state, input_ids, plan.static.depth, self.exit_confidence)
            return Draft(TreeSpec.chain(len(chain)), to_device(chain, input_ids.device, input_ids.dtype))
        if isinstance(self.dynamic, Rescoring):
            return self._grown_draft(plan.step, input_ids, plan.room)
        if self.dynamic is not None:
            tree, tokens = chosen_tree(searched, input_ids.device)  # room > 0: the search chose at least one node
            return Draft(tree, tokens.to(input_ids.dtype))
        return Draft(plan.static, searched.to(input_ids.dtype))

    def _with_lookup(self, draft: Draft | None, plan: "_Plan") -> Draft | None:
        """``draft`` with prompt lookup's copied tokens grafted in (when it is on and copies something)."""
        copied = []
        if self.lookup_tokens and plan.room > 0:
            copied = context_continuation(plan.input_ids[0].cpu(), min(self.lookup_tokens, plan.room), self.lookup_ngram)
        if copied:
            draft = with_copied(draft, copied, plan.input_ids.device)
            self.stats.context_steps += 1
        self._last = draft
        return draft

    def _grown_draft(self, step: StepDrafts, input_ids: torch.LongTensor, room: int) -> Draft:
        """The lattice's tree, rescored by whichever rescorers have a weight above 0 (none: the plain lattice)."""
        scorer = None
        # the scorer feeds the root and at most top_k nodes per further depth after the cached positions
        fed = 1 + self.dynamic.top_k * (min(self.dynamic.depth, room) - 1)
        if self.rescorer is not None and tree_attention_ok(self._model, input_ids.shape[1] + fed):
            scorer = self.rescorer.path_scorer(self.rescorer_state, input_ids)
        rescore = lattice_rescore(self.dynamic, input_ids[0], self.ngram, scorer, self._draft_index)
        try:
            tree, tokens = dynamic_draft(step, self.dynamic, room, rescore and self._profiled(rescore))
        finally:
            if scorer is not None:
                with self.phase("rescore"):
                    scorer.close()
        return Draft(tree, tokens.to(input_ids.dtype))  # room > 0: dynamic_draft never returns None here

    def _step_drafts(self, input_ids: torch.LongTensor, last_hidden_state: torch.Tensor,
                     last_token: int | None = None) -> StepDrafts:
        """This step's drafts from what the heads read after ``input_ids`` (`SequenceState.heads_input`)."""
        heads_input = self.state.heads_input(input_ids, last_hidden_state)
        return StepDrafts(self.drafter, heads_input, int(input_ids[0, -1]) if last_token is None else last_token,
                          self.state.context())

    def _profiled(self, rescore: Callable) -> Callable:
        """``rescore`` charged to the profiler's ``rescore`` phase."""

        def timed(*args):
            with self.phase("rescore"):
                return rescore(*args)

        return timed

    def fall_back_to_chain(self, draft: Draft) -> Draft | None:
        """Verify only the draft's top-1 chain this step (for attention that cannot take a tree mask)."""
        self._last = draft.top_chain()
        return self._last

    def cut_to(self, draft: Draft, nodes: int) -> Draft | None:
        """Verify only the draft's first ``nodes`` nodes this step (strict verification's row limit, a static cache's
        room)."""
        self._last = draft.first_nodes(nodes)
        return self._last

    def record_step(self, accepted: int) -> None:
        """Record how the last proposal fared: ``accepted`` of its tokens were kept."""
        draft = self._last
        self.stats.record_step(
            emitted=accepted + 1,
            depth=draft.tree.depth if draft else 0,
            nodes=len(draft.tree) if draft else 0,
        )
        self._last = None


@dataclass
class _Plan:
    """One sequence's step before drafting (`Proposer._plan`)."""

    input_ids: torch.LongTensor
    room: int
    static: TreeSpec | None
    can_draft: bool  # a draft fits before max_length
    step: StepDrafts | None
    drafts: bool = False  # the gate let this step draft (set by `propose_together`)


@torch.no_grad()
def propose_together(
    proposers: list[Proposer], input_ids: list[torch.LongTensor], hidden: list[torch.Tensor],
    next_token_logits: list[torch.Tensor], last_tokens: list[int | None], gate_decisions: list[bool | None],
) -> list[Draft | None]:
    """`Proposer.propose` for several sequences (one proposer each, all of one drafter), with each
    depth's guesses for every sequence computed in one call of the drafter (`drafting.run_together`): the gate's
    depth 0 first, then the trees' searches level by level. Each sequence gets the draft it would get alone (up to
    the rounding of a batched call); one sequence is `propose` itself."""
    plans = [p._plan(ids, h, last) for p, ids, h, last in zip(proposers, input_ids, hidden, last_tokens)]
    prime_roots([plan.step for plan in plans if plan.step is not None])
    for p, plan, h, last, logits, decision in zip(proposers, plans, hidden, last_tokens, next_token_logits,
                                                  gate_decisions):
        first_logits = plan.step.root_logits()[None] if plan.step is not None else None
        if plan.can_draft and decision is None:
            decision = p.gate.should_draft(logits, first_logits)
        plan.drafts = plan.can_draft and bool(decision)
        if plan.drafts and plan.step is None and not p.drafter.drafts_chains:
            plan.step = p._step_drafts(plan.input_ids, h, last)
        if plan.can_draft:  # no room left for a draft is not the gate's decision
            p.stats.record_gate(plan.drafts)
    searches = {i: p._search(plan) for i, (p, plan) in enumerate(zip(proposers, plans)) if plan.drafts}
    together = [i for i, search in searches.items() if search is not None]
    results = dict(zip(together, run_together([plans[i].step for i in together], [searches[i] for i in together])))
    return [p._with_lookup(p._draft(plan, results.get(i)) if plan.drafts else None, plan)
            for i, (p, plan) in enumerate(zip(proposers, plans))]
