"""`cerberus-hf train` as torchrun runs it, for tests/test_multiprocess_training.py.

``python launch_train.py RECORD_DIR KILL_AT_STEP SHARD_TOKENS -- <train options>``: every process writes the
hidden-state shards it computed to ``RECORD_DIR/shards-<process>.json`` and the batches of the sequence trainers'
feature files (EAGLE-3's features, Kangaroo's exit states) it computed to ``RECORD_DIR/batches-<process>.json``; with
a ``KILL_AT_STEP`` above 0 every process kills itself (SIGKILL, no clean-up) once that step's checkpoint is written;
``SHARD_TOKENS`` makes the cache several shards, and the feature files several batches, even on tiny data.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this worktree's cerberus_hf

from cerberus_hf.drafters import kangaroo
from cerberus_hf.tools.cli import main
from cerberus_hf.training import (
    chain_trainer,
    checkpointing,
    hidden_cache,
    sequence_trainer,
    sequences,
    trainer,
)

RANK = int(os.environ.get("RANK", "0"))


def _recorded(record_dir: Path, shard_tokens: int):
    """`build_hidden_cache` with ``shard_tokens``, writing how many shards this process computed."""

    def build(*args, **kwargs):
        cache = hidden_cache.build_hidden_cache(*args, **kwargs, shard_tokens=shard_tokens)
        (record_dir / f"shards-{RANK}.json").write_text(json.dumps({"computed": cache.info["shards_computed"],
                                                                    "shards": cache.info["shards"]}))
        return cache

    return build


def _counted(record_dir: Path):
    """`first_layers`, which the feature files run once a batch, writing how many batches this process ran."""
    path, calls = record_dir / f"batches-{RANK}.json", [0]
    path.write_text(json.dumps({"computed": 0}))

    @contextlib.contextmanager
    def first_layers(base, count):
        with kangaroo.first_layers(base, count) as decoder:

            def counted(**kwargs):
                calls[0] += 1
                path.write_text(json.dumps({"computed": calls[0]}))
                return decoder(**kwargs)

            yield counted

    return first_layers


def _kill_at(step: int, at: int) -> None:
    if step == at:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    record_dir, kill_at, shard_tokens = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    assert sys.argv[4] == "--"
    trainer.build_hidden_cache = sequences.build_hidden_cache = _recorded(record_dir, shard_tokens)
    sequence_trainer.first_layers = chain_trainer.first_layers = _counted(record_dir)
    sequence_trainer.sequence_features = functools.partial(sequence_trainer.sequence_features, batch_tokens=shard_tokens)
    chain_trainer.exit_states = functools.partial(chain_trainer.exit_states, batch_tokens=shard_tokens)
    if kill_at > 0:
        checkpointing.on_step_end = functools.partial(_kill_at, at=kill_at)
    sys.exit(main(["train", *sys.argv[5:]]))
