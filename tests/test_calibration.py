"""Calibration: tree construction from rank statistics and a cost curve, gate fitting, and the stored
device-keyed settings that generate() then uses by default."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GenerationConfig

from cerberus_hf.hardware import HardwareKey, bf16_matmul
from cerberus_hf.errors import UserError
from cerberus_hf.calibration import calibrate, calibrate_chain, format_chain_report, format_report
from cerberus_hf.calibration.pipeline import store_calibration
from cerberus_hf.calibration.fit import (
    accepted_length, build_tree, dynamic_accepted, fit_dynamic_tree, fit_gate, path_frequencies, static_accepted, walk,
)
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.calibration import machine, measure
from cerberus_hf.calibration.measure import non_decreasing
from cerberus_hf.calibration.positions import ChainPosition, PositionRecord, collect_chain_positions, collect_positions
from cerberus_hf.blocks.tree import DynamicTree
from cerberus_hf.tools.calibrate import parse_budgets
from helpers import NEW_TOKENS, PROMPT_LEN, fresh_model, get_prompt, install_oracle, reference
from tiny_models import DEVICE, tiny_model


def records(rank_rows, signal=None):
    """Positions of sequences of their own: each is one step of decoding, so expectations are plain means."""
    return [PositionRecord(list(r), {"base_entropy": s, "head_entropy": s, "base_top1": s}, sequence=i)
            for i, (r, s) in enumerate(zip(rank_rows, signal or [0.0] * len(rank_rows)))]


def test_accepted_length_follows_the_tree():
    tree = {(0,), (1,), (0, 0), (1, 0), (0, 0, 2)}
    assert accepted_length([0, 0, 2], tree) == 3
    assert accepted_length([1, 0, 0], tree) == 2
    assert accepted_length([2, 0, 0], tree) == 0
    assert accepted_length([0, -1, 0], tree) == 1


def test_path_frequencies_are_prefix_closed_and_sorted():
    recs = records([[0, 0], [0, 1], [0, 0], [1, 0], [-1, 0]])
    freqs = dict(path_frequencies(recs))
    assert freqs[(0,)] == pytest.approx(3 / 5) and freqs[(0, 0)] == pytest.approx(2 / 5)
    assert (-1,) not in freqs and (-1, 0) not in freqs
    order = [p for p, _ in path_frequencies(recs)]
    assert all(p[:-1] in order[: order.index(p)] for p in order if len(p) > 1)


def test_tree_size_follows_the_cost_curve():
    recs = records([[0, 0, 0]] * 6 + [[1, 0, 0]] * 3 + [[0, 1, 0]] * 1)
    flat = {n: 1.0 for n in range(1, 65)}
    paths, best, _ = build_tree(recs, flat, draft_time=0.0)
    assert best["expected_tau"] == pytest.approx(1 + 3.0)  # every seen path is in: all 3 tokens accepted
    steep = {n: float(n) for n in range(1, 65)}
    small, best_small, _ = build_tree(recs, steep, draft_time=0.0)
    assert len(small) < len(paths) and small[0] == [0]


def test_the_walk_steps_over_the_positions_a_long_step_crosses():
    """Decoding visits a position only where a step starts: after 3 accepted drafts it lands 4 positions on. A mean
    over every position would count the easy run once per position (tau 2.5 here, against the 2.0 decoding makes)."""
    accepted = [3, 3, 3, 3, 0, 0, 0, 0, 3, 0] + [0, 2, 2, 2]
    recs = [PositionRecord([], {}, sequence=0 if i < 10 else 1) for i in range(len(accepted))]
    walked = walk(recs, torch.tensor(accepted), seconds=torch.arange(len(accepted), dtype=torch.float64))
    # sequence 0: steps at 0 (4 tokens), 4, 5, 6, 7 (1 each), 8 (4, past its end); sequence 1: at 10 (1), 11 (3)
    assert (int(walked.tokens[0]), int(walked.steps[0])) == (12 + 4, 6 + 2)
    assert float(walked.sums["seconds"][0]) == 0 + 4 + 5 + 6 + 7 + 8 + 10 + 11
    assert float(walked.tau[0]) == pytest.approx(2.0) != pytest.approx(1 + sum(accepted) / len(accepted))
    both = walk(recs, torch.tensor([accepted, [0] * len(accepted)]), seconds=1.0)  # policies walk side by side
    assert both.steps.tolist() == [8, len(accepted)] and both.tokens.tolist() == [16, len(accepted)]


@pytest.mark.parametrize("head_type", ["hydra", "eagle3", "dflash"])
@pytest.mark.parametrize("kind", ["chain", "dynamic"])
def test_expected_tau_is_what_greedy_decoding_of_the_same_sequence_makes(head_type, kind):
    """Calibration's expectation, walked over a sequence, equals decoding that sequence step for step. The oracle
    misses depth k at position p when p + k is a multiple of 3: a 3-token chain accepts 0, 2 and 1 drafts at
    positions 0, 1 and 2 mod 3 (tau 2.0 over every position), but decoding lands on 1 mod 3 each time (tau 3.0)."""
    model = fresh_model("llama", head_type, num_heads=3)
    sequence = reference("llama")
    install_oracle(model, [sequence], corrupt=lambda p, k: (p + k) % 3 == 0)
    dynamic = DynamicTree(nodes=4, depth=3, top_k=2)
    recs = collect_positions(model, [(sequence[0].tolist(), PROMPT_LEN - 1)], top_k=2, dynamic=dynamic)
    if kind == "chain":
        accepted, tree = static_accepted(recs, [[0], [0, 0], [0, 0, 0]]), {"draft_tree": [[0], [0, 0], [0, 0, 0]],
                                                                            "dynamic_tree": None}
    else:
        accepted, tree = dynamic_accepted(recs, dynamic.nodes), {"dynamic_tree": dynamic.to_dict()}
    walked = walk(recs, torch.tensor(accepted))
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, gate_threshold=None, rescoring=None,
                         prompt_lookup_num_tokens=0, **tree)
    assert torch.equal(out, sequence)
    steps = int(walked.steps[0])
    decoded = model.generation_stats.tokens_per_step[1: 1 + steps]  # after the prefill: the steps the records cover
    assert int(walked.tokens[0]) == sum(decoded) and len(decoded) == steps
    if kind == "chain":
        assert 1 + sum(accepted) / len(accepted) < float(walked.tau[0]) - 0.5


def test_non_decreasing_pools_each_fall_into_its_mean():
    assert non_decreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert non_decreasing([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]
    assert non_decreasing([1.0, 1.0, 2.0, 5.0]) == [1.0, 1.0, 2.0, 5.0]


def test_cost_curve_holds_its_shape_while_the_machine_drifts(monkeypatch):
    """A forward over n tokens costs 1 + n / 10 units, and the machine slows down steadily, by a tenth of its first
    speed after every second forward (as a shared or heating machine drifts). Pairing each size with a one-token
    forward just before it keeps the relative costs exact; times taken seconds apart would not."""
    base = tiny_model("llama")
    clock, forwards = [0.0], [1]  # the prefix's forward runs alone: pairs start after it

    def advance(module, args, kwargs):
        n = kwargs["input_ids"].shape[1]
        clock[0] += (1 + n / 10) * (1 + 0.1 * (forwards[0] // 2))
        forwards[0] += 1

    base.register_forward_pre_hook(advance, with_kwargs=True)
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    cost = measure.measure_cost_curve(base, max_tokens=8, context=16, repeats=3)
    assert sorted(cost) == list(range(1, 9))
    for n in range(2, 9):
        assert cost[n] / cost[1] == pytest.approx((1 + n / 10) / 1.1)


def test_a_view_timed_at_one_token_only_is_budgeted_for_its_one_token_forwards_alone():
    """A bounded cost curve plans its sizes from what a pass costs: a view timed at one token only (the one-row way)
    adds a one-token forward a size, not one over n tokens, so it leaves room for more sizes than a view timed at every
    size would. Three views of 1 s a token and 150 s: 8 of the 14 sizes fit when all are timed at every size, all 14
    when the third is timed at one token only."""
    every = measure.budget_sizes(64, single=3.0, seconds=150.0)
    one_only = measure.budget_sizes(64, single=3.0, seconds=150.0, timed=2.0)
    assert (len(every), len(one_only)) == (8, 14)
    assert measure.pass_seconds(one_only, 3.0, 2.0) <= 150.0 < measure.pass_seconds(one_only, 3.0)


@pytest.mark.parametrize("head_type", ["eagle3", "hydra"])
def test_drafting_timings_run_the_base_over_the_context_once(head_type):
    """EAGLE-3 keeps a state over the sequence, so its drafting and gate timings start after a context the base runs
    over: once for all of them (in bf16 without bf16 kernels each such forward took seconds of a first use bounded
    to about 30). Heads that read the newest state need no such forward."""
    base = tiny_model("llama")
    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=2)
    lengths = []
    base.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                   with_kwargs=True)
    probe = DynamicTree(nodes=4, depth=2, top_k=2)
    timings = machine.Timings.measure(model, {n: 1.0 for n in range(1, 8)}, machine.MeasurePlan(draft_repeats=2),
                                      probe, [])
    assert timings.draft > 0 and timings.dynamic > 0 and timings.gates["head_entropy"] > 0
    assert lengths == ([] if head_type == "hydra" else [lengths[0]]) and all(n > 3 for n in lengths)


def test_gate_threshold_separates_good_from_bad_positions():
    # Low signal: 3 tokens accepted; high signal: none. Drafting costs 2 plain steps.
    recs = records([[0, 0, 0]] * 50 + [[5, 5, 5]] * 50, signal=[0.1 * i for i in range(50)] + [10 + i for i in range(50)])
    gate = fit_gate(recs, static_accepted(recs, [[0], [0, 0], [0, 0, 0]]), tree_step=2.0, plain_step=1.0)
    row = gate["signals"]["base_entropy"]
    assert 4.9 < row["threshold"] < 10
    assert row["draft_rate"] == pytest.approx(0.5)
    assert row["auc"] == pytest.approx(1.0) and row["spearman"] < -0.8
    assert row["tokens_per_s"] > gate["always_draft_tokens_per_s"] and row["tokens_per_s"] > gate["never_tokens_per_s"]
    # a head-entropy gate runs the first head before deciding: a gated step costs a plain one plus that
    costly = fit_gate(recs, static_accepted(recs, [[0], [0, 0], [0, 0, 0]]), tree_step=2.0, plain_step=1.0,
                      gate_costs={"head_entropy": 1.0})["signals"]
    assert costly["base_entropy"]["tokens_per_s"] == pytest.approx(250 / 150)  # 50 steps of 4 tokens, 50 of 1
    assert costly["head_entropy"]["tokens_per_s"] == pytest.approx(250 / 200)  # gating now saves nothing


def test_gate_never_drafts_when_drafts_never_pay():
    recs = records([[5, 5]] * 20, signal=[float(i) for i in range(20)])
    gate = fit_gate(recs, static_accepted(recs, [[0]]), tree_step=2.0, plain_step=1.0)
    assert gate["signals"]["base_entropy"]["threshold"] == 0.0


def test_dynamic_tree_size_follows_where_the_true_path_was_chosen():
    # where each depth's true node came in the dynamic tree's order of choice (-1: never drafted)
    recs = [PositionRecord([0, 0], {}, order, sequence=i) for i, order in enumerate(([0, 1], [0, 3], [2, -1], [-1, 0]))]
    assert dynamic_accepted(recs, 1) == [1, 1, 0, 0]
    assert dynamic_accepted(recs, 2) == [2, 1, 0, 0]
    assert dynamic_accepted(recs, 4) == [2, 2, 1, 0]
    best, table = fit_dynamic_tree(recs, {n: 1.0 for n in range(1, 10)}, draft_time=0.0, max_nodes=6)
    assert [row["expected_tau"] for row in table][:4] == pytest.approx([1.5, 1.75, 2.0, 2.25])
    assert best["nodes"] == 4  # nothing more is ever accepted, and a flat curve breaks ties to the smallest
    best, _ = fit_dynamic_tree(recs, {n: float(n) for n in range(1, 10)}, draft_time=0.0, max_nodes=6)
    assert best["nodes"] == 1


def test_a_budgeted_dynamic_tree_is_priced_by_the_nodes_it_drafted_at_each_position():
    # (true path's places in the order of choice, nodes the budget drafted) at five positions; the plain
    # tree finds the true path at the same places but always drafts as many nodes as it may
    drafted = [([0, 1], 2), ([0, 1], 2), ([0, -1], 1), ([-1, -1], 1), ([-1, -1], 6)]
    recs = [PositionRecord([0, 0], {}, order, budgeted={(0.9, 0.2): (order, n)}, sequence=i)
            for i, (order, n) in enumerate(drafted)]
    steep = {n: float(n) for n in range(1, 10)}
    best, table = fit_dynamic_tree(recs, steep, draft_time=0.5, max_nodes=5, budget=(0.9, 0.2))
    assert dynamic_accepted(recs, 5, budget=(0.9, 0.2)) == [2, 2, 1, 0, 0]
    row = table[3]  # at most 4 nodes: 2, 2, 1, 1 and 4 drafted; each position's step on the cost curve
    assert row["mean_nodes"] == pytest.approx(10 / 5)
    assert row["step_seconds"] == pytest.approx((3 + 3 + 2 + 2 + 5) / 5 + 0.5)
    assert row["expected_tau"] == pytest.approx(1 + 5 / 5)
    plain_best, plain = fit_dynamic_tree(recs, steep, draft_time=0.5, max_nodes=5)
    assert plain[3]["mean_nodes"] == 4 and plain[3]["step_seconds"] == pytest.approx(5.5)
    # the budget verifies fewer nodes where no more are needed: on a steep curve 2 nodes pay with it (2.0
    # tokens in 3.1 s), not without (1 node: 1.6 tokens in 2.5 s)
    assert plain_best["nodes"] == 1 and plain_best["tokens_per_s"] == pytest.approx(1.6 / 2.5)
    assert best["nodes"] == 2 and best["tokens_per_s"] == pytest.approx(2.0 / 3.1)


def test_calibrate_keeps_a_budget_only_where_it_does_best():
    model = fresh_model("llama", "hydra", randomize=True, num_heads=3)
    sequence = [(reference("llama")[0].tolist(), PROMPT_LEN - 1)]
    report = calibrate(model, sequence, max_nodes=8, repeats=1, dynamic_budgets=((0.9, 0.2), (0.5, 0.5)))
    fits = {(row["top_p"], row["min_ratio"]): row["best"] for row in report["dynamic_budgets"]}
    assert list(fits) == [(1.0, 0.0), (0.9, 0.2), (0.5, 0.5)]  # the plain tree first
    assert all(row["mean_nodes"] <= row["nodes"] for row in fits.values())
    assert fits[(1.0, 0.0)]["mean_nodes"] == fits[(1.0, 0.0)]["nodes"]
    assert "dynamic tree budget (top_p, min_ratio)" in format_report(report)
    chosen = report["settings"]["dynamic_tree"]
    kept = (chosen.get("top_p", 1.0), chosen.get("min_ratio", 0.0))
    assert fits[kept] == max(fits.values(), key=lambda row: row["tokens_per_s"]) == report["dynamic_expected"]
    assert chosen["nodes"] == fits[kept]["nodes"]
    # whatever was kept, generate() drafts it and output stays exact
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, dynamic_tree=chosen, gate_threshold=None,
                         prompt_lookup_num_tokens=0)
    assert torch.equal(out, reference("llama"))
    with pytest.raises(UserError, match="TOP_P:MIN_RATIO"):
        parse_budgets(["0.9"])
    with pytest.raises(UserError, match="top_p must be in"):
        parse_budgets(["1.5:0.2"])
    assert parse_budgets(["0.95:0.25"]) == ((0.95, 0.25),)


@pytest.mark.parametrize("head_type", ["cerberus", "clover", "eagle3", "dflash"])
def test_calibrate_stores_settings_that_generate_uses(tmp_path, head_type):
    model = fresh_model("llama", head_type, num_heads=3)
    install_oracle(model, [reference("llama")], corrupt=lambda p, k: (p + k) % 3 == 0)
    # the plain dynamic tree only: its size is the same every step (budgets: the test below)
    report = calibrate(model, [(reference("llama")[0].tolist(), PROMPT_LEN - 1)], max_nodes=8, repeats=1,
                       dynamic_budgets=())
    assert "cost of one forward" in format_report(report)
    key = report["key"]
    assert key == str(HardwareKey.of(DEVICE, torch.float32)) and key.startswith(f"{DEVICE.type}/float32/")
    assert list(model.generation_config.cerberus_calibration) == [key]
    if DEVICE.type == "cpu":  # a CPU entry records the CPU's bf16 instructions
        assert report["settings"]["bf16_matmul"] == bf16_matmul("cpu")
        assert report["settings"]["amx"] == (bf16_matmul("cpu") == "AMX")
    else:
        assert "bf16_matmul" not in report["settings"] and "amx" not in report["settings"]
    settings = model.decoding_settings(DEVICE)
    assert settings["calibration"] == key
    assert settings["draft_tree"] == report["settings"]["draft_tree"] and len(settings["draft_tree"]) >= 1
    assert settings["tree_kind"] in ("static", "dynamic") and settings["dynamic_tree"]["depth"] == 3
    assert 1 <= settings["dynamic_tree"]["nodes"] <= 32
    other = "cuda" if DEVICE.type == "cpu" else "cpu"
    assert model.decoding_settings(other)["draft_tree"] is None  # nothing calibrated for the other device
    model.generation_config.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert loaded.cerberus_calibration[key]["draft_tree"] == settings["draft_tree"]
    # The calibrated defaults drive generate(), and output stays exact.
    model.generation_config.cerberus_calibration[key]["gate_threshold"] = None
    model.generation_config.cerberus_calibration[key]["tree_kind"] = "static"
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, reference("llama"))
    assert model.generation_stats.drafted_tokens >= len(settings["draft_tree"])
    model.generation_config.cerberus_calibration[key]["tree_kind"] = "dynamic"
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, reference("llama"))
    nodes = settings["dynamic_tree"]["nodes"]
    assert model.generation_stats.draft_steps > 0
    stats = model.generation_stats
    # the fitted size every step, fewer only in the last steps, where the room before max_length cuts the depth
    # (the size depends on the measured cost curve, so a large one under load is limited there too)
    assert nodes * (stats.draft_steps - 3) <= stats.drafted_tokens <= nodes * stats.draft_steps
    assert not math.isnan(report["expected"]["expected_tau"])
    assert report["gate_seconds"]["head_entropy"] > 0


def test_chain_positions_follow_the_drafts_and_the_exit():
    """drafted(): up to the length, ending after the first draft below the confidence; accepted(): the
    leading right drafts among those."""
    position = ChainPosition(confidences=[0.9, 0.4, 0.8], hits=[True, True, False], signals={})
    assert [position.drafted(3, c) for c in (0.0, 0.5, 0.95)] == [3, 2, 1]
    assert position.drafted(1, 0.0) == 1
    assert [position.accepted(n) for n in (1, 2, 3)] == [1, 2, 2]


def test_calibrate_chain_measures_what_kangaroo_drafts_and_stores_what_generate_uses():
    model = fresh_model("llama", "kangaroo", num_heads=3)
    sequence = reference("llama", NEW_TOKENS + 8)[0].tolist()
    untrained = collect_chain_positions(model, [(sequence, PROMPT_LEN - 1)])
    install_oracle(model, [torch.tensor(sequence)])
    positions = collect_chain_positions(model, [(sequence, PROMPT_LEN - 1)])
    assert len(positions) == len(untrained) == len(sequence) - 3 - PROMPT_LEN  # every step with three targets
    assert all(position.hits == [True] * 3 for position in positions)  # teacher-forced: the oracle is always right
    assert sum(sum(p.hits) for p in untrained) < sum(sum(p.hits) for p in positions)
    report = calibrate_chain(model, [(sequence, PROMPT_LEN - 1)], repeats=1)
    assert "chosen: length" in format_chain_report(report)
    assert report["depth_acceptance"] == [1.0, 1.0, 1.0]  # the oracle is right at every depth it reaches
    assert all(set(by_length) == {1, 2, 3} and min(by_length.values()) > 0
               for by_length in report["chain_step_seconds"].values())  # a real step timed per draft length
    settings = model.decoding_settings(DEVICE)
    assert settings["calibration"] == report["key"]
    assert settings["exit_confidence"] == report["settings"]["exit_confidence"]
    length = report["settings"]["draft_tree"]
    assert length == [[0] * (d + 1) for d in range(len(length))]
    model.generation_config.cerberus_calibration[report["key"]]["gate_threshold"] = None
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert torch.equal(out, reference("llama"))
    assert max(model.generation_stats.tokens_per_step) <= len(length) + 1


def test_calibrate_cli_refuses_tree_options_for_a_chain_drafter(tmp_path):
    import argparse
    import json

    from cerberus_hf import CerberusForCausalLM
    from cerberus_hf.tools import calibrate as calibrate_tool
    from helpers import get_base

    base = get_base("llama")
    base.save_pretrained(tmp_path / "base")
    model = CerberusForCausalLM.from_base(base, head_type="kangaroo", exit_layer=1, num_heads=2,
                                          base_model_name_or_path=str(tmp_path / "base"))
    model.save_pretrained(tmp_path / "kangaroo")
    sequence = reference("llama")[0].tolist()
    (tmp_path / "data.jsonl").write_text(json.dumps({
        "id": "a", "mode": "greedy", "prompt": "p", "input_ids": sequence[:PROMPT_LEN],
        "output_ids": sequence[PROMPT_LEN:], "finished": True}) + "\n")
    parser = argparse.ArgumentParser()
    calibrate_tool.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--heads", str(tmp_path / "kangaroo"), "--data", str(tmp_path / "data.jsonl"),
                              "--held-out-fraction", "0", "--top-k", "5", "--rescoring-weights", "0", "1"])
    with pytest.raises(UserError, match=r"--top-k, --rescoring-weights do\(es\) not apply to kangaroo"):
        args.func(args)


def test_calibrate_cli_keeps_the_vocabulary_heads_were_trained_over(tmp_path):
    """Heads trained with --train-vocab never trained the other rows: calibrate refuses to swap in another
    draft vocabulary, and without --draft-vocab keeps theirs."""
    import argparse

    from cerberus_hf.tools import calibrate as calibrate_tool

    from cerberus_hf.configuration_cerberus import CerberusConfig

    CerberusConfig(hidden_size=32, vocab_size=128, draft_vocab_size=64, draft_vocab_trained=True).save_pretrained(
        tmp_path / "heads")
    (tmp_path / "data.jsonl").write_text("")
    parser = argparse.ArgumentParser()
    calibrate_tool.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--heads", str(tmp_path / "heads"), "--data", str(tmp_path / "data.jsonl"),
                              "--draft-vocab", "32"])
    with pytest.raises(UserError, match="trained over its own 64-token vocabulary"):
        args.func(args)
    CerberusConfig(hidden_size=32, vocab_size=128, draft_vocab_size=64).save_pretrained(tmp_path / "heads")
    with pytest.raises(ValueError, match="holds no records"):  # past the check, to the (empty) data
        args.func(args)


def test_calibrate_cli_in_bfloat16_writes_its_entry_and_leaves_the_weights_as_stored(tmp_path, monkeypatch):
    """--write after --dtype bfloat16 adds that dtype's entry beside the others; the folder's heads keep the
    precision they were saved in (a calibration once wrote them back rounded to bf16)."""
    import argparse
    import json

    from safetensors.torch import load_file

    from cerberus_hf import CerberusForCausalLM
    from cerberus_hf.blocks.ngram import NGRAM_WEIGHTS_NAME, NgramModel
    from cerberus_hf.tools import calibrate as calibrate_tool
    from helpers import get_base

    base = get_base("llama")
    base.save_pretrained(tmp_path / "base")
    model = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=2,
                                          base_model_name_or_path=str(tmp_path / "base"))
    for parameter in model.heads.parameters():  # weights that bf16 cannot hold exactly
        torch.nn.init.normal_(parameter, std=0.1)
    model.generation_config.cerberus_calibration = {"cpu/float32/Another CPU": {"draft_tree": [[0]]}}
    model.save_pretrained(tmp_path / "heads")
    weights = next((tmp_path / "heads").glob("*.safetensors"))
    before = load_file(weights)
    sequence = reference("llama")[0].tolist()
    # An n-gram file shared through a link, as the shipped Medusa folder links Cerberus's: --write must leave it be.
    NgramModel.build([(sequence, 0)], vocab_size=base.config.vocab_size, order=2).save(tmp_path / "shared.safetensors")
    (tmp_path / "heads" / NGRAM_WEIGHTS_NAME).symlink_to(tmp_path / "shared.safetensors")
    ngram_bytes = (tmp_path / "shared.safetensors").read_bytes()
    weights_stat = weights.stat()
    (tmp_path / "data.jsonl").write_text(json.dumps({
        "id": "a", "mode": "greedy", "prompt": "p", "input_ids": sequence[:PROMPT_LEN],
        "output_ids": sequence[PROMPT_LEN:], "finished": True}) + "\n")
    def measured(model, sequences, **options):  # what this test is about is what --write keeps, not the fit
        assert next(model.heads.parameters()).dtype == torch.bfloat16
        return {"key": str(store_calibration(model, {"draft_tree": [[0], [1]]}))}

    monkeypatch.setattr(calibrate_tool, "calibrate", measured)
    monkeypatch.setattr(calibrate_tool, "format_report", lambda report: "")
    parser = argparse.ArgumentParser()
    calibrate_tool.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--heads", str(tmp_path / "heads"), "--data", str(tmp_path / "data.jsonl"),
                              "--held-out-fraction", "0", "--dtype", "bfloat16", "--write"])
    assert args.func(args) == 0
    assert (tmp_path / "heads" / NGRAM_WEIGHTS_NAME).is_symlink()
    assert (tmp_path / "shared.safetensors").read_bytes() == ngram_bytes
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == (weights_stat.st_ino, weights_stat.st_mtime_ns)
    after = load_file(weights)
    assert set(after) == set(before) and all(after[k].dtype == before[k].dtype and torch.equal(after[k], before[k])
                                             for k in before)
    stored = json.loads((tmp_path / "heads" / "generation_config.json").read_text())["cerberus_calibration"]
    assert set(stored) == {"cpu/float32/Another CPU", str(HardwareKey.of("cpu", torch.bfloat16))}
    assert stored[str(HardwareKey.of("cpu", torch.bfloat16))]["draft_tree"] == [[0], [1]]
