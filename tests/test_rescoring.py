"""Lattice rescoring: the n-gram model's probabilities, the rescored tree's choice, files, calibration and
the generate() switch. (Greedy identity and sampling with rescoring on every architecture and family are
in test_drafters.py and test_sampling.py, as the "rescored" tree kind.)"""

from __future__ import annotations

import math

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.decoding.drafting import StepDrafts, dynamic_selection
from cerberus_hf.blocks.ngram import NGRAM_WEIGHTS_NAME, NgramModel
from cerberus_hf.blocks.rescoring import Rescoring, ngram_rescore, repeats_a_token
from cerberus_hf.blocks.tree import DynamicTree
from cerberus_hf.calibration import calibrate, format_report
from cerberus_hf.tools.cli import main as cli_main
from helpers import (NEW_TOKENS, PROMPT_LEN, fresh_model, get_prompt, here, install_oracle, reference,
                     tiny_ngram)
from tiny_models import DEVICE


def test_kneser_ney_probability_by_hand():
    # bigrams (0,1) x2, (1,0) x2, (0,2) x1; every target has a full history, so unigram counts are
    # continuation counts: 0, 1 and 2 each follow one distinct token.
    model = NgramModel.build([([0, 1, 0, 1, 0, 2], 1)], vocab_size=4, order=2)
    d1 = 0.95  # n1 = 3, n2 = 0: Ney's estimate 1.0, clamped
    p1 = {w: max(1 - d1, 0) / 3 + d1 * 3 / 3 / 4 for w in (0, 1, 2)} | {3: d1 * 3 / 3 / 4}
    d2 = 1 / (1 + 2 * 2)  # n1 = 1, n2 = 2
    expected = {w: max((2 if w == 1 else 1 if w == 2 else 0) - d2, 0) / 3 + d2 * 2 / 3 * p1[w] for w in range(4)}
    got = model.log_probs(torch.tensor([[0]]), torch.arange(4)[None]).exp()[0]
    assert got.tolist() == pytest.approx([expected[w] for w in range(4)], rel=1e-5)
    # an unseen context falls back to the unigrams
    assert model.log_probs(torch.tensor([[3]]), torch.arange(4)[None]).exp()[0].tolist() == pytest.approx(
        [p1[w] for w in range(4)], rel=1e-5)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_context_gives_a_distribution(order):
    generator = torch.Generator().manual_seed(order)
    data = [(torch.randint(0, 9, (30,), generator=generator).tolist(), 0) for _ in range(5)]
    model = NgramModel.build(data, vocab_size=9, order=order)
    contexts = torch.cat([torch.tensor([data[0][0][3:6], data[1][0][:3], [8, 8, 8]]), torch.randint(0, 9, (4, 3))])
    probs = model.log_probs(contexts, torch.arange(9).expand(len(contexts), -1)).exp()
    assert torch.allclose(probs.sum(-1), torch.ones(len(contexts)), atol=1e-5)
    assert bool((probs > 0).all())
    # a shorter context than the order is fine (the start of a sequence)
    assert model.log_probs(torch.zeros(1, 0, dtype=torch.long), torch.arange(9)[None]).exp().sum() == pytest.approx(1, abs=1e-5)


def test_frequent_continuations_score_higher():
    model = NgramModel.build([([5, 6, 7] * 20, 0)], vocab_size=10, order=3)
    logp = model.log_probs(torch.tensor([[5, 6]]), torch.tensor([[7, 5, 1]]))[0]
    assert logp[0] > math.log(0.9)
    assert logp[1] > logp[2]  # 5 has been seen after another token (7), 1 never: Kneser-Ney's lower order


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        NgramModel.build([([1, 2, 12], 0)], vocab_size=10)
    with pytest.raises(ValueError, match="empty"):
        NgramModel.build([([1, 2], 2)], vocab_size=10)
    with pytest.raises(ValueError, match="int64"):
        NgramModel.build([([1, 2], 0)], vocab_size=300_000, order=4)
    model = NgramModel.build([([1, 2, 3, 1, 2], 0)], vocab_size=10)
    path = tmp_path / NGRAM_WEIGHTS_NAME
    model.save(path)
    loaded = NgramModel.load(path, vocab_size=10)
    contexts, candidates = torch.tensor([[1, 2], [2, 3]]), torch.tensor([[3, 1], [1, 9]])
    assert torch.equal(loaded.log_probs(contexts, candidates), model.log_probs(contexts, candidates))
    with pytest.raises(ValueError, match="another tokenizer"):
        NgramModel.load(path, vocab_size=11)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(OSError, match="not a readable n-gram file"):
        NgramModel.load(path)


def test_rescoring_settings_are_validated():
    assert Rescoring.from_dict({"nodes": 4, "depth": 2}).to_dict() == {
        "nodes": 4, "depth": 2, "top_k": 4, "candidates": 8, "weight": 0.5, "lm_weight": 0.0}
    for bad, message in (({"nodes": 4, "depth": 2, "beam": 3}, "unknown keys"), ({"nodes": 0, "depth": 2}, "nodes"),
                         ({"nodes": 4, "depth": 2, "weight": -1.0}, "weight"), ({"nodes": 4, "depth": 5}, "exceeds"),
                         ({"nodes": 4, "depth": 2, "lm_weight": -0.5}, "lm_weight")):
        with pytest.raises(ValueError, match=message):
            Rescoring.from_dict(bad, num_heads=3)


def test_weight_zero_is_the_dynamic_tree():
    model = fresh_model("llama", "medusa", randomize=True, seed=2, num_heads=3)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    ngram = tiny_ngram(model.config.vocab_size)
    plain = dynamic_selection(StepDrafts(model.heads, hidden, 5), DynamicTree(nodes=7, depth=3, top_k=3), 3)
    rescore = ngram_rescore(ngram, torch.tensor([1, 2, 5]), weight=0.0)
    rescored = dynamic_selection(StepDrafts(model.heads, hidden, 5), Rescoring(7, 3, top_k=3, candidates=3, weight=0.0),
                                 3, rescore)
    assert list(rescored.items()) == list(plain.items())


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_rescored_tree_is_the_best_combined_paths(head_type):
    """Each chosen node's score is its path's summed head log-probability plus the weighted n-gram
    log-probability after the sequence and the path; nothing expanded and left out scores higher."""
    model = fresh_model("llama", head_type, randomize=True, seed=4, num_heads=3)
    hidden = torch.randn(1, model.config.hidden_size).to(DEVICE)
    ngram = tiny_ngram(model.config.vocab_size, seed=1)
    history = torch.tensor([3, 9, 5])
    settings = Rescoring(nodes=8, depth=3, top_k=2, candidates=5, weight=2.0)
    chosen = dynamic_selection(StepDrafts(model.heads, hidden, 5), settings, 3, ngram_rescore(ngram, history, 2.0))
    assert len(chosen) == 8 and all(len(p) == 1 or p[:-1] in chosen for p in chosen)

    @torch.no_grad()
    def score(path):
        tokens, total = [5], 0.0
        for depth, rank in enumerate(path):
            logp = torch.log_softmax(model.heads(hidden, torch.tensor([tokens + [0] * (3 - len(tokens))], device=DEVICE))[0, depth], -1)
            top = logp.topk(5)
            token = int(top.indices[rank])
            context = torch.tensor([history.tolist() + tokens[1:]])
            total += float(top.values[rank]) + 2.0 * float(ngram.log_probs(context, torch.tensor([[token]]))[0, 0])
            tokens.append(token)
        return total, tokens[-1]

    chosen_scores = []
    for path, token in chosen.items():
        value, drafted = score(path)
        assert drafted == token
        chosen_scores.append(value)
    # the best node of each depth is on the frontier, so all its candidates were scored: none left out beats
    # the worst chosen node (chosen is best first)
    frontier = [()] + [next(p for p in chosen if len(p) == depth) for depth in (1, 2)]
    for parent in frontier:
        for rank in range(5):
            if (*parent, rank) not in chosen:
                assert score((*parent, rank))[0] <= min(chosen_scores) + 1e-4


def test_a_strong_ngram_reorders_the_lattice():
    """Heads that rank a repeated token first lose it to the n-gram's continuation (the failure rescoring fixes)."""
    model = fresh_model("llama", "medusa", randomize=True, seed=6, num_heads=2)
    hidden = torch.randn(1, model.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    step = StepDrafts(model.heads, hidden, 5)
    logp0 = step.expand(0, [step.root])[1][0].log_softmax(-1)
    logp1 = step.expand(1, [step.root])[1][0].log_softmax(-1)
    top0, top1 = logp0.topk(2), logp1.topk(4)
    first, second = model.heads.token_ids(top0.indices).tolist()
    ranked = model.heads.token_ids(top1.indices).tolist()
    follow = ranked[3]  # the heads' 4th choice at depth 1
    # the heads alone keep the better of the two-node trees: a chain of top-1s or the two best first tokens
    chain = bool(top0.values[0] + top1.values[0] > top0.values[1])
    heads_only = {(0,): first, (0, 0): ranked[0]} if chain else {(0,): first, (1,): second}
    ngram = NgramModel.build([([5, first, follow] * 30, 0)], model.config.vocab_size, order=3)
    plain = dynamic_selection(step, Rescoring(2, 2, top_k=1, candidates=4, weight=0.0), 2, ngram_rescore(ngram, torch.tensor([5]), 0.0))
    strong = dynamic_selection(step, Rescoring(2, 2, top_k=1, candidates=4, weight=5.0), 2, ngram_rescore(ngram, torch.tensor([5]), 5.0))
    assert plain == heads_only
    assert strong == {(0,): first, (0, 3): follow}
    assert repeats_a_token([5, 5, 7]) and not repeats_a_token([5, 7, 5])


def test_generate_rescoring_switch_and_files(tmp_path):
    model = fresh_model("llama", "cerberus", randomize=True, seed=3, num_heads=3)
    settings = {"nodes": 5, "depth": 3, "top_k": 2, "candidates": 4, "weight": 0.5}
    with pytest.raises(ValueError, match="n-gram model"):
        model.generate(get_prompt("llama"), max_new_tokens=4, rescoring=settings)
    with pytest.raises(ValueError, match="rescoring must be a dict"):
        model.generate(get_prompt("llama"), max_new_tokens=4, rescoring=[5, 3])
    model.ngram = tiny_ngram(model.config.vocab_size, sequences=[reference("llama")[0].tolist()])
    calls = []
    real = model.ngram.log_probs
    model.ngram.log_probs = lambda *a: calls.append(1) or real(*a)
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, rescoring=settings, gate_threshold=None,
                         prompt_lookup_num_tokens=0)
    assert torch.equal(out, reference("llama")) and calls
    stats = model.generation_stats
    # 5 nodes a step, fewer only in the last steps, where the room left before max_length cuts the depth
    assert 5 * (stats.draft_steps - 3) <= stats.drafted_tokens <= 5 * stats.draft_steps
    # the calibrated default: tree_kind "rescored" turns it on; a call naming another tree or None turns it off
    model.generation_config.cerberus_calibration = {here(): {"tree_kind": "rescored", "rescoring": settings}}
    calls.clear()
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, gate_threshold=None)
    assert calls
    calls.clear()
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, gate_threshold=None, rescoring=None)
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, gate_threshold=None, draft_tree=[[0], [1]])
    assert not calls
    # saved and loaded with the heads
    del model.ngram.log_probs
    model.save_pretrained(tmp_path)
    assert (tmp_path / NGRAM_WEIGHTS_NAME).is_file()
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    assert loaded.ngram is not None and loaded.ngram.order == model.ngram.order
    assert torch.equal(loaded.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS), reference("llama"))
    # an n-gram model of another vocabulary is refused when the folder loads
    NgramModel.build([([1, 2, 3], 0)], vocab_size=model.config.vocab_size + 1).save(tmp_path / NGRAM_WEIGHTS_NAME)
    with pytest.raises(ValueError, match="another tokenizer"):
        CerberusForCausalLM.from_pretrained(tmp_path, base_model=model.base)


def test_calibrate_fits_the_rescored_tree():
    model = fresh_model("llama", "medusa", num_heads=3)
    install_oracle(model, [reference("llama")], corrupt=lambda p, k: (p + k) % 3 == 0)
    model.ngram = tiny_ngram(model.config.vocab_size, sequences=[reference("llama")[0].tolist()])
    report = calibrate(model, [(reference("llama")[0].tolist(), PROMPT_LEN - 1)], max_nodes=8, repeats=1,
                       dynamic_max_nodes=8, rescoring_weights=(0.0, 1.0), rescoring_candidates=5)
    rescoring = report["rescoring"]
    assert [(row["weight"], row["lm_weight"]) for row in rescoring["by_weights"]] == [(0.0, 0.0), (1.0, 0.0)]
    stored = model.decoding_settings(DEVICE)
    assert stored["rescoring"] == rescoring["settings"] and stored["rescoring"]["weight"] in (0.0, 1.0)
    assert 1 <= stored["rescoring"]["nodes"] <= 8 and stored["rescoring"]["candidates"] == 5
    assert stored["tree_kind"] in ("static", "dynamic", "rescored")
    assert set(stored["rescoring_options"]) == {"ngram"} and stored["rescoring_options"]["ngram"]["weight"] == 1.0
    assert 0.0 <= rescoring["heads_top_block_repeats"] <= 1.0 and rescoring["rescorer"] is None
    text = format_report(report)
    assert "rescored tree" in text and "n-gram weight" in text


def test_ngram_command_counts_the_training_split(tmp_path):
    from cerberus_hf.tools.ngram import training_sequences
    from cerberus_hf.training.data import Record

    records = [Record(f"p{i}", (1, 2), (3, 4, i % 7)) for i in range(40)]
    kept = training_sequences(records, held_out_fraction=0.25)
    assert 0 < len(kept) < 40 and all(start == 2 for _, start in kept)
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(
        f'{{"id": "{r.id}", "mode": "greedy", "prompt": "x", "input_ids": {list(r.input_ids)}, '
        f'"output_ids": {list(r.output_ids)}, "finished": true}}\n' for r in records))
    model = fresh_model("llama", "medusa", num_heads=2)
    model.save_pretrained(tmp_path / "heads")
    assert cli_main(["ngram", "--heads", str(tmp_path / "heads"), "--data", str(data), "--order", "2",
                     "--held-out-fraction", "0.25"]) == 0
    ngram = NgramModel.load(tmp_path / "heads" / NGRAM_WEIGHTS_NAME, vocab_size=model.config.vocab_size)
    assert ngram.order == 2 and ngram.tokens == 3 * len(kept)
