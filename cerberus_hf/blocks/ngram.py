"""A token-id n-gram model (interpolated Kneser-Ney), small enough to query inside a decoding step.

The lattice rescorer (`blocks.rescoring`) asks, once per draft depth, for the log-probability of each
head's candidate tokens after each path drafted so far: a few hundred lookups per step. Everything is a
sorted ``int64`` table and `torch.searchsorted`, so a query is a handful of vectorised calls and the model
loads from one safetensors file without Python objects per n-gram.

An m-gram ``(t_1, .., t_m)`` is coded as the base-``V`` number ``t_1 V^(m-1) + .. + t_m`` (``V``: the
vocabulary size), exact while ``V^order < 2^63``. Per order the model keeps the codes of its m-grams
(sorted) with their counts (raw at the top order, Kneser-Ney continuation counts below: how many distinct
tokens precede the m-gram), and the codes of their contexts with the total count and the number of
distinct tokens that follow each. Probabilities interpolate every order with one absolute discount per
order (Ney's estimate ``n1 / (n1 + 2 n2)``) and, below the unigrams, the uniform distribution, so every
token has a non-zero probability.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch
from safetensors import SafetensorError, safe_open

from ..errors import UserError
from ..files import save_safetensors

NGRAM_WEIGHTS_NAME = "ngram.safetensors"
# the command that counts one beside the heads, as the messages that need one print it
NGRAM_COMMAND = "cerberus-hf ngram --heads FOLDER --data DATA"
NGRAM_FORMAT_VERSION = "1"


def _codes(grams: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Base-``vocab_size`` codes of the rows of ``grams`` ``[n, m]`` (0 for ``m = 0``)."""
    code = torch.zeros(grams.shape[0], dtype=torch.long, device=grams.device)
    for column in range(grams.shape[1]):
        code = code * vocab_size + grams[:, column]
    return code


def _lookup(sorted_keys: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, found) of each query in ``sorted_keys`` (index clamped where not found)."""
    if sorted_keys.numel() == 0:
        zeros = torch.zeros_like(queries)
        return zeros, torch.zeros_like(queries, dtype=torch.bool)
    index = torch.searchsorted(sorted_keys, queries).clamp(max=sorted_keys.numel() - 1)
    return index, sorted_keys[index] == queries


class NgramModel:
    """Interpolated Kneser-Ney over token ids; `build` counts, `log_probs` queries, `save`/`load` persist."""

    def __init__(self, vocab_size: int, order: int, tables: dict[str, torch.Tensor], tokens: int):
        self.vocab_size = vocab_size
        self.order = order
        self.tables = tables
        self.tokens = tokens  # training tokens counted (for reports)

    # ------------------------------------------------------------------------------------ building
    @classmethod
    def build(cls, sequences: Iterable[tuple[Sequence[int], int]], vocab_size: int, order: int = 3) -> "NgramModel":
        """Count ``(tokens, start)`` sequences: every token at index ``>= start`` is a target, with up to
        ``order - 1`` tokens before it (earlier tokens of the same sequence, e.g. the prompt's end) as its
        context. Positions with a shorter history are counted at the orders they have."""
        if order < 1:
            raise UserError(f"order must be >= 1, got {order}.")
        if vocab_size < 2 or float(vocab_size) ** order >= 2.0**63:
            raise UserError(f"An order-{order} model over {vocab_size} tokens cannot be coded in int64; lower the order.")
        grams: list[list[torch.Tensor]] = [[] for _ in range(order + 1)]
        total = 0
        for tokens, start in sequences:
            ids = torch.as_tensor(list(tokens), dtype=torch.long)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise UserError(f"A sequence holds token ids outside [0, {vocab_size}): wrong vocabulary?")
            start = max(int(start), 0)
            if start >= ids.numel():
                continue
            total += ids.numel() - start
            targets = torch.arange(start, ids.numel())
            # each target is counted once, at the longest order its history allows
            history = torch.clamp(targets + 1, max=order)
            for m in range(1, order + 1):
                ends = targets[history == m]
                if ends.numel():
                    grams[m].append(ids[ends[:, None] + torch.arange(1 - m, 1)])
        if total == 0:
            raise UserError("No target tokens to count: the data is empty.")
        tables: dict[str, torch.Tensor] = {}
        # occurrences of m-grams that are counted raw (the top order, and shorter histories at the start)
        raw = [torch.cat(g) if g else torch.zeros(0, m, dtype=torch.long) for m, g in enumerate(grams)]
        higher: torch.Tensor | None = None  # distinct (m+1)-grams, to count continuations of m-grams
        for m in range(order, 0, -1):
            distinct, counts = torch.unique(raw[m], dim=0, return_counts=True)
            if higher is not None and higher.numel():
                # Kneser-Ney: an m-gram's count below the top order is the number of distinct tokens before it
                suffixes, continuation = torch.unique(higher[:, 1:], dim=0, return_counts=True)
                distinct, inverse = torch.unique(torch.cat([distinct, suffixes]), dim=0, return_inverse=True)
                merged = torch.zeros(distinct.shape[0], dtype=torch.long)
                merged.index_add_(0, inverse, torch.cat([counts, continuation]))
                counts = merged
            higher = distinct
            codes = _codes(distinct, vocab_size)
            order_by = torch.argsort(codes)
            codes, counts, distinct = codes[order_by], counts[order_by], distinct[order_by]
            context_codes, context_index = torch.unique(_codes(distinct[:, :-1], vocab_size), return_inverse=True)
            context_total = torch.zeros(context_codes.numel(), dtype=torch.long).index_add_(0, context_index, counts)
            context_types = torch.bincount(context_index, minlength=context_codes.numel())
            n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
            discount = n1 / (n1 + 2 * n2) if n1 + n2 else 0.5
            tables[f"{m}.codes"] = codes
            tables[f"{m}.counts"] = counts.to(torch.int32)
            tables[f"{m}.context_codes"] = context_codes
            tables[f"{m}.context_total"] = context_total
            tables[f"{m}.context_types"] = context_types.to(torch.int32)
            tables[f"{m}.discount"] = torch.tensor([min(max(discount, 0.05), 0.95)], dtype=torch.float64)
        return cls(vocab_size, order, tables, total)

    # ------------------------------------------------------------------------------------ querying
    def to(self, device: torch.device | str) -> "NgramModel":
        self.tables = {name: tensor.to(device) for name, tensor in self.tables.items()}
        return self

    @property
    def device(self) -> torch.device:
        return self.tables["1.codes"].device

    def log_probs(self, contexts: torch.LongTensor, candidates: torch.LongTensor) -> torch.Tensor:
        """``log P(candidates[i, j] | contexts[i])`` ``[n, k]`` (float32). ``contexts`` ``[n, c]`` holds the
        tokens before each candidate, oldest first; only the last ``order - 1`` are read."""
        n, k = candidates.shape
        device = self.device
        contexts = contexts[:, max(contexts.shape[1] - (self.order - 1), 0):].to(device)
        words = candidates.to(device).reshape(-1)
        probability = torch.full((n * k,), 1.0 / self.vocab_size, dtype=torch.float64, device=device)
        for m in range(1, self.order + 1):
            width = m - 1
            if width > contexts.shape[1]:
                break
            history = contexts[:, contexts.shape[1] - width:] if width else contexts[:, :0]
            context_code = _codes(history, self.vocab_size).repeat_interleave(k)
            slot, seen = _lookup(self.tables[f"{m}.context_codes"], context_code)
            gram, found = _lookup(self.tables[f"{m}.codes"], context_code * self.vocab_size + words)
            total = self.tables[f"{m}.context_total"][slot].to(torch.float64)
            types = self.tables[f"{m}.context_types"][slot].to(torch.float64)
            discount = float(self.tables[f"{m}.discount"])
            count = torch.where(found, self.tables[f"{m}.counts"][gram].to(torch.float64), torch.zeros_like(total))
            interpolated = (count - discount).clamp(min=0) / total + discount * types / total * probability
            probability = torch.where(seen, interpolated, probability)
        return probability.log().to(torch.float32).reshape(n, k)

    # ------------------------------------------------------------------------------------ files
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tables.values())

    def save(self, path: str | os.PathLike) -> None:
        metadata = {"format": "pt", "cerberus_ngram": NGRAM_FORMAT_VERSION, "vocab_size": str(self.vocab_size),
                    "order": str(self.order), "tokens": str(self.tokens)}
        save_safetensors({name: t.contiguous().cpu() for name, t in self.tables.items()}, path, metadata=metadata)

    @classmethod
    def load(cls, path: str | os.PathLike, vocab_size: int | None = None) -> "NgramModel":
        """Read a saved model; ``vocab_size`` (the base's) is checked against the one it was counted over."""
        try:
            with safe_open(str(path), framework="pt") as handle:  # one read: the tables and the metadata
                tables = {name: handle.get_tensor(name) for name in handle.keys()}
                metadata = handle.metadata() or {}
        except (SafetensorError, OSError, ValueError, RuntimeError) as error:
            raise OSError(f"{path} is not a readable n-gram file ({error}); build it again with "
                          f"`{NGRAM_COMMAND}`.") from error
        if metadata.get("cerberus_ngram") != NGRAM_FORMAT_VERSION:
            raise OSError(f"{path} is not a cerberus-hf n-gram model (format {metadata.get('cerberus_ngram')!r}).")
        model = cls(int(metadata["vocab_size"]), int(metadata["order"]), tables, int(metadata.get("tokens", 0)))
        missing = [f"{m}.{name}" for m in range(1, model.order + 1)
                   for name in ("codes", "counts", "context_codes", "context_total", "context_types", "discount")
                   if f"{m}.{name}" not in tables]
        if missing:
            raise OSError(f"{path} lacks tables {missing[:3]}: the file is incomplete; build it again.")
        if vocab_size is not None and model.vocab_size != vocab_size:
            raise UserError(f"{path} was counted over a {model.vocab_size}-token vocabulary, the base has {vocab_size}: "
                            "it belongs to another tokenizer.")
        return model
