"""The half of a calibration that travels with a checkpoint: what the drafter guessed at each position of the
calibration data (`PositionRecord`s, or `ChainPosition`s for a chain drafter), measured once on data.

Those records are all a fit needs from the data: the trees and the gate are chosen from them and from the machine's
costs (`calibration.machine`), which belong to the machine that decodes. `cerberus-hf calibrate --write` saves them
beside the heads as `POSITIONS_NAME` (and `save_pretrained` whenever the model holds them), so that a machine no
stored entry serves can fit its own settings on first use (`calibration.first_use`) without the data.

The file is safetensors: one tensor per field (``[positions]`` or ``[positions, heads]``), and the settings the
positions were collected with as JSON in its metadata; never pickle.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import torch
from safetensors import safe_open
from safetensors.torch import save

from ..blocks.rescoring import Rescoring
from ..blocks.tree import DynamicTree
from .positions import ChainPosition, PositionRecord

POSITIONS_NAME = "calibration_positions.safetensors"
_METADATA_KEY = "cerberus_calibration_positions"
_FORMAT = 1


@dataclass
class PositionStatistics:
    """The calibration positions of one checkpoint and the settings they were collected with: the ranks' depth
    (``top_k``), the largest static tree to consider (``max_nodes``), the dynamic tree drafted at every position
    (``probe``, None for a chain drafter), the per-node budgets tried with it, as (top_p, min_ratio), and the
    rescored trees (one per pair of weights)."""

    records: list  # PositionRecord (tree drafters) or ChainPosition (chain drafters), by sequence and position
    top_k: int = 10
    max_nodes: int = 63
    probe: DynamicTree | None = None
    budgets: tuple[tuple[float, float], ...] = ()
    rescorings: tuple[Rescoring, ...] = ()

    @property
    def chains(self) -> bool:
        """Whether these are a chain drafter's positions (`ChainPosition`)."""
        return isinstance(self.records[0], ChainPosition)

    @property
    def budget_trees(self) -> list[DynamicTree]:
        """The probe with each per-node budget."""
        return [replace(self.probe, top_p=top_p, min_ratio=min_ratio) for top_p, min_ratio in self.budgets]

    def to_bytes(self) -> bytes:
        """The file's contents (deterministic: the same statistics give the same bytes)."""
        metadata = {"format": _FORMAT, "kind": "chain" if self.chains else "tree", "top_k": self.top_k,
                    "max_nodes": self.max_nodes, "probe": self.probe and self.probe.to_dict(),
                    "budgets": [list(b) for b in self.budgets], "rescorings": [r.to_dict() for r in self.rescorings],
                    "signals": sorted(self.records[0].signals)}
        tensors = _chain_tensors(self.records) if self.chains else _tree_tensors(self)
        tensors["sequence"] = torch.tensor([r.sequence for r in self.records], dtype=torch.int32)
        for name in metadata["signals"]:
            tensors[f"signals.{name}"] = torch.tensor([r.signals[name] for r in self.records], dtype=torch.float64)
        return save(tensors, {_METADATA_KEY: json.dumps(metadata, sort_keys=True)})

    def save(self, folder: str | os.PathLike) -> str:
        """Write `POSITIONS_NAME` into ``folder``; returns its path."""
        path = os.path.join(folder, POSITIONS_NAME)
        with open(path, "wb") as handle:
            handle.write(self.to_bytes())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, num_heads: int, chains: bool) -> "PositionStatistics":
        """The statistics in the file at ``path``, for a drafter of ``num_heads`` heads that drafts chains or not;
        anything else is refused in one line."""
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = json.loads((handle.metadata() or {})[_METADATA_KEY])
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
            if metadata["format"] != _FORMAT:
                raise ValueError(f"format {metadata['format']}, this version reads {_FORMAT}")
            if (metadata["kind"] == "chain") != chains:
                raise ValueError(f"{metadata['kind']} positions, for a drafter that "
                                 f"{'drafts' if metadata['kind'] == 'chain' else 'does not draft'} chains")
            statistics = _from_tensors(metadata, tensors, num_heads)
        except Exception as error:  # a malformed file of any kind, said in one line
            raise ValueError(f"{path}: not calibration positions these heads can use ({type(error).__name__}: "
                             f"{error})".replace("\n", " ")) from None
        return statistics


def _tree_tensors(statistics: PositionStatistics) -> dict[str, torch.Tensor]:
    """A tree drafter's records as tensors: ranks, the probe's and each budget's and rescoring's order of the true
    path (with the nodes each budget drafted), and whether the top-1 block repeats a token."""
    records = statistics.records

    def table(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int16).reshape(len(records), -1)

    tensors = {"ranks": table([r.ranks for r in records]),
               "top_block_repeats": torch.tensor([r.top_block_repeats for r in records], dtype=torch.bool)}
    if statistics.probe is not None:
        tensors["dynamic_order"] = table([r.dynamic_order for r in records])
    for i, budget in enumerate(statistics.budgets):
        tensors[f"budgeted.{i}.order"] = table([r.budgeted[budget][0] for r in records])
        tensors[f"budgeted.{i}.nodes"] = torch.tensor([r.budgeted[budget][1] for r in records], dtype=torch.int32)
    for i, settings in enumerate(statistics.rescorings):
        key = (settings.weight, settings.lm_weight)
        tensors[f"rescored.{i}.order"] = table([r.rescored_order[key] for r in records])
        tensors[f"rescored.{i}.repeats"] = torch.tensor([r.rescored_block_repeats[key] for r in records],
                                                        dtype=torch.bool)
    return tensors


def _chain_tensors(records: list[ChainPosition]) -> dict[str, torch.Tensor]:
    """A chain drafter's records as tensors: each depth's draft probability and whether it was right."""
    return {"confidences": torch.tensor([r.confidences for r in records], dtype=torch.float64),
            "hits": torch.tensor([r.hits for r in records], dtype=torch.bool)}


def _from_tensors(metadata: dict, tensors: dict[str, torch.Tensor], num_heads: int) -> PositionStatistics:
    """`PositionStatistics.to_bytes` read back; a table of another width than ``num_heads`` is refused."""
    sequence = tensors["sequence"].tolist()
    signals = {name: tensors[f"signals.{name}"].tolist() for name in metadata["signals"]}
    count = len(sequence)
    if not count:
        raise ValueError("no position")
    for name, tensor in tensors.items():
        if tensor.shape[0] != count or (tensor.dim() == 2 and tensor.shape[1] != num_heads) or tensor.dim() > 2:
            raise ValueError(f"{name} has shape {list(tensor.shape)} for {count} positions of {num_heads} heads")

    def signals_at(i: int) -> dict[str, float]:
        return {name: values[i] for name, values in signals.items()}

    if metadata["kind"] == "chain":
        confidences, hits = tensors["confidences"].tolist(), tensors["hits"].tolist()
        return PositionStatistics([ChainPosition(confidences[i], hits[i], signals_at(i), sequence[i])
                                   for i in range(count)], metadata["top_k"], metadata["max_nodes"])
    probe = DynamicTree.from_dict(metadata["probe"], num_heads) if metadata["probe"] else None
    budgets = tuple((float(p), float(r)) for p, r in metadata["budgets"])
    rescorings = tuple(Rescoring.from_dict(r, num_heads) for r in metadata["rescorings"])
    ranks, repeats = tensors["ranks"].tolist(), tensors["top_block_repeats"].tolist()
    dynamic = tensors["dynamic_order"].tolist() if probe is not None else [None] * count
    budgeted = [(b, tensors[f"budgeted.{i}.order"].tolist(), tensors[f"budgeted.{i}.nodes"].tolist())
                for i, b in enumerate(budgets)]
    rescored = [((r.weight, r.lm_weight), tensors[f"rescored.{i}.order"].tolist(),
                 tensors[f"rescored.{i}.repeats"].tolist()) for i, r in enumerate(rescorings)]
    records = [PositionRecord(ranks[i], signals_at(i), dynamic[i],
                              budgeted={b: (order[i], nodes[i]) for b, order, nodes in budgeted},
                              rescored_order={k: order[i] for k, order, _ in rescored}, top_block_repeats=repeats[i],
                              rescored_block_repeats={k: flags[i] for k, _, flags in rescored}, sequence=sequence[i])
               for i in range(count)]
    return PositionStatistics(records, metadata["top_k"], metadata["max_nodes"], probe, budgets, rescorings)
