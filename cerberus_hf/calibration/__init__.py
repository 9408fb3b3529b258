"""Calibration: fit the draft tree and the gate to the heads and to the device they run on.

Three measurements, then two choices:

1. The verification cost curve: wall time of one cached forward with ``n`` query tokens, ``n = 1..64``,
   relative to ``n = 1`` (on a CPU it is far from flat; on a GPU nearly flat for dozens of tokens).
2. For calibration sequences (the base's own continuations), the rank of the true token ``t + k + 2``
   among head ``k``'s guesses at every position ``t``, and the candidate gate signals there.
3. The time the heads take to draft one step.

The dynamic tree is also tried with Clover's per-node budgets (``DYNAMIC_BUDGETS``: a node's children
within a cumulative draft probability, and not far below its most probable child), which make the tree's
size vary from step to step: each is drafted for real at every position and its expected tokens per
second is total tokens over total time, ``sum(1 + accepted) / sum(cost(size + 1) + draft time)``.

With an n-gram model (`cerberus-hf ngram`) or a small LM (`--rescorer`, a Kangaroo checkpoint) beside
the heads, a third tree kind is fitted: the dynamic tree over a wider lattice of the heads' guesses,
rescored by them (`blocks.rescoring`), drafted for real at every position for each pair of candidate
weights (the LM reads each held-out sequence once, and at each position sees only what decoding would);
the weights and size with the best expected tokens per second are kept, with the drafting time of each
combination of rescorers, and how often the heads' top-1 block repeats a token, before and after
rescoring, is reported.

The tree: a node ``(r0, ..., rd)`` is accepted at a position exactly when the true tokens' ranks there
start with that path, so the mean accepted length of a tree is the sum of its paths' empirical
frequencies. Adding paths in order of frequency gives the best tree of each size (prefixes are at
least as frequent as their extensions); the size kept maximises expected tokens per second,
``(1 + accepted) / (cost(n + 1) + draft time)``.

The gate: drafting at a position yields ``1 + accepted`` tokens for the tree's step time, not drafting
yields 1 token for a plain step. For each signal, the threshold maximising total tokens over total time
on the calibration positions is chosen; the signal kept is the one with the best such throughput. Rank
correlation and AUC (for "at least one draft accepted") are reported per signal.
"""

from .pipeline import calibrate, calibrate_chain, load_sequences
from .report import format_chain_report, format_report

__all__ = ["calibrate", "calibrate_chain", "format_chain_report", "format_report", "load_sequences"]
