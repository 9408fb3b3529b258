"""Head training on cached hidden states, with a tiny random Llama whose own greedy answers are the data."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.tools import train as train_cli
from cerberus_hf.training import checkpointing
from cerberus_hf.drafters.base import capture_lm_head_input
from cerberus_hf.training.data import frequent_tokens, read_records
from cerberus_hf.training.hidden_cache import build_hidden_cache, split_record_ids
from cerberus_hf.training.evaluation import evaluate_heads
from cerberus_hf.training.loss import projection_loss
from cerberus_hf.training.trainer import HeadTrainingSettings, train_heads

from tiny_models import VOCAB, prompt_ids
from helpers import family_options

NUM_HEADS = 3
# The tiny problem wants a larger step than the real one (1e-3); everything else is the real recipe.
FAST = HeadTrainingSettings(batch_size=32, lr=3e-2, eval_every=0, show_progress=False)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hidden_cache")


def fresh(base, family="cerberus", **kwargs):
    """Fresh heads of a head type or of one of the tests' `VARIANTS`."""
    return CerberusForCausalLM.from_base(base, **{**family_options(family), "num_heads": NUM_HEADS, "num_layers": 1,
                                                  **kwargs})


def heads_equal(a, b) -> bool:
    sa, sb = a.heads.state_dict(), b.heads.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------------------------ the cache


def test_cache_states_its_disk_cost_and_refuses_what_does_not_fit(base, data_path, tmp_path, monkeypatch, caplog):
    import shutil
    from collections import namedtuple

    from cerberus_hf.training import hidden_cache

    positions = sum(len(r.output_ids) for r in read_records(data_path))
    need = positions * hidden_cache.cache_bytes_per_token(base.config.hidden_size, 4)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(need * 10, need * 10 - need + 1, need - 1))
    with pytest.raises(RuntimeError, match="needs .* GB .* free"):
        build_hidden_cache(base, data_path, tmp_path, teacher_topk=4, show_progress=False)
    assert not list(tmp_path.rglob("shard-*"))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(need * 10, 0, need * 10))
    with caplog.at_level("INFO", logger="cerberus_hf.training.hidden_cache"):
        build_hidden_cache(base, data_path, tmp_path, teacher_topk=4, shard_tokens=200, show_progress=False)
    assert f"{positions} answer positions" in caplog.text and "take about" in caplog.text


def test_cache_holds_lm_head_inputs_tokens_and_teacher(base, data_path, tmp_path):
    cache = build_hidden_cache(base, data_path, tmp_path, teacher_topk=5, show_progress=False)
    records = read_records(data_path)
    record = records[3]
    rows = slice(int(cache.record_offsets[3]), int(cache.record_offsets[4]))
    ids = torch.tensor([list(record.input_ids) + list(record.output_ids)], device=base.device)
    with capture_lm_head_input(base) as captured, torch.no_grad():
        logits = base(ids).logits[0].cpu()
    p = len(record.input_ids)
    expected = captured["hidden"][0, p - 1 : -1].cpu()  # the states that predict each answer token (the cache is on the CPU)
    assert cache.hidden.dtype == torch.float16
    torch.testing.assert_close(cache.hidden[rows].float(), expected, atol=2e-2, rtol=2e-3)
    assert cache.tokens[rows].tolist() == list(record.output_ids)
    assert torch.equal(cache.teacher_ids[rows, 0].long(), logits[p - 1 : -1].argmax(-1))
    # Greedy data the base generated itself: the answer token is the base's top-1 everywhere.
    assert cache.base_agreement() == 1.0
    # Head k at the last rows of a record has no target: those rows are not training positions.
    assert int(cache.remaining()[rows][-1]) == 0 and rows.stop - 1 not in set(cache.positions().tolist())


def test_a_cache_of_the_state_before_the_final_norm_is_kept_apart(base, data_path, tmp_path):
    """``state_source="final_norm_input"`` keeps the last decoder layer's output, in a folder of its own; the
    teacher still comes from the lm_head's input, and the default cache keeps the key it had before the
    option existed (caches on disk stay valid)."""
    import hashlib

    from cerberus_hf.training.hidden_cache import CACHE_FORMAT_VERSION, base_fingerprint

    post = build_hidden_cache(base, data_path, tmp_path, teacher_topk=5, show_progress=False)
    pre = build_hidden_cache(base, data_path, tmp_path, teacher_topk=5, show_progress=False,
                             state_source="final_norm_input")
    assert pre.info["key"] != post.info["key"] and pre.info["state_source"] == "final_norm_input"
    old_payload = {"format": CACHE_FORMAT_VERSION, "base": base_fingerprint(base), "teacher_topk": 5,
                   "max_seq_len": post.info["max_seq_len"]}
    assert post.info["key"] == hashlib.sha256(json.dumps(old_payload, sort_keys=True).encode()).hexdigest()[:16]
    assert torch.equal(pre.tokens, post.tokens) and torch.equal(pre.teacher_ids, post.teacher_ids)
    assert torch.equal(pre.teacher_logprobs, post.teacher_logprobs)

    # the final norm turns each kept state into the default cache's (up to float16 storage)
    assert not torch.allclose(pre.hidden.float(), post.hidden.float(), atol=1e-2)
    with torch.no_grad():
        torch.testing.assert_close(base.model.norm(pre.hidden.float().to(base.device)).cpu(), post.hidden.float(),
                                   atol=2e-2, rtol=2e-2)


def test_cache_is_resumable_per_shard(base, data_path, tmp_path):
    first = build_hidden_cache(base, data_path, tmp_path, teacher_topk=4, shard_tokens=200, show_progress=False)
    assert first.info["shards"] >= 3 and first.info["shards_computed"] == first.info["shards"]
    again = build_hidden_cache(base, data_path, tmp_path, teacher_topk=4, shard_tokens=200, show_progress=False)
    assert again.info["shards_computed"] == 0
    shards = sorted((tmp_path / first.info["key"]).glob("shard-*.safetensors"))
    shards[1].unlink()  # as if killed before this shard was written
    redone = build_hidden_cache(base, data_path, tmp_path, teacher_topk=4, shard_tokens=200, show_progress=False)
    assert redone.info["shards_computed"] == 1
    assert torch.equal(redone.hidden, first.hidden) and torch.equal(redone.tokens, first.tokens)
    assert torch.equal(redone.teacher_logprobs, first.teacher_logprobs)


def test_cache_shards_are_shared_between_combinations_of_files(base, data_path, tmp_path):
    """Shards are cut and named by content: after caching two files apart, caching them together (in either
    order) computes at most the one shard that straddles the boundary, and holds the same states."""
    lines = data_path.read_text().splitlines(keepends=True)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(lines[:7]))
    second.write_text("".join(lines[7:]))
    cache_dir = tmp_path / "cache"
    options = dict(teacher_topk=4, shard_tokens=120, show_progress=False)
    parts = [build_hidden_cache(base, path, cache_dir, **options) for path in (first, second)]
    assert all(part.info["shards"] >= 2 for part in parts)
    for order in ((first, second), (second, first)):
        records = [r for path in order for r in read_records(path)]
        both = build_hidden_cache(base, records, cache_dir, **options)
        assert both.info["shards_computed"] <= 1
        expected = parts if order[0] == first else parts[::-1]
        torch.testing.assert_close(both.hidden, torch.cat([part.hidden for part in expected]), atol=2e-3, rtol=0)
        assert torch.equal(both.tokens, torch.cat([part.tokens for part in expected]))


def test_split_depends_on_ids_only():
    ids = [f"prompt-{i}" for i in range(200)]
    held_out = split_record_ids(ids, 0.1)
    assert 5 <= len(held_out) <= 40
    assert split_record_ids(list(reversed(ids)) + ids[:50], 0.1) == held_out
    assert split_record_ids(["a", "b"], 0.0) == set() and len(split_record_ids(["a", "b"], 0.01)) == 1


# ------------------------------------------------------------------------------------------------ the loss


@pytest.mark.parametrize("trainable_projection", [False, True])
def test_chunked_projection_loss_matches_autograd(trainable_projection):
    torch.manual_seed(0)
    rows, hidden, vocab = 37, 16, 50
    states = torch.randn(rows, hidden, requires_grad=True)
    weight = torch.randn(vocab, hidden).requires_grad_(trainable_projection)
    bias = torch.randn(vocab).requires_grad_(trainable_projection)
    ids = torch.randint(0, vocab, (rows, 4))
    ids[:, 1] = ids[:, 0]  # repeated ids add up
    probs = torch.softmax(torch.randn(rows, 4), -1)
    upstream = torch.randn(rows)

    losses, top1 = projection_loss(states, weight, ids, probs, ids[:, 0], bias=bias, chunk_rows=8)
    (losses * upstream).sum().backward()
    ref_states = states.detach().clone().requires_grad_()
    ref_weight = weight.detach().clone().requires_grad_(trainable_projection)
    ref_bias = bias.detach().clone().requires_grad_(trainable_projection)
    logp = torch.nn.functional.linear(ref_states, ref_weight, ref_bias).log_softmax(-1)
    ref = -(probs * logp.gather(1, ids)).sum(-1)
    (ref * upstream).sum().backward()

    torch.testing.assert_close(losses, ref)
    torch.testing.assert_close(states.grad, ref_states.grad)
    assert torch.equal(top1, logp.argmax(-1) == ids[:, 0])
    if trainable_projection:
        torch.testing.assert_close(weight.grad, ref_weight.grad)
        torch.testing.assert_close(bias.grad, ref_bias.grad)


@pytest.mark.parametrize("trainable_projection", [False, True])
def test_restricted_projection_loss_is_the_softmax_over_the_vocab_and_the_targets(trainable_projection):
    """With ``vocab`` the loss, its gradients and the top-1 are those of the softmax over ``vocab`` plus every
    target id, as if the other rows of the projection did not exist."""
    torch.manual_seed(0)
    rows, hidden, size = 29, 16, 60
    states = torch.randn(rows, hidden, requires_grad=True)
    weight = torch.randn(size, hidden).requires_grad_(trainable_projection)
    bias = torch.randn(size).requires_grad_(trainable_projection)
    vocab = torch.tensor([7, 3, 41, 12, 30])
    ids = torch.randint(0, size, (rows, 3))
    probs = torch.softmax(torch.randn(rows, 3), -1)
    upstream = torch.randn(rows)

    losses, top1 = projection_loss(states, weight, ids, probs, ids[:, 0], bias=bias, chunk_rows=8, vocab=vocab)
    (losses * upstream).sum().backward()
    kept = sorted(set(vocab.tolist()) | set(ids.flatten().tolist()))
    assert len(kept) < size  # some rows really are left out
    ref_states = states.detach().clone().requires_grad_()
    ref_weight = weight.detach().clone().requires_grad_(trainable_projection)
    ref_bias = bias.detach().clone().requires_grad_(trainable_projection)
    logits = torch.nn.functional.linear(ref_states, ref_weight, ref_bias)
    masked = torch.full_like(logits, float("-inf"))
    masked[:, kept] = logits[:, kept]
    logp = masked.log_softmax(-1)
    ref = -(probs * logp.gather(1, ids)).sum(-1)
    (ref * upstream).sum().backward()

    torch.testing.assert_close(losses, ref)
    torch.testing.assert_close(states.grad, ref_states.grad)
    assert torch.equal(top1, logp.argmax(-1) == ids[:, 0])
    full, _ = projection_loss(states.detach(), weight.detach(), ids, probs, ids[:, 0], bias=bias.detach())
    assert bool((losses.detach() < full).all())  # fewer rows in the partition function
    if trainable_projection:
        torch.testing.assert_close(weight.grad, ref_weight.grad)
        torch.testing.assert_close(bias.grad, ref_bias.grad)
        assert not bool(weight.grad[[i for i in range(size) if i not in kept]].any())


# ------------------------------------------------------------------------------------------------ training


@pytest.mark.parametrize("head_type", ["medusa", "cerberus", "hydra", "clover", "hydra+prefix", "clover+prenorm"])
def test_training_learns_and_saves_a_loadable_checkpoint(base, data_path, cache_dir, tmp_path, head_type):
    model = fresh(base, head_type)
    cache = build_hidden_cache(base, data_path, cache_dir, show_progress=False, state_source=model.config.state_source)
    train_positions = cache.positions()
    before = evaluate_heads(model, cache, train_positions)
    metrics = train_heads(model, data_path, tmp_path,
                          replace(FAST, epochs=12, cache_dir=cache_dir, distill_weight=0.2))

    history = metrics["history"]
    assert history[-1]["loss"] < 0.75 * history[0]["loss"]
    after = evaluate_heads(model, cache, train_positions)
    chance = 1 / VOCAB
    assert all(b < 0.1 for b in before["top1"])
    assert after["top1"][0] > 0.3 and min(after["top1"]) > 15 * chance, after
    assert all(t5 >= t1 for t1, t5 in zip(after["top1"], after["top5"]))
    assert len(metrics["top1"]) == len(metrics["top5"]) == NUM_HEADS
    assert metrics["cost"]["device"].startswith(base.device.type) and metrics["cost"]["wall_time_s"] > 0
    assert metrics["cost"]["positions_per_s"] > 0
    assert metrics["data"]["held_out_records"] >= 1
    assert json.loads((tmp_path / "training_metrics.json").read_text())["steps"] == metrics["steps"]

    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.config.head_type == family_options(head_type)["head_type"] and heads_equal(loaded, model)
    assert loaded.heads.state_source == model.config.state_source
    prompt = prompt_ids(seed=99, length=7)
    expected = base.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(loaded.generate(prompt, max_new_tokens=12, eos_token_id=None, pad_token_id=0), expected)


def test_head_dropout_acts_in_training_only(base):
    """Dropout regularises what training fits (`forced_states` in training mode); evaluation and drafting see the
    heads whole."""
    plain, dropped = fresh(base, "hydra"), fresh(base, "hydra", head_dropout=0.5)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in plain.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    dropped.heads.load_state_dict(plain.heads.state_dict())
    hidden, tokens = torch.randn(4, plain.config.hidden_size), torch.randint(0, VOCAB, (4, NUM_HEADS))
    hidden, tokens = hidden.to(base.device), tokens.to(base.device)
    dropped.heads.train()
    torch.manual_seed(0)
    first = dropped.heads.forced_states(hidden, tokens)
    assert not torch.allclose(first, dropped.heads.forced_states(hidden, tokens))
    assert not torch.allclose(first, plain.heads.forced_states(hidden, tokens))
    dropped.heads.eval()
    torch.testing.assert_close(dropped.heads.forced_states(hidden, tokens), plain.heads.forced_states(hidden, tokens))
    torch.testing.assert_close(dropped.heads(hidden, tokens), plain.heads(hidden, tokens))


def test_same_seed_same_heads_other_seed_other_heads(base, data_path, cache_dir, tmp_path):
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        model = fresh(base)
        train_heads(model, data_path, tmp_path / name, replace(FAST, max_steps=8, seed=seed, cache_dir=cache_dir))
        runs[name] = model
    assert heads_equal(runs["a"], runs["b"])
    assert not heads_equal(runs["a"], runs["c"])


def test_train_fraction_takes_nested_subsets_and_keeps_the_held_out_split(base, data_path, cache_dir, tmp_path):
    runs = {f: train_heads(fresh(base), data_path, tmp_path / str(f),
                           replace(FAST, max_steps=1, train_fraction=f, cache_dir=cache_dir))["data"]
            for f in (0.3, 0.6, 1.0)}
    assert len({r["held_out_records"] for r in runs.values()}) == 1
    assert runs[0.3]["train_positions"] < runs[0.6]["train_positions"] < runs[1.0]["train_positions"]
    with pytest.raises(ValueError, match="train_fraction"):
        replace(FAST, train_fraction=0.0)


def test_settings_refuse_bad_values_and_the_cli_fills_them_with_the_same_defaults(tmp_path):
    """`HeadTrainingSettings` refuses a value out of range in one line when it is made, and ``cerberus-hf train``
    gives `train_heads` the settings' own defaults where no option is given, and each option where one is."""
    for bad, message in ((dict(distill_weight=1.5), "distill_weight must be in"),
                         (dict(text_distill_weight=-0.1), "text_distill_weight must be in"),
                         (dict(train_fraction=1.2), "train_fraction must be in"),
                         (dict(projection_dtype="float33"), "projection_dtype must name a torch dtype")):
        with pytest.raises(ValueError, match=message) as error:
            HeadTrainingSettings(**bad)
        assert "\n" not in str(error.value)
    with pytest.raises(TypeError, match="learning_rate"):
        HeadTrainingSettings(learning_rate=1e-3)
    assert HeadTrainingSettings(projection_dtype="bfloat16").projection_torch_dtype == torch.bfloat16
    assert [HeadTrainingSettings(eval_every=n).checkpoint_every for n in (0, 40, 250)] == [100, 40, 100]

    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers(dest="command"))
    common = ["train", "--data", "x.jsonl", "--output", str(tmp_path / "out")]
    assert train_cli._head_training_settings(parser.parse_args(common)) == HeadTrainingSettings()
    given = train_cli._head_training_settings(parser.parse_args(
        common + ["--lr", "0.01", "--train-fraction", "0.5", "--projection-dtype", "bfloat16", "--init-from", "h",
                  "--no-resume", "--no-progress"]))
    assert given == HeadTrainingSettings(lr=0.01, train_fraction=0.5, projection_dtype="bfloat16", init_from="h",
                                         resume=False, show_progress=False)


def test_text_records_train_on_the_teacher_and_are_not_scored(base, data_path, cache_dir, tmp_path):
    """A second file of "text" records (a dataset's answers) trains with the base's distribution as the whole
    target, and held-out accuracy is measured on the base's own answers only."""
    from cerberus_hf.training import trainer as trainer_module

    text_path = tmp_path / "text.jsonl"
    g = torch.Generator().manual_seed(5)
    with text_path.open("w") as f:
        for i in range(16):
            f.write(json.dumps({"id": f"t{i:03d}", "mode": "text", "input_ids": prompt_ids(seed=100 + i)[0].tolist(),
                                "output_ids": torch.randint(3, VOCAB, (30,), generator=g).tolist()}) + "\n")
    seen = []
    original = trainer_module.Rows

    class Spy(original):
        def __init__(self, cache, remaining, positions, num_heads, distill_weight, device, context_window=0):
            super().__init__(cache, remaining, positions, num_heads, distill_weight, device, context_window)
            if torch.is_tensor(distill_weight):  # training rows (evaluation passes 0.0)
                text = cache.position_modes("text")[positions[self.batch_index.cpu()] + self.head.cpu() + 1]
                seen.append((text, self.target_probs[:, 0].clone().cpu(), self.target_probs[:, 1:].sum(-1).cpu()))

    trainer_module.Rows = Spy
    try:
        metrics = train_heads(fresh(base), [data_path, text_path], tmp_path / "mixed",
                              replace(FAST, epochs=1, cache_dir=cache_dir, teacher_topk=4, eval_fraction=0.25))
    finally:
        trainer_module.Rows = original
    text = torch.cat([s[0] for s in seen])
    label_share, teacher_share = torch.cat([s[1] for s in seen]), torch.cat([s[2] for s in seen])
    assert text.any() and (~text).any()
    assert torch.all(label_share[text] == 0) and torch.allclose(teacher_share[text], torch.ones(int(text.sum())))
    assert torch.all(label_share[~text] == 1)  # distill_weight 0 for the base's own answers
    assert metrics["data"]["text_records"] == 16 and metrics["data"]["path"] == [str(data_path), str(text_path)]
    scored = metrics["eval"]["positions"]
    only_own = train_heads(fresh(base), data_path, tmp_path / "own",
                           replace(FAST, epochs=1, cache_dir=cache_dir, teacher_topk=4, eval_fraction=0.25))
    assert scored == only_own["eval"]["positions"]  # the same held-out base answers, no text positions
    with pytest.raises(ValueError, match="more than once"):
        train_heads(fresh(base), [data_path, data_path], tmp_path / "twice",
                    replace(FAST, epochs=1, cache_dir=cache_dir))


def test_killed_run_resumes_to_the_same_weights(base, data_path, cache_dir, tmp_path, monkeypatch):
    """Dropout draws from the global RNG, so only a restored RNG state resumes to the same weights."""
    settings = replace(FAST, max_steps=20, save_every=5, distill_weight=0.5, cache_dir=cache_dir)

    def fresh_dropout():
        return fresh(base, "hydra+prefix", head_dropout=0.3)

    uninterrupted = fresh_dropout()
    train_heads(uninterrupted, data_path, tmp_path / "uninterrupted", settings)

    def kill(step):
        if step == 13:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "on_step_end", kill)
    with pytest.raises(KeyboardInterrupt):
        train_heads(fresh_dropout(), data_path, tmp_path / "killed", settings)
    monkeypatch.undo()
    checkpoints = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000005", "step-00000010"]  # the last two are kept

    resumed = fresh_dropout()  # a new process starts from fresh heads and finds the checkpoint
    metrics = train_heads(resumed, data_path, tmp_path / "killed", settings)
    assert metrics["steps"] == 20
    assert heads_equal(resumed, uninterrupted)
    for name in (checkpointing.OPTIMIZER_NAME, checkpointing.WEIGHTS_NAME, checkpointing.RNG_TENSORS_NAME.format(0)):
        final = {run: load_file(tmp_path / run / "checkpoints" / "step-00000020" / name)
                 for run in ("uninterrupted", "killed")}  # AdamW's moments and steps, the heads, the RNG state
        assert final["killed"].keys() == final["uninterrupted"].keys() and final["killed"]
        assert all(torch.equal(final["killed"][k], final["uninterrupted"][k]) for k in final["killed"])
    optimizer = load_file(tmp_path / "killed" / "checkpoints" / "step-00000020" / checkpointing.OPTIMIZER_NAME)
    assert {key.split(".", 1)[1] for key in optimizer} == {"exp_avg", "exp_avg_sq", "step"}

    # A checkpoint in the files of older versions is refused with what to do.
    legacy = tmp_path / "legacy" / "checkpoints" / "step-00000005"
    legacy.mkdir(parents=True)
    state = json.loads((tmp_path / "killed" / "checkpoints" / "step-00000020" / "trainer_state.json").read_text())
    (legacy / "trainer_state.json").write_text(json.dumps(state))
    (legacy / "optimizer.safetensors").touch()
    with pytest.raises(ValueError, match="older cerberus-hf"):
        train_heads(fresh_dropout(), data_path, tmp_path / "legacy", settings)

    # Other settings refuse to resume; resume=False starts over.
    with pytest.raises(ValueError, match="other settings"):
        train_heads(fresh_dropout(), data_path, tmp_path / "killed", replace(settings, lr=1e-2))
    restarted = fresh_dropout()
    train_heads(restarted, data_path, tmp_path / "killed", replace(settings, lr=1e-2, resume=False))
    assert not heads_equal(restarted, uninterrupted)


def test_own_projection_heads_train(base, data_path, cache_dir, tmp_path):
    model = fresh(base, "medusa", head_projection="own")
    metrics = train_heads(model, data_path, tmp_path, replace(FAST, max_steps=15, cache_dir=cache_dir))
    assert metrics["history"][-1]["loss"] < metrics["history"][0]["loss"]
    assert not torch.equal(model.heads.lm_heads[0].weight, base.get_output_embeddings().weight)


@pytest.mark.parametrize("head_type", ["medusa", "cerberus", "hydra", "clover", "kangaroo"])
def test_training_over_a_train_vocabulary_learns(base, data_path, cache_dir, tmp_path, head_type):
    """``train_vocab`` scores each step over the data's most frequent answer tokens and the batch's targets:
    the heads still learn, the run records the setting, the same held-out positions are scored as without it
    (among the vocabulary), and the saved heads draft among it and stay exact."""
    from cerberus_hf.training.chain_trainer import train_chain_drafter

    def run(vocab, out):
        if head_type == "kangaroo":
            return train_chain_drafter(fresh_kangaroo(base), data_path, out, epochs=20, cache_dir=cache_dir,
                                       train_vocab=vocab, **KANGAROO_FAST), None
        model = fresh(base, head_type)
        settings = replace(FAST, epochs=12, cache_dir=cache_dir, train_vocab=vocab)
        return train_heads(model, data_path, out, settings), model

    (full, _), (restricted, model) = run(None, tmp_path / "full"), run(VOCAB // 8, tmp_path / "restricted")
    losses = [entry["loss"] for entry in restricted["history"]]
    assert sum(losses[-3:]) / 3 < 0.75 * losses[0]
    assert restricted["config"]["train_vocab"] == VOCAB // 8 and full["config"]["train_vocab"] is None
    assert restricted["history"][0]["loss"] < full["history"][0]["loss"]  # a smaller partition function
    if head_type == "kangaroo":
        assert restricted["eval"]["positions"] == full["eval"]["positions"] > 0
    else:
        assert restricted["data"]["eval_positions"] == full["data"]["eval_positions"]
        cache = build_hidden_cache(base, data_path, cache_dir, show_progress=False)
        fitted = evaluate_heads(model, cache, cache.positions(), vocab=model.heads.draft_vocab)
        assert fitted["top1"][0] > 0.3, fitted
    # the saved heads draft among the vocabulary they were trained to rank, and stay exact
    records = read_records(data_path)
    vocab = frequent_tokens(records, VOCAB // 8)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "restricted", base_model=base)
    assert loaded.config.draft_vocab_size == VOCAB // 8 and torch.equal(loaded.heads.draft_vocab.cpu(), vocab)
    assert loaded.config.draft_vocab_trained  # the rows outside it never learned: no other vocabulary is taken
    with pytest.raises(ValueError, match="trained over their own"):
        loaded.set_draft_vocab(vocab[:4])
    prompt = torch.tensor([records[0].input_ids], device=base.device)
    expected = base.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(loaded.generate(prompt, max_new_tokens=16, eos_token_id=None, pad_token_id=0), expected)


def test_a_run_starts_from_saved_heads_and_refuses_other_ones(base, data_path, cache_dir, tmp_path):
    """``init_from``: the run starts from the saved weights, not fresh ones (with a zero learning rate it ends on
    them), leaves their draft vocabulary behind, records the folder, and refuses heads of another drafter."""
    first = fresh(base)
    train_heads(first, data_path, tmp_path / "first",
                replace(FAST, max_steps=6, cache_dir=cache_dir, train_vocab=VOCAB // 8))
    assert first.config.draft_vocab_trained

    second = fresh(base)
    assert not heads_equal(second, first)
    metrics = train_heads(second, data_path, tmp_path / "second",
                          replace(FAST, max_steps=1, cache_dir=cache_dir, init_from=tmp_path / "first", lr=0.0))
    assert metrics["config"]["init_from"] == str(tmp_path / "first")
    assert metrics["continued_from"]["steps"] == 6 and metrics["continued_from"]["continued_from"] is None
    assert metrics["continued_from"]["train_time_s"] > 0
    assert second.heads.draft_vocab is None and not second.config.draft_vocab_trained
    trained = {k: v for k, v in first.heads.state_dict().items() if k != "draft_vocab"}
    assert trained.keys() == second.heads.state_dict().keys()
    assert all(torch.equal(v, second.heads.state_dict()[k]) for k, v in trained.items())

    for other in (fresh(base, num_heads=NUM_HEADS - 1), fresh(base, "hydra")):
        with pytest.raises(ValueError, match="holds other heads than this run trains"):
            train_heads(other, data_path, tmp_path / "other",
                        replace(FAST, max_steps=1, cache_dir=cache_dir, init_from=tmp_path / "first"))


def test_accuracy_among_a_draft_vocabulary_ranks_only_its_tokens():
    """``top_hits`` with a vocabulary: the top-1 is the best token inside it, and a label outside it is a miss."""
    from cerberus_hf.training.evaluation import outside_of, top_hits

    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 1.0, 2.0]])
    labels = torch.tensor([3, 0])
    assert top_hits(logits, labels)[0].tolist() == [False, True]
    outside = outside_of(torch.tensor([2, 3]), 4, logits.device)
    hit1, hit5 = top_hits(logits, labels, outside)
    assert hit1.tolist() == [True, False] and hit5.tolist() == [True, False]


def test_cli_trains_from_a_base_folder(base, data_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CERBERUS_HF_CACHE", str(tmp_path / "cache"))  # the default hidden-state cache goes here
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "--base", str(base_dir), "--head-type", "medusa", "--num-heads", "2",
                              "--data", str(data_path), "--output", str(tmp_path / "out"), "--max-steps", "4",
                              "--batch-size", "16", "--distill-weight", "0.5", "--head-weight-decay", "0.8",
                              "--no-progress"])
    assert args.func(args) == 0
    assert "held-out top-1" in capsys.readouterr().out
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out")  # the base is found from the config
    assert loaded.config.head_type == "medusa" and loaded.config.num_heads == 2
    assert len(list((tmp_path / "cache" / "hidden_states").glob("*/shard-*.safetensors"))) >= 1
    args = parser.parse_args(["train", "--base", str(base_dir), "--data", str(data_path), "--cache-only",
                              "--no-progress"])
    assert args.func(args) == 0
    assert "0 of 1 shards computed" in capsys.readouterr().out  # the training run already cached everything


@pytest.mark.parametrize("head_type, options, said, config", [
    ("kangaroo", ["--exit-layer", "1"], "adapter saved to", {"head_type": "kangaroo"}),
    ("dflash", ["--num-heads", "3", "--feature-layers", "1"], "drafter saved to",
     {"head_type": "dflash", "num_heads": 3, "feature_layers": [1]}),
])
def test_cli_trains_a_sequence_drafter(base, data_path, cache_dir, tmp_path, capsys, head_type, options, said, config):
    """`train --head-type kangaroo` and `dflash` reach their trainers (Kangaroo's once failed on an import)."""
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "--base", str(base_dir), "--head-type", head_type, *options,
                              "--data", str(data_path), "--output", str(tmp_path / "out"), "--max-steps", "2",
                              "--batch-tokens", "256", "--eval-fraction", "0.25", "--cache-dir", str(cache_dir),
                              "--no-progress"])
    assert args.func(args) == 0
    assert said in capsys.readouterr().out
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out").config
    assert {key: getattr(loaded, key) for key in config} == config


# ------------------------------------------------------------------------------------------------ kangaroo
def fresh_kangaroo(base, **kwargs):
    return CerberusForCausalLM.from_base(base, head_type="kangaroo", num_heads=4, exit_layer=1, exit_confidence=0.0,
                                         **kwargs)


KANGAROO_FAST = dict(batch_tokens=256, lr=3e-3, eval_every=0, eval_fraction=0.25, show_progress=False)


def test_kangaroo_adapter_training_learns_and_keeps_output_exact(base, data_path, cache_dir, tmp_path):
    from cerberus_hf.training.chain_trainer import train_chain_drafter

    model = fresh_kangaroo(base)
    records = read_records(data_path)
    prompt = torch.tensor([records[0].input_ids], device=base.device)
    reference = base.generate(prompt, max_new_tokens=24, do_sample=False)
    untrained = train_chain_drafter(fresh_kangaroo(base), data_path, tmp_path / "zero", max_steps=1,
                                    cache_dir=cache_dir, **dict(KANGAROO_FAST, lr=0.0))
    metrics = train_chain_drafter(model, data_path, tmp_path / "out", epochs=20, cache_dir=cache_dir, **KANGAROO_FAST)
    # The tiny base's exit at layer 1 of 2 is already its final answer 85% of the time on held-out records,
    # which 12 training records cannot improve; what training must do is fit them.
    losses = [entry["loss"] for entry in metrics["history"]]
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0]
    assert metrics["eval"]["positions"] == untrained["eval"]["positions"] > 0
    out = model.generate(prompt, max_new_tokens=24, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference.tolist()
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out", base_model=base)
    assert loaded.generate(prompt, max_new_tokens=24, prompt_lookup_num_tokens=0).tolist() == reference.tolist()
    # with the base's distribution in the target (the hidden-state cache's top-k teacher)
    distilled = train_chain_drafter(fresh_kangaroo(base), data_path, tmp_path / "distilled", epochs=20,
                                    distill_weight=1.0, cache_dir=cache_dir, **KANGAROO_FAST)
    losses = [entry["loss"] for entry in distilled["history"]]  # soft cross-entropy: the teacher's entropy is its floor
    assert sum(losses[-5:]) / 5 < losses[0] - 0.03


def test_killed_kangaroo_run_resumes_to_the_same_weights(base, data_path, cache_dir, tmp_path, monkeypatch):
    from cerberus_hf.training.chain_trainer import train_chain_drafter

    settings = dict(max_steps=12, save_every=4, cache_dir=cache_dir, **KANGAROO_FAST)
    uninterrupted = fresh_kangaroo(base)
    train_chain_drafter(uninterrupted, data_path, tmp_path / "uninterrupted", **settings)

    def kill(step):
        if step == 10:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "on_step_end", kill)
    with pytest.raises(KeyboardInterrupt):
        train_chain_drafter(fresh_kangaroo(base), data_path, tmp_path / "killed", **settings)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-00000004", "step-00000008"]
    resumed = fresh_kangaroo(base)
    metrics = train_chain_drafter(resumed, data_path, tmp_path / "killed", **settings)
    assert metrics["steps"] == 12
    assert heads_equal(resumed, uninterrupted)
    with pytest.raises(ValueError, match="other settings"):
        train_chain_drafter(fresh_kangaroo(base), data_path, tmp_path / "killed", **dict(settings, lr=1e-3))


# ------------------------------------------------------------------------------------------------ eagle3
EAGLE_FAST = dict(batch_tokens=256, lr=3e-3, eval_every=0, eval_fraction=0.25, show_progress=False)


@pytest.mark.parametrize("family", ["eagle3", "dflash"])
def test_unrolled_training_learns_every_depth_and_keeps_output_exact(base, data_path, cache_dir, tmp_path, family):
    """EAGLE-3's training-time test and DFlash's blocks after every position (`train_sequence_drafter`)."""
    from cerberus_hf.training.sequence_trainer import train_sequence_drafter

    records = read_records(data_path)
    prompt = torch.tensor([records[0].input_ids], device=base.device)
    reference = base.generate(prompt, max_new_tokens=24, do_sample=False)
    untrained = train_sequence_drafter(fresh(base, family), data_path, tmp_path / "zero", max_steps=1,
                                       cache_dir=cache_dir, **dict(EAGLE_FAST, lr=0.0))
    model = fresh(base, family)
    metrics = train_sequence_drafter(model, data_path, tmp_path / "out", epochs=15, cache_dir=cache_dir, **EAGLE_FAST)
    assert len(metrics["top1"]) == NUM_HEADS
    # every unrolled depth learns (the held-out records share the tiny base's habits)
    assert all(after > before + 0.05 for before, after in zip(untrained["top1"], metrics["top1"])), metrics["top1"]
    assert metrics["eval"]["positions"] == untrained["eval"]["positions"]
    assert metrics["eval"]["positions"][0] > metrics["eval"]["positions"][-1] > 0  # depth j targets A[j + 1:]
    out = model.generate(prompt, max_new_tokens=24, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference.tolist()
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out", base_model=base)
    assert heads_equal(loaded, model)
    assert loaded.generate(prompt, max_new_tokens=24, prompt_lookup_num_tokens=0).tolist() == reference.tolist()
    assert loaded.generation_stats.tau > 1.0


@pytest.mark.parametrize("family", ["eagle3", "dflash"])
def test_killed_unrolled_run_resumes_to_the_same_weights(base, data_path, cache_dir, tmp_path, monkeypatch, family):
    from cerberus_hf.training.sequence_trainer import train_sequence_drafter

    settings = dict(max_steps=9, save_every=3, cache_dir=cache_dir, distill_weight=0.5, **EAGLE_FAST)
    uninterrupted = fresh(base, family)
    train_sequence_drafter(uninterrupted, data_path, tmp_path / "uninterrupted", **settings)
    monkeypatch.setattr(checkpointing, "on_step_end", lambda step: (_ for _ in ()).throw(KeyboardInterrupt) if step == 7
                        else None)
    with pytest.raises(KeyboardInterrupt):
        train_sequence_drafter(fresh(base, family), data_path, tmp_path / "killed", **settings)
    monkeypatch.undo()
    resumed = fresh(base, family)
    assert train_sequence_drafter(resumed, data_path, tmp_path / "killed", **settings)["steps"] == 9
    assert heads_equal(resumed, uninterrupted)


def test_every_epoch_has_the_same_batches_in_its_own_order():
    from cerberus_hf.training.sequences import epoch_groups

    lengths = [(7 * i) % 23 + 3 for i in range(40)]
    epochs = [epoch_groups(list(range(40)), lengths, 64, seed=0, epoch=e) for e in range(3)]
    assert all(sorted(map(sorted, groups)) == sorted(map(sorted, epochs[0])) for groups in epochs)
    assert epochs[0] != epochs[1] and sorted(i for group in epochs[0] for i in group) == list(range(40))
    assert all(max(lengths[i] for i in group) * len(group) <= 64 for group in epochs[0])


def test_eagle3_run_starts_from_a_saved_drafter_and_refuses_other_layers(base, data_path, cache_dir, tmp_path):
    """``init_from`` for EAGLE-3: a run continues from the saved drafter (with a zero learning rate it ends on it), records
    the folder, and refuses a drafter that fuses other layers before anything is computed."""
    from cerberus_hf.training.sequence_trainer import train_sequence_drafter

    first = fresh(base, "eagle3")
    train_sequence_drafter(first, data_path, tmp_path / "first", max_steps=3, cache_dir=cache_dir, **EAGLE_FAST)
    second = fresh(base, "eagle3")
    assert not heads_equal(second, first)
    metrics = train_sequence_drafter(second, data_path, tmp_path / "second", max_steps=1, cache_dir=cache_dir,
                                     init_from=tmp_path / "first", **dict(EAGLE_FAST, lr=0.0))
    assert metrics["config"]["init_from"] == str(tmp_path / "first")
    assert metrics["continued_from"]["steps"] == 3  # from the first run's metrics: its card states both runs
    assert heads_equal(second, first)
    other = fresh(base, "eagle3", feature_layers=[1])
    with pytest.raises(ValueError, match="feature_layers"):
        train_sequence_drafter(other, data_path, tmp_path / "other", max_steps=1, cache_dir=cache_dir,
                               init_from=tmp_path / "first", **EAGLE_FAST)
    assert not (tmp_path / "other").exists()


def test_record_batches_score_records_as_training_scores_its_held_out_split(base, data_path, cache_dir, tmp_path):
    """`record_batches` (scoring a drafter on answer files of one's own) over the held-out records gives the accuracy
    the trainer reported for them, depth by depth."""
    from cerberus_hf.training.sequence_trainer import evaluate_unrolled, record_batches, train_sequence_drafter
    from cerberus_hf.training.sequences import load_sequences

    model = fresh(base, "eagle3")
    metrics = train_sequence_drafter(model, data_path, tmp_path / "out", epochs=3, cache_dir=cache_dir, **EAGLE_FAST)
    data = load_sequences(base, data_path, cache_dir=cache_dir, max_seq_len=None, distill_weight=0.0, teacher_topk=0,
                          eval_fraction=EAGLE_FAST["eval_fraction"], show_progress=False, min_answer=2)
    held_out = [data.records[i] for i in data.eval_members]
    scored = evaluate_unrolled(model.heads, record_batches(base, model.heads, held_out, tmp_path / "features",
                                                           batch_size=3))
    assert scored["positions"] == metrics["eval"]["positions"]
    assert scored["top1"] == pytest.approx(metrics["top1"], abs=1.5 / scored["positions"][-1])  # a tie's row at most
    assert 0 < sum(scored["top1"]) < len(scored["top1"])


def test_eagle3_features_are_cached_once_and_resume_after_a_kill(base, data_path, tmp_path, monkeypatch):
    from cerberus_hf.drafters.eagle3 import capture_features
    from cerberus_hf.training import sequence_trainer

    records = read_records(data_path)
    whole, starts = sequence_trainer.sequence_features(base, records, [1, 1], tmp_path, None, batch_tokens=64,
                                                       show_progress=False)
    ids = torch.tensor([records[3].input_ids + records[3].output_ids], device=base.device)
    with torch.no_grad(), capture_features(base, [1, 1]) as captured:
        base(ids)
    rows = torch.from_numpy(whole[starts[3] : starts[3] + ids.shape[1]].astype("float32"))
    torch.testing.assert_close(rows, captured["features"][0].float().cpu(), atol=2e-3, rtol=2e-3)  # float16 on disk
    calls = []
    original = sequence_trainer.right_padded

    def killed_after_five(*args, **kwargs):
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(sequence_trainer, "right_padded", killed_after_five)
    with pytest.raises(KeyboardInterrupt):
        sequence_trainer.sequence_features(base, records, [1], tmp_path / "other", None, batch_tokens=32,
                                           show_progress=False)
    monkeypatch.undo()
    calls.clear()
    monkeypatch.setattr(sequence_trainer, "right_padded", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    resumed, _ = sequence_trainer.sequence_features(base, records, [1], tmp_path / "other", None, batch_tokens=32,
                                                    show_progress=False)
    total = len(sequence_trainer.batches_by_length([len(r.input_ids) + len(r.output_ids) for r in records], 32))
    assert len(calls) == total - 5  # the 5 batches written before the kill are not recomputed
    torch.testing.assert_close(torch.from_numpy(resumed.astype("float32")),
                               torch.from_numpy(whole[:, : resumed.shape[1]].astype("float32")))


def test_cli_refuses_options_the_chosen_head_type_would_ignore(tmp_path):
    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers(dest="command"))
    common = ["train", "--data", "x.jsonl", "--output", str(tmp_path / "out")]
    for head_type, option in (("kangaroo", ["--batch-size", "64"]), ("medusa", ["--exit-layer", "4"]),
                              ("medusa", ["--adapter-heads", "4"]), ("kangaroo", ["--context-window", "8"]),
                              ("clover", ["--num-layers", "2"]), ("cerberus", ["--prefix-layer"]),
                              ("kangaroo", ["--head-dropout", "0.2"]), ("kangaroo", ["--init-from", "heads"]),
                              ("eagle3", ["--batch-size", "64"]), ("eagle3", ["--num-layers", "2"]),
                              ("dflash", ["--batch-size", "64"]), ("dflash", ["--exit-layer", "1"]),
                              ("hydra", ["--feature-layers", "2", "9"]), ("eagle3", ["--state-source", "final_norm_input"])):
        args = parser.parse_args(common + ["--head-type", head_type] + option)
        with pytest.raises(SystemExit, match=f"{option[0]} do\\(es\\) not apply to --head-type {head_type}"):
            train_cli._refuse_options_of_other_head_types(args)
    for option in (["--adapter-heads", "4"], ["--context-window", "8"]):  # Hydra reads them for its prefix layer only
        args = parser.parse_args(common + ["--head-type", "hydra"] + option)
        with pytest.raises(SystemExit, match=f"{option[0]} shape\\(s\\) Hydra's prefix layer: add --prefix-layer"):
            train_cli._refuse_options_of_other_head_types(args)
    for head_type, option in (("kangaroo", ["--adapter-heads", "4"]), ("clover", ["--adapter-heads", "4"]),
                              ("clover", ["--context-window", "8", "--batch-size", "64"]),
                              ("hydra", ["--prefix-layer", "--adapter-heads", "4", "--head-dropout", "0.2"]),
                              ("eagle3", ["--feature-layers", "2", "9", "--batch-tokens", "512", "--adapter-heads", "4",
                                          "--head-weight-decay", "0.9"]),
                              ("dflash", ["--feature-layers", "1", "--num-layers", "2", "--batch-tokens", "512"])):
        train_cli._refuse_options_of_other_head_types(parser.parse_args(common + ["--head-type", head_type] + option))
