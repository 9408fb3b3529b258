"""Head checkpoint files: where they are (folder or Hub cache), reading them safely, writing them.

Only safetensors are read: a pickle can run code on load, so a checkpoint that only has pickle weights
is refused rather than converted behind the user's back.
"""

from __future__ import annotations

import os

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers.utils import cached_file

HEADS_WEIGHTS_NAME = "cerberus_heads.safetensors"
PICKLE_WEIGHT_NAMES = ("cerberus_heads.bin", "pytorch_model.bin", "cerberus_heads.pt", "heads.pt", "medusa_lm_head.pt")


def resolve_file(name_or_path: str, filename: str, required: bool = True, **hub_kwargs) -> str | None:
    """Local path of ``filename`` in a folder or a Hub repo (through the Hub cache, so offline works)."""
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, filename)
        if os.path.isfile(path):
            return path
        if required:
            raise OSError(f"{name_or_path} has no {filename}.")
        return None
    return cached_file(
        name_or_path,
        filename,
        _raise_exceptions_for_missing_entries=required,
        _raise_exceptions_for_connection_errors=required,
        **hub_kwargs,
    )


def resolve_heads_file(name_or_path: str, **hub_kwargs) -> str:
    """The heads' safetensors file; refuses pickle-only checkpoints with a message saying why."""
    path = resolve_file(name_or_path, HEADS_WEIGHTS_NAME, required=False, **hub_kwargs)
    if path is not None:
        return path
    for name in PICKLE_WEIGHT_NAMES:
        if resolve_file(name_or_path, name, required=False, **hub_kwargs) is not None:
            raise OSError(
                f"{name_or_path} holds pickle weights ({name}) and no {HEADS_WEIGHTS_NAME}. cerberus-hf only "
                "loads safetensors, because unpickling can execute arbitrary code. Convert the file where you "
                "trust it (torch.load, then safetensors.torch.save_file) and load the result."
            )
    raise OSError(f"{name_or_path} has no {HEADS_WEIGHTS_NAME}: it is not a cerberus-hf head checkpoint.")


def load_heads_state_dict(path: str) -> dict[str, torch.Tensor]:
    """Read a safetensors file, turning any format error into one that names the file."""
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        raise OSError(
            f"{path} is not a readable safetensors file ({size} bytes; {error}). It may be truncated or corrupt: "
            "download or save it again."
        ) from error


def save_heads_state_dict(state_dict: dict[str, torch.Tensor], folder: str) -> str:
    """Write heads as safetensors (contiguous copies, so tied or strided tensors save cleanly)."""
    path = os.path.join(folder, HEADS_WEIGHTS_NAME)
    save_file({k: v.detach().contiguous() for k, v in state_dict.items()}, path, metadata={"format": "pt"})
    return path
