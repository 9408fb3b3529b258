"""Model cards are written from measured numbers: a bench run's rows for the checkpoint become its card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers import GenerationConfig

from cerberus_hf.tools.bench import run_bench
from cerberus_hf.configuration_cerberus import CerberusConfig
from cerberus_hf.tools.model_card import EVALUATION, TRAINING_METRICS, evaluation_from_bench, render_card
from helpers import fresh_model, get_base, get_prompt, here


def test_card_takes_its_decoding_table_from_the_bench_rows_of_its_checkpoint():
    model = fresh_model("llama", "cerberus", randomize=True, num_heads=2)
    model.generation_config.cerberus_calibration = {here(): {"draft_tree": [[0], [1], [0, 0]]}}
    other = fresh_model("llama", "medusa", num_heads=2)
    result = run_bench(get_base("llama"), {"cerberus tiny": model, "medusa tiny": other}, [get_prompt("llama")],
                       max_new_tokens=8, variants=["chain", "tree"])
    result.update(n_prompts=1, max_new_tokens=8, prompts_file="/x/prompts.jsonl", device="cpu", command="cerberus-hf bench")

    evaluation = evaluation_from_bench(result, "cerberus tiny")
    assert [run["configuration"] for run in evaluation["runs"]] == ["chain, gate off", "tree, gate off"]
    by_name = {row["method"]: row for row in result["methods"]}
    assert evaluation["runs"][1]["tau"] == by_name["cerberus tiny (tree, gate off)"]["tau"]
    assert "prompts" not in evaluation["runs"][0]  # per-prompt records stay in the bench JSON

    rescoring = {"nodes": 6, "depth": 2, "top_k": 2, "candidates": 4, "weight": 0.5}
    calibration = {"cpu/float32/X": {"draft_tree": [[0], [1], [0, 0]], "gate_signal": "head_entropy", "gate_threshold": 2.5},
                   "cpu/bfloat16/X": {"draft_tree": [[0]], "tree_kind": "rescored", "rescoring": rescoring}}
    card = render_card(model.config, None, evaluation, "cerberus-hf card --bench b.json", calibration)
    assert "Calibrated for `cpu/float32/X` (used by default on the closest hardware): static tree of 3 nodes " \
           "`[[0], [1], [0, 0]]`, gate drafts while head_entropy < 2.500" in card
    assert "Calibrated for `cpu/bfloat16/X` (used by default on the closest hardware): rescored tree of 6 nodes chosen " \
           "among 4 guesses per depth with n-gram weight 0.5 (also fitted: static tree of 1 nodes `[[0]]`), no gate" in card
    # the tiny test base has no name: the metadata leaves base_model out (it used to write "base_model: None")
    assert card.startswith("---\ndatasets:") and "library_name: cerberus-hf" in card and "base_model" not in card.split("\n---")[0]
    budgeted = {"cpu/float32/X": {"tree_kind": "dynamic", "dynamic_tree": {"nodes": 8, "depth": 2, "top_k": 4,
                                                                           "top_p": 0.95, "min_ratio": 0.25}}}
    assert "dynamic tree of 8 nodes, 2 deep, top-4 per level, each node's children within probability 0.95 and at " \
           "least 0.25 times the most probable one" in render_card(model.config, None, None, "c", budgeted)
    tree = evaluation["runs"][1]
    assert f"| tree, gate off | {tree['tau']:.2f} | 100% | {tree['speedup']:.2f}x | 100% |" in card
    assert "Measured by `cerberus-hf bench`" in card and "prompts.jsonl" in card
    assert "Greedy, 1 prompts" in card and "strict=True" not in card.split("## Decoding")[1]  # the bench ran float32
    result["dtype"] = "bfloat16"
    reduced = render_card(model.config, None, evaluation_from_bench(result, "cerberus tiny"), "c", None)
    assert "Greedy in bfloat16, 1 prompts" in reduced and "compares with plain `generate()` in bfloat16" in reduced

    with pytest.raises(ValueError, match="no rows for 'cerberus other'"):
        evaluation_from_bench(result, "cerberus other")


def test_kangaroo_card_says_what_the_drafter_is_made_of():
    model = fresh_model("llama", "kangaroo", num_heads=5, adapter_heads=2, adapter_head_dim=8)
    training = {"top1": [0.25], "top5": [0.5], "config": {"lr": 0.01, "batch_tokens": 4096}, "data": {"path": ["a/x.jsonl", "b/y.jsonl"]}, "cost": {}}
    calibration = {"cpu/float32/X": {"draft_tree": [[0], [0, 0], [0, 0, 0]], "exit_confidence": 0.4}}
    card = render_card(model.config, training, None, "cerberus-hf card", calibration)
    assert "# Kangaroo adapter for" in card and "the base's first 1 layers" in card and "width 16" in card
    assert "up to 5 tokens" in card
    assert "| adapter | the next token, from layer 1 | 0.250 | 0.500 |" in card
    assert "drafts of up to 3 tokens, exit confidence 0.4, no gate" in card
    assert "batch_tokens=4096" in card and "Data: `x.jsonl, y.jsonl`" in card
    never = render_card(model.config, None, None, "cerberus-hf card", {"cpu/float32/X": {"gate_threshold": 0.0}})
    assert "gate never drafts" in never


def test_clover_card_says_what_the_drafter_is_made_of():
    model = fresh_model("llama", "clover", num_heads=3, adapter_heads=2, adapter_head_dim=8, context_window=6)
    training = {"top1": [0.5, 0.3, 0.2], "top5": [0.7, 0.5, 0.4], "config": {}, "data": {}, "cost": {}}
    card = render_card(model.config, training, None, "cerberus-hf card", None)
    assert "# Clover heads for" in card and "width 16" in card and "newest 6 verified states" in card
    assert "residual layer" not in card
    assert "| 2 | token t+4 | 0.200 | 0.400 |" in card


def test_hydra_card_says_whether_a_prefix_layer_reads_the_sequence():
    training = {"top1": [0.5, 0.3], "top5": [0.7, 0.5], "config": {}, "data": {}, "cost": {}}
    with_prefix = render_card(fresh_model("llama", "hydra+prefix", num_heads=2, context_window=6).config, training,
                              None, "cerberus-hf card", None)
    assert "# Hydra heads for" in with_prefix and "prefix layer (Hydra++" in with_prefix
    assert "attention 2 heads of 8" in with_prefix and "newest 6 verified states" in with_prefix
    plain = render_card(fresh_model("llama", "hydra", num_heads=2).config, training, None, "cerberus-hf card", None)
    assert "prefix layer" not in plain


def test_card_states_a_resumed_runs_training_time_not_its_last_process():
    """A run resumed from a checkpoint records the last process's wall time and the training time of all of them:
    the card states the total, not the last process's minutes as the run's cost."""
    model = fresh_model("llama", "cerberus", num_heads=2)
    resumed = {"wall_time_s": 677.0, "train_time_s": 596.0, "train_time_s_total": 2846.0, "device": "cpu: X"}
    card = render_card(model.config, {"top1": [0.3, 0.2], "top5": [0.5, 0.4], "config": {}, "data": {}, "cost": resumed},
                       None, "cerberus-hf card", None)
    assert "training 47.4 min on cpu: X, over several processes" in card and "the last ran 11.3 minutes" in card
    whole = dict(resumed, wall_time_s=3000.0, train_time_s=2846.0)
    card = render_card(model.config, {"top1": [0.3, 0.2], "top5": [0.5, 0.4], "config": {}, "data": {}, "cost": whole},
                       None, "cerberus-hf card", None)
    assert "- Cost: 50.0 minutes on cpu: X, of which training 47.4 min and " in card


def test_card_states_the_strict_settings_beside_an_entry():
    model = fresh_model("llama", "medusa", num_heads=2)
    strict = {"draft_tree": [[0], [1]], "tree_kind": "static", "gate_threshold": None, "strict_rows": 32}
    calibration = {"cpu/bfloat16/X": {"draft_tree": [[0], [1], [0, 0]], "gate_threshold": None, "strict": strict}}
    card = render_card(model.config, None, None, "c", calibration)
    assert "Calibrated for `cpu/bfloat16/X` (used by default on the closest hardware): static tree of 3 nodes" in card
    assert ("  - with `generate(strict=True)` (output bit-identical to plain `generate()` in this dtype; at most 32 "
            "positions a verification): static tree of 2 nodes `[[0], [1]]`, no gate") in card


def test_card_states_the_earlier_runs_a_run_continued_from():
    """A run started from saved heads (``init_from``): the card states each earlier run and the whole training behind
    the heads, not only the last run's steps and minutes."""
    model = fresh_model("llama", "cerberus", num_heads=2)
    first = {"folder": "a", "steps": 600, "epochs": 0.42, "train_time_s": 2220.0, "continued_from": None}
    training = {"top1": [0.3, 0.2], "top5": [0.5, 0.4], "config": {}, "data": {}, "steps": 1800, "epochs": 1.25,
                "cost": {"wall_time_s": 4800.0, "train_time_s": 4680.0}, "continued_from": first}
    card = render_card(model.config, training, None, "cerberus-hf card", None)
    assert ("- Continued from earlier training: 600 steps (0.42 epoch(s), 37.0 min), then this run; 2400 steps "
            "(1.67 epochs) and 115.0 min of training in all.") in card
    second = dict(training, continued_from={**first, "steps": 100, "continued_from": dict(first, steps=50)})
    assert "50 steps (0.42 epoch(s), 37.0 min); 100 steps" in render_card(model.config, second, None, "c", None)
    assert "Continued" not in render_card(model.config, dict(training, continued_from=None), None, "c", None)


def test_card_metadata_is_written_by_huggingface_hub_and_reads_back():
    """The front matter is huggingface_hub's ``ModelCardData`` dumped as YAML: parsed back by ``ModelCard`` it gives
    the same fields, a base name that YAML must quote included, and the Markdown after it is unchanged."""
    model = fresh_model("llama", "hydra", num_heads=2)
    model.config.base_model_name_or_path = "org/base: v2 #1"
    card = render_card(model.config, None, None, "cerberus-hf card", None)
    parsed = ModelCard(card)
    assert parsed.data.to_dict() == {"base_model": "org/base: v2 #1", "datasets": ["self-distillation"],
                                     "library_name": "cerberus-hf", "pipeline_tag": "text-generation",
                                     "tags": ["speculative-decoding", "draft-heads", "hydra"]}
    assert parsed.text.startswith("\n# Hydra heads for org/base: v2 #1\n") and str(parsed) == card


SHIPPED = sorted(path.parent for path in (Path(__file__).parents[1] / "model_cards").glob("*/evaluation.json"))


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda folder: folder.name)
def test_shipped_card_says_what_its_folder_holds(folder):
    """A shipped card is what `card --reuse-evaluation` writes from its folder today: a calibration stored since, or
    a change of wording, is in the card (rewrite it with that command)."""
    def read(name: str) -> dict | None:
        return json.loads((folder / name).read_text()) if (folder / name).is_file() else None

    calibration = getattr(GenerationConfig.from_pretrained(folder), "cerberus_calibration", None)
    card = render_card(CerberusConfig.from_pretrained(folder), read(TRAINING_METRICS), read(EVALUATION), "", calibration)
    shipped = (folder / "README.md").read_text()
    assert shipped.split("## Provenance")[0] == card.split("## Provenance")[0], \
        f"rewrite it: cerberus-hf card --heads {folder.relative_to(folder.parents[1])} --reuse-evaluation"
