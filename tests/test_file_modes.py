"""Files the library writes get the mode any other file of the user gets: ``0o666`` less the umask (`cerberus_hf.files`).

safetensors writes ``0o600`` and `tempfile.mkstemp` too: heads, exports, n-gram models and the first-use calibration
cache were unreadable by a serving engine running as another user until every writer went through `cerberus_hf.files`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load_file

from cerberus_hf import files
from cerberus_hf.calibration.first_use import CalibrationCache
from cerberus_hf.hardware import HardwareKey
from cerberus_hf.tools.cli import main as cli_main
from cerberus_hf.tools.export import export_speculators, export_vllm_medusa
from helpers import fresh_model, get_base, tiny_ngram, write_greedy_records

MODES = [(0o022, 0o644), (0o077, 0o600)]


@pytest.fixture(params=MODES, ids=["umask-022", "umask-077"])
def expected_mode(request) -> int:
    """Run the test under each umask; the mode every written file must have."""
    umask, mode = request.param
    previous = os.umask(umask)
    yield mode
    os.umask(previous)


def modes(folder: Path) -> dict[str, int]:
    """The permission bits of every file under ``folder``, by path relative to it."""
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


def test_save_pretrained_writes_every_file_with_the_users_mode(tmp_path, expected_mode):
    model = fresh_model("llama", "cerberus", num_heads=2)
    model.ngram = tiny_ngram(model.config.vocab_size)
    model.save_pretrained(tmp_path / "heads")
    written = modes(tmp_path / "heads")
    assert {"cerberus_heads.safetensors", "ngram.safetensors", "config.json"} <= set(written)
    assert set(written.values()) == {expected_mode}, written


@pytest.mark.parametrize("family, export", [("eagle3", export_speculators), ("medusa", export_vllm_medusa)])
def test_exports_are_written_with_the_users_mode(tmp_path, expected_mode, family, export):
    export(fresh_model("llama", family, num_heads=2), tmp_path / "out")
    assert modes(tmp_path / "out") == {"config.json": expected_mode, "model.safetensors": expected_mode}


def test_the_ngram_commands_output_has_the_users_mode(tmp_path, expected_mode):
    model = fresh_model("llama", "cerberus", num_heads=2)
    model.save_pretrained(tmp_path / "heads")
    data = write_greedy_records(get_base("llama"), tmp_path / "records.jsonl", count=4)
    output = tmp_path / "counted.safetensors"
    assert cli_main(["ngram", "--heads", str(tmp_path / "heads"), "--data", str(data), "--order", "2",
                     "--output", str(output)]) == 0
    assert stat.S_IMODE(output.stat().st_mode) == expected_mode


def test_the_calibration_cache_has_the_users_mode(tmp_path, expected_mode, monkeypatch):
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf_home"))  # a cache folder of the test's own
    monkeypatch.setattr(CalibrationCache, "_remembered", {})
    cache = CalibrationCache("0123456789abcdef")
    cache.write(HardwareKey.of("cpu", torch.float32), {"draft_tree": [[0]]}, {"seconds": 1.0})
    cache.write(HardwareKey.of("cpu", torch.bfloat16), {"draft_tree": [[0]]}, {"seconds": 1.0})  # rewritten whole
    assert stat.S_IMODE(cache.path.stat().st_mode) == expected_mode
    assert [p.name for p in cache.path.parent.iterdir()] == [cache.path.name]  # no temporary file left


@pytest.mark.parametrize("where", ["proc", "os.umask"])
def test_the_umask_is_read_and_left_as_it_was(tmp_path, monkeypatch, where):
    if where == "os.umask":  # where the system does not report it: set and put back
        monkeypatch.setattr(files, "_PROC_STATUS", str(tmp_path / "absent"))
    previous = os.umask(0o027)
    try:
        assert files.user_file_mode() == 0o640
    finally:
        assert os.umask(previous) == 0o027


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "state.json"
    files.write_atomically(path, "old")
    with pytest.raises(TypeError):
        files.write_atomically(path, b"new")  # bytes to a text file: fails once the temporary file exists
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failed_safetensors_save_leaves_the_old_file_and_no_temporary_one(tmp_path, expected_mode):
    path = tmp_path / "shard.safetensors"
    files.save_safetensors_atomically({"x": torch.ones(2)}, path)
    with pytest.raises(ValueError):  # refused after the temporary file exists
        files.save_safetensors_atomically({"x": torch.ones(2), "y": "not a tensor"}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["shard.safetensors"] and modes(tmp_path) == {path.name: expected_mode}
    assert load_file(path)["x"].tolist() == [1.0, 1.0]
