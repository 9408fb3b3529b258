"""Head checkpoint files: where they are (folder or Hub cache), reading them safely, writing them.

Only safetensors are read: a pickle can run code on load, so a checkpoint that only has pickle weights
is refused rather than converted behind the user's back.
"""

from __future__ import annotations

import os

import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers.utils import cached_file

from .files import save_safetensors

HEADS_WEIGHTS_NAME = "cerberus_heads.safetensors"
PICKLE_WEIGHT_NAMES = ("cerberus_heads.bin", "pytorch_model.bin", "cerberus_heads.pt", "heads.pt", "medusa_lm_head.pt",
                       "medusa_lm_head.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth", ".ckpt")  # how a pickle is named

# from_pretrained keywords that say which copy of a folder or Hub repository to read
HUB_KWARGS = ("revision", "cache_dir", "force_download", "local_files_only", "token", "subfolder")


def check_source(name_or_path: str, filename: str | None = None) -> None:
    """Refuse a folder or Hub id that can be neither: not an existing folder, and not shaped like a Hub id
    (``name`` or ``namespace/name``; a path such as ``/data/heads`` or ``./heads`` is not), so that a mistyped
    path is named as such instead of being sent to the Hub; and a folder without ``filename`` when given."""
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        if filename is not None and not os.path.isfile(os.path.join(name_or_path, filename)):
            raise FileNotFoundError(f"no {filename} in {name_or_path}")
        return
    if os.path.exists(name_or_path):
        raise NotADirectoryError(f"{name_or_path} is a file, not a folder or Hub id")
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        raise FileNotFoundError(f"no folder or Hub id {name_or_path}") from None


def resolve_file(name_or_path: str, filename: str, required: bool = True, **hub_kwargs) -> str | None:
    """Local path of ``filename`` in a folder or a Hub repo (through the Hub cache, so offline works)."""
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, filename)
        if os.path.isfile(path):
            return path
        if os.path.islink(path):  # a copied folder whose link pointed outside it: damaged, not "without the file"
            raise FileNotFoundError(f"{path} is a link to {os.readlink(path)}, which does not exist from there; copy "
                                    "the file itself into the folder or mend the link")
        if required:
            raise FileNotFoundError(f"no {filename} in {name_or_path}")
        return None
    check_source(name_or_path)
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
    refuse_pickles(name_or_path, HEADS_WEIGHTS_NAME, **hub_kwargs)
    raise OSError(f"{name_or_path} has no {HEADS_WEIGHTS_NAME}: it is not a cerberus-hf head checkpoint.")


def refuse_pickles(name_or_path: str, expected: str, **hub_kwargs) -> None:
    """Refuse, in one line that says how to convert it, a checkpoint that has pickle weights where ``expected`` (its
    safetensors file) is missing: one of `PICKLE_WEIGHT_NAMES`, or in a local folder any file named as a pickle
    (`PICKLE_SUFFIXES`). Nothing is unpickled, only names are looked at."""
    names = list(PICKLE_WEIGHT_NAMES)
    if os.path.isdir(name_or_path):
        names += sorted(name for name in os.listdir(name_or_path) if name.lower().endswith(PICKLE_SUFFIXES))
    for name in names:
        if resolve_file(name_or_path, name, required=False, **hub_kwargs) is not None:
            raise OSError(
                f"{name_or_path} holds pickle weights ({name}) and no {expected}. cerberus-hf only loads "
                "safetensors, because unpickling can execute arbitrary code. Convert the file where you trust it "
                f"(torch.load, then safetensors.torch.save_file to {expected}) and load the result."
            )


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
    save_safetensors({k: v.detach().contiguous() for k, v in state_dict.items()}, path, metadata={"format": "pt"})
    return path
