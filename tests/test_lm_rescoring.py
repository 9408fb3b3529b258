"""Lattice rescoring with a small neural LM (a Kangaroo drafter read as a language model): its path scores
against the same drafter run over whole sequences, the rescore term, files and errors, calibration and the
bench rows. (Greedy identity and sampling with it on every architecture and family are in test_drafters.py
and test_sampling.py, as the "rescored_lm" tree kind.)"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.remote_code import LOADING_CODE
from cerberus_hf.checkpoint import HEADS_WEIGHTS_NAME
from cerberus_hf.blocks.rescoring import lm_rescore
from cerberus_hf.modeling_cerberus import RESCORER_FOLDER
from cerberus_hf.tools.bench import build_methods
from cerberus_hf.compat import cache_argument
from cerberus_hf.calibration import calibrate, format_report
from helpers import ARCHITECTURES, NEW_TOKENS, PROMPT_LEN, fresh_model, get_prompt, install_oracle, reference
from tiny_models import DEVICE

PATHS = [(), (5,), (7,), (5, 9), (7, 3), (5, 9, 11), (7, 3, 3)]


def whole_sequence_log_probs(drafter, base, sequence: torch.Tensor) -> torch.Tensor:
    """The drafter's log-distribution after the last token of ``sequence``, from one plain forward over it."""
    with torch.no_grad(), drafter.capture(base) as captured:
        base(input_ids=sequence)
        return torch.log_softmax(drafter.logits(drafter.adapt(captured["exit"])[0, -1]).float(), -1)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_path_scores_are_the_drafters_own_over_the_whole_path(arch):
    """Scoring paths as a tree (nodes fed depth by depth, several per forward, under a tree mask) gives what
    the drafter computes over the sequence and the path in one causal forward; closing leaves the caches as
    they were. Also with later positions cached but hidden, as calibration scores them."""
    drafter, base = fresh_model(arch, "kangaroo", randomize=True, seed=1).heads, fresh_model(arch).base
    # 8 cached positions and 7 nodes fit the sliding window (16) of the tiny Mistral and Gemma 2
    sequence = reference(arch)[:, : PROMPT_LEN + 1]
    for visible in (sequence.shape[1] - 1, PROMPT_LEN - 3):  # everything cached is visible / the end is hidden
        cache = DynamicCache(config=base.config)
        with torch.no_grad(), drafter.capture(base) as captured:
            base(input_ids=sequence[:, :-1], **cache_argument(cache), use_cache=True)
            state = drafter.start(base, cache)
            state.observe(captured, None)
            scorer = drafter.path_scorer(state, sequence, visible=visible)
            first = scorer.log_probs(PATHS[:3])
            scores = scorer.log_probs(PATHS)  # the first three come from memory, the rest are fed now
            scorer.close()
        assert torch.equal(first, scores[:3])
        assert state.length == cache.get_seq_length() == sequence.shape[1] - 1
        for path, score in zip(PATHS, scores):
            whole = torch.cat([sequence[:, : visible + 1], torch.tensor([list(path)], dtype=torch.long, device=sequence.device)],
                              dim=1)
            assert torch.allclose(score, whole_sequence_log_probs(drafter, base, whole), atol=1e-5), (visible, path)


def test_path_scorer_refuses_more_than_a_sliding_window_can_attend_to():
    drafter, base = fresh_model("mistral", "kangaroo", randomize=True, seed=1).heads, fresh_model("mistral").base
    sequence = reference("mistral")[:, : PROMPT_LEN + 7]  # 14 cached positions: 3 nodes go past the window of 16
    cache = DynamicCache(config=base.config)
    with torch.no_grad(), drafter.capture(base) as captured:
        base(input_ids=sequence[:, :-1], **cache_argument(cache), use_cache=True)
        cache.activate_past_recording()  # as the decoding loop does after the prefill, so that crop can roll back
        state = drafter.start(base, cache)
        state.observe(captured, None)
        scorer = drafter.path_scorer(state, sequence)
        scorer.log_probs([(5,)])  # the root and one node: 16 positions
        with pytest.raises(RuntimeError, match="sliding window"):
            scorer.log_probs([(5, 9)])
        scorer.close()
    assert state.length == cache.get_seq_length() == sequence.shape[1] - 1


def test_lm_term_is_the_weighted_log_probability_with_a_floor_outside_its_vocabulary():
    class Scorer:
        def log_probs(self, paths):
            return torch.log_softmax(torch.arange(4.0).repeat(len(paths), 1), -1)

    index_of = torch.tensor([-1, 0, 1, -1, 2, 3])  # tokens 1, 2, 4, 5 are its draft vocabulary
    scores = lm_rescore(Scorer(), index_of, 0.5)([(), (1,)], torch.tensor([[1, 5], [0, 3]]))
    log_probs = torch.log_softmax(torch.arange(4.0), -1)
    assert torch.allclose(scores, 0.5 * torch.stack([log_probs[[0, 3]], log_probs[[0, 0]]]))
    full = lm_rescore(Scorer(), None, 2.0)([()], torch.tensor([[2, 1]]))
    assert torch.allclose(full, 2.0 * log_probs[[2, 1]][None])


def test_lm_rescoring_switch_files_and_errors(tmp_path):
    model = fresh_model("llama", "medusa", randomize=True, seed=3, num_heads=3)
    settings = {"nodes": 5, "depth": 3, "top_k": 2, "candidates": 4, "weight": 0.0, "lm_weight": 1.0}
    with pytest.raises(ValueError, match="neural rescorer"):
        model.generate(get_prompt("llama"), max_new_tokens=4, rescoring=settings)
    kangaroo = fresh_model("llama", "kangaroo", randomize=True, seed=2)
    model.load_rescorer(kangaroo)
    calls = []
    feed = type(kangaroo.heads).path_scorer
    model.rescorer.path_scorer = lambda *a, **k: calls.append(1) or feed(model.rescorer, *a, **k)
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, rescoring=settings, gate_threshold=None,
                         prompt_lookup_num_tokens=0, profile=True)
    assert torch.equal(out, reference("llama")) and calls
    assert model.generation_stats.phase_seconds["rescore"] > 0
    calls.clear()
    model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, gate_threshold=None,
                   rescoring={**settings, "lm_weight": 0.0})  # weight 0: the plain lattice, nothing scored
    assert not calls
    del model.rescorer.path_scorer
    # saved beside the heads and loaded with them, also as remote code would find it
    model.save_pretrained(tmp_path)
    assert (tmp_path / RESCORER_FOLDER / HEADS_WEIGHTS_NAME).is_file()
    # with the config's stubs for trust_remote_code, no package code
    assert sorted(p.name for p in (tmp_path / RESCORER_FOLDER).rglob("*.py")) == sorted(LOADING_CODE)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=model.base)
    for (name, mine), theirs in zip(model.rescorer.state_dict().items(), loaded.rescorer.state_dict().values()):
        assert torch.equal(mine, theirs), name
    assert torch.equal(loaded.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, rescoring=settings),
                       reference("llama"))
    loaded.load_rescorer(None)
    assert loaded.rescorer is None
    # refused: heads that cannot score paths, a checkpoint for another base, a corrupt file
    with pytest.raises(ValueError, match="kangaroo"):
        model.load_rescorer(fresh_model("llama", "cerberus"))
    other = fresh_model("llama", "kangaroo", base_model_name_or_path="someone/another-model")
    mine = fresh_model("llama", "medusa", base_model_name_or_path="someone/this-model")
    with pytest.raises(ValueError, match="another base"):
        mine.load_rescorer(other)
    (tmp_path / RESCORER_FOLDER / HEADS_WEIGHTS_NAME).write_bytes(b"not safetensors")
    with pytest.raises(OSError, match="corrupt"):
        CerberusForCausalLM.from_pretrained(tmp_path, base_model=model.base)


def test_calibrate_fits_both_rescorers_and_the_bench_runs_each():
    model = fresh_model("llama", "medusa", num_heads=3)
    install_oracle(model, [reference("llama")], corrupt=lambda p, k: (p + k) % 3 == 0)
    model.load_rescorer(fresh_model("llama", "kangaroo", randomize=True, seed=2))
    report = calibrate(model, [(reference("llama")[0].tolist(), PROMPT_LEN - 1)], max_nodes=8, repeats=1,
                       dynamic_max_nodes=8, rescoring_weights=(0.0,), rescoring_lm_weights=(0.5,),
                       rescoring_candidates=5)
    rescoring = report["rescoring"]
    assert [(row["weight"], row["lm_weight"]) for row in rescoring["by_weights"]] == [(0.0, 0.0), (0.0, 0.5)]
    assert rescoring["rescorer"]["type"] == "kangaroo" and rescoring["ngram"] is None
    stored = model.decoding_settings(DEVICE)
    assert set(stored["rescoring_options"]) == {"lm"} and stored["rescoring_options"]["lm"]["lm_weight"] == 0.5
    assert "LM weight" in format_report(report)
    labels = [m.name for m in build_methods(model.base, {"m": model}, 4, variants=["ltree", "rtree-lm", "rtree-ngram"],
                                                  packed_peer=False)]
    assert labels[2:] == ["m (lattice tree (no rescorer), gate off)", "m (rescored tree, LM only, gate off)"]
