"""`cerberus-hf divergence`: departure points, the batched yardstick, and float32 identity of every row."""

from __future__ import annotations

import pytest
import torch

from cerberus_hf.tools.divergence import (
    BATCHED, DRAFTING_OFF, PLAIN, batched_continuation, first_difference, markdown_table, run_divergence, summarize,
)
from cerberus_hf import CerberusForCausalLM
from helpers import fresh_model, get_base, install_oracle, reference
from tiny_models import PAD, prompt_ids


def test_first_difference():
    t = torch.tensor
    assert first_difference(t([1, 2, 3]), t([1, 2, 3])) is None
    assert first_difference(t([1, 5, 3]), t([1, 2, 3])) == 1
    assert first_difference(t([1, 2]), t([1, 2, 3])) == 2 and first_difference(t([1, 2, 3]), t([1, 2])) == 2


def test_summary_counts_identical_prompts_and_departures_from_the_reference():
    records = [{"prompt": 0, "new_tokens": 10, "departs_at": None, "departs_from_reference_at": None},
               {"prompt": 1, "new_tokens": 10, "departs_at": 4, "departs_from_reference_at": 2},
               {"prompt": 2, "new_tokens": 8, "departs_at": 6, "departs_from_reference_at": None}]
    row = summarize("m", records)
    assert row["identical"] == pytest.approx(1 / 3) and row["median_departure"] == 4.0 and row["tau"] is None
    assert row["identical_to_reference"] == pytest.approx(2 / 3)
    assert row["tokens_before_reference_departure"] == pytest.approx((10 + 2 + 8) / 3)
    for record, steps in zip(records, (5, 10, 3)):
        record["steps"] = steps
    assert summarize("m", records)["tau"] == 28 / 18


def test_batched_continuation_is_the_lone_continuation_in_float32():
    base = get_base("llama")
    ids, other = prompt_ids(3, length=6), prompt_ids(4, length=9)
    lone = base.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
    assert torch.equal(batched_continuation(base, ids, other, 12, PAD), lone)


def test_every_row_is_identical_in_float32():
    base = get_base("llama")
    oracle = fresh_model("llama", "medusa", num_heads=3)
    install_oracle(oracle, [reference("llama", 16)])
    untrained = fresh_model("llama", "cerberus", num_heads=2)
    encoded = [reference("llama", 16)[:, :8], prompt_ids(5, length=7)]
    result = run_divergence(base, {"oracle": oracle, "untrained": untrained}, encoded, 16, PAD, reference_base=base)
    rows = {row["method"]: row for row in result["methods"]}
    assert list(rows) == [PLAIN, BATCHED, "oracle", "untrained", DRAFTING_OFF]
    for row in rows.values():
        assert row["identical"] == 1.0 and row["identical_to_reference"] == 1.0 and row["median_departure"] is None
    assert rows["oracle"]["prompts"][0]["steps"] < 16 / 2  # the oracle's drafts were verified and kept
    assert rows[DRAFTING_OFF]["tau"] is None and rows["untrained"]["tau"] >= 1
    result.update(dtype="float32", reference_dtype="float32")
    assert f"| oracle | {rows['oracle']['tau']:.2f} | 100% |  | 100% | 16.0 |" in markdown_table(result)


def test_strict_rows_are_identical_in_bfloat16():
    """--strict adds a strict row per checkpoint; in bf16 it is identical to plain bf16 generate() (the drafted row
    may or may not be: this is what the command measures)."""
    import copy

    base = copy.deepcopy(get_base("llama")).to(torch.bfloat16)
    model = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=3, gate_threshold=None).to(torch.bfloat16)
    encoded = [reference("llama", 16)[:, :8], prompt_ids(5, length=7)]
    result = run_divergence(base, {"m": model}, encoded, 16, PAD, strict=True)
    rows = {row["method"]: row for row in result["methods"]}
    assert list(rows) == [PLAIN, BATCHED, "m", "m, strict", DRAFTING_OFF]
    assert rows["m, strict"]["identical"] == 1.0 and rows["m, strict"]["tau"] >= 1
