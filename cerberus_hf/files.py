"""Files the package reads from itself and files it writes for the user, in one place.

- `packaged_file`: a file of the package's ``data/`` folder, found through `importlib.resources`, so that every
  default a command reads (the training prompts, the MT-Bench questions) is the installed package's own copy, from a
  wheel as from a checkout, never a path relative to a source tree.
- `save_safetensors`, `write_atomically`, `give_user_mode`: what the library writes gets the permissions any other
  file of the user gets (``0o666`` less the umask, as `open` gives a new file). safetensors (0.8) writes through a
  temporary file created ``0o600`` and renames it, and `tempfile.mkstemp` creates ``0o600`` too: left as
  they are, heads, exports, n-gram models and caches would be unreadable by a serving engine running as another user
  or by the other users of a shared model folder.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.resources
import os
import tempfile
import threading
from pathlib import Path

import torch
from safetensors.torch import save_file

_PROC_STATUS = "/proc/self/status"  # Linux (4.7 and later) reports the umask there: reading it changes nothing
_UMASK_LOCK = threading.Lock()
# packaged files copied out of an install that is not a folder (a zip), removed when the process exits
_EXTRACTED = contextlib.ExitStack()
atexit.register(_EXTRACTED.close)


def packaged_file(name: str) -> Path:
    """The path of ``name`` in the package's ``data/`` folder, through `importlib.resources` (the installed copy, a
    file on disk however the package was installed)."""
    resource = importlib.resources.files(__package__) / "data" / name
    return _EXTRACTED.enter_context(importlib.resources.as_file(resource))


def _umask() -> int:
    """The process's umask. Read from `_PROC_STATUS` where the system reports it; elsewhere `os.umask` can only set
    it, so it is set and put back under a lock, set to ``0o077`` meanwhile: a file another thread creates in that
    instant is private, never more open than the user asked."""
    try:
        with open(_PROC_STATUS, encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        umask = os.umask(0o077)
        os.umask(umask)
    return umask


def user_file_mode() -> int:
    """The mode a new file of this process gets from `open`: ``0o666`` less the umask (read at each call, so a
    umask changed after import is respected)."""
    return 0o666 & ~_umask()


def give_user_mode(path: str | os.PathLike) -> None:
    """Set ``path``'s mode to `user_file_mode`: for a file a writer created with a mode of its own (safetensors'
    ``0o600``)."""
    os.chmod(path, user_file_mode())


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike,
                     metadata: dict[str, str] | None = None) -> None:
    """`safetensors.torch.save_file`, the file then given `user_file_mode`."""
    save_file(tensors, str(path), metadata=metadata)
    give_user_mode(path)


@contextlib.contextmanager
def _replaced_atomically(path: str | os.PathLike):
    """Yield the name of a new temporary file beside ``path`` to write; it is moved onto ``path`` (given
    `user_file_mode`) when the block ends and removed when it raises: a reader or a killed run never sees half a file,
    and two writers (processes or threads) never share a temporary name."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        yield temporary
        give_user_mode(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (flushed to disk before it takes the name)."""
    with _replaced_atomically(path) as temporary, open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def save_safetensors_atomically(tensors: dict[str, torch.Tensor], path: str | os.PathLike,
                                metadata: dict[str, str] | None = None) -> None:
    """`save_safetensors` whole or not at all: written beside ``path`` under a temporary name, then renamed."""
    with _replaced_atomically(path) as temporary:
        save_file(tensors, temporary, metadata=metadata)
