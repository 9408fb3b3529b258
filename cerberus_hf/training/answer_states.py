"""The base's states over its own answers, kept while it writes them, so that training need not run it again.

Distilling runs the base over every prompt and answer token; the hidden-state cache (`hidden_cache`) then ran it
over the same tokens once more, only to read the state from which it predicted each answer token. On a CPU that
second pass cost as much as the distilling (docs/training.md). While `distill` generates, the lm_head's input at the
prompt's last position and at every decoded position is exactly that state, so it is kept (float16, as the cache
keeps it) for each answer written, and the cache takes it instead of computing it.

One file per answer record, ``<cache_dir>/answer-states/<base key>/<record content hash>.safetensors`` holding
``hidden`` ``[answer tokens, hidden size]``: ``base key`` names the base's fingerprint (`base_fingerprint`: type,
shape, dtype and weight checksum), so states kept from one base in one dtype serve only that base in that dtype;
the record's content hash names its prompt, answer and mode, so an answer written again or edited is never paired
with another's states. Files are written to a temporary name and renamed; a record without one (a kill between its
line and its file, another engine, answers written before this existed) is computed by the cache as before.

The states come from batched decoding (left-padded rows, one step at a time), the cache's own from one forward over
each whole record: the same state up to the rounding of another order of summation, which the 28 layers of a 1.5B
base carry through to a few float16 values in a thousand (docs/training.md), far below what training resolves.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from ..files import save_safetensors_atomically

FOLDER = "answer-states"


def states_folder(cache_dir: str | os.PathLike, fingerprint: dict) -> Path:
    """Where the answer states of the base with this `base_fingerprint` live under ``cache_dir``."""
    key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / FOLDER / key


def save_states(folder: Path, record_hash: str, hidden: torch.Tensor) -> None:
    """Keep ``hidden`` ``[answer tokens, hidden size]`` for the record with this content hash (float16); nothing is
    kept where a state overflows float16 (the cache then computes the record, and refuses it the same way)."""
    half = hidden.to(torch.float16).cpu().contiguous()
    if not bool(torch.isfinite(half).all()):
        return
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors_atomically({"hidden": half}, folder / f"{record_hash}.safetensors")


def load_states(folder: Path | None, record_hash: str, tokens: int, hidden_size: int) -> torch.Tensor | None:
    """The first ``tokens`` kept states of a record (the cache may cut a long record short), where they are and have
    the shape for it; else None."""
    if folder is None:
        return None
    path = folder / f"{record_hash}.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        hidden = handle.get_tensor("hidden")
    return hidden[:tokens] if hidden.shape[0] >= tokens and hidden.shape[1:] == (hidden_size,) else None
