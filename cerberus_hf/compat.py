"""What cerberus-hf needs of transformers beyond its public API, in one place: each seam with why it is needed and
the releases it was checked on.

The supported range is declared in ``pyproject.toml``; CI runs the exactness and generate tests at both of its ends
(``.ci/run``). A new transformers release that moves one of these seams breaks here, in one module, and in CI.

Checked on transformers 5.18.0, 5.23.0 and 5.24.0.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import transformers
from packaging.version import Version
from transformers import GenerationMixin

TRANSFORMERS_VERSION = Version(transformers.__version__)

# The KV cache is named ``cache`` from 5.24 on, ``past_key_values`` before: in a model's forward() arguments, in the
# model_kwargs generate() hands a custom decoding function, and in model outputs. 5.24 still reads the old name but
# warns (FutureWarning) and drops it in 5.40, so each call passes the name its version expects.
CACHE_ARGUMENT = "cache" if TRANSFORMERS_VERSION >= Version("5.24.0.dev0") else "past_key_values"


def cache_argument(cache: Any) -> dict[str, Any]:
    """``{name: cache}`` to pass a KV cache to a model's forward() (or an output's constructor) under the name this
    transformers expects."""
    return {CACHE_ARGUMENT: cache}


def handed_cache(model_kwargs: dict) -> Any:
    """The cache generate() prepared and handed a custom decoding function in ``model_kwargs`` (either name)."""
    cache = model_kwargs.get("cache")
    return cache if cache is not None else model_kwargs.get("past_key_values")


def set_handed_cache(model_kwargs: dict, cache: Any) -> None:
    """Put ``cache`` in ``model_kwargs`` where generate() put the one it prepared (the prefill reads it there)."""
    name = "cache" if model_kwargs.get("cache") is not None else "past_key_values"
    model_kwargs[name] = cache


def auto_compile(model: Any, cache: Any, generation_config: Any) -> bool:
    """``GenerationMixin._valid_auto_compile_criteria`` (private, 5.18-5.24): whether generate() would compile
    ``model``'s forward for plain decoding with ``cache`` and this config (a compileable cache on CUDA and other
    accelerators unless ``disable_compile``; elsewhere only with ``compile_config._compile_all_devices``), so that a
    call compiles the draft-verify loop exactly when it would compile plain decoding. It reads the cache from
    generate()'s model_kwargs, under either name."""
    return bool(model._valid_auto_compile_criteria({"cache": cache, "past_key_values": cache}, generation_config))


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned (``output.cache`` from 5.24 on, where ``past_key_values`` warns)."""
    return output.get(CACHE_ARGUMENT)


def prefill(model: Any, input_ids: Any, generation_config: Any, model_kwargs: dict) -> Any:
    """``GenerationMixin._prefill`` (private, 5.18-5.24): the prefill generate()'s own decoding loops run, so the
    first step's logits and cache are exactly plain decoding's, whatever the model's input preparation."""
    return model._prefill(input_ids, generation_config, model_kwargs)


def default_generation_params(generation_config: Any) -> dict:
    """``GenerationConfig._get_default_generation_params`` (private, 5.18-5.24): the global defaults (max_length...)
    generate() falls back to, needed to count a left-padded batch's max_length as generate() counts it."""
    return generation_config._get_default_generation_params()


def attn_implementation(config: Any) -> str | None:
    """``PreTrainedConfig._attn_implementation`` (private, 5.18-5.24): which attention function a model's layers
    call. Tree verification needs a 4D mask to pass through (not flash attention); strict verification needs sdpa."""
    return getattr(config, "_attn_implementation", None)


def tree_attention_ok(model, length: int) -> bool:
    """Whether ``model`` can attend under a tree mask over a sequence of ``length`` positions (the cached
    ones plus those fed with the mask): it needs a 4D mask, which flash-attention kernels do not take, and one
    mask serves every layer, so sliding-window layers must still see the whole sequence."""
    if "flash" in str(attn_implementation(model.config) or ""):
        return False
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    return window is None or length <= window


# ``_attn_implementation_internal``: the plain field behind `attn_implementation`'s property, whose setter also
# writes sub-configs; a view of a config (`module_views.config_view`) sets this field on the copy only.
ATTN_IMPLEMENTATION_FIELD = "_attn_implementation_internal"


_GENERATE_CODE = inspect.unwrap(GenerationMixin.generate).__code__


def custom_generate_source() -> str | None:
    """The folder or Hub id named by the ``generate(custom_generate=..., trust_remote_code=True)`` call that is running
    a repository's ``custom_generate/generate.py`` (None outside one). transformers hands that function the model and
    generate()'s arguments but not the repository it came from, which the heads' function needs to find its weights:
    it is read from ``GenerationMixin.generate``'s local ``custom_generate`` in the calling frame (5.18-5.24)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _GENERATE_CODE:
            source = frame.f_locals.get("custom_generate")
            return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
        frame = frame.f_back
    return None
