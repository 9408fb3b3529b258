"""Lattice rescoring: choose which of the heads' guesses to verify with a language model's help.

Parallel heads (Medusa, Cerberus) guess each depth on its own, so the paths through their top-k
"lattice" include incoherent ones (a token repeated, two continuations spliced). Kim et al. (2024) rescore
the lattice with a language model before verification. Here the lattice is searched as the dynamic tree
searches it (`drafting.dynamic_selection`): level by level, every frontier path is extended by each of the
depth's ``candidates`` best guesses, scored by

    score(path + x) = score(path) + log p_head(x) + weight * log p_ngram(x | context, path)
                                                  + lm_weight * log p_lm(x | context, path),

the ``top_k`` best extensions form the next frontier, and the ``nodes`` best paths drafted (scores only
fall along a path, so they form a tree) are verified together in one forward, prefixes shared. With both
weights 0 this is the plain dynamic tree over the same lattice. Two rescorers are offered:

* global: an n-gram model over token ids (`ngram.NgramModel`), whose context is the end of the sequence so
  far followed by the path's own drafted tokens; a few vectorised lookups per depth;
* local, neural: a small causal LM sharing the base's tokenizer that reads the whole sequence and the path,
  here a Kangaroo drafter (the base's first layers, an adapter and the base's lm_head over the draft
  vocabulary; `drafters.kangaroo.PathScorer`): one forward of its few layers per depth, over the frontier's
  new nodes under a tree mask. Tokens outside its draft vocabulary get the least probability it gives.

Rescoring only chooses what is verified: the emitted tokens are still the base's own. The weights,
``nodes`` and ``candidates`` are fitted by ``cerberus-hf calibrate`` on held-out data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, ClassVar

import torch

from .ngram import NgramModel
from .transfer import to_device
from .tree import tree_settings_from_dict

Rescore = Callable[[list[tuple[int, ...]], torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Rescoring:
    """Lattice-rescoring settings: verify the ``nodes`` best paths at most ``depth`` deep; extend ``top_k``
    paths per level by each depth's ``candidates`` best guesses; weigh the n-gram's log-probability by
    ``weight`` and the neural rescorer's by ``lm_weight``."""

    nodes: int
    depth: int
    top_k: int = 4
    candidates: int = 8
    weight: float = 0.5
    lm_weight: float = 0.0
    EXAMPLE: ClassVar[dict] = {"nodes": 16, "depth": 4, "weight": 0.5}  # quoted by the errors of a bad dict

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
        drafted = to_device(paths, model.device, torch.long).reshape(len(paths), -1)
        contexts = torch.cat([context.expand(len(paths), -1), drafted], dim=1)
        return weight * model.log_probs(contexts, candidates).to(candidates.device)

    return rescore


def lm_rescore(scorer, index_of: torch.Tensor | None, weight: float) -> Rescore:
    """``weight`` times each candidate's log-probability under a neural rescorer's ``scorer``
    (`drafters.base.Drafter.path_scorer`) after the path drafted above it. ``index_of`` maps a token id to
    its index in the rescorer's draft vocabulary (-1: not in it; None: the full vocabulary)."""

    def rescore(paths: list[tuple[int, ...]], candidates: torch.Tensor) -> torch.Tensor:
        log_probs = scorer.log_probs(paths)  # [n, V]
        if index_of is None:
            return weight * log_probs.gather(1, candidates.to(log_probs.device)).to(candidates.device)
        index = index_of[candidates.to(index_of.device)].to(log_probs.device)
        picked = log_probs.gather(1, index.clamp(min=0))
        floor = log_probs.min(dim=1, keepdim=True).values  # a token it never drafts: its least likely one
        return weight * torch.where(index >= 0, picked, floor).to(candidates.device)

    return rescore


def lattice_rescore(settings: Rescoring, history: torch.LongTensor, ngram: NgramModel | None, scorer,
                    index_of: torch.Tensor | None) -> Rescore | None:
    """What `drafting.dynamic_selection` adds to each candidate under ``settings``: the n-gram's term after
    ``history`` where ``weight`` is above 0, plus the LM ``scorer``'s (`lm_rescore`) where ``lm_weight`` is
    above 0 and there is a scorer this step; None when neither applies (the plain lattice)."""
    parts = []
    if settings.weight > 0:
        parts.append(ngram_rescore(ngram, history, settings.weight))
    if settings.lm_weight > 0 and scorer is not None:
        parts.append(lm_rescore(scorer, index_of, settings.lm_weight))
    if len(parts) < 2:
        return parts[0] if parts else None
    return lambda paths, candidates: sum(rescore(paths, candidates) for rescore in parts)


def repeats_a_token(tokens: list[int]) -> bool:
    """Whether a block repeats a token at consecutive depths (the failure rescoring is meant to fix)."""
    return any(a == b for a, b in zip(tokens, tokens[1:]))
