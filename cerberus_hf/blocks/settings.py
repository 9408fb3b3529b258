"""What one `generate()` call decodes with, resolved in one place: the call's arguments, else the calibration stored
for this device, dtype and processor, else the heads' config.

`stored_settings` reads the defaults (one calibration entry over the config's values, as a plain dict that the
bench, the card and calibration also read); `resolve_settings` turns them and a call's overrides into one
`DecodingSettings`, the small typed object the loop and the candidate generator read. Loading a folder checks each
stored entry with the same function (`check_entry`), so what loads is what a call can use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError, check_int, check_number
from .acceptance import TypicalAcceptance
from .gate import EntropyGate
from .lookup import DEFAULT_MAX_NGRAM
from .packed import ONE_ROW_AS_IS
from .rescoring import Rescoring
from .tree import DynamicTree, TreeSpec

UNSET: Any = object()  # an argument the call did not give (None is a setting: "off")
TREE_KINDS = ("static", "dynamic", "rescored")


@dataclass(frozen=True)
class DecodingSettings:
    """The settings of one `generate()` call.

    Attributes:
        calibration: the stored entry the defaults came from (``None``: the config's).
        gate: decides per step whether to draft.
        tree: the static tree to draft (``None``: the chain of every head's top-1, unless ``dynamic`` is set).
        dynamic: the dynamic (EAGLE-2) or rescored tree grown each step instead, or ``None``.
        lookup_tokens: tokens prompt lookup may graft into each draft (0: off); ``lookup_ngram``: the longest
            suffix n-gram it matches.
        exit_confidence: a chain drafter's draft ends after a token drafted below this probability.
        typical: Medusa's (lossy) typical acceptance, or ``None`` (lossless).
        strict_rows: strict verification's most positions per forward, or ``None`` (batched verification).
    """

    calibration: str | None
    gate: EntropyGate
    tree: TreeSpec | None
    dynamic: DynamicTree | Rescoring | None
    lookup_tokens: int = 0
    lookup_ngram: int = DEFAULT_MAX_NGRAM
    exit_confidence: float = 0.0
    typical: TypicalAcceptance | None = None
    strict_rows: int | None = None

    @property
    def rescoring(self) -> Rescoring | None:
        return self.dynamic if isinstance(self.dynamic, Rescoring) else None

    def most_positions(self, num_heads: int) -> int:
        """The most positions one verification of these settings computes: the root, the largest draft (the grown
        tree's budget, the static tree, else a chain through ``num_heads``) and the copied tokens grafted below."""
        nodes = (self.dynamic.nodes if self.dynamic is not None
                 else len(self.tree.paths) if self.tree is not None else num_heads)
        return 1 + nodes + self.lookup_tokens


def stored_settings(entry: dict, config: Any, calibration: str | None = None) -> dict:
    """The defaults of a call: a calibration ``entry`` (`cerberus-hf calibrate`; ``{}`` for none) over ``config``'s
    values, as a dict with every key (``"calibration"`` names the entry)."""
    return {
        "calibration": calibration,
        "gate_threshold": entry.get("gate_threshold", config.gate_threshold),
        "gate_signal": entry.get("gate_signal", config.gate_signal),
        "draft_tree": entry.get("draft_tree", config.draft_tree),
        "dynamic_tree": entry.get("dynamic_tree", config.dynamic_tree),
        "tree_kind": entry.get("tree_kind", "dynamic" if config.dynamic_tree else "static"),
        "rescoring": entry.get("rescoring"),
        "rescoring_options": entry.get("rescoring_options", {}),
        "prompt_lookup_num_tokens": entry.get("prompt_lookup_num_tokens", config.prompt_lookup_num_tokens),
        "exit_confidence": entry.get("exit_confidence", config.exit_confidence),
        # False: unpacked was faster here; ONE_ROW_AS_IS: packed, one row through the weight as it is (None: pack)
        "packed_weights": entry.get("packed_weights"),
    }


def resolve_settings(
    stored: dict,
    num_heads: int,
    *,
    gate_threshold: float | None = UNSET,
    draft_tree: list[list[int]] | None = UNSET,
    dynamic_tree: dict | DynamicTree | None = UNSET,
    rescoring: dict | Rescoring | None = UNSET,
    lookup_tokens: int | None = None,
    lookup_ngram: int = DEFAULT_MAX_NGRAM,
    exit_confidence: float | None = None,
    typical: TypicalAcceptance | bool = False,
    strict_rows: int | None = None,
    has_rescorers: Callable[[dict | Rescoring], bool] = lambda rescoring: True,
) -> DecodingSettings:
    """One call's `DecodingSettings`: each argument the call gave, else ``stored`` (`stored_settings`).

    A call that names only ``draft_tree`` drafts that static tree; the stored rescored tree is used only where
    ``has_rescorers`` says the model has what it weighs (an n-gram model, a small LM). A call's explicit
    ``rescoring`` that needs a missing rescorer is refused."""
    check_int("prompt_lookup_num_tokens", lookup_tokens, 0, optional=True)
    check_number("exit_confidence", exit_confidence, 0.0, 1.0, optional=True)
    gate = EntropyGate(stored["gate_threshold"] if gate_threshold is UNSET else gate_threshold, stored["gate_signal"])
    paths = stored["draft_tree"] if draft_tree is UNSET else draft_tree
    tree = TreeSpec.from_paths(paths, num_heads) if paths is not None else None
    if rescoring is UNSET:
        use = draft_tree is UNSET and dynamic_tree is UNSET and stored["tree_kind"] == "rescored"
        rescoring = stored["rescoring"] if use and stored["rescoring"] is not None and has_rescorers(
            stored["rescoring"]) else None
    rescoring = _grown_tree(Rescoring, rescoring, num_heads)
    if dynamic_tree is UNSET:
        use = draft_tree is UNSET and stored["tree_kind"] == "dynamic"
        dynamic_tree = stored["dynamic_tree"] if use else None
    dynamic_tree = _grown_tree(DynamicTree, dynamic_tree, num_heads)
    return DecodingSettings(
        calibration=stored["calibration"],
        gate=gate,
        tree=tree,
        dynamic=rescoring if rescoring is not None else dynamic_tree,
        lookup_tokens=(stored["prompt_lookup_num_tokens"] if lookup_tokens is None else lookup_tokens) or 0,
        lookup_ngram=lookup_ngram,
        exit_confidence=float(exit_confidence if exit_confidence is not None else stored["exit_confidence"] or 0.0),
        typical=_typical(typical),
        strict_rows=strict_rows,
    )


def _grown_tree(cls: type, value: Any, num_heads: int) -> Any:
    """``value`` (a call's or a stored ``dynamic_tree`` / ``rescoring``) as a ``cls``: None and a ``cls`` as they
    are, anything else checked as a dict (`tree.tree_settings_from_dict`, one line with a valid example)."""
    return value if value is None or isinstance(value, cls) else cls.from_dict(value, num_heads)


def _typical(value: Any) -> TypicalAcceptance | None:
    """A call's ``typical_acceptance`` (True, False, None or a `TypicalAcceptance`) as the setting it means."""
    if value is True:
        return TypicalAcceptance()
    if value is None or value is False or isinstance(value, TypicalAcceptance):
        return value or None
    raise UserError(f"typical_acceptance must be True, False or a TypicalAcceptance, e.g. "
                    f"typical_acceptance=TypicalAcceptance(epsilon=0.09, alpha=0.3); got {value!r}.")


def check_entry(entry: Any, config: Any) -> None:
    """Refuse a stored calibration entry a call could not use: it is resolved as a call resolves it (every tree
    kind it holds, each stored rescoring option too)."""
    if not isinstance(entry, dict):
        raise ValueError(f"settings must be a mapping, got {type(entry).__name__}")
    stored = stored_settings(entry, config)
    if stored["tree_kind"] not in TREE_KINDS:
        raise ValueError(f"tree_kind must be static, dynamic or rescored, got {stored['tree_kind']!r}")
    check_int("prompt_lookup_num_tokens", stored["prompt_lookup_num_tokens"], 0, optional=True)
    packing = stored["packed_weights"]
    if not (packing is None or isinstance(packing, bool) or packing == ONE_ROW_AS_IS):
        raise ValueError(f"packed_weights must be true, false, {ONE_ROW_AS_IS!r} or null, got "
                         f"{stored['packed_weights']!r}")
    for kind in TREE_KINDS:
        resolve_settings({**stored, "tree_kind": kind}, config.num_heads)
    for options in (stored["rescoring_options"] or {}).values():
        resolve_settings(stored, config.num_heads, rescoring=options)
