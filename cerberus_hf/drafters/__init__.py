"""Drafter families, each in its own module as the small part that differs from `base.Drafter`.

Adding a family of heads: a module here with a `Drafter` subclass (``drafter_type``, ``reads_tokens``,
`head_state`, and `make_block` if its blocks take more inputs; `readout` if the projection reads part of a
head's state; `window_rows` and `read_window` with ``context_window`` if the heads read the sequence before
``t``), its name in `DRAFTER_CLASSES` below and in
`configuration_cerberus.HEAD_TYPES`. Decoding, calibration, training, the bench and the cards then work
for it unchanged. A drafter that drafts through the base itself (Kangaroo) sets ``drafts_chains`` and
implements `Drafter.start` / `Drafter.draft_chain` instead of `head_state`.
"""

from __future__ import annotations

from ..configuration_cerberus import HEAD_TYPES, CerberusConfig
from .base import Drafter, ResidualBlock
from .cerberus import CerberusDrafter
from .clover import CloverDrafter
from .dflash import DFlashDrafter
from .eagle3 import Eagle3Drafter
from .hydra import HydraDrafter
from .kangaroo import KangarooDrafter
from .medusa import MedusaDrafter
from .mtp import MtpDrafter

DRAFTER_CLASSES: dict[str, type[Drafter]] = {
    cls.drafter_type: cls for cls in (MedusaDrafter, CerberusDrafter, HydraDrafter, KangarooDrafter, CloverDrafter,
                                          Eagle3Drafter, DFlashDrafter, MtpDrafter)
}
assert tuple(DRAFTER_CLASSES) == HEAD_TYPES, "configuration_cerberus.HEAD_TYPES must list every family"


def build_drafter(config: CerberusConfig) -> Drafter:
    """The drafter a config describes, freshly initialised (not yet attached to a base)."""
    if config.head_type not in DRAFTER_CLASSES:
        raise ValueError(f"Unknown head_type {config.head_type!r}; expected one of {', '.join(DRAFTER_CLASSES)}.")
    if config.hidden_size is None or config.vocab_size is None:
        raise ValueError("CerberusConfig needs hidden_size and vocab_size (taken from the base) to build heads.")
    return DRAFTER_CLASSES[config.head_type](config)


__all__ = ["DRAFTER_CLASSES", "CerberusDrafter", "CloverDrafter", "DFlashDrafter", "Drafter", "Eagle3Drafter",
           "HydraDrafter", "KangarooDrafter", "MedusaDrafter", "MtpDrafter", "ResidualBlock", "build_drafter"]
