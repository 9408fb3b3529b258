"""The code a saved folder carries so that it loads with ``trust_remote_code=True``: three short modules that import
the installed package (the config, the model, the base's tokenizer), and transformers' ``custom_generate/`` folder.

Why imports and not the code itself: release 0.1 copied 27 to 30 package modules into every saved folder,
flattened so that transformers' copier could follow them. A copy is frozen when it is saved: it carries no version
pin, so it broke on the day its user upgraded transformers (5.24 renamed the cache argument), it cannot be mended
by upgrading the package, and it made every Hub repository of heads a fork of the package. With the stubs the
code lives in one place, the installed package, which pip versions; a folder holds weights, config, card and
calibration. A user who lacks the package is told by transformers' own import check what to install
(``pip install cerberus_hf``; pip reads the underscore as the hyphen).

``custom_generate/generate.py`` serves ``base.generate(**inputs, custom_generate=<folder or Hub id>,
trust_remote_code=True)`` for a base the user has loaded already (`cerberus_hf.custom_generate`);
``custom_generate/requirements.txt`` makes transformers name the release that has it when an older one is installed.

Folders saved by 0.1 still load with `CerberusForCausalLM.from_pretrained`, which notes their copied code;
``cerberus-hf refresh-folder FOLDER`` (`refresh_folder`) swaps that code for the stubs.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from transformers.utils import CONFIG_NAME

from .checkpoint import HEADS_WEIGHTS_NAME
from .errors import UserError

AUTO_MAP = {
    "AutoConfig": "configuration_cerberus.CerberusConfig",
    "AutoModelForCausalLM": "modeling_cerberus.CerberusForCausalLM",
}

# The first release whose package has every module the stubs import.
REQUIRES = "cerberus-hf>=0.2.0"

_STUB = '''"""{what} from the installed cerberus-hf package (`pip install cerberus-hf`).

This folder holds draft heads; the code that runs them is the package's, so it follows the package's releases.
"""

from cerberus_hf.{module} import {name}

__all__ = ["{name}"]
'''

LOADING_CODE = {
    "configuration_cerberus.py": _STUB.format(
        what="The configuration of these draft heads", module="configuration_cerberus", name="CerberusConfig"),
    "modeling_cerberus.py": _STUB.format(
        what="The base model with these draft heads", module="modeling_cerberus", name="CerberusForCausalLM"),
    "tokenization_cerberus.py": _STUB.format(
        what="The tokenizer of these draft heads' base", module="tokenization_cerberus", name="CerberusTokenizer"),
}
# The folder's tokenizer_config.json, where it has no tokenizer of its own: AutoTokenizer (and so pipeline()) finds
# the base's tokenizer through the stub (`tokenization_cerberus`)
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_ENTRY = {"auto_map": {"AutoTokenizer": [None, "tokenization_cerberus.CerberusTokenizer"]}}

CUSTOM_GENERATE_CODE = {
    "custom_generate/generate.py": '''"""Speculative decoding with the draft heads of this repository, for a base model loaded already:

    base.generate(**inputs, custom_generate="<this repository or folder>", trust_remote_code=True)

Output equals the same call without ``custom_generate`` (greedy: token for token); the heads only make it sooner.
The decoding loop is the installed cerberus-hf package's (`pip install cerberus-hf`).
"""

from cerberus_hf.custom_generate import generate

__all__ = ["generate"]
''',
    "custom_generate/requirements.txt": REQUIRES + "\n",
}

# Python files that release 0.1 (and the lab versions before it) copied into saved folders.
_COPIED_MODULE = re.compile(
    r"^(?:(?:decoding|drafters)(?:_\w+)?|acceptance|base_model|candidate_generator|checkpoint|compat|"
    r"context_lookup|errors|gate|heads|module_views|profiling|real_models|remote_code|stats|tree)\.py$"
)


# The first release that runs each head type, where it is later than `REQUIRES`'s.
FIRST_RELEASE = {"eagle3": "0.3.0"}


def custom_generate_code(head_type: str) -> dict[str, str]:
    """`CUSTOM_GENERATE_CODE` for a folder of ``head_type`` heads: its requirements name the first release that runs
    them."""
    if head_type not in FIRST_RELEASE:
        return CUSTOM_GENERATE_CODE
    return {**CUSTOM_GENERATE_CODE, "custom_generate/requirements.txt": f"cerberus-hf>={FIRST_RELEASE[head_type]}\n"}


def write_loading_code(folder: str | os.PathLike, files: dict[str, str] = LOADING_CODE) -> list[Path]:
    """Write ``files`` (by default the stub modules, whose ``auto_map`` is `AUTO_MAP`, which the config writes, with
    the tokenizer's `TOKENIZER_ENTRY`; `CUSTOM_GENERATE_CODE` for the ``custom_generate/`` folder) into ``folder``;
    returns the paths written. A tokenizer saved in the folder is kept: its own config is not replaced."""
    written = []
    for name, text in files.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    entry = Path(folder) / TOKENIZER_CONFIG_NAME
    if "tokenization_cerberus.py" in files and not entry.is_file():
        entry.write_text(json.dumps(TOKENIZER_ENTRY, indent=2) + "\n", encoding="utf-8")
        written.append(entry)
    return written


def copied_code(folder: str | os.PathLike) -> list[Path]:
    """The package modules an earlier release copied into ``folder`` (empty for a folder of this layout)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stubs = (folder / "modeling_cerberus.py", folder / "configuration_cerberus.py")
    copied = sorted(path for path in folder.glob("*.py") if _COPIED_MODULE.match(path.name))
    # a 0.1 folder's modeling/configuration modules are the copies themselves, not the stubs
    copied += [path for path in stubs if path.is_file() and path.read_text(encoding="utf-8") != LOADING_CODE[path.name]]
    return copied


def refresh_folder(folder: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """Bring a saved folder to this layout: remove the code an earlier release copied into it, write the stubs and
    ``custom_generate/``, and set ``auto_map`` in its config; the same in a subfolder that holds draft heads of its
    own (a lattice rescorer). Weights, configs, calibration and card are kept. Returns (removed, written)."""
    folder = Path(folder)
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no {CONFIG_NAME}; not a saved folder of draft heads")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("model_type") != "cerberus":
        raise UserError(f"{config_path}: model_type is {config.get('model_type')!r}, not 'cerberus'")
    removed = copied_code(folder)
    for path in removed:
        path.unlink()
    has_heads = (folder / HEADS_WEIGHTS_NAME).is_file()
    generate_code = custom_generate_code(config.get("head_type", "cerberus")) if has_heads else {}
    written = write_loading_code(folder, {**LOADING_CODE, **generate_code})
    if config.get("auto_map") != AUTO_MAP:
        config["auto_map"] = AUTO_MAP
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for sub in sorted(path.parent for path in folder.glob(f"*/{CONFIG_NAME}")):
        if json.loads((sub / CONFIG_NAME).read_text(encoding="utf-8")).get("model_type") == "cerberus":
            more_removed, more_written = refresh_folder(sub)
            removed, written = removed + more_removed, written + more_written
    return removed, written

