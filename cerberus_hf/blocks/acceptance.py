"""Which token a verification position emits: the rule that decides what drafts are kept.

Exact rules (the default) pick every emitted token exactly as plain decoding would at that prefix (argmax,
or a sample from the processed distribution) and keep a drafted child only if it equals that token.
Greedy output is therefore identical, and sampled output is distributed as the base's: drafts only
decide how many of those tokens one forward pass yields.

Typical acceptance (Medusa, Cai et al. 2024) is an explicit opt-in that is NOT lossless: with sampling it
keeps the first drafted child whose probability exceeds ``min(epsilon, alpha * exp(-H(p)))`` instead of
sampling, trading the base's distribution for longer accepted runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gate import entropy
from .transfer import to_device


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance: keep a draft if ``p(x) > min(epsilon, alpha * exp(-H(p)))``."""

    epsilon: float = 0.09
    alpha: float = 0.3

    def threshold(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.alpha * torch.exp(-entropy(probs.log())), max=self.epsilon)


def pick_token(
    scores: torch.Tensor,
    do_sample: bool,
    drafted: list[int],
    typical: TypicalAcceptance | None = None,
) -> torch.LongTensor:
    """The token ([1, 1]) emitted at a position with processed ``scores`` ([1, vocab]) and drafted
    children ``drafted`` (token ids, in rank order)."""
    if not do_sample:
        return scores.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(scores, dim=-1)
    if typical is not None and drafted:
        threshold = typical.threshold(probs)
        for token in drafted:
            if probs[0, token] > threshold:
                return to_device([[token]], scores.device, torch.long)
    return torch.multinomial(probs, num_samples=1)
