"""`cerberus-hf distill --engine vllm` (vLLM's offline batch generation) writes the records the own engine writes: the
same greedy answers in fp32 on a sample of the packaged prompts, with the real SmolLM2-135M-Instruct. Runs only where
vLLM imports (`make test-engines` runs it in vLLM's venv); the error where it does not: test_cli_errors.py."""

from __future__ import annotations

import json

import pytest

from cerberus_hf.training.data import PACKAGED_PROMPTS, load_prompts
from cerberus_hf.training.distill import eos_ids, generate_distillation_data

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-engines runs this in a venv with it)")
pytestmark = pytest.mark.real_model

PROMPTS = 6
NEW_TOKENS = 48


def _records(path) -> dict:
    return {(r["id"], r["mode"]): r for r in map(json.loads, path.read_text().splitlines())}


def test_vllm_engine_writes_the_own_engines_greedy_answers(tmp_path):
    import torch

    from cerberus_hf.real_models import load_packaged_model

    base, tokenizer = load_packaged_model(dtype=torch.float32)
    prompts = load_prompts(str(PACKAGED_PROMPTS), limit=PROMPTS)
    written = {}
    for engine in ("continuous", "vllm"):
        path = generate_distillation_data(base, tokenizer, prompts, tmp_path / f"{engine}.jsonl", batch_size=4,
                                          max_new_tokens=NEW_TOKENS, sample_fraction=0.5, engine=engine,
                                          progress=False)
        written[engine] = _records(path)
    ours, theirs, eos = written["continuous"], written["vllm"], eos_ids(base, tokenizer)
    assert sorted(ours) == sorted(theirs) and any(mode == "sample" for _, mode in theirs)
    for key, record in theirs.items():
        assert {k: v for k, v in record.items() if k not in ("output_ids", "finished")} == \
            {k: v for k, v in ours[key].items() if k not in ("output_ids", "finished")}
        assert 1 <= len(record["output_ids"]) <= NEW_TOKENS
        assert record["finished"] == (record["output_ids"][-1] in eos)
        assert not eos & set(record["output_ids"][:-1])
    greedy = [key for key in theirs if key[1] == "greedy"]
    assert [theirs[key]["output_ids"] for key in greedy] == [ours[key]["output_ids"] for key in greedy]
    assert [theirs[key]["finished"] for key in greedy] == [ours[key]["finished"] for key in greedy]
