"""EAGLE-3's own parts: which states it fuses, its KV cache over verified positions, and training-time test.

Greedy exactness, sampling and strict mode run for it in the family matrices (test_drafters, test_sampling,
test_strict); here is what those cannot see: that training's unrolled steps compute exactly what drafting computes
on the true path (or training fits the wrong thing), and that the cache follows acceptance."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.decoding.drafting import StepDrafts
from cerberus_hf.drafters.eagle3 import capture_features, default_feature_layers
from helpers import fresh_model, get_base, randomize_heads, reference
from tiny_models import DEVICE


def deep_base(layers: int = 6) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(DEVICE).eval()


def test_default_layers_are_eagle3s_low_middle_and_high():
    assert default_feature_layers(30) == [2, 15, 27]
    assert default_feature_layers(32) == [2, 16, 29]
    assert default_feature_layers(2) == [1, 1, 1]
    model = CerberusForCausalLM.from_base(deep_base(8), head_type="eagle3")
    assert model.config.feature_layers == [2, 4, 5]
    assert (model.config.adapter_heads, model.config.adapter_kv_heads, model.config.adapter_head_dim) == (4, 2, 8)
    assert CerberusForCausalLM.from_base(deep_base(8), head_type="eagle3", feature_layers=[1, 7]).heads.fc.in_features == 64


def test_features_are_the_states_entering_the_chosen_layers():
    base = deep_base(6)
    ids = torch.tensor([[1, 5, 7, 9, 11]], device=DEVICE)
    with torch.no_grad(), capture_features(base, [1, 3, 5]) as captured:
        states = base(ids, output_hidden_states=True).hidden_states
    expected = torch.cat([states[1], states[3], states[5]], dim=-1)
    torch.testing.assert_close(captured["features"], expected)


def test_unrolled_training_steps_are_what_drafting_computes_on_the_true_path():
    """Step ``j``'s row ``t`` of `unrolled_outputs` is depth ``j``'s state when drafting after position ``t`` with every
    earlier guess right, the cache built by the decoding state from the same sequence."""
    model = fresh_model("llama", "eagle3", randomize=True, seed=3, num_heads=4)
    heads = model.heads
    sequence = reference("llama")[0]
    length = sequence.shape[0] - 5
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(sequence[None, :length])
        features = captured["features"]
        unrolled = heads.unrolled_outputs(features, sequence[None], steps=4)
    for t in (3, 9, length - 1):
        state = heads.start(model.base, None)
        state.observe({"features": features[:, : t + 1]}, None)
        with torch.no_grad():
            read = state.heads_input(sequence[None, : t + 2], None)
            step = StepDrafts(heads, read, int(sequence[t + 1]), state.context())
            node = step.root
            for depth in range(4):
                states, logits = step.expand(depth, [node])
                torch.testing.assert_close(heads.readout(depth, states)[0], unrolled[depth][0, t], atol=1e-5, rtol=1e-5)
                node = type(node)((*node.tokens, int(sequence[t + depth + 2])), states[0])


def test_the_cache_grows_by_kept_positions_as_if_read_at_once():
    """Extending the cache step by step with the kept positions of each forward equals reading the whole sequence."""
    model = fresh_model("qwen2", "eagle3", randomize=True, seed=5)
    heads = model.heads
    sequence = reference("qwen2")[0]
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(sequence[None])
        features = captured["features"]
    whole = heads.start(model.base, None)
    stepped = heads.start(model.base, None)
    stepped.observe({"features": features[:, :6]}, None)
    with torch.no_grad():
        stepped.heads_input(sequence[None, :7], None)
        # a forward over 4 positions of which the 1st and 3rd were kept, then over 2 of which both were
        extra = torch.stack([features[0, 6], features[0, 0], features[0, 7], features[0, 1]])[None]
        stepped.observe({"features": extra}, [0, 2])
        stepped.observe({"features": features[:, 8:10]}, [0, 1])
        last = stepped.heads_input(sequence[None, :11], None)
        whole.observe({"features": features[:, :10]}, None)
        whole_read = whole.heads_input(sequence[None, :11], None)
    torch.testing.assert_close(last, whole_read, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip(stepped.context(), whole.context()):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_a_node_reads_its_own_path_only():
    """Siblings in one batched depth do not see each other: a node's state is the same drafted alone."""
    model = fresh_model("llama", "eagle3", randomize=True, seed=7, num_heads=3)
    heads = model.heads
    sequence = reference("llama")[0]
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(sequence[None, :10])
    state = heads.start(model.base, None)
    state.observe(captured, None)
    with torch.no_grad():
        read = state.heads_input(sequence[None, :11], None)
        step = StepDrafts(heads, read, int(sequence[10]), state.context())
        level0, _ = step.expand(0, [step.root])
        nodes = [type(step.root)((token,), level0[0]) for token in (5, 9, 13)]
        together, _ = step.expand(1, nodes)
        deeper = [type(step.root)((*nodes[i].tokens, 20 + i), together[i]) for i in range(3)]
        both, logits = step.expand(2, deeper)
        alone, alone_logits = step.expand(2, deeper[1:2])
    torch.testing.assert_close(both[1], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1], alone_logits[0], atol=1e-5, rtol=1e-5)


def test_saved_heads_load_with_their_layers_and_draft_the_same(tmp_path):
    base = get_base("llama")
    model = CerberusForCausalLM.from_base(base, head_type="eagle3", num_heads=3)
    randomize_heads(model, seed=11, std=0.2)
    model.save_pretrained(tmp_path)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.config.feature_layers == model.config.feature_layers
    assert (tmp_path / "custom_generate" / "requirements.txt").read_text() == "cerberus-hf>=0.3.0\n"  # the first to run it
    for (name, mine), theirs in zip(model.heads.state_dict().items(), loaded.heads.state_dict().values()):
        assert torch.equal(mine, theirs), name
    prompt = reference("llama")[:, :8]
    assert torch.equal(loaded.generate(prompt, max_new_tokens=12), model.generate(prompt, max_new_tokens=12))


def test_feature_layers_outside_the_base_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"feature_layers must lie between 1 and 1 for this base \(2 layers\)"):
        fresh_model("llama", "eagle3", num_heads=2, feature_layers=[1, 2])
    with pytest.raises(ValueError, match="must lie between 1 and 1"):
        with capture_features(get_base("llama"), [1, 2]):
            pass
