"""Reading a saved folder's files and checking them before anything heavy loads: the heads' weights against their
config, and each stored calibration entry as `generate()` would build it. A bad file fails here, named, and nothing is
left half-loaded."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from .checkpoint import load_heads_state_dict, resolve_heads_file
from .configuration_cerberus import CerberusConfig
from .blocks.settings import check_entry
from .drafters import build_drafter
from .errors import UserError


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
