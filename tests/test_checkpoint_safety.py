"""Training checkpoints hold safetensors and JSON only, and resuming never unpickles: a pickle planted in a run's
checkpoint folder (or an old accelerate-written checkpoint) is refused, naming the file, before anything is read.
Also the history across a resume and re-running a finished run from the command line."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import struct
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from cerberus_hf.tools import train as train_cli
from cerberus_hf.training import checkpointing
from cerberus_hf.training.batches import HeadStates
from cerberus_hf.training.checkpointing import (
    OPTIMIZER_NAME, RNG_JSON_NAME, RNG_TENSORS_NAME, STATE_NAME, WEIGHTS_NAME, is_pickle_file,
)
from cerberus_hf.training.trainer import train_heads

from test_training import FAST, KANGAROO_FAST, cache_dir, fresh, fresh_kangaroo  # noqa: F401 - a fixture

SETTINGS = replace(FAST, max_steps=2, save_every=2)
STEP = "step-00000002"
NEW_NAMES = (STATE_NAME, WEIGHTS_NAME, OPTIMIZER_NAME, RNG_TENSORS_NAME.format(0), RNG_JSON_NAME.format(0))
# What accelerate's save_state wrote (cerberus-hf before its own format): the first model, optimizer, scheduler,
# sampler and gradient-scaler files, a second of each, registered objects, every process's RNG state, and an FSDP
# folder (torch.distributed.checkpoint's metadata is a pickle too).
ACCELERATE_NAMES = (
    "custom_checkpoint_0.pkl", "random_states_0.pkl", "random_states_1.pkl", "optimizer.bin", "optimizer_1.bin",
    "scheduler.bin", "scheduler_1.bin", "model.safetensors", "model_1.safetensors", "pytorch_model.bin",
    "sampler.bin", "dl_state_dict.bin", "scaler.pt", "pytorch_model_fsdp_0/.metadata",
)
OTHER_NAMES = ("heads.pth", "last.ckpt", "state.pickle", "notes.txt")  # the other pickle suffixes; content only


class Payload:
    """Unpickling this creates the directory ``marker``: proof that a loader ran the file's code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def plant(path, marker, how: str) -> None:
    """Write a pickle whose loading would create ``marker``: ``"pickle-N"`` (protocol N) or ``"torch.save"``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "torch.save":
        torch.save(Payload(marker), path)  # a zip archive with the pickle inside
    else:
        path.write_bytes(pickle.dumps(Payload(marker), protocol=int(how.split("-")[1])))


@pytest.fixture(scope="module")
def finished_run(base, data_path, cache_dir, tmp_path_factory):  # noqa: F811
    """A run folder whose last checkpoint is its final step (new format)."""
    out = tmp_path_factory.mktemp("run")
    train_heads(fresh(base), data_path, out, replace(SETTINGS, cache_dir=cache_dir))
    return out


def test_planted_payloads_work_when_unpickled(tmp_path):
    """The control: each way of planting does run its payload in a loader that unpickles."""
    for how in ("pickle-2", "pickle-5", "torch.save"):
        marker, path = tmp_path / f"marker-{how}", tmp_path / f"payload-{how}"
        plant(path, marker, how)
        if how == "torch.save":
            torch.load(path, weights_only=False)
        else:
            pickle.loads(path.read_bytes())
        assert marker.is_dir()


def test_a_checkpoint_is_safetensors_and_json_only(finished_run):
    folder = finished_run / "checkpoints" / STEP
    assert sorted(p.name for p in folder.iterdir()) == sorted(NEW_NAMES)
    assert not any(is_pickle_file(p) for p in folder.iterdir())
    state = json.loads((folder / STATE_NAME).read_text())
    assert state["step"] == 2 and set(state["optimizer"]) == {"param_groups", "scalars"}
    assert state["optimizer"]["param_groups"][0]["betas"] == [0.9, 0.999] and "lr_lambdas" not in state["scheduler"]
    assert set(state["window"]) == {"loss", "steps", "head_loss", "head_hits", "head_rows"}
    rng = json.loads((folder / RNG_JSON_NAME.format(0)).read_text())
    assert set(rng) == {"python", "numpy"}
    assert load_file(folder / RNG_TENSORS_NAME.format(0))["torch"].dtype == torch.uint8
    optimizer = load_file(folder / OPTIMIZER_NAME)
    assert {key.split(".", 1)[1] for key in optimizer} == {"exp_avg", "exp_avg_sq", "step"}


CASES = [(name, "pickle-" + str(2 + i % 4)) for i, name in enumerate(NEW_NAMES + ACCELERATE_NAMES + OTHER_NAMES)]
CASES += [(WEIGHTS_NAME, "torch.save"), ("model.safetensors", "torch.save"), ("notes.txt", "torch.save")]


@pytest.mark.parametrize("name, how", CASES)
def test_a_planted_pickle_is_refused_unopened(base, data_path, cache_dir, finished_run, tmp_path,  # noqa: F811
                                              name, how):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    planted, marker = run / "checkpoints" / STEP / name, tmp_path / "marker"
    plant(planted, marker, how)
    with pytest.raises(ValueError, match=re.escape(f"{planted} is a pickle; cerberus-hf never unpickles")) as refused:
        train_heads(fresh(base), data_path, run, replace(SETTINGS, cache_dir=cache_dir))
    assert "\n" not in str(refused.value) and "cannot be resumed safely" in str(refused.value)
    assert not marker.exists()


def test_a_planted_pickle_is_refused_by_the_kangaroo_trainer(base, data_path, cache_dir, tmp_path):  # noqa: F811
    from cerberus_hf.training.chain_trainer import train_chain_drafter

    settings = dict(max_steps=2, save_every=2, cache_dir=cache_dir, **KANGAROO_FAST)
    train_chain_drafter(fresh_kangaroo(base), data_path, tmp_path / "run", **settings)
    planted, marker = tmp_path / "run" / "checkpoints" / STEP / "random_states_0.pkl", tmp_path / "marker"
    plant(planted, marker, "pickle-4")
    with pytest.raises(ValueError, match=re.escape(f"{planted} is a pickle")):
        train_chain_drafter(fresh_kangaroo(base), data_path, tmp_path / "run", **settings)
    assert not marker.exists()


def test_a_checkpoint_written_by_accelerate_is_refused(base, data_path, cache_dir, finished_run,  # noqa: F811
                                                      tmp_path):
    """What cerberus-hf wrote before this format: accelerate's save_state files beside trainer_state.json."""
    from accelerate import Accelerator

    model = fresh(base)
    optimizer = torch.optim.AdamW(model.heads.parameters(), lr=1e-3)
    scheduler = checkpointing.cosine_with_warmup(optimizer, 1, 10)
    accelerator = Accelerator()
    accelerator.prepare(HeadStates(model.heads), optimizer)
    accelerator.register_for_checkpointing(scheduler)
    folder = tmp_path / "run" / "checkpoints" / STEP
    accelerator.save_state(str(folder))
    shutil.copy(finished_run / "checkpoints" / STEP / STATE_NAME, folder / STATE_NAME)
    first = sorted(p for p in folder.iterdir() if p.suffix in (".bin", ".pkl"))[0]
    with pytest.raises(ValueError, match=re.escape(f"{first} is a pickle") + ".*before .* cannot be resumed safely"):
        train_heads(fresh(base), data_path, tmp_path / "run", replace(SETTINGS, cache_dir=cache_dir))
    # starting over never reads them
    metrics = train_heads(fresh(base), data_path, tmp_path / "run",
                          replace(SETTINGS, cache_dir=cache_dir, resume=False))
    assert metrics["steps"] == 2 and not any(is_pickle_file(p) for p in (tmp_path / "run").rglob("*") if p.is_file())


def test_a_safetensors_header_that_starts_like_a_pickle_is_not_one(tmp_path):
    """A safetensors header of 0x0280 bytes makes the file begin ``\\x80\\x02``, a pickle protocol-2 header."""
    header = json.dumps({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 0x0280) + header.ljust(0x0280) + struct.pack("<f", 1.5))
    assert path.read_bytes()[:2] == b"\x80\x02" and load_file(path)["x"].item() == 1.5
    assert not is_pickle_file(path)
    for protocol in (2, 3, 4, 5):
        path.write_bytes(pickle.dumps({"x": 1}, protocol=protocol))
        assert is_pickle_file(path)


# ------------------------------------------------------------------------------------------------ the resumed run


def test_the_history_entry_a_resume_splits_averages_all_its_steps(base, data_path, cache_dir, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    """Killed at step 4 with a checkpoint at step 3, the run resumes inside the interval of the entry logged at
    step 5: that entry averages steps 1-5, as the uninterrupted run's does, not 4-5."""
    settings = replace(FAST, max_steps=10, save_every=3, log_every=5, distill_weight=0.5, cache_dir=cache_dir)
    uninterrupted = train_heads(fresh(base, "hydra", head_dropout=0.3), data_path, tmp_path / "uninterrupted",
                                settings)

    def kill(step):
        if step == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "on_step_end", kill)
    with pytest.raises(KeyboardInterrupt):
        train_heads(fresh(base, "hydra", head_dropout=0.3), data_path, tmp_path / "killed", settings)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-00000003"]
    resumed = train_heads(fresh(base, "hydra", head_dropout=0.3), data_path, tmp_path / "killed", settings)
    assert [entry["step"] for entry in resumed["history"]] == [5, 10]
    assert resumed["history"] == uninterrupted["history"]


def test_rerunning_a_finished_run_says_it_is_complete(base, data_path, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("CERBERUS_HF_CACHE", str(tmp_path / "cache"))
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "--base", str(base_dir), "--head-type", "medusa", "--num-heads", "2",
                              "--data", str(data_path), "--output", str(tmp_path / "out"), "--max-steps", "2",
                              "--batch-size", "16", "--no-progress"])
    assert args.func(args) == 0
    assert "positions/s" in capsys.readouterr().out
    assert args.func(args) == 0  # the same command again: the last checkpoint is the final step
    out = capsys.readouterr().out
    assert "None" not in out and "already complete: 2 steps" in out and "heads saved to" in out
