"""Reading a saved folder's files and checking them before anything heavy loads: its config, the heads' weights
against it, each stored calibration entry as `generate()` would build it, the n-gram model, and a neural rescorer
against the heads it serves. A bad file fails here, named, and nothing is left half-loaded."""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import GenerationConfig

from .blocks.ngram import NGRAM_WEIGHTS_NAME, NgramModel
from .checkpoint import HEADS_WEIGHTS_NAME, load_heads_state_dict, resolve_file, resolve_heads_file
from .configuration_cerberus import CerberusConfig
from .blocks.settings import check_entry
from .drafters import DRAFTER_CLASSES, build_drafter
from .errors import UserError

RESCORER_FOLDER = "rescorer"  # where a checkpoint keeps its neural lattice rescorer


def read_config(path: str, config: Any, hub_kwargs: dict) -> CerberusConfig:
    """The config of the checkpoint at ``path`` (folder or Hub id), or ``config`` where given: one that remote code
    loaded from another copy of `configuration_cerberus` is converted, anything else refused."""
    if config is None:
        config = CerberusConfig.from_pretrained(path, **hub_kwargs)
    elif not isinstance(config, CerberusConfig):
        if getattr(config, "model_type", None) != CerberusConfig.model_type:
            raise TypeError(f"config must be a CerberusConfig, got {type(config).__name__}.")
        # Remote code can load the config class from another module copy than this one.
        config = CerberusConfig.from_dict(config.to_dict())
    return config


def read_folder(path: str, config: CerberusConfig,
                hub_kwargs: dict) -> tuple[dict[str, torch.Tensor], GenerationConfig | None, NgramModel | None]:
    """(the heads' weights, the generation config, the n-gram model) of the checkpoint at ``path`` (folder or Hub
    id), each read and checked against ``config``; the last two None where the folder has none."""
    state_dict = read_heads(path, config, hub_kwargs)
    generation_file = resolve_file(path, "generation_config.json", required=False, **hub_kwargs)
    generation_config = None
    if generation_file is not None:
        generation_config = GenerationConfig.from_pretrained(os.path.dirname(generation_file))
        check_calibration(generation_config, config, generation_file)
    ngram_file = resolve_file(path, NGRAM_WEIGHTS_NAME, required=False, **hub_kwargs)
    ngram = NgramModel.load(ngram_file, vocab_size=config.vocab_size) if ngram_file is not None else None
    return state_dict, generation_config, ngram


def read_heads(path: str, config: CerberusConfig, hub_kwargs: dict) -> dict[str, torch.Tensor]:
    """The heads' weights in the checkpoint at ``path`` (folder or Hub id), checked against ``config``."""
    heads_file = resolve_heads_file(path, **hub_kwargs)
    state_dict = load_heads_state_dict(heads_file)
    check_heads_state_dict(config, state_dict, heads_file)
    return state_dict


def check_heads_state_dict(config: CerberusConfig, state_dict: dict[str, torch.Tensor], path: str) -> None:
    """Compare a heads file with the heads its config describes, before anything heavy is loaded."""
    with torch.device("meta"):
        expected = build_drafter(config).state_dict()
    problems = [f"missing {k}" for k in expected if k not in state_dict]
    problems += [f"unexpected {k}" for k in state_dict if k not in expected]
    problems += [
        f"{k} has shape {tuple(state_dict[k].shape)}, config implies {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and state_dict[k].shape != v.shape
    ]
    for key, value in state_dict.items():
        if key not in expected:
            continue
        if expected[key].is_floating_point() != value.is_floating_point():
            problems.append(f"{key} is {str(value.dtype).removeprefix('torch.')}, config implies "
                            f"{'a floating dtype' if expected[key].is_floating_point() else 'integer ids'}")
        elif value.is_floating_point() and not bool(torch.isfinite(value).all()):
            problems.append(f"{key} holds NaN or infinite values")
    vocab = state_dict.get("draft_vocab")
    if vocab is not None and "draft_vocab" in expected and not vocab.is_floating_point() and vocab.numel():
        if int(vocab.min()) < 0 or int(vocab.max()) >= config.vocab_size:
            problems.append(f"draft_vocab holds token ids outside [0, {config.vocab_size}) (from {int(vocab.min())} "
                            f"to {int(vocab.max())})")
        elif vocab.unique().numel() != vocab.numel():
            problems.append(f"draft_vocab lists {vocab.numel() - vocab.unique().numel()} token ids twice")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise UserError(f"{path} does not match its config ({config.head_type}, {config.num_heads} heads, "
                        f"hidden {config.hidden_size}, vocab {config.vocab_size}): {shown}.")


def check_calibration(generation_config: GenerationConfig, config: CerberusConfig, path: str) -> None:
    """Refuse a generation config whose stored calibration (`cerberus-hf calibrate`) `generate()` could not use:
    each entry's settings are built as a call builds them (trees, gate, rescoring), strict halves included, so a
    bad entry fails on load with the file and the entry named, not at some later call on that machine."""
    entries = getattr(generation_config, "cerberus_calibration", None)
    if entries is None:
        return
    if not isinstance(entries, dict):
        raise UserError(f"{path}: cerberus_calibration must map device keys to settings, got {type(entries).__name__}.")
    for key, entry in entries.items():
        for label, settings in ((key, entry), (f"{key} (strict)", (entry or {}).get("strict") if isinstance(entry, dict) else None)):
            if settings is None and label != key:
                continue
            try:
                check_entry(settings, config)
            except (ValueError, TypeError) as error:
                raise UserError(f"{path}: calibration entry {label!r}: {error}") from None


def check_rescorer(own: CerberusConfig, config: CerberusConfig, where: str) -> None:
    """Refuse a neural rescorer (``config``, read from ``where``) that heads of config ``own`` cannot use: one of a
    family that guesses from the base's state alone, or one made for another base."""
    drafter_class = DRAFTER_CLASSES[config.head_type]
    if not drafter_class.drafts_chains:
        raise UserError(f"{where} holds {config.head_type} heads, which guess from the base's state alone; a "
                        "neural rescorer must read tokens on its own: use a kangaroo checkpoint.")
    mine, theirs = own.base_model_name_or_path, config.base_model_name_or_path
    if (config.hidden_size, config.vocab_size) != (own.hidden_size, own.vocab_size) or (
            mine and theirs and mine != theirs):
        raise UserError(f"{where} was made for another base ({theirs or config.base_model_type}, hidden size "
                        f"{config.hidden_size}, vocabulary {config.vocab_size}) than these heads' "
                        f"({mine or own.base_model_type}, {own.hidden_size}, "
                        f"{own.vocab_size}).")


def rescorer_folder(path: str, hub_kwargs: dict) -> str | None:
    """Where the checkpoint at ``path`` (folder or Hub id) keeps its neural rescorer, its weights fetched beside its
    config (None: it has none)."""
    rescorer_file = resolve_file(path, f"{RESCORER_FOLDER}/config.json", required=False, **hub_kwargs)
    if rescorer_file is None:
        return None
    resolve_file(path, f"{RESCORER_FOLDER}/{HEADS_WEIGHTS_NAME}", **hub_kwargs)  # beside it (from the Hub too)
    return os.path.dirname(rescorer_file)
