"""The entropy gate: per step, draft only when the base is confident enough for drafts to be accepted.

Cerberus (arXiv 2410.13344) observes that the entropy of the base's next-token distribution is
negatively correlated with how many drafted tokens get accepted. Above a threshold a step skips the
heads and the multi-token verification and decodes one token, which costs one plain forward.
"""

from __future__ import annotations

import math

import torch


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` over the last dimension; 0 * log 0 counts as 0."""
    return torch.special.entr(torch.softmax(logits.float(), dim=-1)).sum(dim=-1)


class EntropyGate:
    """Decides per step between drafting and plain decoding.

    ``threshold=None`` or ``+inf`` drafts on every step; ``0`` or ``-inf`` never drafts (entropy is never
    negative); a value in between drafts when the entropy of the base's raw next-token distribution is
    strictly below it.
    """

    def __init__(self, threshold: float | None):
        if threshold is not None and math.isnan(threshold):
            raise ValueError("gate_threshold must be a number, None or inf, not NaN.")
        self.threshold = None if threshold is None or threshold == math.inf else float(threshold)

    @property
    def always_drafts(self) -> bool:
        return self.threshold is None

    @property
    def never_drafts(self) -> bool:
        return self.threshold is not None and self.threshold <= 0

    def should_draft(self, next_token_logits: torch.Tensor) -> bool:
        if self.always_drafts:
            return True
        if self.never_drafts:
            return False
        return bool(entropy(next_token_logits).max() < self.threshold)
