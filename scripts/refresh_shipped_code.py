"""Rewrite the remote code in every shipped folder under model_cards/ from the package (after a code change).

Removes the folder's old Python files and writes `cerberus_hf.remote_code.remote_code_files` in their place;
weights, configs and cards are left alone.  Usage: python scripts/refresh_shipped_code.py
"""

from pathlib import Path

import cerberus_hf.modeling_cerberus  # noqa: F401  (the entry module must be imported)
from cerberus_hf.remote_code import write_remote_code

for folder in sorted(Path(__file__).resolve().parents[1].glob("model_cards/*/")):
    if not (folder / "config.json").is_file():
        continue
    for old in folder.glob("*.py"):
        old.unlink()
    written = write_remote_code(folder, "cerberus_hf.modeling_cerberus")
    print(f"{folder.name}: {len(written)} modules")
