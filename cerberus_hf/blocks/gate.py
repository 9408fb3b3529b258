"""The entropy gate: per step, draft only when drafts are likely to be accepted.

Cerberus (arXiv 2410.13344) observes that the entropy of the base's next-token distribution is
negatively correlated with how many drafted tokens get accepted. When the gate's signal is at or above
its threshold, a step skips the draft and the multi-token verification and decodes one token, which
costs one plain forward.

Signals (lower means "more likely accepted", so every signal drafts when it is below the threshold):

* ``base_entropy``: entropy (nats) of the base's raw next-token distribution (the paper's choice);
* ``head_entropy``: entropy of the first draft head's distribution (needs the heads run first);
* ``base_top1``: one minus the base's top-1 probability.
"""

from __future__ import annotations

import math

import torch

from ..errors import check_number

GATE_SIGNALS = ("base_entropy", "head_entropy", "base_top1")


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` over the last dimension; 0 * log 0 counts as 0."""
    return torch.special.entr(torch.softmax(logits.float(), dim=-1)).sum(dim=-1)


def gate_signal(name: str, base_logits: torch.Tensor, first_head_logits: torch.Tensor | None = None) -> torch.Tensor:
    """The named signal from the base's raw next-token logits and, for ``head_entropy``, head 0's logits."""
    if name == "base_entropy":
        return entropy(base_logits)
    if name == "head_entropy":
        return entropy(first_head_logits)
    if name == "base_top1":
        return 1.0 - torch.softmax(base_logits.float(), dim=-1).amax(dim=-1)
    raise ValueError(f"Unknown gate signal {name!r}; expected one of {', '.join(GATE_SIGNALS)}.")


class EntropyGate:
    """Decides per step between drafting and plain decoding.

    ``threshold=None`` or ``+inf`` drafts on every step; ``0`` or ``-inf`` never drafts (no signal is
    negative); a value in between drafts when the signal is strictly below it.
    """

    def __init__(self, threshold: float | None, signal: str = "base_entropy"):
        check_number("gate_threshold", threshold, optional=True)  # not NaN, not a string
        if signal not in GATE_SIGNALS:
            raise ValueError(f"Unknown gate signal {signal!r}; expected one of {', '.join(GATE_SIGNALS)}.")
        self.threshold = None if threshold is None or threshold == math.inf else float(threshold)
        self.signal = signal

    @property
    def always_drafts(self) -> bool:
        return self.threshold is None

    @property
    def never_drafts(self) -> bool:
        return self.threshold is not None and self.threshold <= 0

    @property
    def needs_heads(self) -> bool:
        """Whether the signal reads the heads' output (so the heads run before the decision)."""
        return self.signal == "head_entropy" and not (self.always_drafts or self.never_drafts)

    def draft_rows(self, base_logits: torch.Tensor) -> torch.Tensor:
        """The decision for each row of ``base_logits`` ``[n, vocab]`` as a bool tensor, left on the device (a
        signal that reads the base's logits alone), so a caller reads it together with what else it reads."""
        return gate_signal(self.signal, base_logits) < self.threshold

    def should_draft(self, next_token_logits: torch.Tensor, first_head_logits: torch.Tensor | None = None) -> bool:
        if self.always_drafts:
            return True
        if self.never_drafts:
            return False
        return bool(gate_signal(self.signal, next_token_logits, first_head_logits).max() < self.threshold)
