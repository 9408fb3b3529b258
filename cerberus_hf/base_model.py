"""The base model a set of heads rides on: loading it from what the config names, and checking a match."""

from __future__ import annotations

import os

from torch import nn
from transformers import AutoModelForCausalLM, GenerationConfig

from .configuration_cerberus import CerberusConfig
from .errors import UserError

# from_pretrained keywords that concern how the base is loaded (the rest of what AutoModel passes is its own).
BASE_LOADING_KWARGS = ("dtype", "torch_dtype", "device_map", "attn_implementation", "low_cpu_mem_usage")


def load_base_model(config: CerberusConfig, **kwargs) -> nn.Module:
    """Load the base decoder that ``config`` names, with a message that says what to do when it cannot."""
    name, location, load_kwargs = _base_location(config)
    load_kwargs.update({k: v for k, v in kwargs.items() if k in BASE_LOADING_KWARGS})
    try:
        base = AutoModelForCausalLM.from_pretrained(location, **load_kwargs)
        base.name_or_path = name
        return base
    except (OSError, ValueError) as error:
        raise OSError(
            f"The base model these heads were built for, {name!r}"
            f"{' (' + config.base_gguf_file + ')' if config.base_gguf_file else ''}, could not be loaded: {error}\n"
            "Pass the base yourself with from_pretrained(..., base_model=model), or fix base_model_name_or_path."
        ) from error


def load_base_tokenizer(config: CerberusConfig):
    """The tokenizer of the base that ``config`` names (what a folder of heads, which holds none, tokenizes with)."""
    from transformers import AutoTokenizer

    name, location, load_kwargs = _base_location(config)
    try:
        return AutoTokenizer.from_pretrained(location, **load_kwargs)
    except (OSError, ValueError) as error:
        raise OSError(f"The tokenizer of the base these heads were built for, {name!r}, could not be loaded: {error}\n"
                      "Pass the base's tokenizer yourself (pipeline(..., tokenizer=...)).") from error


def _base_location(config: CerberusConfig) -> tuple[str, str, dict]:
    """(the base's recorded name, where to load it from, ``from_pretrained`` keywords that say which file and revision)
    for the base that ``config`` names; a one-line error where it cannot be had."""
    name = config.base_model_source or config.base_model_name_or_path
    if not name:
        raise UserError("This CerberusConfig names no base model: pass base_model=<a loaded model> instead.")
    from .real_models import resolve_source  # the packaged-base loader, off the package's import path

    try:
        location, source_kwargs = resolve_source(name)
    except (ModuleNotFoundError, FileNotFoundError) as error:
        raise OSError(f"The base model these heads were built for, {name!r}, is not available: {error}") from error
    if location.startswith((os.sep, ".", "~")) and not os.path.exists(os.path.expanduser(location)):
        raise OSError(
            f"The base model these heads were built for, {name!r}, is not there: no such folder. Pass the base "
            "yourself with from_pretrained(..., base_model=model), or fix base_model_name_or_path."
        )
    load_kwargs = dict(source_kwargs)
    if config.base_model_revision:
        load_kwargs["revision"] = config.base_model_revision
    if config.base_gguf_file:
        load_kwargs["gguf_file"] = config.base_gguf_file
    return name, location, load_kwargs


def base_shape(base: nn.Module) -> tuple[str, int, int]:
    """(model_type, hidden size, vocabulary rows) of a base, read from its output projection."""
    lm_head = base.get_output_embeddings()
    if lm_head is None or not hasattr(lm_head, "weight"):
        raise UserError(f"{type(base).__name__} has no output embedding (lm_head) for draft heads to project through.")
    vocab_size, hidden_size = lm_head.weight.shape
    return base.config.model_type, hidden_size, vocab_size


def check_base_compatible(config: CerberusConfig, base: nn.Module) -> None:
    """Refuse a base whose shape differs from the one the heads were built for, naming every difference."""
    model_type, hidden_size, vocab_size = base_shape(base)
    problems = []
    if config.hidden_size is not None and config.hidden_size != hidden_size:
        problems.append(f"hidden size {config.hidden_size} (heads) vs {hidden_size} (base)")
    if config.vocab_size is not None and config.vocab_size != vocab_size:
        problems.append(f"vocabulary size {config.vocab_size} (heads) vs {vocab_size} (base)")
    if config.base_model_type is not None and config.base_model_type != model_type:
        problems.append(f"model type {config.base_model_type!r} (heads) vs {model_type!r} (base)")
    if problems:
        raise UserError(
            f"These heads were built for {config.base_model_name_or_path or 'another base'} and do not fit "
            f"{type(base).__name__}: " + "; ".join(problems) + "."
        )


def greedy_generation_config(base_config: GenerationConfig | None) -> GenerationConfig:
    """The base's special tokens, greedy decoding: what a head checkpoint ships so pipelines do not sample."""
    base_config = base_config or GenerationConfig()
    return GenerationConfig(
        bos_token_id=base_config.bos_token_id,
        eos_token_id=base_config.eos_token_id,
        pad_token_id=base_config.pad_token_id,
        do_sample=False,
    )
