"""Drafters saved in other projects' layouts load as this package's families (`cerberus_hf.importing`): an export loads
back with the same tensors and drafts, EAGLE's and Medusa's own layouts draft what their published formulas (written
out plainly here, from the papers and the public code's arithmetic) compute, greedy output stays plain `generate()`'s
for every layout on every tiny base and every path (the loop's chains and dynamic trees, a batch, the static cache, the
device step), and a bad file is refused in one line before the base loads."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig

import cerberus_hf.importing as importing
from cerberus_hf import CerberusConfig, CerberusForCausalLM
from cerberus_hf.calibration.positions import collect_positions
from cerberus_hf.calibration.statistics import POSITIONS_NAME, PositionStatistics
from cerberus_hf.tools.export import export_speculators, export_vllm_medusa
from cerberus_hf.training.sequence_trainer import train_sequence_drafter
from helpers import (NEW_TOKENS, fresh_model, get_base, get_prompt, install_oracle, randomize_heads, reference,
                     tiny_ngram)
from test_batched import BATCH_ARCHS, NEW as BATCH_NEW, TREES as BATCH_TREES, alone, new_tokens
from test_device_step import TREES as DEVICE_TREES, batch, plain, took_device_step
from test_generate import padded_batch
from test_static_cache import STATIC_ARCHS, generate_static
from cerberus_hf.testing import MTP_ARCHITECTURES, tiny_mtp_model
from tiny_models import ARCHITECTURES, DEVICE, VOCAB, prompt_ids

HIDDEN = 32
DYNAMIC = {"nodes": 6, "depth": 3, "top_k": 3}


# ------------------------------------------------------------------------------------------------ helpers
def draft_logits(model: CerberusForCausalLM, sequence: torch.Tensor) -> torch.Tensor:
    """Every depth's logits ``[n, depths, VOCAB]`` after each position of ``sequence`` with the true tokens above it
    (as drafting computes them on the true path), over token ids (-inf off the draft vocabulary)."""
    heads = model.heads
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(sequence[None])
        logits = heads.teacher_forced(captured, sequence[None], 0)[1].cpu()
    full = torch.full((*logits.shape[:2], VOCAB), float("-inf"))
    full[..., heads.token_ids(torch.arange(logits.shape[-1], device=DEVICE)).cpu()] = logits
    return full


def assert_same_state(mine: dict, theirs: dict) -> None:
    assert sorted(mine) == sorted(theirs)
    for name, tensor in mine.items():
        if name == "draft_vocab":  # an export lists the draft vocabulary by token id
            assert torch.equal(torch.sort(tensor).values, torch.sort(theirs[name]).values)
        else:
            assert torch.equal(tensor, theirs[name]), name


def assert_same_export(first, second) -> None:
    assert json.loads((first / "config.json").read_text()) == json.loads((second / "config.json").read_text())
    mine, theirs = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


def deep_base(layers: int = 8) -> torch.nn.Module:
    """A tiny llama deep enough for EAGLE's own choice of layers (2, L // 2, L - 3) to be three distinct ones."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(DEVICE).eval()


@pytest.fixture
def base_loads(monkeypatch):
    """Every base the importer loads by name."""
    calls = []
    monkeypatch.setattr(importing, "load_base_model", lambda config, **kwargs: calls.append(config) or None)
    return calls


# ------------------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("arch, options", [
    ("llama", {}),
    ("qwen2", dict(norm_before_residual=True, rope_theta=500.0, rms_norm_eps=1e-5, intermediate_size=48)),
])
def test_a_speculators_export_loads_back_with_the_same_tensors_and_drafts(tmp_path, arch, options):
    model = fresh_model(arch, "eagle3", num_heads=3, **options)
    randomize_heads(model, seed=2, std=0.2)
    model.set_draft_vocab(torch.tensor([40, 3, 77, 12, 5, 60, 2, 90, 33, 18]))
    export_speculators(model, tmp_path / "out")
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out", base_model=model.base)
    assert loaded.config.head_projection == "shared" and loaded.config.num_heads == 3
    assert loaded.config.feature_layers == model.config.feature_layers
    for name, value in options.items():
        assert getattr(loaded.config, name) == value
    assert_same_state(model.heads.state_dict(), loaded.heads.state_dict())
    export_speculators(loaded, tmp_path / "again")
    assert_same_export(tmp_path / "out", tmp_path / "again")
    sequence = reference(arch)[0]
    torch.testing.assert_close(draft_logits(loaded, sequence), draft_logits(model, sequence))
    assert torch.equal(loaded.generate(get_prompt(arch), max_new_tokens=24), reference(arch))


@pytest.mark.parametrize("projection, vocab", [("shared", [7, 1, 50, 23, 64, 9]), ("own", None), ("own", [7, 1, 50])])
def test_a_vllm_medusa_export_loads_back_with_the_same_tensors_and_drafts(tmp_path, projection, vocab):
    model = fresh_model("llama", "medusa", num_heads=3, num_layers=2, head_projection=projection)
    randomize_heads(model, seed=3, std=0.2)
    if vocab is not None:
        model.set_draft_vocab(torch.tensor(vocab))
    export_vllm_medusa(model, tmp_path / "out")
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out", base_model=model.base)
    assert (loaded.config.head_projection, loaded.config.num_layers) == (projection, 2)
    assert loaded.config.draft_vocab_trained == (projection == "own" and vocab is not None)
    if projection == "own" and vocab is not None:  # the rows outside the draft vocabulary are the base's now
        for mine, theirs in zip(model.heads.lm_heads, loaded.heads.lm_heads):
            assert torch.equal(mine.weight[vocab], theirs.weight[vocab])
    else:
        assert_same_state(model.heads.state_dict(), loaded.heads.state_dict())
    export_vllm_medusa(loaded, tmp_path / "again")
    assert_same_export(tmp_path / "out", tmp_path / "again")
    sequence = reference("llama")[0]
    torch.testing.assert_close(draft_logits(loaded, sequence), draft_logits(model, sequence))
    assert torch.equal(loaded.generate(get_prompt("llama"), max_new_tokens=24), reference("llama"))


@pytest.mark.parametrize("family", ["medusa", "eagle3"])
def test_an_export_loads_back_with_the_settings_and_files_the_folder_decodes_with(tmp_path, family):
    """What the engines do not read travels for this library (issue 74): the config's decoding settings (5 copied
    prompt tokens, the gate's signal, a tree), the n-gram rescorer, the calibration positions and entries; the export
    loaded back decodes with each as the folder does, and a folder saved from it holds them again."""
    model = fresh_model("llama", family, num_heads=3, prompt_lookup_num_tokens=5, gate_signal="head_entropy",
                        draft_tree=[[0], [1], [0, 0]])
    randomize_heads(model, seed=5, std=0.2)
    model.set_draft_vocab(torch.tensor([40, 3, 77, 12, 5, 60, 2, 90, 33, 18]))
    model.ngram = tiny_ngram(VOCAB, seed=1)
    sequence = reference("llama")[0].tolist()
    model.calibration_statistics = PositionStatistics(collect_positions(model, [(sequence, 4)]), top_k=4, max_nodes=7)
    entry = {"draft_tree": [[0], [0, 0]], "gate_threshold": 2.5, "prompt_lookup_num_tokens": 3}
    model.generation_config.cerberus_calibration = {"cpu/float32/Some CPU": entry}
    (export_vllm_medusa if family == "medusa" else export_speculators)(model, tmp_path / "out")
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "out", base_model=model.base)
    for name in ("prompt_lookup_num_tokens", "gate_signal", "draft_tree"):
        assert getattr(loaded.config, name) == getattr(model.config, name), name
    assert loaded.ngram is not None and loaded.ngram.order == model.ngram.order
    assert all(torch.equal(table, model.ngram.tables[name]) for name, table in loaded.ngram.tables.items())
    assert loaded.calibration_statistics.to_bytes() == model.calibration_statistics.to_bytes()
    assert loaded.generation_config.cerberus_calibration == {"cpu/float32/Some CPU": entry}
    assert loaded.decoding_settings(calibrate=False) == model.decoding_settings(calibrate=False)
    loaded.save_pretrained(tmp_path / "saved")
    for name in ("ngram.safetensors", POSITIONS_NAME):
        assert (tmp_path / "saved" / name).is_file(), name
    assert torch.equal(loaded.generate(get_prompt("llama"), max_new_tokens=24), reference("llama"))


def test_an_export_of_default_settings_carries_nothing_and_a_bad_carried_key_is_refused(tmp_path, base_loads):
    model = fresh_model("llama", "medusa", num_heads=2)
    assert export_vllm_medusa(model, tmp_path / "out") == ["config.json", "model.safetensors"]
    assert "cerberus_hf" not in json.loads((tmp_path / "out" / "config.json").read_text())
    assert importing.CARRIED_POSITIONS == f"{importing.CARRIED_FOLDER}/{POSITIONS_NAME}"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    (tmp_path / "out" / "config.json").write_text(json.dumps({**config, "cerberus_hf": 5}))
    with pytest.raises(ValueError, match="cerberus_hf must map decoding settings to values"):
        CerberusForCausalLM.from_pretrained(tmp_path / "out")
    assert base_loads == []


# ------------------------------------------------------------------------------------------------ Medusa's layout
def write_medusa(folder, heads: int, layers: int, said: int | None = None, seed: int = 0) -> dict:
    """A folder in FasterDecoding/Medusa's layout, with random heads; returns its tensors."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for h in range(heads):
        for i in range(layers):
            tensors[f"{h}.{i}.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g) * 0.3
            tensors[f"{h}.{i}.linear.bias"] = torch.randn(HIDDEN, generator=g) * 0.3
        tensors[f"{h}.{layers}.weight"] = torch.randn(VOCAB, HIDDEN, generator=g)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "medusa_lm_head.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"medusa_num_heads": said or heads, "medusa_num_layers": layers, "version": "2",
                   "base_model_name_or_path": "lmsys/not-loaded-here"}, handle)
    return tensors


def test_medusas_own_layout_drafts_what_medusas_formula_computes(tmp_path, caplog):
    """Medusa (Cai et al., 2024): head ``h`` is ``ResBlock`` ``x + SiLU(W x + b)`` applied ``medusa_num_layers``
    times to the base's last hidden state, then its own ``lm_head``. The config names 2 heads and the file holds 3
    (as published Medusa configs do): the three load, and the line says so."""
    tensors = write_medusa(tmp_path, heads=3, layers=2, said=2)
    base = get_base("llama")
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert (loaded.config.num_heads, loaded.config.num_layers, loaded.config.head_projection) == (3, 2, "own")
    assert "Medusa's layout" in caplog.text and "names 2 heads and the file holds 3" in caplog.text
    sequence = reference("llama")[0]
    with torch.no_grad():
        states = base(sequence[None], output_hidden_states=True).hidden_states[-1][0].cpu()
    expected = []
    for h in range(3):
        x = states
        for i in range(2):
            x = x + F.silu(x @ tensors[f"{h}.{i}.linear.weight"].T + tensors[f"{h}.{i}.linear.bias"])
        expected.append(x @ tensors[f"{h}.2.weight"].T)
    torch.testing.assert_close(draft_logits(loaded, sequence), torch.stack(expected, dim=1), atol=1e-4, rtol=1e-4)
    assert torch.equal(loaded.generate(get_prompt("llama"), max_new_tokens=24), reference("llama"))
    assert CerberusForCausalLM.from_pretrained(tmp_path, base_model=base, num_heads=2).config.num_heads == 2


# ------------------------------------------------------------------------------------------------ EAGLE-3 layouts
EAGLE_SHAPE = dict(heads=4, kv_heads=2, head_dim=8, width=48, draft=40, eps=1e-5, theta=500.0)


def eagle3_tensors(prefix: str, base: torch.nn.Module, seed: int = 0, draft: int = EAGLE_SHAPE["draft"]) -> dict:
    """Random EAGLE-3 drafter tensors in EAGLE's names (``prefix``: ``midlayer.`` or speculators' ``layers.0.``), with
    ``d2t``/``t2d`` for a random draft vocabulary of ``draft`` tokens and the base's embedding."""
    g = torch.Generator().manual_seed(seed)
    s = EAGLE_SHAPE
    ids = torch.sort(torch.randperm(VOCAB, generator=g)[:draft]).values

    def rand(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    tensors = {"fc.weight": rand(HIDDEN, 3 * HIDDEN), "norm.weight": 1 + rand(HIDDEN), "lm_head.weight": rand(
        draft, HIDDEN, scale=1.0), "d2t": ids - torch.arange(draft), "t2d": torch.isin(torch.arange(VOCAB), ids),
        "embed_tokens.weight": base.get_input_embeddings().weight.detach().cpu().clone()}
    layer = {"input_layernorm.weight": 1 + rand(HIDDEN), "hidden_norm.weight": 1 + rand(HIDDEN),
             "self_attn.q_proj.weight": rand(s["heads"] * s["head_dim"], 2 * HIDDEN),
             "self_attn.k_proj.weight": rand(s["kv_heads"] * s["head_dim"], 2 * HIDDEN),
             "self_attn.v_proj.weight": rand(s["kv_heads"] * s["head_dim"], 2 * HIDDEN),
             "self_attn.o_proj.weight": rand(HIDDEN, s["heads"] * s["head_dim"]),
             "post_attention_layernorm.weight": 1 + rand(HIDDEN), "mlp.gate_proj.weight": rand(s["width"], HIDDEN),
             "mlp.up_proj.weight": rand(s["width"], HIDDEN), "mlp.down_proj.weight": rand(HIDDEN, s["width"])}
    return {**tensors, **{prefix + name: t for name, t in layer.items()}}


def write_eagle3(folder, layout: str, tensors: dict, norm_before_residual: bool = False, **config) -> None:
    """A folder in EAGLE's own EAGLE-3 layout (``"eagle"``) or speculators' (``"speculators"``)."""
    s, draft = EAGLE_SHAPE, tensors["lm_head.weight"].shape[0]
    layer = {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": s["width"], "num_hidden_layers": 1,
             "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"], "rms_norm_eps": s["eps"],
             "vocab_size": VOCAB, "hidden_act": "silu", "tie_word_embeddings": False}
    if layout == "eagle":
        raw = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "rope_theta": s["theta"],
               "draft_vocab_size": draft}
    else:
        raw = {"speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"], "draft_vocab_size": draft,
               "norm_before_residual": norm_before_residual, "eagle_aux_hidden_state_layer_ids": None,
               "transformer_layer_config": {**layer, "head_dim": s["head_dim"],
                                            "rope_parameters": {"rope_type": "default", "rope_theta": s["theta"]}},
               "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                                      "verifier": {"name_or_path": "meta-llama/not-loaded-here"}}}
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({**raw, **config}, handle)


def eagle3_reference(t: dict, prefix: str, base: torch.nn.Module, sequence: torch.Tensor,
                     norm_before_residual: bool = False) -> torch.Tensor:
    """EAGLE-3's first drafting step after every position but the last, as EAGLE's ``cnets.py`` computes it (Li et
    al., 2025), written out: the states entering layers 2, L // 2 and L - 3 fused by ``fc``; the token that followed
    embedded; both RMS-normed and concatenated; rotary (base ``rope_theta``) grouped-query causal attention; the residual
    onto the fused state (speculators' ``norm_before_residual``: the normed one); a SwiGLU MLP; the final norm and the
    drafter's own ``lm_head`` over its draft vocabulary (row ``i`` is token ``i + d2t[i]``)."""
    s, n, dim = EAGLE_SHAPE, sequence.shape[0] - 1, EAGLE_SHAPE["head_dim"]
    layer = {name[len(prefix):]: value for name, value in t.items() if name.startswith(prefix)}

    def rms(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s["eps"])

    with torch.no_grad():
        states = base(sequence[None], output_hidden_states=True).hidden_states
    count = len(states) - 1
    fused = torch.cat([states[i][0, :n] for i in (2, count // 2, count - 3)], -1).cpu() @ t["fc.weight"].T
    embedded = t["embed_tokens.weight"][sequence[1:].cpu()]
    x = torch.cat([rms(embedded, layer["input_layernorm.weight"]), rms(fused, layer["hidden_norm.weight"])], -1)
    angles = torch.arange(n)[:, None] / s["theta"] ** (torch.arange(0, dim, 2) / dim)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def heads(name, count):
        out = (x @ layer[f"self_attn.{name}_proj.weight"].T).view(n, count, dim).transpose(0, 1)
        return out.repeat_interleave(s["heads"] // count, dim=0)

    def rotated(y):
        return y * cos + torch.cat([-y[..., dim // 2:], y[..., : dim // 2]], -1) * sin

    q, k, v = rotated(heads("q", s["heads"])), rotated(heads("k", s["kv_heads"])), heads("v", s["kv_heads"])
    scores = (q @ k.transpose(1, 2)) / math.sqrt(dim) + torch.full((n, n), float("-inf")).triu(1)
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1) @ layer["self_attn.o_proj.weight"].T
    h = (rms(fused, layer["hidden_norm.weight"]) if norm_before_residual else fused) + attended
    normed = rms(h, layer["post_attention_layernorm.weight"])
    h = h + (F.silu(normed @ layer["mlp.gate_proj.weight"].T) * (normed @ layer["mlp.up_proj.weight"].T)
             ) @ layer["mlp.down_proj.weight"].T
    return rms(h, t["norm.weight"]) @ t["lm_head.weight"].T


@pytest.mark.parametrize("layout, prefix, norm_before_residual", [
    ("eagle", "midlayer.", False), ("speculators", "layers.0.", True),
])
def test_an_eagle3_drafter_trained_elsewhere_drafts_what_eagle3_computes(tmp_path, caplog, layout, prefix,
                                                                         norm_before_residual):
    base = deep_base()
    tensors = eagle3_tensors(prefix, base)
    write_eagle3(tmp_path / "in", layout, tensors, norm_before_residual)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "in", base_model=base)
    config = loaded.config
    assert (config.head_projection, config.draft_vocab_size, config.draft_vocab_trained) == ("own", 40, True)
    assert (config.feature_layers, config.intermediate_size, config.rms_norm_eps, config.rope_theta) == (
        [2, 4, 5], 48, 1e-5, 500.0)
    assert config.num_heads == (4 if layout == "eagle" else 3)
    assert "as eagle3 heads" in caplog.text and ("pass num_heads=" in caplog.text) == (layout == "eagle")
    sequence = prompt_ids(4, length=12)[0]
    expected = eagle3_reference(tensors, prefix, base, sequence, norm_before_residual)
    ids = torch.arange(40) + tensors["d2t"]
    drafted = draft_logits(loaded, sequence)[:-1, 0]
    torch.testing.assert_close(drafted[:, ids], expected, atol=1e-4, rtol=1e-4)
    prompt = prompt_ids(5, length=8)
    assert torch.equal(loaded.generate(prompt, max_new_tokens=16), base.generate(prompt, max_new_tokens=16,
                                                                                 do_sample=False))
    export_speculators(loaded, tmp_path / "out")  # its own lm_head goes out as it came in, and loads back the same
    assert torch.equal(load_file(tmp_path / "out" / "model.safetensors")["lm_head.weight"], tensors["lm_head.weight"])
    again = CerberusForCausalLM.from_pretrained(tmp_path / "out", base_model=base, num_heads=4)
    assert_same_state(loaded.heads.state_dict(), again.heads.state_dict())


# ------------------------------------------------------------------------------------------------ every path
LAYOUTS = ("speculators", "eagle", "medusa", "vllm-medusa")
LOOP_TREES = {"chain": dict(draft_tree=None, dynamic_tree=None), "dynamic": dict(dynamic_tree=DYNAMIC)}


def write_layout(folder, layout: str, arch: str | torch.nn.Module, draft: int = 40) -> str:
    """A 3-deep drafter of ``layout`` with random weights (EAGLE-3's over ``draft`` tokens) for the tiny ``arch`` (or
    this base) in ``folder``; returns the name of its weight file."""
    base = get_base(arch) if isinstance(arch, str) else arch
    if layout in ("speculators", "eagle"):
        prefix = "layers.0." if layout == "speculators" else "midlayer."
        write_eagle3(folder, layout, eagle3_tensors(prefix, base, draft=draft), layout == "speculators")
    elif layout == "medusa":
        write_medusa(folder, heads=3, layers=1)
        return "medusa_lm_head.safetensors"
    else:
        model = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=3, head_projection="own")
        randomize_heads(model, seed=0)
        export_vllm_medusa(model, folder)
    return "model.safetensors"


def imported(folder, layout: str, arch: str | torch.nn.Module, drafter: str, references: list[torch.Tensor]
             ) -> CerberusForCausalLM:
    """A 3-deep drafter of ``layout`` with random weights, written for the tiny ``arch`` (or this base) and loaded onto
    it;
    ``drafter="oracle"``: its logits then rank the ``references``' next tokens first (second at some depths), so that
    drafts are accepted to different depths (random ones almost never are). EAGLE-3's draft vocabulary is 40 tokens
    for random drafts and the whole vocabulary, permuted, for the oracle's (which drafts any token)."""
    base = get_base(arch) if isinstance(arch, str) else arch
    write_layout(folder, layout, base, draft=VOCAB if drafter == "oracle" else 40)
    model = CerberusForCausalLM.from_pretrained(folder, base_model=base, num_heads=3)
    assert model.config.head_type == ("medusa" if "medusa" in layout else "eagle3")
    if drafter == "oracle":
        install_oracle(model, references, corrupt=lambda p, k: (p * 7 + k) % 5 == 0)
    return model


def accepted(model, drafter: str) -> None:
    """Random drafts were made; the oracle's were accepted (the acceptance and rollback of the path ran)."""
    stats = model.generation_stats
    assert stats.drafted_tokens > 0 and (drafter == "random" or stats.tau > 1.5)


def path_cases(archs, trees) -> list:
    """Every base and tree with the oracle's drafts; with random ones (the draft vocabulary's path, every draft
    rejected) on llama, and on the other bases as a slow test."""
    slow = [pytest.mark.slow]
    return [pytest.param(arch, tree, drafter, marks=slow if drafter == "random" and arch != "llama" else [])
            for arch in archs for tree in trees for drafter in ("oracle", "random")]


def row_references(arch: str, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    base = get_base(arch)
    return [base.generate(row[m.bool()][None], max_new_tokens=BATCH_NEW + 8, do_sample=False)
            for row, m in zip(ids, mask)]


@pytest.mark.parametrize("arch, tree, drafter", path_cases(ARCHITECTURES, LOOP_TREES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_imported_layout_decodes_as_plain_generate_on_every_tiny_base(tmp_path, layout, arch, tree, drafter):
    model = imported(tmp_path, layout, arch, drafter, [reference(arch, NEW_TOKENS + 8)])
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, gate_threshold=None, **LOOP_TREES[tree])
    assert out.tolist() == reference(arch).tolist()
    accepted(model, drafter)


@pytest.fixture(scope="module", params=MTP_ARCHITECTURES)
def mtp_base(request, tmp_path_factory):
    return tiny_mtp_model(request.param, str(tmp_path_factory.mktemp(request.param)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_imported_layout_decodes_as_plain_generate_on_the_tiny_mtp_bases(tmp_path, mtp_base, layout):
    """The tiny DeepSeek-V3 (latent attention) and GLM-4.5 bases that ship MTP layers take the imported drafters too."""
    prompt = prompt_ids(3, length=8)
    expected = mtp_base.generate(prompt, max_new_tokens=NEW_TOKENS + 8, do_sample=False)
    model = imported(tmp_path, layout, mtp_base, "oracle", [expected])
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, gate_threshold=None, dynamic_tree=DYNAMIC)
    assert out.tolist() == expected[:, : prompt.shape[1] + NEW_TOKENS].tolist()
    accepted(model, "oracle")


@pytest.mark.parametrize("arch, tree, drafter", path_cases(BATCH_ARCHS, ["chain", "static", "dynamic"]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_imported_layout_decodes_a_batch_as_each_row_alone(tmp_path, layout, arch, tree, drafter):
    ids, mask = padded_batch()
    model = imported(tmp_path, layout, arch, drafter, row_references(arch, ids, mask))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=BATCH_NEW, **BATCH_TREES[tree])
    assert new_tokens(out, ids.shape[1]) == alone(arch, ids, mask)
    accepted(model, drafter)


@pytest.mark.parametrize("arch, tree, drafter", path_cases(STATIC_ARCHS, LOOP_TREES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_imported_layout_decodes_through_a_static_cache(tmp_path, layout, arch, tree, drafter):
    model = imported(tmp_path, layout, arch, drafter, [reference(arch, NEW_TOKENS + 8)])
    out = generate_static(model, arch, gate_threshold=None, **LOOP_TREES[tree])
    assert out.tolist() == reference(arch).tolist()
    accepted(model, drafter)


@pytest.mark.parametrize("arch, tree, drafter", path_cases(BATCH_ARCHS, DEVICE_TREES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_imported_layout_decodes_through_the_device_step(tmp_path, layout, arch, tree, drafter):
    ids, mask = batch(4)
    model = imported(tmp_path, layout, arch, drafter, row_references(arch, ids, mask))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=BATCH_NEW, device_step=True,
                         draft_tree=DEVICE_TREES[tree])
    assert took_device_step(model)
    assert out.tolist() == plain(arch, ids, mask)
    accepted(model, drafter)


# ------------------------------------------------------------------------------------------------ hostile files
class _Payload:
    """Unpickling this creates a folder: proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("layout, pickle_name", [
    ("medusa", "medusa_lm_head.pt"), ("eagle", "pytorch_model.bin"), ("eagle", "eagle3_drafter.pth"),
    ("speculators", "pytorch_model.bin"), ("vllm-medusa", "model.pt"),
])
def test_a_pickled_weight_file_is_refused_unread_with_how_to_convert_it(tmp_path, base_loads, layout, pickle_name):
    weights = write_layout(tmp_path, layout, "llama")
    tensors = load_file(tmp_path / weights)
    os.remove(tmp_path / weights)
    marker = str(tmp_path / "unpickled")
    torch.save({**tensors, "payload": _Payload(marker)}, tmp_path / pickle_name)
    with pytest.raises(OSError, match=f"pickle weights \\({pickle_name}\\) and no {weights}") as raised:
        CerberusForCausalLM.from_pretrained(tmp_path)
    assert "safetensors.torch.save_file" in str(raised.value) and "\n" not in str(raised.value)
    assert not os.path.exists(marker), "the pickle was loaded"
    assert base_loads == []


# a weight matrix of each layout (speculators' bad tensors are the cases of the test after this one)
MATRICES = {"eagle": "midlayer.mlp.down_proj.weight", "medusa": "1.0.linear.weight", "vllm-medusa": "lm_heads.1.weight"}


@pytest.mark.parametrize("harm", ["shape", "missing"])
@pytest.mark.parametrize("layout", MATRICES)
def test_a_misshapen_or_missing_tensor_in_each_layout_is_refused_in_one_line(tmp_path, base_loads, layout, harm):
    weights, name = write_layout(tmp_path, layout, "llama"), MATRICES[layout]
    tensors = load_file(tmp_path / weights)
    rows, columns = tensors[name].shape
    if harm == "shape":
        tensors[name] = tensors[name][:, 1:].contiguous()
        message = rf"does not match its config: {name} has shape \({rows}, {columns - 1}\), its config implies"
    else:
        del tensors[name]
        message = f"does not match its config: missing {name}"
    save_file(tensors, tmp_path / weights)
    with pytest.raises(ValueError, match=message) as raised:
        CerberusForCausalLM.from_pretrained(tmp_path, num_heads=3)
    assert "\n" not in str(raised.value) and weights in str(raised.value)
    assert base_loads == []


@pytest.mark.parametrize("layout, config", [
    ("speculators", {"eagle_aux_hidden_state_layer_ids": [1, 3, 8]}),
    ("eagle", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 8]}}),
])
def test_a_config_naming_layers_the_base_lacks_is_refused_in_one_line(tmp_path, layout, config):
    write_layout(tmp_path, layout, "llama")
    _edit(tmp_path, config)
    with pytest.raises(ValueError, match=r"feature_layers must lie between 1 and 1 for this base \(2 layers\), got "
                                         r"\[1, 3, 8\]") as raised:
        CerberusForCausalLM.from_pretrained(tmp_path, base_model=get_base("llama"))
    assert "\n" not in str(raised.value)


def _speculators_export(folder) -> None:
    model = fresh_model("llama", "eagle3", num_heads=2)
    model.set_draft_vocab(torch.tensor([4, 8, 15, 16, 23, 42]))
    export_speculators(model, folder, verifier="meta-llama/not-loaded-here")


def _edit(folder, config: dict | None = None, drop: tuple = (), **tensors) -> None:
    if config is not None:
        raw = json.loads((folder / "config.json").read_text())
        for key, value in config.items():
            if isinstance(value, dict) and isinstance(raw.get(key), dict):
                raw[key].update(value)
            else:
                raw[key] = value
        (folder / "config.json").write_text(json.dumps(raw))
    if drop or tensors:
        state = {k: v for k, v in load_file(folder / "model.safetensors").items() if k not in drop}
        state.update(tensors)
        save_file(state, folder / "model.safetensors")


@pytest.mark.parametrize("edit, error, message", [
    (dict(**{"fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN)}), ValueError, r"fc\.weight has shape \(32, 64\), its config "
                                                                         r"implies \(32, 96\)"),
    (dict(drop=("layers.0.mlp.up_proj.weight",)), ValueError, r"missing layers\.0\.mlp\.up_proj\.weight"),
    (dict(**{"layers.0.extra.weight": torch.zeros(2)}), ValueError, r"unexpected layers\.0\.extra\.weight"),
    (dict(**{"norm.weight": torch.full((HIDDEN,), float("nan"))}), ValueError, r"norm\.weight holds NaN"),
    (dict(d2t=torch.tensor([4, 8, 15, 16, 23, 99]) - torch.arange(6)), ValueError, r"d2t maps draft tokens to ids "
                                                                                 r"outside \[0, 96\)"),
    (dict(d2t=torch.tensor([4, 8, 15, 16, 23, 23]) - torch.arange(6)), ValueError, "an id another one has"),
    (dict(t2d=torch.zeros(VOCAB, dtype=torch.bool)), ValueError, "t2d marks other token ids"),
    (dict(d2t=torch.zeros(6)), ValueError, r"d2t is float32, its config implies int values"),
    (dict(config={"transformer_layer_config": {"num_hidden_layers": 2}}), ValueError, "2 decoder layers"),
    (dict(config={"transformer_layer_config": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}}),
     ValueError, "rotary scaling 'llama3'"),
    (dict(config={"fc_norm": True}), ValueError, r"fc_norm: true, which cerberus-hf's EAGLE-3 cannot run"),
    (dict(config={"norm_before_fc": True}), ValueError, r"norm_before_fc: true, which cerberus-hf's EAGLE-3 cannot"),
    (dict(config={"norm_output": True}), ValueError, r"norm_output: true, which cerberus-hf's EAGLE-3 cannot run"),
    (dict(config={"transformer_layer_config": {"model_type": "qwen3"}}), ValueError,
     "transformer_layer_config must describe a llama decoder layer, got 'qwen3'"),
    (dict(**{"layers.0.self_attn.q_proj.bias": torch.zeros(HIDDEN)}), ValueError,
     r"unexpected layers\.0\.self_attn\.q_proj\.bias"),
    (dict(**{"fc.weight": torch.zeros(HIDDEN, 3 * HIDDEN, dtype=torch.long)}), ValueError,
     "fc.weight is int64, its config implies float values"),
    (dict(config={"target_hidden_size": 64}), ValueError, "target_hidden_size 64"),
    (dict(config={"speculators_model_type": "independent"}), ValueError, "speculators 'independent' drafters"),
    (dict(config={"transformer_layer_config": {"rms_norm_eps": -1.0}}), ValueError, "rms_norm_eps must be > 0"),
    (dict(config={"transformer_layer_config": {"num_key_value_heads": 3}}), ValueError,
     r"config\.json: adapter_heads \(4\) must be a multiple of adapter_kv_heads \(3\)"),
])
def test_a_bad_speculators_folder_is_refused_in_one_line_before_the_base_loads(tmp_path, base_loads, edit, error,
                                                                                message):
    _speculators_export(tmp_path)
    _edit(tmp_path, **edit)
    with pytest.raises(error, match=message) as raised:
        CerberusForCausalLM.from_pretrained(tmp_path)
    assert "\n" not in str(raised.value)
    assert base_loads == []


def test_other_bad_folders_are_refused_in_one_line(tmp_path, base_loads):
    base = deep_base()
    tensors = eagle3_tensors("midlayer.", base)
    write_eagle3(tmp_path / "eagle", "eagle", tensors)
    with pytest.raises(ValueError, match="EAGLE's EAGLE-3 layout names no base model: pass base_model="):
        CerberusForCausalLM.from_pretrained(tmp_path / "eagle")
    write_eagle3(tmp_path / "other", "eagle", {**tensors, "embed_tokens.weight": tensors["embed_tokens.weight"] + 1})
    with pytest.raises(ValueError, match="embed_tokens is not this base's input embedding"):
        CerberusForCausalLM.from_pretrained(tmp_path / "other", base_model=base)
    for name, config, what in (("llama", {"model_type": "llama", "hidden_size": 32}, r"model_type 'llama'"),
                               ("eagle1", {"architectures": ["LlamaForCausalLMEagle"]}, "an EAGLE-1/EAGLE-2 drafter")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=rf"names no drafter layout cerberus-hf loads \({what}"):
            CerberusForCausalLM.from_pretrained(tmp_path / name)
    write_medusa(tmp_path / "medusa", heads=2, layers=1, said=3)
    with pytest.raises(ValueError, match=r"does not match its config: missing 2\.0\.linear\.weight"):
        CerberusForCausalLM.from_pretrained(tmp_path / "medusa")
    write_medusa(tmp_path / "two", heads=2, layers=1)
    with pytest.raises(ValueError, match=r"num_heads=3, but .* holds 2 Medusa heads"):
        CerberusForCausalLM.from_pretrained(tmp_path / "two", num_heads=3)
    model = fresh_model("llama", "medusa", num_heads=2)
    export_vllm_medusa(model, tmp_path / "vllm")
    _edit(tmp_path / "vllm", {"medusa_fc_bias": False})
    with pytest.raises(ValueError, match="holds biases but .* says medusa_fc_bias: false"):
        CerberusForCausalLM.from_pretrained(tmp_path / "vllm")
    assert base_loads == []


@pytest.mark.parametrize("layout, sizes, message", [
    ("medusa", dict(hidden_size=48), r"hidden size 32 \(heads\) vs 48 \(base\)"),
    ("speculators", dict(hidden_size=48), r"hidden size 32 \(heads\) vs 48 \(base\)"),
    ("vllm-medusa", dict(vocab_size=128), r"vocabulary size 96 \(heads\) vs 128 \(base\)"),
])
def test_a_drafter_for_another_base_is_refused_in_one_line(tmp_path, layout, sizes, message):
    write_layout(tmp_path, layout, "llama")
    config = LlamaConfig(**{**dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64), **sizes})
    with pytest.raises(ValueError, match=message) as raised:
        CerberusForCausalLM.from_pretrained(tmp_path, base_model=AutoModelForCausalLM.from_config(config))
    assert "\n" not in str(raised.value)


def test_a_vllm_medusa_logit_scale_is_refused_in_one_line(tmp_path, base_loads):
    write_layout(tmp_path, "vllm-medusa", "llama")
    _edit(tmp_path, {"logit_scale": 2.0})
    with pytest.raises(ValueError, match="logit_scale 2.0 scales the drafts' distributions, which cerberus-hf's"):
        CerberusForCausalLM.from_pretrained(tmp_path)
    assert base_loads == []


def test_eagles_layout_may_name_the_layers_it_reads(tmp_path):
    base = deep_base()
    write_eagle3(tmp_path, "eagle", eagle3_tensors("midlayer.", base),
                 eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "use_aux_hidden_state": True})
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base, num_heads=2)
    assert (loaded.config.feature_layers, loaded.heads.feature_layers, loaded.config.num_heads) == ([1, 3, 6], [1, 3, 6], 2)


def test_an_imported_drafter_saves_and_loads_as_a_cerberus_folder(tmp_path):
    base = deep_base()
    write_eagle3(tmp_path / "in", "speculators", eagle3_tensors("layers.0.", base), norm_before_residual=True)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path / "in", base_model=base)
    loaded.save_pretrained(tmp_path / "saved")
    again = CerberusForCausalLM.from_pretrained(tmp_path / "saved", base_model=base)
    assert again.config.name_or_path == str(tmp_path / "saved")  # where each was loaded from: the rest is the same
    assert {**again.config.to_dict(), "_name_or_path": ""} == {**loaded.config.to_dict(), "_name_or_path": ""}
    assert_same_state(loaded.heads.state_dict(), again.heads.state_dict())
    with pytest.raises(ValueError, match="trained over their own 40-token draft vocabulary"):
        again.set_draft_vocab(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="project through an lm_head of their own"):  # its trainer uses the base's
        train_sequence_drafter(again, str(tmp_path / "no-data.jsonl"), tmp_path / "run")


def test_the_eagle3_layer_settings_are_checked():
    with pytest.raises(ValueError, match="rope_theta must be a number > 0"):
        CerberusConfig(head_type="eagle3", rope_theta=0)
    with pytest.raises(ValueError, match="set draft_vocab_trained"):
        CerberusConfig(head_type="eagle3", head_projection="own", draft_vocab_size=10)
    with pytest.raises(ValueError, match="intermediate_size must be an integer >= 1"):
        CerberusConfig(head_type="eagle3", intermediate_size=0)
