"""Which way one `generate()` call decodes, decided once, before anything runs (`choose_path`).

Three questions, each answered from what the call asked and what the base, the drafter and the call's settings allow:

* **the device step** (`device_step`): greedy decoding with a static tree and nothing to do on the host per token runs
  each step as one function of device buffers; the default on CUDA, asked for elsewhere with ``device_step=True``;
* **rows together or apart**: a batch is verified in one forward a step (`batched`) where the base takes a 4D mask
  without a sliding window and the drafter drafts depth by depth, else its rows are decoded one at a time (`loop`);
* **a static cache**, where the call asked for one (``cache_implementation="static"``): used (`static_cache`) unless
  the base, the drafter or the rows need a cache that can be rolled back out of place, when the dynamic cache stands
  in.

Each answer that is "no" carries why, in words a user reads in the one-line warning the call gives. The path chosen
gives the decoding method the base's own generate() runs (`path_decoding`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.cache_utils import StaticLayer
from transformers.utils import logging

from ..blocks.profiling import StepProfiler
from ..blocks.settings import DecodingSettings
from ..blocks.stats import GenerationStats
from ..blocks.tree import TreeSpec
from ..compat import attn_implementation
from ..drafters.base import Drafter
from .batched import batched_speculative_generate
from .device_step import DeviceDecoding
from .loop import speculative_generate

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class DecodingPath:
    """The way one call decodes: by the device step, else by the loop with its rows together (``apart`` None) or one
    at a time (``apart``: why); ``no_static``: why a static cache cannot serve (None: it can)."""

    device_step: bool
    apart: str | None
    no_static: str | None

    @property
    def together(self) -> bool:
        """Whether the call's rows decode as one batch: by the device step, or by the loop with its rows together."""
        return self.apart is None or self.device_step


def choose_path(base: nn.Module, drafter: Drafter, settings: DecodingSettings, config: GenerationConfig, rows: int,
                device_step: bool | None, wants_host: str | None) -> DecodingPath:
    """The path of a call over ``rows`` rows; ``device_step``: the call's wish (None: the default, on CUDA only);
    ``wants_host``: what the call does on the host per token, which the device step cannot (None: nothing)."""
    on_device = False
    if device_step is not False:
        why = wants_host or device_step_refusal(base, drafter, settings, config)
        on_device = why is None and (bool(device_step) or base.device.type == "cuda")
        if why is not None and device_step:
            _warn(f"device_step=True is not used here ({why}); decoding with the loop.")
    # the device step decodes a batch together; where it falls back (`device_step.DeviceDecoding`), so does the loop
    apart = "one row" if rows == 1 else None if on_device else batch_refusal(base, drafter, settings)
    if rows > 1 and apart is not None:
        _warn(f"this batch is decoded row by row: {apart}.")
    return DecodingPath(on_device, apart, static_refusal(base, drafter, settings, 1 if apart else rows))


def host_work(streamer, processors, criteria, profile: bool) -> str | None:
    """What a call does on the host per token, which the device step cannot do (None: nothing)."""
    if profile:
        return "profile=True times the loop's phases"
    if streamer is not None or processors or criteria:
        return "a streamer, logits processors or stopping criteria of the call's own"
    return None


def _warn(message: str) -> None:
    logger.warning_once(f"cerberus-hf: {message}")


@dataclass
class LoopDecoding:
    """`generate()`'s decoding callable for the draft-verify loop, with what the call bound (``generate()`` hands a
    custom decoding callable neither a streamer nor the call's settings): its rows together (`batched`) or one at a
    time (`loop`), as ``path`` says."""

    path: DecodingPath
    settings: DecodingSettings
    streamer: object | None
    profiler: object | None
    compile_base: nn.Module
    make_proposer: Callable

    def __call__(self, model: nn.Module, input_ids: torch.LongTensor, logits_processor, stopping_criteria,
                 generation_config: GenerationConfig, synced_gpus: bool = False, **model_kwargs):
        run = speculative_generate if self.path.apart is not None else batched_speculative_generate
        return run(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                   streamer=self.streamer, make_proposer=self.make_proposer,
                   settings=self.settings, profiler=self.profiler, compile_base=self.compile_base,
                   no_static=self.path.no_static, **model_kwargs)


def path_decoding(owner: nn.Module, drafter: Drafter, proposer: Callable, path: DecodingPath,
                  settings: DecodingSettings, streamer, stats: GenerationStats,
                  profiler: StepProfiler | None) -> LoopDecoding | DeviceDecoding:
    """The decoding method the base's generate() runs (its ``custom_generate``) on the path chosen: the loop, or
    the whole step on the device. ``owner``: the model (its base, its config; it keeps the device steps);
    ``drafter``: its heads as the call drafts with them; ``proposer``: makes a `Proposer` from a generation config
    and the call's ``settings``, ``stats`` and ``profiler``."""
    decode = LoopDecoding(path, settings, streamer, profiler, owner.base, functools.partial(
        proposer, settings=settings, stats=stats, profiler=profiler))
    if not path.device_step:
        return decode
    return DeviceDecoding(owner, drafter, settings.tree or TreeSpec.chain(owner.config.num_heads), stats,
                          decode, "reduce-overhead" if owner.device.type == "cuda" else None)


SLIDING = "the base has sliding-window layers"


def _base_refusal(base: nn.Module) -> str | None:
    """Why the base cannot be verified under one 4D mask over fixed slots (None: it can)."""
    if getattr(base.config.get_text_config(), "sliding_window", None) is not None:
        return SLIDING
    if "flash" in str(attn_implementation(base.config) or ""):
        return "flash attention takes no 4D mask"
    return None


def drafts_through_base_cache(drafter: Drafter, settings: DecodingSettings | None) -> str | None:
    """Why this call's drafting runs through the base's own KV cache (None: it does not), which a cache shared by a
    batch's rows or rolled back in place cannot serve: Kangaroo's chain, the neural rescorer's small LM."""
    if drafter.drafts_chains:
        return f"{drafter.drafter_type} drafts through the base's own cache"
    if settings is not None and settings.rescoring is not None and settings.rescoring.lm_weight > 0:
        return "the neural rescorer drafts through the base's own cache"
    return None


def batch_refusal(base: nn.Module, drafter: Drafter, settings: DecodingSettings) -> str | None:
    """Why a batch cannot be decoded together with this base, drafter and call's settings (None: it can)."""
    return (_base_refusal(base) or drafts_through_base_cache(drafter, settings)
            or ("strict verification computes each position as a one-token forward does"
                if settings.strict_rows is not None else None))


def static_refusal(base: nn.Module, drafter: Drafter, settings: DecodingSettings | None, rows: int) -> str | None:
    """Why this call cannot verify through a static cache (None: it can)."""
    if not getattr(StaticLayer, "is_croppable", False):
        return "this transformers' static cache cannot be cut back (5.24 or later can)"
    if rows > 1:
        return "a batch decodes with the dynamic cache"
    base_refusal = _base_refusal(base)
    if base_refusal is not None:
        return base_refusal + (", which a static cache cannot roll back in place" if base_refusal == SLIDING else "")
    through_base = drafts_through_base_cache(drafter, settings)
    if through_base is not None:
        return through_base
    if settings is not None and settings.strict_rows is not None:
        return "strict verification runs its attention position by position"
    return None


def device_step_refusal(base: nn.Module, drafter: Drafter, settings: DecodingSettings,
                        config: GenerationConfig) -> str | None:
    """Why the device step cannot serve this call (None: it can): greedy decoding with a static tree, a drafter whose
    heads read the base's last state (or a window of them), a base verified under one 4D mask."""
    if config.do_sample:
        return "sampling"
    if config.return_dict_in_generate and (config.output_scores or config.output_logits):
        return "scores or logits are returned"
    if settings.typical is not None or settings.strict_rows is not None:
        return "typical acceptance or strict verification"
    if settings.dynamic is not None:
        return "the tree is grown each step"
    if drafter.drafts_chains:
        return f"{drafter.drafter_type} drafts through the base's own cache"
    if not drafter.steps_on_device:
        return f"{drafter.drafter_type} keeps a cache per sequence outside the device step's buffers"
    if drafter.state_source != "lm_head_input":
        return "the drafter reads the base's state before its final norm"
    return _base_refusal(base)
