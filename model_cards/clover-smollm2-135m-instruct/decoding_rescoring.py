"""Lattice rescoring: choose which of the heads' guesses to verify with an n-gram model's help.

Parallel heads (Medusa, Cerberus) guess each depth on its own, so the paths through their top-k
"lattice" include incoherent ones (a token repeated, two continuations spliced). Kim et al. (2024) rescore
the lattice with a language model before verification. Here the lattice is searched as the dynamic tree
searches it (`drafting.dynamic_selection`): level by level, every frontier path is extended by each of the
depth's ``candidates`` best guesses, scored by

    score(path + x) = score(path) + log p_head(x) + weight * log p_ngram(x | context, path),

the ``top_k`` best extensions form the next frontier, and the ``nodes`` best paths drafted (scores only
fall along a path, so they form a tree) are verified together in one forward, prefixes shared. With
``weight = 0`` this is the plain dynamic tree over the same lattice. The n-gram context is the end of
the sequence so far followed by the path's own drafted tokens. Rescoring only chooses what is verified:
the emitted tokens are still the base's own. ``weight``, ``nodes`` and ``candidates`` are fitted by
``cerberus-hf calibrate`` on held-out data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch

from .decoding_ngram import NgramModel
from .decoding_tree import tree_settings_from_dict

Rescore = Callable[[list[tuple[int, ...]], torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Rescoring:
    """Lattice-rescoring settings: verify the ``nodes`` best paths at most ``depth`` deep; extend ``top_k``
    paths per level by each depth's ``candidates`` best guesses; weigh the n-gram's log-probability by
    ``weight``."""

    nodes: int
    depth: int
    top_k: int = 4
    candidates: int = 8
    weight: float = 0.5

    @classmethod
    def from_dict(cls, value: dict, num_heads: int | None = None) -> "Rescoring":
        return tree_settings_from_dict(cls, "rescoring", value, num_heads)

    def to_dict(self) -> dict:
        return asdict(self)


def ngram_rescore(model: NgramModel, history: torch.LongTensor, weight: float) -> Rescore:
    """The score `drafting.dynamic_selection` adds to each candidate: ``weight`` times its n-gram
    log-probability after ``history`` (the sequence so far, 1-D) and the path drafted above it."""
    context = history[max(history.numel() - (model.order - 1), 0):].to(model.device)

    def rescore(paths: list[tuple[int, ...]], candidates: torch.Tensor) -> torch.Tensor:
        drafted = torch.tensor(paths, dtype=torch.long, device=model.device).reshape(len(paths), -1)
        contexts = torch.cat([context.expand(len(paths), -1), drafted], dim=1)
        return weight * model.log_probs(contexts, candidates).to(candidates.device)

    return rescore


def repeats_a_token(tokens: list[int]) -> bool:
    """Whether a block repeats a token at consecutive depths (the failure rescoring is meant to fix)."""
    return any(a == b for a, b in zip(tokens, tokens[1:]))
