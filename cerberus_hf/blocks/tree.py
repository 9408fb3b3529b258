"""Draft trees: which head guesses are verified together, and the buffers verification needs.

A tree is a list of paths in Medusa's convention: ``(0,)`` is head 0's top-1 guess, ``(0, 1)`` is head 1's
top-2 guess placed after head 0's top-1, and so on; every prefix of a path must itself be a path. A
chain of ``n`` heads is ``(0,), (0, 0), ..., (0,) * n``. Node ``i`` of the tree is fed to the base at input
position ``i + 1`` (position 0 is the last accepted token, the root), at sequence position
``past + depth``, and may attend to the root, its ancestors and itself.

A draft may also carry tokens copied from the context (prompt lookup): they hang below a node as a chain
whose path entries are ``CONTEXT_RANK`` (``(0, -1, -1)``: head 0's top-1, then two copied tokens). Such
trees are built per step by `graft_chain` and are never stored in a config.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from functools import cached_property, lru_cache
from typing import ClassVar, NamedTuple

import torch

from ..errors import UserError
from .transfer import to_device

CONTEXT_RANK = -1  # path entry of a token copied from the context rather than guessed by a head
TREE_EXAMPLE = "draft_tree=[[0], [0, 0], [1]]"  # a valid tree, quoted by the errors of a bad one


@dataclass(frozen=True)
class TreeSpec:
    """A validated tree shape with its precomputed index buffers (built once per shape)."""

    paths: tuple[tuple[int, ...], ...]

    @classmethod
    def from_paths(cls, paths, num_heads: int | None = None) -> "TreeSpec":
        """The tree of ``paths`` (a ``draft_tree`` from a call, a config or a calibration), checked before use: a
        malformed one is a `UserError` naming ``draft_tree`` and showing a valid tree."""
        if not _is_list(paths) or not all(_is_list(p) and all(_is_rank(r) for r in p) for p in paths):
            raise UserError(f"draft_tree must be a list of paths, each a list of ranks (integers >= 0), e.g. "
                            f"{TREE_EXAMPLE}; got {paths!r}.")
        normalized = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        if not normalized:
            raise UserError("draft_tree needs at least one path, e.g. draft_tree=[[0]].")
        known = set(normalized)
        for path in normalized:
            if not path or min(path) < 0:
                raise UserError(f"draft_tree path {list(path)} is invalid: paths are non-empty lists of ranks >= 0, "
                                f"e.g. {TREE_EXAMPLE}.")
            if len(path) > 1 and path[:-1] not in known:
                raise UserError(f"draft_tree path {list(path)} has no parent path {list(path[:-1])} in the tree: every "
                                f"prefix of a path is a path too, e.g. {TREE_EXAMPLE}.")
            if num_heads is not None and len(path) > num_heads:
                raise UserError(f"draft_tree path {list(path)} is {len(path)} deep but there are only {num_heads} "
                                "heads.")
        return cls(tuple(normalized))

    @classmethod
    def chain(cls, depth: int) -> "TreeSpec":
        return cls(tuple((0,) * d for d in range(1, depth + 1)))

    def __len__(self) -> int:
        return len(self.paths)

    @cached_property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @cached_property
    def is_chain(self) -> bool:
        """One path: node i is node i-1's only child (then the model's causal mask is the tree mask)."""
        return self.parents == list(range(-1, len(self.paths) - 1))

    @cached_property
    def parents(self) -> list[int]:
        """Parent node of each node, -1 for children of the root."""
        index = {p: i for i, p in enumerate(self.paths)}
        return [index[p[:-1]] if len(p) > 1 else -1 for p in self.paths]

    @cached_property
    def children(self) -> list[list[int]]:
        """Children of the root (entry 0) and of node i (entry i + 1), in rank order."""
        out: list[list[int]] = [[] for _ in range(len(self.paths) + 1)]
        for node, parent in enumerate(self.parents):
            out[parent + 1].append(node)
        return out

    @cached_property
    def top_k(self) -> int:
        return max(p[-1] for p in self.paths) + 1

    @cached_property
    def position_offsets(self) -> torch.Tensor:
        """Offsets from the root's sequence position: 0 for the root, the depth for each node."""
        return torch.tensor([0] + [len(p) for p in self.paths])

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """[n+1, n+1] bool: row attends to column (root, ancestors, itself)."""
        n = len(self.paths) + 1
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[:, 0] = True
        for node in range(len(self.paths)):
            row, cursor = node + 1, node
            while cursor >= 0:
                mask[row, cursor + 1] = True
                cursor = self.parents[cursor]
        return mask

    @cached_property
    def parent_positions(self) -> torch.Tensor:
        """[n] each node's parent's position among the fed tokens (0: the root, node ``i``: ``i + 1``)."""
        return torch.tensor([parent + 1 for parent in self.parents], dtype=torch.long)

    @cached_property
    def earlier_siblings(self) -> torch.Tensor:
        """[n, n] bool: column ``j`` is a sibling of node ``i`` (row) listed before it."""
        parents = torch.tensor(self.parents)
        n = len(self.parents)
        return (parents[:, None] == parents[None, :]) & torch.ones(n, n, dtype=torch.bool).tril(-1)

    @cached_property
    def levels(self) -> list[tuple[list[int], list[int], list[int]]]:
        """Per depth: its nodes, their parents without repeats (-1: the root) in order, and each node's parent's row
        in that list (what a drafter expanding the parents returns one row of guesses for)."""
        out = []
        for depth in range(1, self.depth + 1):
            members = [i for i, path in enumerate(self.paths) if len(path) == depth]
            parents = list(dict.fromkeys(self.parents[i] for i in members))
            row = {parent: r for r, parent in enumerate(parents)}
            out.append((members, parents, [row[self.parents[i]] for i in members]))
        return out

    @cached_property
    def level_paths(self) -> list[list[list[int]]]:
        """Per depth: for each of its nodes (in `levels` order), the nodes from its depth-1 ancestor down to itself,
        whose drafted tokens follow the sequence when that node is reached."""
        out = []
        for members, _, _ in self.levels:
            paths = []
            for node in members:
                path = [node]
                while self.parents[path[0]] >= 0:
                    path.insert(0, self.parents[path[0]])
                paths.append(path)
            out.append(paths)
        return out

    def level_paths_on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """`level_paths` as one ``[nodes, depth]`` index tensor per depth on ``device``, copied once per device."""
        cached = self._on.get(("paths", device))
        if cached is None:
            cached = self._on[("paths", device)] = tuple(to_device(p, device, torch.long) for p in self.level_paths)
        return cached

    def on(self, device: torch.device) -> "_TreeTensors":
        """The tensors decoding reads (`position_offsets`, `ancestor_mask`, what greedy acceptance compares, each
        depth's node, row and rank indices) on ``device``: copied there once per tree and device, without a wait."""
        cached = self._on.get(device)
        if cached is None:
            levels = tuple(
                tuple(to_device(index, device, torch.long)
                      for index in (members, rows, [self.paths[i][-1] for i in members]))
                for members, _, rows in self.levels)
            cached = self._on[device] = _TreeTensors(
                to_device(self.parent_positions, device), to_device(self.earlier_siblings, device),
                to_device(self.ancestor_mask, device), to_device(self.position_offsets, device), levels)
        return cached

    @cached_property
    def _on(self) -> dict:
        return {}

    @cached_property
    def first_path(self) -> list[int]:
        """Nodes reached by always taking the first child: the heads' top-1 chain, or the copied chain."""
        nodes, children = [], self.children[0]
        while children:
            nodes.append(children[0])
            children = self.children[children[0] + 1]
        return nodes

    def truncated(self, max_depth: int) -> "TreeSpec | None":
        """The tree without nodes deeper than ``max_depth`` (None when nothing is left)."""
        if max_depth >= self.depth:
            return self
        kept = tuple(p for p in self.paths if len(p) <= max_depth)
        return TreeSpec(kept) if kept else None

    def attention_mask(self, past_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Additive 4D mask [1, 1, n+1, past + n+1]: the whole past is visible, the tree part by ancestry."""
        n = len(self.paths) + 1
        mask = torch.zeros(1, 1, n, past_length + n, dtype=dtype, device=device)
        blocked = ~self.on(device).ancestor_mask
        mask[0, 0, :, past_length:].masked_fill_(blocked, torch.finfo(dtype).min)
        return mask


class _TreeTensors(NamedTuple):
    parent_positions: torch.Tensor
    earlier_siblings: torch.Tensor
    ancestor_mask: torch.Tensor  # the root's row and column included; `node_ancestors` is the nodes' part
    position_offsets: torch.Tensor
    levels: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]  # per depth: nodes, parent rows, ranks

    @property
    def node_ancestors(self) -> torch.Tensor:
        return self.ancestor_mask[1:, 1:]


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2-style tree settings: verify the ``nodes`` most probable of the paths grown ``depth`` deep,
    expanding the ``top_k`` best children of the ``top_k`` best nodes per level.

    ``top_p`` and ``min_ratio`` add Clover's per-node budget: of each node's children only those within a
    cumulative draft probability of ``top_p`` (the most probable always) and at least ``min_ratio`` times
    as probable as the most probable are drafted. A confident step then verifies fewer than ``nodes``
    nodes, where a cost curve that rises with every node pays for it; an unsure one spends the budget on
    its alternatives. The defaults (1.0, 0.0) draft every child."""

    nodes: int
    depth: int
    top_k: int = 4
    top_p: float = 1.0
    min_ratio: float = 0.0
    EXAMPLE: ClassVar[dict] = {"nodes": 16, "depth": 4, "top_k": 4}  # quoted by the errors of a bad dict

    def __post_init__(self):
        # non-numbers are left to tree_settings_from_dict's messages
        if isinstance(self.top_p, (int, float)) and not 0.0 < self.top_p <= 1.0:
            raise UserError(f"dynamic_tree top_p must be in (0, 1], got {self.top_p!r}.")
        if isinstance(self.min_ratio, (int, float)) and not 0.0 <= self.min_ratio <= 1.0:
            raise UserError(f"dynamic_tree min_ratio must be in [0, 1], got {self.min_ratio!r}.")

    @property
    def budgeted(self) -> bool:
        """Whether the per-node budget removes any child."""
        return self.top_p < 1.0 or self.min_ratio > 0.0

    @classmethod
    def from_dict(cls, value: dict, num_heads: int | None = None) -> "DynamicTree":
        return tree_settings_from_dict(cls, "dynamic_tree", value, num_heads)

    def to_dict(self) -> dict:
        """The settings; the budget's fields only where set, so a tree without one is stored as before."""
        values = asdict(self)
        if not self.budgeted:
            del values["top_p"], values["min_ratio"]
        return values


def tree_settings_from_dict(cls: type, label: str, value, num_heads: int | None = None):
    """``cls(**value)`` for a dataclass of grown-tree settings (`DynamicTree`, `rescoring.Rescoring`) read
    from a config or a call, named ``label`` in errors. A value that is no dict, a missing or unknown key, an
    ``int`` field below 1, a ``float`` field below 0 and a depth beyond ``num_heads`` heads are refused with a
    `UserError` that quotes a valid dict (``cls.EXAMPLE``), so a call fails before it decodes, in one line."""
    example = f"e.g. {label}={_example(cls, num_heads)}"
    if not isinstance(value, Mapping):
        raise UserError(f"{label} must be a dict, a {cls.__name__} or None, {example}; got {value!r}.")
    names = [f.name for f in fields(cls)]
    unknown = set(value) - set(names)
    if unknown:
        raise UserError(f"{label} has unknown keys {sorted(unknown)}; expected {', '.join(names)}, {example}.")
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in value]
    if missing:
        raise UserError(f"{label} is missing {', '.join(map(repr, missing))}, {example}.")
    for f in fields(cls):  # the annotations are strings (postponed evaluation)
        number = value.get(f.name, f.default)
        if f.type == "int" and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
            raise UserError(f"{label} {f.name} must be an integer >= 1, got {number!r}, {example}.")
        if f.type == "float" and (isinstance(number, bool) or not isinstance(number, (int, float)) or not number >= 0):
            raise UserError(f"{label} {f.name} must be a number >= 0, got {number!r}, {example}.")
    settings = cls(**value)
    if num_heads is not None and settings.depth > num_heads:
        raise UserError(f"{label} depth {settings.depth} exceeds the {num_heads} heads, {example}.")
    return settings


def _example(cls: type, num_heads: int | None) -> dict:
    """``cls.EXAMPLE``, no deeper than ``num_heads`` heads (when known)."""
    return {**cls.EXAMPLE, "depth": min(cls.EXAMPLE["depth"], num_heads or cls.EXAMPLE["depth"])}


def _is_list(value) -> bool:
    """Whether ``value`` is a list-like sequence (a tuple too), not a string."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _is_rank(value) -> bool:
    """Whether ``value`` is an integer (not a bool): a rank of a tree path (its range is checked by the caller)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@lru_cache(maxsize=1024)
def graft_chain(tree: TreeSpec | None, below: tuple[int, ...], length: int) -> TreeSpec:
    """``tree`` (None: no head nodes) with a chain of ``length`` copied-context nodes appended below the
    node whose path is ``below`` (``()``: the root). The new nodes come last, parents before children, so
    the tree's existing buffers keep their meaning; shapes repeat from step to step, hence the cache."""
    if length < 1:
        raise ValueError(f"A grafted chain needs at least one node, got {length}.")
    existing = tree.paths if tree is not None else ()
    if below and below not in existing:
        raise ValueError(f"Cannot graft below {list(below)}: no such node in the tree.")
    return TreeSpec(existing + tuple(below + (CONTEXT_RANK,) * k for k in range(1, length + 1)))
