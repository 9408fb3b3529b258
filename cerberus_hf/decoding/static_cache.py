"""Verification through a pre-allocated (static) KV cache, its forward compiled once per bucket of step sizes.

``generate(..., cache_implementation="static")`` asks transformers for a cache whose tensors are allocated once and
updated in place, so that a compiled forward sees the same addresses and shapes every step (on CUDA, through CUDA
graphs: a step replays recorded kernels instead of launching each from Python). The draft-verify loop uses it as it
uses the dynamic cache: each step appends the newest token and the draft, the accepted branch is moved to the front
of the fed positions in place and the cache's length is cut back after it (`verification.keep_cache_positions`; a static
layer's ``crop`` only moves its length, and the next step overwrites what lies beyond).

What a compiled forward needs, and how this gives it:

- **Fixed shapes.** A step feeds 1 + its draft's nodes; compiled, it is padded to the next of a few bucket sizes
  (`BUCKETS`), so a call compiles at most one graph per bucket and none after warm-up. A padding position attends
  only to the past and itself; its cache slot lies beyond the kept length and is overwritten later. A larger step
  runs uncompiled at its own size.
- **One mask layout.** Every step passes an explicit 4D mask over all of the cache's slots: the past visible, the
  tree by ancestry, the free slots hidden (a chain gets its causal mask the same way).
- **Room.** The cache holds ``max_length`` plus the largest bucket, rounded up to `ROOM_MULTIPLE` slots; compiled,
  it keeps the largest room a call on this base has had, as transformers keeps the largest length it has seen, so
  that calls of different lengths share compiled graphs. A tree wider than the room left near the end of a call is
  cut to it (`max_draft`). A cache the caller passed is replaced by one with that room (its contents are not read).
- **One compiled forward per base.** The forward is the base's own ``get_compiled_call`` with the call's
  ``compile_config`` (None: transformers' default), as plain decoding's: compiled on the base, not on the per-call
  view `CerberusForCausalLM.generate` runs (a view compiled anew every call would recompile). The drafter's capture
  hooks run inside it, uncompiled (one graph break where a hook records a state, so ``fullgraph=True`` is turned off
  with a one-line note); what they recorded and the logits are copied out after the forward, since a CUDA graph's
  outputs live in memory its next replay reuses.

Whether it compiles follows transformers' own rule for plain decoding (`compat.auto_compile`): on CUDA (and a few
other accelerators) with a static cache, unless ``disable_compile``; elsewhere only with a ``compile_config`` whose
``_compile_all_devices`` is set. Uncompiled, the static cache gives the same tokens through the same forward.

What it cannot serve (`paths.static_refusal`, and a static cache whose layers are not all plain attention layers)
decodes with the dynamic cache instead, after a one-line warning: a sliding-window base (a static window layer rolls
its slots over and cannot be rolled back in place), flash attention (it takes no 4D mask), Kangaroo and the neural
rescorer (they draft through the base's own cache), strict verification (its attention runs position by position), a
batch (`decoding.batched` selects rows of a dynamic cache), and a transformers before 5.24, whose static cache
cannot be cut back.
"""

from __future__ import annotations

from typing import Callable

import copy

import torch
from torch import nn
from transformers import DynamicCache, GenerationConfig, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.utils import logging

from ..compat import auto_compile, cache_argument, handed_cache, set_handed_cache
from .proposer import Draft
from .verification import Verification, keep_cache_positions, step_inputs

logger = logging.get_logger(__name__)

# The step sizes a compiled forward is specialised to (the newest token plus the draft's nodes, padded up): one graph
# each. A step larger than the largest runs uncompiled at its own size.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
ROOM_MULTIPLE = 256


def dynamic_instead(model: nn.Module, model_kwargs: dict, why: str) -> DynamicCache:
    """Swap the static cache generate() prepared for a dynamic one, saying why in one line."""
    logger.warning_once(f"cerberus-hf: cache_implementation='static' is not used here ({why}); decoding with the "
                        "dynamic cache.")
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    set_handed_cache(model_kwargs, cache)
    return cache


def verification_for(model: nn.Module, compile_base: nn.Module, generation_config: GenerationConfig,
                     model_kwargs: dict, no_static: str | None) -> Verification:
    """How this call verifies: through generate()'s dynamic cache, or, when the call asked for a static one, a static
    cache with room for the drafts (`StaticVerification`) where the call's path allows one (``no_static``: why not,
    `paths.static_refusal`), and the dynamic cache with a one-line warning where it does not. Called before the
    prefill, which fills the cache chosen."""
    cache = handed_cache(model_kwargs)
    if not isinstance(cache, StaticCache):
        return Verification(cache)
    if no_static is not None:
        return Verification(dynamic_instead(model, model_kwargs, no_static))
    verification = StaticVerification.prepare(model, compile_base, generation_config)
    if any(type(layer) is not StaticLayer for layer in verification.cache.layers):
        return Verification(dynamic_instead(model, model_kwargs, "the base's static cache has layers other than "
                                            "plain attention, which cannot be rolled back in place"))
    set_handed_cache(model_kwargs, verification.cache)
    return verification


def bucket(size: int) -> int:
    """The compiled step size ``size`` positions are padded to (``size`` itself beyond the largest bucket)."""
    return next((b for b in BUCKETS if b >= size), size)


class StaticVerification(Verification):
    """Verification forwards over a static cache sized for the call, compiled where transformers would compile plain
    decoding, and then padded to `BUCKETS`. Created before the prefill (`prepare`), whose cache it replaces."""

    def __init__(self, cache: StaticCache, room: int, forward: Callable, compiled: bool):
        super().__init__(cache)
        self.room = room  # the cache's slots
        self.forward_call = forward  # the compiled forward, or the base itself
        self.compiled = compiled
        self.length = 0  # the cache's length after the last forward, padding included
        self.widest = 1  # the widest bucket this call fed (`pads_up`)

    @classmethod
    def prepare(cls, model: nn.Module, compile_base: nn.Module, generation_config: GenerationConfig
                ) -> "StaticVerification":
        """A static cache to stand in for generate()'s (sized ``max_length``, with no room for the last step's draft)
        with room for the largest bucket, and the forward: ``compile_base``'s compiled call (the base itself, not a
        per-call view of it) where transformers would compile, ``model`` otherwise."""
        config = model.config.get_text_config(decoder=True)
        room = -(-(generation_config.max_length + BUCKETS[-1]) // ROOM_MULTIPLE) * ROOM_MULTIPLE
        cache = StaticCache(config=config, max_cache_len=room)  # allocated at its first update
        compiled = auto_compile(compile_base, cache, generation_config)
        if not compiled:
            return cls(cache, room, model, compiled)
        largest = getattr(compile_base, "_cerberus_static_room", 0)
        if largest > room:  # the shapes an earlier call compiled
            room, cache = largest, StaticCache(config=config, max_cache_len=largest)
        compile_base._cerberus_static_room = room
        compile_config = generation_config.compile_config
        if compile_config is not None and compile_config.fullgraph:
            logger.warning_once("cerberus-hf: compile_config.fullgraph=True is turned off for the draft-verify loop: "
                                "the drafter's hook on the base cuts the graph where it records a state.")
            compile_config = copy.copy(compile_config)
            compile_config.fullgraph = False
        return cls(cache, room, compile_base.get_compiled_call(compile_config), compiled)

    def forward(self, model: nn.Module, input_ids: torch.LongTensor, draft: Draft | None, captured: dict):
        """The base's forward over the newest token and ``draft`` (padded to its bucket when compiled); returns the
        outputs with logits (and ``captured``'s states) of the fed positions only, copied out of the forward's
        buffers."""
        past = input_ids.shape[1] - 1
        size = 1 + (len(draft.tokens) if draft is not None else 0)
        padded = bucket(size) if self.compiled else size  # padding only buys an uncompiled forward more work
        if self.compiled and padded in BUCKETS and self.pads_up(input_ids.device):
            padded = self.widest = max(padded, self.widest)
        valid = torch.ones(1, past, dtype=torch.bool, device=input_ids.device)
        tokens, positions, mask = step_inputs([input_ids], [draft], [past + 1], valid, model.dtype,
                                              pad=0, width=padded)
        # the cache's free slots, hidden
        mask = torch.nn.functional.pad(mask, (0, self.room - past - padded), value=torch.finfo(model.dtype).min)
        call = self.forward_call if self.compiled and padded in BUCKETS else model
        outputs = call(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True,
                       **cache_argument(self.cache))
        self.fed, self.length = padded, past + padded
        outputs.logits = outputs.logits[:, :size].clone()
        for name, value in list(captured.items()):
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == padded:
                captured[name] = value[:, :size].clone()
        return outputs

    @staticmethod
    def pads_up(device: torch.device) -> bool:
        """Whether a compiled step is padded up to the widest bucket the call fed before, not only to its own. On an
        accelerator the steps a call cuts short near ``max_length`` (1 + 3, 1 + 2, 1 + 1 for a chain of 4) would each
        compile a graph of their own, and compiling each costs far more than padding the step does. Padding costs
        little on an accelerator in bf16, more in fp32, whose products of a few rows run on slower kernels; compile
        times and the padding's cost are measured in docs/cuda.md. On a CPU each padded position costs its share of the forward,
        so steps keep their own bucket."""
        return device.type != "cpu"

    def keep(self, kept: list[int]) -> None:
        keep_cache_positions(self.cache, self.fed, [kept], end=self.length)

    def max_draft(self, past: int) -> int | None:
        """A draft wider than the largest bucket runs at its own size, and near the end of a call may not fit."""
        return self.room - past - 1
