"""Bases split raw over numbered PyPI packages (Qwen2.5-Coder): assembled once, checksummed, and a missing or
corrupt part named in one line, with fake installed packages (dist-info folders on sys.path)."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

from cerberus_hf import real_models
from cerberus_hf.real_models import PackagedModel, gguf_path

PARTS = [b"first part " * 100, b"second part " * 50, b"third"]


def install_fake_part(site: Path, package: str, index: int, data: bytes) -> None:
    """A wheel-installed package ``{package}-part{index}`` holding ``data/partNN.bin``, as pip leaves it."""
    module = f"{package.replace('-', '_')}_part{index}"
    data_file = site / module / "data" / f"part{index:02d}.bin"
    data_file.parent.mkdir(parents=True)
    data_file.write_bytes(data)
    info = site / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}-part{index}\nVersion: 0.1.0\n")
    (info / "RECORD").write_text(f"{module}/data/part{index:02d}.bin,,\n{info.name}/METADATA,,\n")


def fake_model(sha256: str | None) -> PackagedModel:
    return PackagedModel(name="fake-split", hub_id="org/fake-split", package="cerberus-fake-split",
                         gguf_file="fake.gguf", parts=len(PARTS), sha256=sha256, extra="qwen-coder")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CERBERUS_HF_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    return folder


def test_parts_are_concatenated_in_order_and_checked(site):
    for index, data in enumerate(PARTS, 1):
        install_fake_part(site, "cerberus-fake-split", index, data)
    whole = b"".join(PARTS)
    path = gguf_path(fake_model(hashlib.sha256(whole).hexdigest()))
    assert path.read_bytes() == whole
    assert path.parent == real_models.cache_dir() / "gguf"
    assert [p.name for p in path.parent.iterdir()] == ["fake.gguf"]  # no partial file left
    assert gguf_path(fake_model("not read again")) == path  # assembled once


def test_a_missing_part_is_named_with_the_install_command(site):
    install_fake_part(site, "cerberus-fake-split", 1, PARTS[0])
    install_fake_part(site, "cerberus-fake-split", 3, PARTS[2])
    with pytest.raises(ModuleNotFoundError) as error:
        gguf_path(fake_model(None))
    message = str(error.value)
    assert "'cerberus-fake-split-part2'" in message and "pip install 'cerberus-hf[qwen-coder]'" in message
    assert "\n" not in message
    assert not (real_models.cache_dir() / "gguf" / "fake.gguf").exists()


def test_a_corrupt_part_fails_the_checksum_and_leaves_nothing(site):
    for index, data in enumerate(PARTS, 1):
        install_fake_part(site, "cerberus-fake-split", index, data[:-1] + b"!" if index == 2 else data)
    expected = hashlib.sha256(b"".join(PARTS)).hexdigest()
    with pytest.raises(ValueError, match="reinstall") as error:
        gguf_path(fake_model(expected))
    assert expected in str(error.value) and "\n" not in str(error.value)
    assert not any((real_models.cache_dir() / "gguf").iterdir())


@pytest.mark.parametrize("model", [real_models.QWEN_CODER_1_5B, real_models.QWEN_CODER_0_5B])
def test_the_qwen_bases_are_listed_with_their_checksums(model):
    assert real_models.PACKAGED_MODELS[model.name] is model
    assert model.parts and len(model.sha256) == 64 and model.extra == "qwen-coder"
