"""Self-distillation data generation (cerberus_hf.training.distill) on a tiny random Llama."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from cerberus_hf.tools import distill as distill_cli
from cerberus_hf.training import distill
from cerberus_hf.training.data import load_prompts, read_records
from cerberus_hf.training.distill import generate_distillation_data, sampled_ids
from helpers import CHAT_TEMPLATE
from tiny_models import PAD, tiny_model, tiny_tokenizer

FIELDS = {"id", "mode", "prompt", "input_ids", "output_ids", "finished"}


@pytest.fixture(scope="module")
def model_and_tokenizer():
    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "right"  # generate_distillation_data must switch it to left
    return model, tokenizer


def _prompts(n: int = 10) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    prompts = []
    for i in range(n):
        length = int(torch.randint(1, 9, (1,), generator=g))
        words = " ".join(f"w{int(t)}" for t in torch.randint(5, 96, (length,), generator=g))
        prompts.append({"id": f"p{i}", "prompt": words})
    return prompts


def _lines(path):
    """The file's records as written (every field), to check the format itself."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _by_key(records):
    return {(r["id"], r["mode"]): r for r in records}


def _run(model, tokenizer, prompts, path, **kwargs):
    kwargs = {"batch_size": 4, "max_new_tokens": 12, "sample_fraction": 0.3, "progress": False, **kwargs}
    return generate_distillation_data(model, tokenizer, prompts, path, **kwargs)


# `make test` runs the default engine (continuous) and the static one; transformers' own batching is marked slow
@pytest.mark.parametrize("engine", ["continuous", pytest.param("transformers", marks=pytest.mark.slow), "static"])
def test_record_format_and_greedy_matches_unbatched(model_and_tokenizer, tmp_path, engine):
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(10)
    # Make a token the tiny model emits early act as EOS, so some answers finish before max_new_tokens.
    first = tokenizer.apply_chat_template([{"role": "user", "content": prompts[0]["prompt"]}],
                                          add_generation_prompt=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        free = model.generate(torch.tensor([first]), max_new_tokens=4, do_sample=False, pad_token_id=PAD)
    stop = int(free[0, len(first) + 2])
    original_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = stop
    try:
        path = _run(model, tokenizer, prompts, tmp_path / "d.jsonl", engine=engine)
        records = _lines(path)
        assert tokenizer.padding_side == "left"
        assert len(records) == 10 + len(sampled_ids([p["id"] for p in prompts], 0.3, seed=0))
        assert any(r["mode"] == "sample" for r in records)
        assert len(_by_key(records)) == len(records)
        for r in records:
            assert set(r) == FIELDS
            assert r["mode"] in ("greedy", "sample")
            source = next(p for p in prompts if p["id"] == r["id"])
            assert r["prompt"] == source["prompt"]
            expected = tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                                     add_generation_prompt=True, return_dict=True)["input_ids"]
            assert r["input_ids"] == list(expected)
            out = r["output_ids"]
            assert 1 <= len(out) <= 12
            assert stop not in out[:-1]  # trimmed at the first EOS, no padding after it
            assert r["finished"] == (out[-1] == stop)
            if not r["finished"]:
                assert len(out) == 12
        assert _by_key(records)[("p0", "greedy")]["finished"]

        # Batched (left-padded, length-sorted) greedy answers equal one-prompt-at-a-time generate().
        for r in (r for r in records if r["mode"] == "greedy"):
            with torch.no_grad():
                alone = model.generate(torch.tensor([r["input_ids"]]), max_new_tokens=12, do_sample=False,
                                       pad_token_id=PAD, eos_token_id=stop)
            assert alone[0, len(r["input_ids"]):].tolist()[: len(r["output_ids"])] == r["output_ids"]
    finally:
        model.generation_config.eos_token_id = original_eos


@pytest.mark.parametrize("slack", [1, 4])
def test_continuous_engine_moves_its_window_and_frees_slots(model_and_tokenizer, slack):
    """The continuous engine's column window reaches the end of its buffer and is moved back many times (slack 1:
    at nearly every step), slots are refilled as answers end and emptied at the tail, and every answer still
    equals one-at-a-time greedy generate()."""
    model, _ = model_and_tokenizer
    g = torch.Generator().manual_seed(2)
    tasks = [(f"t{i}", "greedy", "", torch.randint(5, 96, (int(torch.randint(1, 14, (1,), generator=g)),),
                                                     generator=g).tolist()) for i in range(11)]
    with torch.no_grad():  # a token the tiny model emits early acts as EOS, so answers end at different steps
        stop = int(model.generate(torch.tensor([tasks[0][3]]), max_new_tokens=3, do_sample=False,
                                  pad_token_id=PAD)[0, -1])
    results, counted = {}, []
    for done in distill._continuous_generate(model, tasks, PAD, {stop}, batch_size=3, max_new_tokens=9,
                                             temperature=1.0, top_p=1.0, generator=torch.Generator(), slack=slack,
                                             on_tokens=counted.append):
        results.update({task[0]: (output, finished) for task, output, finished in done})
    assert sorted(results) == sorted(t[0] for t in tasks)
    assert sum(counted) == sum(len(output) for output, _ in results.values())  # each token reported once, as chosen
    assert 1 < len({len(output) for output, _ in results.values()})
    widest = max(len(t[3]) for t in tasks)
    steps = sum(len(output) for output, _ in results.values()) / 3  # at least this many decoding steps ran
    assert steps > widest + 9 + slack  # more columns than the buffer holds beyond `widest`: the window moved
    for pid, _, _, ids in tasks:
        with torch.no_grad():
            alone = model.generate(torch.tensor([ids]), max_new_tokens=9, do_sample=False, pad_token_id=PAD,
                                   eos_token_id=stop)
        expected = alone[0, len(ids):].tolist()
        assert results[pid] == (expected, expected[-1] == stop)


def test_resume_after_truncation(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(10)
    full = _lines(_run(model, tokenizer, prompts, tmp_path / "full.jsonl"))

    path = tmp_path / "resumed.jsonl"
    _run(model, tokenizer, prompts, path)
    lines = path.read_bytes().split(b"\n")
    # Simulate a kill mid-write: 5 complete lines, then half of the sixth.
    path.write_bytes(b"\n".join(lines[:5]) + b"\n" + lines[5][: len(lines[5]) // 2])
    assert len(read_records(path)) == 5

    _run(model, tokenizer, prompts, path)
    resumed = _lines(path)
    assert len(path.read_text().splitlines()) == len(resumed) == len(full)  # no broken or duplicate lines
    assert set(_by_key(resumed)) == set(_by_key(full))
    for key, r in _by_key(full).items():
        if key[1] == "greedy":
            assert _by_key(resumed)[key] == r

    # A complete file is left alone.
    before = path.read_bytes()
    _run(model, tokenizer, prompts, path)
    assert path.read_bytes() == before


def test_sample_fraction_split(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    ids = [f"q{i}" for i in range(200)]
    chosen = sampled_ids(ids, 0.25, seed=0)
    assert 30 <= len(chosen) <= 70 and chosen <= set(ids)
    assert sampled_ids(list(reversed(ids)), 0.25, seed=0) == chosen  # independent of order
    assert sampled_ids(ids[:50], 0.25, seed=0) == chosen & set(ids[:50])  # and of the other prompts (--limit)
    assert sampled_ids(ids, 0.25, seed=1) != chosen
    assert sampled_ids(ids, 0.0, seed=0) == set() and sampled_ids(ids, 1.0, seed=0) == set(ids)

    prompts = _prompts(8)
    records = _lines(_run(model, tokenizer, prompts, tmp_path / "s.jsonl", sample_fraction=0.5, seed=3))
    greedy = {r["id"] for r in records if r["mode"] == "greedy"}
    sampled = {r["id"] for r in records if r["mode"] == "sample"}
    assert greedy == {p["id"] for p in prompts}
    assert sampled == sampled_ids([p["id"] for p in prompts], 0.5, seed=3) and 0 < len(sampled) < 8


def test_load_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"id": "a", "turns": ["first turn", "second turn"], "category": "x"}, {"prompt": "plain prompt"},
            {"text": "text field"}, {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    prompts = load_prompts(path)
    assert [p["prompt"] for p in prompts] == ["first turn", "plain prompt", "text field", "hi"]
    assert [p["id"] for p in prompts] == ["a", "1", "2", "3"]
    assert prompts[0]["category"] == "x"
    assert len(load_prompts(path, limit=2)) == 2
    packaged = load_prompts(None)
    assert len(packaged) >= 1000 and len({p["id"] for p in packaged}) == len(packaged)


def test_cli(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    parser = argparse.ArgumentParser()
    distill_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["distill", "--output", str(tmp_path / "o.jsonl")])
    assert args.prompts == str(distill_cli.PACKAGED_PROMPTS) and args.batch_size == 16 and args.max_new_tokens == 256
    assert args.func is distill_cli.run_cli

    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompt_file = tmp_path / "p.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": p["id"], "turns": [p["prompt"]]}) + "\n" for p in _prompts(5)))
    out = tmp_path / "cli.jsonl"
    args = parser.parse_args(["distill", "--model", str(folder), "--prompts", str(prompt_file), "--output", str(out),
                              "--limit", "4", "--batch-size", "2", "--max-new-tokens", "5", "--sample-fraction", "0.5",
                              "--no-progress"])
    args.func(args)
    records = _lines(out)
    assert sorted((r["id"], r["mode"]) for r in records if r["mode"] == "greedy") == [(f"p{i}", "greedy") for i in range(4)]
    assert {r["id"] for r in records if r["mode"] == "sample"} == sampled_ids([f"p{i}" for i in range(4)], 0.5, seed=0)
    assert json.loads((tmp_path / "cli.jsonl.meta.json").read_text())["max_new_tokens"] == 5
    shard = tmp_path / "shard.jsonl"  # a shard of the prompt set: --first and --limit
    args = parser.parse_args(["distill", "--model", str(folder), "--prompts", str(prompt_file), "--output", str(shard),
                              "--first", "3", "--limit", "2", "--batch-size", "2", "--max-new-tokens", "5",
                              "--sample-fraction", "0", "--device", "cpu", "--no-progress"])
    args.func(args)
    assert sorted(r["id"] for r in _lines(shard)) == ["p3", "p4"]
    kept = tmp_path / "kept.jsonl"  # --keep-states CACHE_DIR: one file of states per answer under that folder
    args = parser.parse_args(["distill", "--model", str(folder), "--prompts", str(prompt_file), "--output", str(kept),
                              "--limit", "2", "--max-new-tokens", "5", "--sample-fraction", "0", "--no-progress",
                              "--keep-states", str(tmp_path / "cache")])
    args.func(args)
    assert len(list((tmp_path / "cache" / "answer-states").glob("*/*.safetensors"))) == 2
    assert parser.parse_args(["distill", "--output", "o", "--keep-states"]).keep_states == "default"  # train's folder


def test_reference_answers_multi_turn_and_long_prompts(model_and_tokenizer, tmp_path):
    """answers='reference' writes the dataset's answers as text records (cut at max_new_tokens, ended by the
    end-of-turn token when whole); a later turn's prompt ids hold the whole chat; long prompts are skipped."""
    model, tokenizer = model_and_tokenizer
    eos = model.generation_config.eos_token_id
    first = [{"role": "user", "content": "w7 w8"}]
    second = first + [{"role": "assistant", "content": "w10 w11 w12"}, {"role": "user", "content": "w9"}]
    prompts = [{"id": "a:0", "prompt": "w7 w8", "messages": first, "reference": "w10 w11 w12"},
               {"id": "a:1", "prompt": "w9", "messages": second, "reference": "w20 w21 w22 w23 w24 w25"},
               {"id": "b", "prompt": " ".join(["w5"] * 40), "reference": "w30"}]
    path = generate_distillation_data(model, tokenizer, prompts, tmp_path / "text.jsonl", max_new_tokens=4,
                                      answers="reference", max_prompt_tokens=30, progress=False)
    records = {r["id"]: r for r in _lines(path)}
    assert sorted(records) == ["a:0", "a:1"]
    assert {r["mode"] for r in records.values()} == {"text"}
    assert records["a:0"]["output_ids"] == [10, 11, 12, eos] and records["a:0"]["finished"]
    assert records["a:1"]["output_ids"] == [20, 21, 22, 23] and not records["a:1"]["finished"]
    expected = tokenizer.apply_chat_template(second, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert records["a:1"]["input_ids"] == list(expected)

    # The base answering the same later turn reads the same chat.
    base = _lines(generate_distillation_data(model, tokenizer, prompts[1:2], tmp_path / "base.jsonl",
                                             max_new_tokens=3, sample_fraction=0.0, progress=False))
    assert base[0]["input_ids"] == list(expected) and base[0]["mode"] == "greedy"
    with pytest.raises(ValueError, match="no reference answer"):
        generate_distillation_data(model, tokenizer, [{"id": "x", "prompt": "w5"}], tmp_path / "x.jsonl",
                                   answers="reference", progress=False)


def test_distilling_keeps_each_answers_states_and_the_cache_takes_them(model_and_tokenizer, tmp_path, monkeypatch):
    """`states_dir`: the continuous engine keeps, for every answer, the lm_head's input before each of its tokens
    (`answer_states`); the hidden-state cache built over those answers then runs the base over no record whose
    states are kept and holds what it computes itself (float16 of fp32 states from batched left-padded decoding
    against one forward per record: equal up to one float16 rounding step), teacher included. A record whose file
    is gone or holds the wrong shape is computed as before."""
    from cerberus_hf.training import answer_states, hidden_cache

    model, tokenizer = model_and_tokenizer
    states_dir = tmp_path / "cache"
    path = _run(model, tokenizer, _prompts(9), tmp_path / "answers.jsonl", sample_fraction=0.3, states_dir=states_dir)
    records = read_records(path)
    folder = answer_states.states_folder(states_dir, hidden_cache.base_fingerprint(model))
    assert len(list(folder.glob("*.safetensors"))) == len(records) > 9  # greedy and sampled answers alike
    computed = hidden_cache.build_hidden_cache(model, records, tmp_path / "computed", teacher_topk=4,
                                               show_progress=False)
    (folder / f"{records[0].content_hash()}.safetensors").unlink()  # a kill between the state and the line
    answer_states.save_states(folder, records[1].content_hash(), torch.zeros(2, model.config.hidden_size))
    real, rows = hidden_cache.right_padded, []  # the rows of the base's forwards over records
    monkeypatch.setattr(hidden_cache, "right_padded", lambda ids, pad: rows.append(len(ids)) or real(ids, pad))
    kept = hidden_cache.build_hidden_cache(model, records, states_dir, teacher_topk=4, show_progress=False)
    assert sum(rows) == 2  # the two records without usable states, and only them
    assert kept.record_ids == computed.record_ids and torch.equal(kept.tokens, computed.tokens)
    step = computed.hidden.float().abs().clamp(min=2 ** -14) * 2 ** -10  # one float16 step at each value
    assert bool(((kept.hidden.float() - computed.hidden.float()).abs() <= step).all())
    assert (kept.teacher_ids[:, 0] == computed.teacher_ids[:, 0]).float().mean() > 0.99


def test_prompts_are_answered_in_a_seeded_sample_order_longest_first_within_windows():
    """A budget stops after the first answers, so those must be a sample like the whole set, not its longest
    prompts; within each bucket of a few batches the longest come first (prompts prefilled together are of similar
    lengths); the order is the same on every run, and a resumed run (some answered) keeps it for the rest; it moves
    with the seed."""
    tasks = [(f"p{i}", "greedy", "", [7] * (i + 1)) for i in range(400)]
    order = distill.distill_order(tasks, 400, batch_size=4, seed=0)
    assert sorted(order) == sorted(tasks) and order == distill.distill_order(list(reversed(tasks)), 400, 4, 0)
    rest = [t for t in order if t[0][-1] != "3"]
    assert distill.distill_order(rest, 400, 4, 0) == rest
    lengths = [len(t[3]) for t in order]
    rises = [i + 1 for i, (earlier, later) in enumerate(zip(lengths, lengths[1:])) if later > earlier]
    assert len(rises) <= 12  # longest first within each of the 13 buckets (400 / 32, rounded up)
    first = lengths[:rises[0]]  # the first bucket: what a budget of about 32 answers spends itself on
    assert 15 < len(first) < 50 and 100 < sum(first) / len(first) < 300  # the set's mean: 200.5, its 32 longest: 384.5
    assert distill.distill_order(tasks, 400, batch_size=4, seed=1) != order


def test_the_progress_bar_counts_each_token_once_and_says_the_time_left(monkeypatch):
    """Tokens are counted as steps choose them where the engine reports steps, not again when their answer is
    written; the time left comes from the rate since the first token."""
    clock = iter([10.0, 12.0, 13.0, 14.0])
    monkeypatch.setattr(distill.time, "perf_counter", lambda: next(clock))
    with distill._DistillBar(1000, "tok", disable=True) as bar:
        bar.decoded(50)  # t = 10: the first tokens
        bar.decoded(50)  # t = 12: 100 tokens in 2 s
        bar.written(3, 100)  # their answers: not counted again
        assert bar.count == 100 and bar.bar.postfix == "50.0 tok/s, about 00:18 left"
        bar.decoded(5000)  # t = 13: no further than the total
        assert bar.count == 1000
    with distill._DistillBar(4, "answer", disable=True) as answers:
        answers.written(3, 100)  # t = 14
        assert answers.count == 3
