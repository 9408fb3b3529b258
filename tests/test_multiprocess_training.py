"""Head training on two processes (`torchrun --nproc_per_node 2`, gloo), against one process.

Each test launches `cerberus-hf train` with torchrun (through tests/launch_train.py, which records the shards each
process computed and can kill every process mid-run) on a tiny random Llama saved to disk, one thread a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from helpers import write_greedy_records
from tiny_models import tiny_model

from cerberus_hf.training.checkpointing import WEIGHTS_NAME

pytestmark = pytest.mark.slow

LAUNCHER = Path(__file__).with_name("launch_train.py")
# All-reduce sums the two halves' gradients in another order than one process sums the whole batch, so the weights
# differ in the last bits; after 12 AdamW steps the largest difference measured was 9.5e-8 (docs/training.md).
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny base folder and 16 records of its own greedy answers."""
    folder = tmp_path_factory.mktemp("multiprocess")
    base = tiny_model("llama")
    base.save_pretrained(folder / "base")
    write_greedy_records(base, folder / "data.jsonl")
    return folder


# 12 steps of Hydra heads, checkpointed every 4.
HYDRA = ["--head-type", "hydra", "--num-heads", "3", "--max-steps", "12", "--save-every", "4", "--batch-size", "32",
         "--lr", "3e-2", "--distill-weight", "0.5", "--eval-every", "100", "--eval-fraction", "0.25"]


def launch(setup: Path, processes: int, output: Path, *, kill_at: int = 0, cache: str = "cache",
           recipe: list[str] = HYDRA) -> subprocess.CompletedProcess:
    """`cerberus-hf train` with ``recipe`` over ``processes`` processes; the cache is 4 shards (shard_tokens 256)."""
    output.mkdir(parents=True, exist_ok=True)
    options = ["--base", str(setup / "base"), "--data", str(setup / "data.jsonl"), "--output", str(output),
               "--cache-dir", str(setup / cache), "--no-progress", *recipe]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               str(LAUNCHER), str(output), str(kill_at), "256", "--", *options]  # standalone: a free port
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=300)


def errors(run: subprocess.CompletedProcess) -> str:
    """The lines of a failed launch that say why."""
    return "\n".join(line for line in run.stderr.splitlines() if "error" in line.lower())[-3000:]


def heads(output: Path, step: int = 12) -> dict[str, torch.Tensor]:
    return load_file(output / "checkpoints" / f"step-{step:08d}" / WEIGHTS_NAME)


def shards_computed(output: Path, processes: int) -> list[int]:
    return [json.loads((output / f"shards-{rank}.json").read_text())["computed"] for rank in range(processes)]


def test_two_processes_train_the_weights_of_one_and_compute_each_shard_once(setup, tmp_path):
    one = launch(setup, 1, tmp_path / "one", cache="cache-one")
    assert one.returncode == 0, errors(one)
    two = launch(setup, 2, tmp_path / "two", cache="cache-two")
    assert two.returncode == 0, errors(two)
    assert shards_computed(tmp_path / "one", 1) == [4]
    assert shards_computed(tmp_path / "two", 2) == [2, 2]  # each of the 4 shards once, split between the processes
    a, b = heads(tmp_path / "one"), heads(tmp_path / "two")
    assert a.keys() == b.keys()
    difference = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"largest weight difference, 2 processes against 1: {difference:.3g}")
    assert difference < TOLERANCE
    earlier = heads(tmp_path / "one", step=8)
    assert max(float((a[k] - earlier[k]).abs().max()) for k in a) > 100 * TOLERANCE  # 4 steps move them far more
    history = [json.loads((tmp_path / run / "training_metrics.json").read_text())["history"] for run in ("one", "two")]
    assert [e["loss"] for e in history[0]] == pytest.approx([e["loss"] for e in history[1]], rel=1e-4)
    again = launch(setup, 2, tmp_path / "again", cache="cache-two")  # the cache is complete: nothing computed
    assert again.returncode == 0, errors(again)
    assert shards_computed(tmp_path / "again", 2) == [0, 0]


def test_two_processes_killed_mid_run_resume_to_the_same_weights(setup, tmp_path):
    whole = launch(setup, 2, tmp_path / "whole")
    assert whole.returncode == 0, errors(whole)
    killed = launch(setup, 2, tmp_path / "killed", kill_at=6)  # both killed between the checkpoints of 4 and 8
    assert killed.returncode != 0
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-00000004"]
    resumed = launch(setup, 2, tmp_path / "killed")
    assert resumed.returncode == 0, errors(resumed)
    assert "resuming from" in resumed.stderr
    a, b = heads(tmp_path / "whole"), heads(tmp_path / "killed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("recipe", [["--head-type", "eagle3"], ["--head-type", "kangaroo", "--exit-layer", "1"]])
def test_sequence_trainers_refuse_several_processes(setup, tmp_path, recipe):
    """Their steps are groups of whole sequences that no process splits (docs/training.md): refused, not run twice."""
    run = launch(setup, 2, tmp_path / "out", recipe=[*recipe, "--max-steps", "2"])
    assert run.returncode != 0
    assert "runs in one process (2 were launched)" in run.stderr
    assert not (tmp_path / "out" / "config.json").exists()
