"""Where a sequence trainer's batches get the frozen base's states: from disk, or computed in the step.

The sequence trainers (Kangaroo's `chain_trainer`, EAGLE-3's and DFlash's `sequence_trainer`) read, for each batch of
sequences, the base's states at every position (the states entering the fused feature layers, or Kangaroo's exited
states) and, with ``distill_weight > 0``, the base's top-k distribution at every answer position. A feature source
hands them over for a batch's members, in the form the family's batch reads (``take``):

* `CachedStates` (``features="cache"``, the default): the trainer fills its disk caches once before training
  (`sequence_features` / `exit_states`, and the hidden-state cache's teacher) and every step reads its rows there;
* `OnlineStates` (``features="online"``): nothing is written; each step runs the base (eval mode, no gradients) over
  the batch's sequences, through its first layers only, or through the whole base when the teacher is wanted, whose
  top-k comes from the lm_head's input as the cache computes it (`hidden_cache.teacher_topk_rows`). The states are
  rounded through float16 as the caches store them, so a batch is the same either way. This trades the cache's disk
  (an 8B base's features over 20M tokens take about half a terabyte) for a forward of the base in every step
  (docs/training.md, "Features computed in the step").

A process that trains on a share of each step's sequences computes only its share's states online.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Sequence

import torch
from torch import nn

from ..drafters.kangaroo import first_layers
from .hidden_cache import base_states, decoder_output_is_lm_head_input, right_padded, teacher_topk_rows

FEATURE_MODES = ("cache", "online")


def checked_feature_mode(features: str) -> str:
    """``features`` once known to be one of `FEATURE_MODES`."""
    if features not in FEATURE_MODES:
        raise ValueError(f"features must be one of {', '.join(FEATURE_MODES)}, got {features!r}.")
    return features


class CachedStates:
    """The base's states and teacher read from caches filled before training: every batch reads the same ones."""

    def __init__(self, states: object, teacher: dict | None):
        self.states, self.teacher = states, teacher

    def take(self, members: list[int]) -> tuple[object, dict | None]:
        """(the states the family's batch reads, the teacher or None) for ``members``: the whole caches."""
        return self.states, self.teacher


class OnlineStates:
    """The base's states and teacher computed for each batch's members when it is made (nothing kept on disk).

    ``capture`` opens the hooks that record the family's states (``captured[key]``, ``[batch, positions, width]``) on
    a forward through the base's first ``layers`` layers; ``pack`` turns the members' states (record index to a
    float16 ``[length, width]`` CPU tensor) into what the family's batch reads. With ``teacher_topk`` the whole base
    runs instead (the hooks record the same states on the way) and the teacher comes from its lm_head's input."""

    def __init__(self, base: nn.Module, sequences: Sequence[Sequence[int]], answers: Sequence[int],
                 capture: Callable[[], AbstractContextManager[dict]], layers: int, key: str,
                 pack: Callable[[dict[int, torch.Tensor]], object], teacher_topk: int = 0):
        self.base, self.sequences, self.answers = base, sequences, answers
        self.capture, self.layers, self.key, self.pack = capture, layers, key, pack
        self.teacher_topk = min(int(teacher_topk), base.get_output_embeddings().weight.shape[0])
        self.device = base.get_output_embeddings().weight.device
        pad = getattr(base.config, "pad_token_id", None)
        self.pad = int(pad) if pad is not None else 0
        self.use_decoder = False
        if self.teacher_topk:  # the backbone alone where it ends at the lm_head's input, as the cache decides
            sample = torch.tensor([list(sequences[0])], device=self.device)
            self.use_decoder = decoder_output_is_lm_head_input(base, sample)

    @torch.no_grad()
    def take(self, members: list[int]) -> tuple[object, dict | None]:
        """(the states the family's batch reads, the teacher or None) over ``members``' sequences, one forward of the
        base over them right-padded. The teacher's ``offsets`` map each member to its first answer row."""
        was_training = self.base.training
        self.base.eval()
        try:
            ids, mask = right_padded([self.sequences[i] for i in members], self.pad)
            ids, mask = ids.to(self.device), mask.to(self.device)
            with self.capture() as captured, (nullcontext() if self.teacher_topk
                                              else first_layers(self.base, self.layers)) as decoder:
                if self.teacher_topk:
                    head_input = base_states(self.base, ids, mask, self.use_decoder)[1]
                else:
                    decoder(input_ids=ids, attention_mask=mask, use_cache=False)
            states = {i: captured[self.key][row, : len(self.sequences[i])].to(torch.float16).cpu()
                      for row, i in enumerate(members)}
            teacher = self._teacher(members, head_input) if self.teacher_topk else None
        finally:
            self.base.train(was_training)
        return self.pack(states), teacher

    def _teacher(self, members: list[int], head_input: torch.Tensor) -> dict:
        """The teacher over ``members``' answer positions, laid out as the cache's (``ids``, ``logprobs``, ``offsets``)
        with each member's rows in member order."""
        ids, logprobs, offsets, row = [], [], {}, 0
        for b, i in enumerate(members):
            answer = self.answers[i]
            start = len(self.sequences[i]) - answer - 1  # the state at p - 1 predicts the first answer token
            top_ids, top_logprobs = teacher_topk_rows(self.base, head_input[b, start : start + answer],
                                                      self.teacher_topk)
            ids.append(top_ids)
            logprobs.append(top_logprobs)
            offsets[i], row = row, row + answer
        return {"ids": torch.cat(ids), "logprobs": torch.cat(logprobs), "offsets": offsets}
