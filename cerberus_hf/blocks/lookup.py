"""Prompt lookup: draft tokens copied from earlier in the sequence.

Answers often repeat their prompt or themselves (names, code, lists). When the last few tokens occurred
before, the tokens that followed them then are a cheap guess for what follows now. The heads guess from
the hidden state and miss exactly these copies, so the candidate generator grafts the copied chain into
the heads' tree (`tree.graft_chain`); verification decides, so output is unchanged.
"""

from __future__ import annotations

import torch

DEFAULT_MAX_NGRAM = 2  # transformers' default max_matching_ngram_size


def context_continuation(sequence: torch.LongTensor, num_tokens: int, max_ngram: int = DEFAULT_MAX_NGRAM) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the latest earlier occurrence of the sequence's last
    ``n`` tokens, for the longest ``n <= max_ngram`` that occurred; ``[]`` when none did.

    The latest occurrence is taken (transformers' prompt lookup takes the first): in a long answer the
    nearest repetition is the likeliest to continue the same way.
    """
    if num_tokens < 1 or max_ngram < 1:
        return []
    sequence = sequence.reshape(-1)
    length = sequence.shape[0]
    for n in range(min(max_ngram, length - 1), 0, -1):
        # windows starting at 0 .. length-n-1: each has at least one token after it
        windows = sequence[: length - 1].unfold(0, n, 1)
        hits = (windows == sequence[length - n :]).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return sequence[start : start + num_tokens].tolist()
    return []
