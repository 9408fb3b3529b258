"""The sequence trainers with the base's states computed in each step (``features="online"``): the same batches and the
same weights as from the disk caches, nothing written to disk, resumable, and reachable from the CLI."""

from __future__ import annotations

import argparse

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.tools import train as train_cli
from cerberus_hf.training import chain_trainer, checkpointing, sequence_trainer
from cerberus_hf.training.sequences import epoch_groups

from helpers import family_options

FAST = dict(batch_tokens=128, lr=3e-3, eval_every=3, eval_fraction=0.25, show_progress=False)


def fresh(base, family: str):
    if family == "kangaroo":
        return CerberusForCausalLM.from_base(base, head_type="kangaroo", num_heads=4, exit_layer=1)
    return CerberusForCausalLM.from_base(base, **{**family_options(family), "num_heads": 3})


def batch_tensors(family: str, model, data_path, cache_dir, distill_weight: float, features: str) -> list:
    """Every tensor of the batches of one epoch's groups and of the held-out groups, made from ``features``."""
    if family == "kangaroo":
        data, source = chain_trainer._chain_inputs(model, data_path, cache_dir, None, distill_weight, 8, 0.25, False,
                                                   features)
    else:
        data, source = sequence_trainer._sequence_inputs(model, data_path, cache_dir, None, distill_weight, 8, 0.25,
                                                         False, features)
    groups = epoch_groups(data.train_members, data.lengths, FAST["batch_tokens"], 0, 0) + [data.eval_members]
    tensors = []
    for members in groups:
        states, teacher = source.take(members)
        if family == "kangaroo":
            batch = chain_trainer.AdapterBatch(members, states, data.answers, data.records, teacher, distill_weight,
                                               "cpu")
            tensors += [batch.states, batch.rows, batch.cols, batch.target_ids, batch.target_probs, batch.labels]
        else:
            batch = sequence_trainer.UnrolledBatch(members, *states, data.sequences, data.answers, 3, teacher,
                                                   distill_weight, "cpu")
            tensors += [batch.features, batch.tokens, *(t for step in batch.targets for t in step)]
    return tensors


@pytest.mark.parametrize("family", ["eagle3", "dflash", "kangaroo"])
@pytest.mark.parametrize("distill_weight", [0.0, 0.5])
def test_online_batches_are_the_cached_ones(base, data_path, tmp_path, family, distill_weight):
    """Rounded through float16 as the caches store them, the states computed in the step are bit for bit the cached
    ones (from the first layers alone, or from the whole base when the teacher is wanted), and so is the teacher."""
    model = fresh(base, family)
    cached = batch_tensors(family, model, data_path, tmp_path / "cache", distill_weight, "cache")
    online = batch_tensors(family, model, data_path, tmp_path / "online", distill_weight, "online")
    assert len(cached) == len(online) > 6
    for a, b in zip(cached, online):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert cached[0].abs().sum() > 0  # states were compared, not zeros
    assert not (tmp_path / "online").exists()  # nothing written, not even the teacher's cache


def train(family: str, model, data_path, output_dir, **settings) -> dict:
    if family == "kangaroo":
        return chain_trainer.train_chain_drafter(model, data_path, output_dir, **settings)
    return sequence_trainer.train_sequence_drafter(model, data_path, output_dir, **settings)


def heads_equal(a, b) -> bool:
    sa, sb = a.heads.state_dict(), b.heads.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("family", ["eagle3", "dflash", "kangaroo"])
def test_online_training_gives_the_cached_weights_and_writes_nothing(base, data_path, tmp_path, family):
    settings = dict(FAST, max_steps=6, distill_weight=0.5, teacher_topk=8)
    cached = fresh(base, family)
    from_cache = train(family, cached, data_path, tmp_path / "cached", cache_dir=tmp_path / "cache", **settings)
    online = fresh(base, family)
    in_step = train(family, online, data_path, tmp_path / "online", cache_dir=tmp_path / "online-cache",
                    features="online", **settings)
    assert heads_equal(cached, online)
    assert not heads_equal(cached, fresh(base, family))  # the steps moved the weights
    assert [e["loss"] for e in in_step["history"]] == [e["loss"] for e in from_cache["history"]]
    assert in_step["evals"] == from_cache["evals"] and len(in_step["evals"]) == 2
    assert not (tmp_path / "online-cache").exists()
    assert any((tmp_path / "cache").iterdir())  # where the cached run kept its states


@pytest.mark.parametrize("resumed_with", ["online", "cache"])
def test_online_run_resumes_after_a_kill(base, data_path, tmp_path, monkeypatch, resumed_with):
    """Resumed online, or from the caches (the mode is not one of the run's settings: both give the same batches)."""
    settings = dict(FAST, max_steps=7, save_every=3, distill_weight=0.5, teacher_topk=8, features="online",
                    cache_dir=tmp_path / "cache")
    uninterrupted = fresh(base, "eagle3")
    train("eagle3", uninterrupted, data_path, tmp_path / "uninterrupted", **settings)

    def kill(step):
        if step == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "on_step_end", kill)
    with pytest.raises(KeyboardInterrupt):
        train("eagle3", fresh(base, "eagle3"), data_path, tmp_path / "killed", **settings)
    monkeypatch.undo()
    assert not (tmp_path / "cache").exists()
    resumed = fresh(base, "eagle3")
    metrics = train("eagle3", resumed, data_path, tmp_path / "killed", **dict(settings, features=resumed_with))
    assert metrics["steps"] == 7 and len(metrics["history"]) == 7
    assert heads_equal(resumed, uninterrupted)


def test_trainers_refuse_an_unknown_feature_mode(base, data_path, tmp_path):
    with pytest.raises(ValueError, match="features must be one of cache, online, got 'disk'"):
        train("eagle3", fresh(base, "eagle3"), data_path, tmp_path / "out", features="disk", **FAST)
    with pytest.raises(ValueError, match="features must be one of cache, online, got 'disk'"):
        train("kangaroo", fresh(base, "kangaroo"), data_path, tmp_path / "out", features="disk", **FAST)


class Reached(Exception):
    """Raised by a stand-in trainer with the keyword arguments it was called with."""


def test_cli_features_flag_reaches_the_trainers_and_heads_refuse_it(base, tmp_path, monkeypatch):
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers(dest="command"))
    common = ["train", "--base", str(base_dir), "--data", "x.jsonl", "--output", str(tmp_path / "out")]

    def reached(*args, **kwargs):
        raise Reached(kwargs)

    monkeypatch.setattr(sequence_trainer, "train_sequence_drafter", reached)
    monkeypatch.setattr(chain_trainer, "train_chain_drafter", reached)
    for head_type, features in (("eagle3", "online"), ("dflash", "online"), ("kangaroo", "online"), ("eagle3", None)):
        shape = ["--exit-layer", "1"] if head_type == "kangaroo" else []
        args = parser.parse_args(common + ["--head-type", head_type, *shape]
                                 + (["--features", features] if features else []))
        with pytest.raises(Reached) as caught:
            args.func(args)
        assert caught.value.args[0]["features"] == (features or "cache")
    args = parser.parse_args(common + ["--head-type", "medusa", "--features", "online"])
    with pytest.raises(SystemExit, match="--features online trains kangaroo, eagle3 and dflash only: --head-type medusa's steps"):
        args.func(args)
