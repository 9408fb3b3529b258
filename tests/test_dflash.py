"""The DFlash family (`cerberus_hf.drafters.dflash`) against transformers' own DFlash decoding, in process: a drafter
saved by transformers' DFlash model class (or in z-lab's layout) loads, drafts what ``DFlashTokenCandidateGenerator``
drafts position by position, and greedy output stays plain `generate()`'s. Bad folders are refused in one line.
(The family-parametrised tests cover it on every path with untrained, random and oracle drafts.)"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
from transformers.generation import candidate_generator

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.drafters.dflash import default_feature_layers
from cerberus_hf.errors import UserError
from helpers import check_rows_against_states, fresh_model, get_base, get_prompt, reference
from tiny_models import ARCHITECTURES, DEVICE, VOCAB

NEW = 20


def deep_base(layers: int = 6) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(DEVICE).eval()


def transformers_drafter(base: torch.nn.Module, target_layer_ids: list[int], layers: int = 2, block_size: int = 4,
                         seed: int = 0) -> MuseGlimmerAssistantModel:
    """transformers' DFlash drafter for ``base``, with random weights large enough that its guesses vary."""
    text = base.config.get_text_config()
    config = MuseGlimmerAssistantConfig(
        hidden_size=text.hidden_size, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, block_size=block_size, mask_token_id=7, target_layer_ids=target_layer_ids,
        layer_types=["full_attention"] * layers, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    drafter = MuseGlimmerAssistantModel(config)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.normal_(0.0, 0.3 if parameter.dim() > 1 else 1.0)
    return drafter.to(DEVICE).eval()


def transformers_drafts(base, drafter, prompt: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, list]]]:
    """(transformers' greedy DFlash output, each step's (sequence so far, its candidate tokens))."""
    steps = []
    original = candidate_generator.DFlashTokenCandidateGenerator.get_candidates

    def recorded(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if logits is not None:
            steps.append((input_ids.clone(), candidates[0, input_ids.shape[1]:].tolist()))
        return candidates, logits

    candidate_generator.DFlashTokenCandidateGenerator.get_candidates = recorded
    try:
        out = base.generate(prompt, assistant_model=drafter, speculation_type="dflash", do_sample=False,
                            max_new_tokens=NEW)
    finally:
        candidate_generator.DFlashTokenCandidateGenerator.get_candidates = original
    return out, steps


def state_drafts(model: CerberusForCausalLM, sequence: torch.Tensor) -> list[int]:
    """The chain `DFlashState` drafts after ``sequence`` (its newest token included), from a prefill of the rest."""
    heads = model.heads
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(sequence[:, :-1])
    state = heads.start(model.base, None)
    state.observe(captured, None)
    state.heads_input(sequence, captured["hidden"][:, -1])
    previous, chain = None, []
    with torch.no_grad():
        for k in range(heads.num_heads):
            previous, logits = heads.draft_level(k, None, sequence[:, -1:].expand(1, k + 1), previous, state.context())
            chain.append(int(logits[0].argmax()))
    return chain


def forced_drafts(model: CerberusForCausalLM, sequence: torch.Tensor) -> torch.Tensor:
    """``[n, depths]``: the chain drafted after each position of ``sequence`` (`teacher_forced`, what calibration
    and training read)."""
    heads = model.heads
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(sequence)
        return heads.teacher_forced(captured, sequence, 0)[1].argmax(-1)


# ------------------------------------------------------------------------------------------------ the reference
@pytest.mark.parametrize("arch", [*ARCHITECTURES, "deep"])
def test_the_drafts_are_transformers_dflash_drafts_position_by_position(tmp_path, caplog, arch):
    base = deep_base() if arch == "deep" else get_base(arch)
    layers = [0, 3] if arch == "deep" else [0]  # the deep base: two of its layers, the drafter's two layers
    drafter = transformers_drafter(base, layers)
    drafter.save_pretrained(tmp_path)
    model = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert "transformers' DFlash layout" in caplog.text and model.heads.feature_layers == [i + 1 for i in layers]
    prompt = get_prompt("llama" if arch == "deep" else arch)
    theirs, steps = transformers_drafts(base, drafter, prompt)
    assert len(steps) >= 8
    forced = forced_drafts(model, theirs)
    for sequence, candidates in steps:
        assert state_drafts(model, sequence) == candidates
        assert forced[sequence.shape[1] - 2].tolist() == candidates
    plain = base.generate(prompt, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(theirs, plain)
    for options in ({}, {"draft_tree": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}, {"dynamic_tree": {"nodes": 6, "depth": 3,
                                                                                                   "top_k": 2}}):
        assert torch.equal(model.generate(prompt, max_new_tokens=NEW, do_sample=False, **options), plain), options


def test_the_loop_drafts_what_transformers_drafts_step_after_step(tmp_path):
    """The decoding loop's own state, kept across steps, drafts each step's chain as transformers' generator does."""
    base = get_base("llama")
    drafter = transformers_drafter(base, [0], seed=3)
    drafter.save_pretrained(tmp_path)
    model = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    prompt = get_prompt("llama")
    _, steps = transformers_drafts(base, drafter, prompt)
    ours: list[list[int]] = []
    real = type(model.heads).draft_level

    def recorded(self, k, *args, **kwargs):
        state, logits = real(self, k, *args, **kwargs)
        if k == 0:
            ours.append([])
        ours[-1].append(int(logits[0].argmax()))
        return state, logits

    type(model.heads).draft_level = recorded
    try:
        out = model.generate(prompt, max_new_tokens=NEW, do_sample=False, gate_threshold=None)
    finally:
        type(model.heads).draft_level = real
    assert torch.equal(out, base.generate(prompt, max_new_tokens=NEW, do_sample=False))
    compared = min(len(ours), len(steps)) - 2  # (the last steps draft less where the room ends)
    assert compared >= 8
    assert ours[:compared] == [candidates for _, candidates in steps[:compared]]


def test_z_labs_layout_loads_as_the_same_drafter(tmp_path, caplog):
    base = get_base("qwen2")
    drafter = transformers_drafter(base, [0], layers=1, block_size=5)
    drafter.save_pretrained(tmp_path / "transformers")
    write_z_lab(tmp_path / "z-lab", tmp_path / "transformers")
    ours = CerberusForCausalLM.from_pretrained(tmp_path / "transformers", base_model=base)
    theirs = CerberusForCausalLM.from_pretrained(tmp_path / "z-lab", base_model=base)
    assert "z-lab's DFlash layout" in caplog.text and theirs.config.num_heads == 4
    mine, other = ours.heads.state_dict(), theirs.heads.state_dict()
    assert sorted(mine) == sorted(other) and all(torch.equal(mine[name], other[name]) for name in mine)
    sequence = reference("qwen2")
    assert torch.equal(forced_drafts(ours, sequence), forced_drafts(theirs, sequence))


def write_z_lab(folder, transformers_folder) -> None:
    """The drafter in ``transformers_folder`` as z-lab's code saves it: a Qwen3 config with ``dflash_config``, the
    encoder's tensors as ``fc`` and ``hidden_norm``."""
    os.makedirs(folder)
    raw = json.loads((transformers_folder / "config.json").read_text())
    config = {key: raw[key] for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                        "num_key_value_heads", "head_dim", "rms_norm_eps", "block_size")}
    config.update(architectures=["DFlashDraftModel"], model_type="qwen3", rope_theta=10000.0, attention_bias=False,
                  num_target_layers=2, dflash_config={"target_layer_ids": raw["target_layer_ids"],
                                                      "mask_token_id": raw["mask_token_id"]})
    (folder / "config.json").write_text(json.dumps(config))
    renamed = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}
    tensors = load_file(transformers_folder / "model.safetensors")
    save_file({renamed.get(name, name): t for name, t in tensors.items()}, folder / "model.safetensors")


# ------------------------------------------------------------------------------------------------ hostile folders
def _drop(folder) -> None:
    tensors = load_file(folder / "model.safetensors")
    del tensors["layers.0.self_attn.k_norm.weight"]
    save_file(tensors, folder / "model.safetensors")


def _reshape(folder) -> None:
    tensors = load_file(folder / "model.safetensors")
    tensors["encoder.fc.weight"] = torch.zeros(32, 64)
    save_file(tensors, folder / "model.safetensors")


def _pickle(folder) -> None:
    tensors = load_file(folder / "model.safetensors")
    os.remove(folder / "model.safetensors")
    torch.save(tensors, folder / "pytorch_model.bin")


def _config(**changes):
    def change(folder) -> None:
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**raw, **changes}))
    return change


@pytest.mark.parametrize("spoil, message", [
    (_drop, "missing layers.0.self_attn.k_norm.weight"),
    (_reshape, r"encoder.fc.weight has shape \(32, 64\), its config implies \(32, 32\)"),
    (_pickle, r"pickle weights \(pytorch_model.bin\) and no model.safetensors"),
    (_config(target_layer_ids=[1]), "feature_layers must lie between 1 and 1"),
    (_config(target_layer_ids="0"), "target_layer_ids must be a list"),
    (_config(block_size=1), "block_size must be at least 2"),
    (_config(mask_token_id=500), r"mask_token_id in \[0, 96\)"),
    (_config(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}), "rotary scaling 'yarn'"),
])
def test_a_bad_dflash_folder_is_refused_in_one_line(tmp_path, spoil, message):
    base = get_base("llama")
    transformers_drafter(base, [0]).save_pretrained(tmp_path)
    spoil(tmp_path)
    with pytest.raises((UserError, OSError), match=message) as raised:
        CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert "\n" not in str(raised.value)


# ------------------------------------------------------------------------------------------------ the family
def test_training_unrolls_the_block_drafting_computes_after_every_position():
    """`DFlashDrafter.unrolled_outputs` over a right-padded batch of two sequences: depth ``j`` at row ``t`` is the
    block the drafter computes after position ``t`` of that sequence alone (`teacher_forced`, which equals
    transformers' drafts above), so training fits what decoding drafts."""
    model = fresh_model("llama", "dflash", randomize=True, seed=3, num_heads=4)
    heads = model.heads
    long = reference("llama")[0]
    short = long[5:]  # other positions, fewer of them: right-padded in the batch
    features = torch.zeros(2, long.shape[0], heads.fc.in_features, device=DEVICE)
    tokens = torch.zeros(2, long.shape[0] + heads.num_heads + 1, dtype=torch.long, device=DEVICE)
    forced = []
    for b, sequence in enumerate((long, short)):
        with torch.no_grad(), heads.capture(model.base) as captured:
            model.base(sequence[None])
            forced.append(heads.teacher_forced(captured, sequence[None], 0)[1])
        features[b, : sequence.shape[0]] = captured["features"][0]
        tokens[b, : sequence.shape[0]] = sequence
    with torch.no_grad():
        unrolled = heads.unrolled_outputs(features, tokens, heads.num_heads)
        for b, sequence in enumerate((long, short)):
            for j in range(heads.num_heads):
                logits = heads.project(unrolled[j][b, : sequence.shape[0] - 1], j)
                torch.testing.assert_close(logits, forced[b][: sequence.shape[0] - 1, j], atol=1e-4, rtol=1e-4)


def test_default_layers_are_z_labs():
    assert default_feature_layers(36, 5) == [2, 10, 18, 26, 34]  # z-lab's [1, 9, 17, 25, 33] for Qwen3-8B
    assert default_feature_layers(2, 1) == [1]
    model = CerberusForCausalLM.from_base(deep_base(8), head_type="dflash", num_heads=3)
    assert model.config.feature_layers == [5] and model.config.mask_token_id == VOCAB - 1


def test_the_device_rows_keep_what_the_sequence_state_keeps():
    """`DFlashRows` against `DFlashState` row by row: two rows, one left-padded, extended by different counts."""
    def compare(drafter, rows, states, sequences):
        newest = torch.cat([sequence[:, -1] for sequence in sequences])
        ours, _ = drafter.draft_level(0, None, newest[:, None], None, rows.context())
        for b in range(2):
            states[b].heads_input(sequences[b], None)
            theirs, _ = drafter.draft_level(0, None, sequences[b][:, -1:], None, states[b].context())
            torch.testing.assert_close(ours[b], theirs[0], atol=1e-5, rtol=1e-5)

    check_rows_against_states("dflash", compare)


# ------------------------------------------------------------------------------------------------ against transformers
def test_transformers_own_drafter_is_the_one_loaded(tmp_path):
    """`importing.transformers_dflash` gives transformers' drafter back with the same tensors as the one imported."""
    from cerberus_hf.importing import transformers_dflash

    base = deep_base()
    drafter = transformers_drafter(base, [0, 3])
    drafter.save_pretrained(tmp_path)
    back = transformers_dflash(CerberusForCausalLM.from_pretrained(tmp_path, base_model=base))
    assert back.config.target_layer_ids == [0, 3] and back.config.block_size == 4 and back.config.mask_token_id == 7
    mine, theirs = back.state_dict(), drafter.state_dict()
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[name], theirs[name]) for name in mine)


def test_the_bench_runs_transformers_dflash_beside_the_drafter():
    """A DFlash checkpoint's rows in `cerberus-hf bench` include transformers' own DFlash decoding with the same
    drafter (one row at a time: left out for batches); every row's output is plain generate()'s."""
    from cerberus_hf.testing import randomize_heads
    from cerberus_hf.tools.bench import run_bench

    base = get_base("llama")
    model = fresh_model("llama", "dflash", num_heads=3)
    randomize_heads(model, seed=1, std=0.3)
    result = run_bench(base, {"dflash tiny": model}, [get_prompt("llama")], max_new_tokens=12, warmup=0, variants=[],
                       prompt_lookup=False, packed_peer=False)
    assert [row["method"] for row in result["methods"]] == [
        "plain generate()", "dflash tiny", "dflash tiny, transformers' DFlash decoding"]
    assert all(row["identical"] == 1.0 for row in result["methods"])
    result = run_bench(base, {"dflash tiny": model}, [get_prompt("llama")], max_new_tokens=4, warmup=0, variants=[],
                       prompt_lookup=False, packed_peer=False, own_drafters=False)
    assert [row["method"] for row in result["methods"]] == ["plain generate()", "dflash tiny"]
