"""The code a saved folder carries so that it loads with ``trust_remote_code=True``, written as flat modules.

transformers' remote-code loader copies the module named in ``auto_map`` and, recursively, every module it
imports relatively into one flat folder, resolving ``from .x import`` to ``x.py`` beside it. It cannot
follow a subpackage (``from .decoding.tree import``) or a parent (``from ..gate import``), so the package's
own layout cannot be copied as it is. Instead the modules the model needs are written flat:
``decoding/tree.py`` becomes ``decoding_tree.py`` and every relative import is rewritten to the flat name.
Only modules reachable from the entry module are written (no CLI, training or benchmark code). Applied to
an already-flat copy (a model loaded as remote code and saved again) it reproduces the same files.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_RELATIVE_IMPORT = re.compile(r"^(\s*)from\s+(\.+)([\w.]*)\s+import\b", re.M)


def _flat_stem(path: Path, root: Path) -> str:
    relative = path.relative_to(root)
    parts = relative.parent.parts if relative.name == "__init__.py" else relative.with_suffix("").parts
    if not parts:
        raise ValueError(f"{path}: the package root's __init__ cannot be part of remote code.")
    return "_".join(parts)


def _resolve(importer: Path, dots: str, dotted: str) -> Path:
    """The file of the module ``from <dots><dotted> import`` names, seen from ``importer``."""
    folder = importer.parent
    for _ in range(len(dots) - 1):
        folder = folder.parent
    target = folder.joinpath(*dotted.split(".")) if dotted else folder
    if target.is_dir():
        return target / "__init__.py"
    return target.with_suffix(".py")


def remote_code_files(entry_module: str) -> dict[str, str]:
    """``{flat file name: source}`` for the module ``entry_module`` (imported) and all it imports relatively.

    The root of the flat layout is the entry module's folder, so its siblings keep their names.
    """
    entry = Path(sys.modules[entry_module].__file__).resolve()
    root = entry.parent
    pending, files = [entry], {}
    while pending:
        path = pending.pop()
        name = _flat_stem(path, root) + ".py"
        if name in files:
            continue

        def rewrite(match: re.Match, importer: Path = path) -> str:
            target = _resolve(importer, match.group(2), match.group(3))
            if not target.is_file():
                raise FileNotFoundError(f"{importer} imports {match.group(2)}{match.group(3)}, which is not {target}.")
            pending.append(target)
            return f"{match.group(1)}from .{_flat_stem(target, root)} import"

        files[name] = _RELATIVE_IMPORT.sub(rewrite, path.read_text(encoding="utf-8"))
    return files


def write_remote_code(folder: str | Path, entry_module: str) -> list[Path]:
    """Write `remote_code_files` of ``entry_module`` into ``folder``; returns the paths written."""
    written = []
    for name, source in sorted(remote_code_files(entry_module).items()):
        path = Path(folder) / name
        path.write_text(source, encoding="utf-8")
        written.append(path)
    return written


def auto_map_entry(cls: type) -> str:
    """``"<flat module>.<Class>"``: how ``auto_map`` names a class whose module sits at the flat root."""
    return f"{Path(sys.modules[cls.__module__].__file__).stem}.{cls.__name__}"
