"""Turning a drafter's guesses into one step's draft tree: a fixed tree of ranks, or a tree grown from the
drafter's own confidence.

A drafter guesses depth by depth (`drafters.base.Drafter.draft_level`). `StepDrafts` runs it for one step
from the verifier's state and newest token: depth ``k`` is computed for the nodes of depth ``k`` that get
children, in one batched call; for drafters whose guesses ignore the tokens above them (Medusa, Cerberus)
one call per depth serves every node.

* `static_draft`: Medusa-style trees of ranks (``[[0], [1], [0, 0], ...]``): node ``(r0, .., rd)`` is the
  rank-``rd`` guess of depth ``d`` under node ``(r0, .., r(d-1))``.
* `dynamic_draft`: EAGLE-2's tree. Level by level, the ``top_k`` most probable children of each frontier
  node are scored by their cumulative draft log-probability, the ``top_k`` best of them form the next
  frontier, and at the end the ``nodes`` best of everything drafted (a path's score never exceeds its
  parent's, so the set is a tree) are verified. ``nodes`` and ``depth`` are fitted by ``calibrate``.
  With Clover's per-node budget (`tree.DynamicTree`'s ``top_p`` and ``min_ratio``) a node's unlikely
  children are never candidates, so the tree's size follows the drafter's confidence; ``calibrate``
  keeps it only where it beats the plain tree on the device's cost curve.
  With an n-gram model the same search rescores a wider lattice of guesses (`rescoring`).
  Decoding, calibration and rescoring run one search (`dynamic_selection`), on the drafter's device, reading the
  chosen tree back once.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..drafters.base import Drafter
from ..blocks.rescoring import Rescore, Rescoring
from ..blocks.transfer import to_device
from ..blocks.tree import DynamicTree, TreeSpec


@dataclass
class _Node:
    # the drafted tokens from the root's child down to this node: host ints where the tree is chosen on the host
    # (dynamic trees), a device tensor where it is fixed (static trees, whose tokens are never read back)
    tokens: tuple[int, ...] | torch.Tensor
    state: torch.Tensor | None  # the drafter's state at this node ([hidden]); None at the root


class StepDrafts:
    """The drafter's guesses for one step, depth by depth, from the verifier's state and newest token."""

    def __init__(self, drafter: Drafter, hidden: torch.Tensor, last_token: int, context: object | None = None):
        self.drafter = drafter
        self.hidden = hidden.reshape(1, -1).to(drafter.dtype)
        self.last_token = last_token
        self.context = context  # the sequence's `SequenceState.context`, passed to every `Drafter.draft_level`
        self.root = _Node((), None)
        self._shared: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def expand(self, depth: int, parents: list[_Node]) -> tuple[torch.Tensor, torch.Tensor]:
        """(states ``[n, hidden]``, logits ``[n, V]``) of depth ``depth`` under each of ``parents``."""
        if not self.drafter.reads_tokens:
            state, logits = self._level(depth)
            return state.expand(len(parents), -1), logits.expand(len(parents), -1)
        previous = torch.stack([p.state for p in parents]) if depth > 0 else None
        return self.drafter.draft_level(depth, self.hidden.expand(len(parents), -1), self._path_tokens(parents), previous,
                                        self.context)

    def _path_tokens(self, parents: list[_Node]) -> torch.Tensor:
        """``[len(parents), depth + 1]``: the newest token, then each parent's drafted tokens."""
        if all(isinstance(p.tokens, tuple) for p in parents):
            return to_device([(self.last_token, *p.tokens) for p in parents], self.hidden.device)
        above = torch.stack([p.tokens for p in parents])  # the parents of one depth: paths of one length
        last = torch.full((len(parents), 1), self.last_token, device=self.hidden.device)
        return torch.cat([last, above], dim=1)

    def _level(self, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(state ``[1, hidden]``, logits ``[1, V]``) of depth ``depth`` for a drafter that ignores drafted tokens (or
        depth 0 of any drafter): one call serves every node of the depth, computed once."""
        if depth not in self._shared:
            previous = self._level(depth - 1)[0] if depth > 0 else None
            tokens = torch.full((1, depth + 1), self.last_token, device=self.hidden.device)
            self._shared[depth] = self.drafter.draft_level(depth, self.hidden, tokens, previous, self.context)
        return self._shared[depth]

    def root_logits(self) -> torch.Tensor:
        """Depth 0's logits ``[V]`` (what a head-entropy gate reads); reused by the draft that follows."""
        return self._level(0)[1][0]

    @staticmethod
    def share_level(steps: list["StepDrafts"], depth: int) -> None:
        """`_level` of several sequences (one drafter) in one call of their drafter, each apart where the drafter
        attends to a context of its own per sequence. Depth ``depth - 1`` is already there (levels go in order)."""
        missing = [step for step in steps if depth not in step._shared]
        if len(missing) > 1 and all(step.context is None for step in missing):
            previous = torch.cat([step._shared[depth - 1][0] for step in missing]) if depth > 0 else None
            tokens = to_device([[step.last_token] * (depth + 1) for step in missing], missing[0].hidden.device)
            states, logits = missing[0].drafter.draft_level(
                depth, torch.cat([step.hidden for step in missing]), tokens, previous)
            for r, step in enumerate(missing):
                step._shared[depth] = (states[r: r + 1], logits[r: r + 1])
        for step in missing:
            step._level(depth)


def static_draft(step: StepDrafts, tree: TreeSpec) -> torch.LongTensor:
    """Tokens ``[len(tree)]`` of a fixed tree of ranks. The shape is known beforehand, so every token stays on the
    device: nothing is read back to the host while drafting (each read would stall a GPU)."""
    return run_alone(step, static_levels(step, tree))


def static_levels(step: StepDrafts, tree: TreeSpec) -> Levels:
    """`static_draft` as `Levels`: each depth's expansion is asked of the caller (`run_alone`, `run_together`)."""
    device = step.hidden.device
    nodes: list[_Node | None] = [None] * len(tree)
    tokens = torch.zeros(len(tree), dtype=torch.long, device=device)
    no_tokens = tokens[:0]
    for depth, ((members, parents, rows), (members_on, rows_on, ranks_on)) in enumerate(
            zip(tree.levels, tree.on(device).levels)):
        states, logits = yield depth, [step.root if p < 0 else nodes[p] for p in parents]
        top = step.drafter.token_ids(logits.topk(tree.top_k, dim=-1).indices)
        picked = top[rows_on, ranks_on]  # indices already on the device: no copy waits for the queue
        tokens[members_on] = picked
        for j, i in enumerate(members):
            parent_tokens = nodes[tree.parents[i]].tokens if tree.parents[i] >= 0 else no_tokens
            nodes[i] = _Node(torch.cat([parent_tokens, picked[j:j + 1]]), states[rows[j]])
    return tokens


# A draft's search written as a generator: it yields ``(depth, parents)`` whenever it needs the drafter's guesses under
# ``parents`` at ``depth``, is sent ``(states, logits)`` back (`StepDrafts.expand`), and returns its result. One
# sequence's search runs alone (`run_alone`); the rows of a batch run theirs in lockstep, each depth's guesses for
# every row computed in one call of the drafter (`run_together`).
Levels = Generator[tuple[int, list[_Node]], tuple[torch.Tensor, torch.Tensor], object]


def run_alone(step: StepDrafts, levels: Levels):
    """The result of one sequence's search ``levels``, each level expanded by ``step``."""
    try:
        request = next(levels)
        while True:
            request = levels.send(step.expand(*request))
    except StopIteration as done:
        return done.value


def run_together(steps: list[StepDrafts], searches: list[Levels]) -> list:
    """The results of several sequences' searches (one `StepDrafts` each, all of one drafter), run level by level with
    each depth's guesses for every sequence computed in one call of the drafter (`expand_together`)."""
    results: list = [None] * len(steps)
    requests: dict[int, tuple[int, list[_Node]]] = {}

    def advance(i: int, reply=None) -> None:
        try:
            requests[i] = next(searches[i]) if reply is None else searches[i].send(reply)
        except StopIteration as done:
            results[i] = done.value

    for i in range(len(steps)):
        advance(i)
    while requests:
        depth = min(depth for depth, _ in requests.values())
        members = [i for i, (d, _) in requests.items() if d == depth]
        replies = expand_together(depth, [steps[i] for i in members], [requests.pop(i)[1] for i in members])
        for i, reply in zip(members, replies):
            advance(i, reply)
    return results


def expand_together(depth: int, steps: list[StepDrafts], parents: list[list[_Node]]
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`StepDrafts.expand` of several sequences at one depth in one call of their drafter: what each sequence's heads
    read, the tokens above each node and the drafter's states are stacked, and the guesses split back. A drafter that
    attends to a context of its own per sequence (EAGLE-3's KV cache) expands each sequence apart."""
    if len(steps) == 1 or any(step.context is not None for step in steps):
        return [step.expand(depth, nodes) for step, nodes in zip(steps, parents)]
    drafter = steps[0].drafter
    if not drafter.reads_tokens:  # one call per depth serves every node of a sequence (`StepDrafts.expand`)
        StepDrafts.share_level(steps, depth)
        return [step.expand(depth, nodes) for step, nodes in zip(steps, parents)]
    counts = [len(nodes) for nodes in parents]
    hidden = torch.cat([step.hidden.expand(len(nodes), -1) for step, nodes in zip(steps, parents)])
    tokens = torch.cat([step._path_tokens(nodes) for step, nodes in zip(steps, parents)])
    previous = torch.stack([node.state for nodes in parents for node in nodes]) if depth > 0 else None
    states, logits = drafter.draft_level(depth, hidden, tokens, previous)
    return list(zip(states.split(counts), logits.split(counts)))


@lru_cache(maxsize=4096)
def _tree_of(paths: tuple[tuple[int, ...], ...]) -> TreeSpec:
    """One `TreeSpec` per shape, so its buffers are built once however often a dynamic tree recurs."""
    return TreeSpec.from_paths(paths)


def dynamic_selection(
    step: StepDrafts, settings: DynamicTree | Rescoring, max_depth: int, rescore: Rescore | None = None
) -> dict[tuple[int, ...], int]:
    """``{path of ranks: token}`` of the nodes EAGLE-2 would verify (see the module docstring), at most
    ``max_depth`` deep, in the order they were chosen: the first ``n`` entries are the tree of ``n`` nodes. Decoding,
    calibration and rescoring run this one search (`search_levels`)."""
    return run_alone(step, search_levels(step, settings, max_depth, rescore))


def search_levels(
    step: StepDrafts, settings: DynamicTree | Rescoring, max_depth: int, rescore: Rescore | None = None
) -> Levels:
    """`dynamic_selection` as `Levels`: each level's expansion is asked of the caller (`run_alone`, `run_together`).

    The search stays on the drafter's device and is read back once, at the end (each read would stall a GPU). Every
    level keeps a fixed number of frontier rows, so no shape depends on values: a child outside Clover's budget gets
    the score -inf instead of being left out, and so do its descendants. Ties go to the node drafted first (stable
    sorts over the drafting order: level by level, row by row), and since a path's score never exceeds its
    parent's, the ``nodes`` best of everything drafted form a tree without a check.

    With `Rescoring` settings each frontier node is extended by the depth's ``candidates`` best guesses
    (not ``top_k``), and ``rescore(paths, token_ids)`` (never positive) is added to their scores (lattice
    rescoring); it reads the frontier's paths on the host, once a level."""
    depth = min(settings.depth, max_depth)
    if depth < 1:
        return {}
    asked = getattr(settings, "candidates", settings.top_k)
    budgeted = isinstance(settings, DynamicTree) and settings.budgeted
    frontier: list[_Node] = [step.root]
    frontier_scores = step.hidden.new_zeros(1, dtype=torch.float32)
    frontier_index = torch.full((1,), -1, dtype=torch.long, device=step.hidden.device)  # into the drafted entries
    drafted_scores, drafted_tokens, drafted_parents, drafted_ranks = [], [], [], []
    count = 0
    for level in range(depth):
        states, logits = yield level, frontier
        top = torch.log_softmax(logits.float(), dim=-1).topk(min(asked, logits.shape[-1]), dim=-1)
        width = top.values.shape[-1]
        values, tokens = top.values, step.drafter.token_ids(top.indices)
        if budgeted:
            values = values.masked_fill(~node_budget(values, settings.top_p, settings.min_ratio), float("-inf"))
        if rescore is not None:
            values = values + rescore(_host_paths(frontier, level), tokens)
        scores = (values + frontier_scores[:, None]).flatten()
        tokens = tokens.flatten()
        drafted_scores.append(scores)
        drafted_tokens.append(tokens)
        drafted_parents.append(frontier_index.repeat_interleave(width))
        drafted_ranks.append(torch.arange(width, device=scores.device).repeat(len(frontier)))
        best = torch.sort(-scores, stable=True).indices[: settings.top_k]
        rows = best // width
        path_tokens = tokens[best][:, None] if level == 0 else torch.cat(
            [torch.stack([node.tokens for node in frontier])[rows], tokens[best][:, None]], dim=1)
        kept = states[rows]  # one gather: a 0-d index tensor per node would be read back (or launched) one by one
        frontier = [_Node(path_tokens[i], kept[i]) for i in range(best.shape[0])]
        frontier_scores, frontier_index = scores[best], count + best
        count += scores.shape[0]
    return _chosen_paths(torch.cat(drafted_scores), torch.cat(drafted_tokens), torch.cat(drafted_parents),
                         torch.cat(drafted_ranks), settings.nodes)


def _host_paths(frontier: list[_Node], level: int) -> list[tuple[int, ...]]:
    """The drafted tokens above each frontier node, on the host (what a `Rescore` reads)."""
    if level == 0:
        return [()]
    return [tuple(path) for path in torch.stack([node.tokens for node in frontier]).tolist()]


def _chosen_paths(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, ranks: torch.Tensor,
                  nodes: int) -> dict[tuple[int, ...], int]:
    """``{path of ranks: token}`` of the ``nodes`` best-scoring drafted entries with a finite score (each entry's
    parent is an index into the entries, -1 for the root), read back from the device in one copy."""
    chosen_entries = torch.sort(-scores, stable=True).indices[:nodes]
    entries, parents, ranks, tokens, finite = torch.stack([
        chosen_entries, parents[chosen_entries], ranks[chosen_entries], tokens[chosen_entries],
        scores[chosen_entries].isfinite().long(),
    ]).tolist()
    paths: dict[int, tuple[int, ...]] = {}  # drafted entry -> its path of ranks
    chosen: dict[tuple[int, ...], int] = {}
    for entry, parent, rank, token, ok in zip(entries, parents, ranks, tokens, finite):
        if not ok:
            break
        path = (*paths[parent], rank) if parent >= 0 else (rank,)
        paths[entry] = path
        chosen[path] = token
    return chosen


def node_budget(log_probs: torch.Tensor, top_p: float, min_ratio: float) -> torch.Tensor:
    """Clover's per-node budget: which of each row's children (``log_probs`` ``[nodes, k]``, best first) may
    be drafted: those whose better siblings hold less than ``top_p`` of the probability and that are at
    least ``min_ratio`` times as probable as the first (so the first always may)."""
    probs = log_probs.exp()
    before = probs.cumsum(dim=-1) - probs
    return (before < top_p) & (probs >= min_ratio * probs[:, :1])


def dynamic_draft(
    step: StepDrafts, settings: DynamicTree | Rescoring, max_depth: int, rescore: Rescore | None = None
) -> tuple[TreeSpec, torch.LongTensor] | None:
    """The tree `dynamic_selection` chooses, with its tokens in tree order (None when nothing fits)."""
    return chosen_tree(dynamic_selection(step, settings, max_depth, rescore), step.hidden.device)


def chosen_tree(chosen: dict[tuple[int, ...], int], device: torch.device) -> tuple[TreeSpec, torch.LongTensor] | None:
    """The tree of a dynamic search's ``chosen`` nodes, with its tokens in tree order on ``device`` (None for none)."""
    if not chosen:
        return None
    tree = _tree_of(tuple(sorted(chosen, key=lambda p: (len(p), p))))
    return tree, to_device([chosen[path] for path in tree.paths], device, torch.long)


def prime_roots(steps: list[StepDrafts]) -> None:
    """Compute depth 0 (what a head-entropy gate reads, `StepDrafts.root_logits`) for several sequences in one call
    of their drafter (each apart where the drafter attends to a context of its own per sequence)."""
    StepDrafts.share_level(steps, 0)
