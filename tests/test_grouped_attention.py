"""Grouped-query attention on the CPU without copying the cache (`blocks.grouped_attention`): the same bits as
transformers' sdpa for a tree's mask and a causal block after the cache, on every tiny architecture, with no
`repeat_kv` copy, and in every CPU decoding view but strict verification's."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_attention
from transformers import DynamicCache

from cerberus_hf.blocks.grouped_attention import GROUPED_ATTENTION, _kernel_groups_heads, grouped_attention_view
from cerberus_hf.blocks.tree import TreeSpec
from cerberus_hf.compat import attn_implementation, cache_argument

from helpers import NEW_TOKENS, fresh_model, get_prompt, reference
from tiny_models import ARCHITECTURES, DEVICE, VOCAB, tiny_model

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="the grouped view applies on the CPU only")

# a tree fed after the cache: the root, two children of it, a child of the first child, a child of that
TREE = TreeSpec.from_paths([[0], [1], [0, 0], [0, 0, 0]])
NODES = len(TREE) + 1  # the root and the tree's nodes


def forward_after_prompt(model, tokens: torch.Tensor, past: int, **kwargs) -> tuple[torch.Tensor, DynamicCache]:
    """Logits of ``tokens`` fed after a ``past``-token prompt in one cached forward, and the cache after it."""
    prompt = torch.randint(0, VOCAB, (1, past), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt, **cache_argument(cache), use_cache=True)
        logits = model(input_ids=tokens, **cache_argument(cache), use_cache=True, **kwargs).logits
    return logits, cache


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("block", ["tree", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_view_computes_the_same_bits(arch, block, dtype):
    base = tiny_model(arch).to(dtype)
    view = grouped_attention_view(base)
    if attn_implementation(base.config) != "sdpa":
        assert view is base  # eager attention (the tiny gemma2) is left as it is
        return
    tokens = torch.randint(0, VOCAB, (1, NODES), generator=torch.Generator().manual_seed(2))
    kwargs, past = {}, 40  # a causal block past the sliding window (16) of the tiny mistral and gemma2
    if block == "tree":  # a tree within the window, as a 4D mask covers the whole cache
        past = 10
        kwargs = dict(attention_mask=TREE.attention_mask(past, base.dtype, base.device),
                      position_ids=(past + TREE.position_offsets)[None])
    expected, expected_cache = forward_after_prompt(base, tokens, past, **kwargs)
    logits, cache = forward_after_prompt(view, tokens, past, **kwargs)
    assert torch.equal(logits, expected)
    for layer, expected_layer in zip(cache.layers, expected_cache.layers):
        assert torch.equal(layer.keys, expected_layer.keys) and torch.equal(layer.values, expected_layer.values)


@pytest.mark.skipif(not _kernel_groups_heads(torch.float32, 8, torch.bool),
                    reason="this torch groups heads under a mask only in its math kernel (torch 2.6 does)")
def test_the_grouped_view_copies_no_keys(monkeypatch):
    """Through the base, a masked block over grouped heads repeats the keys and values; through the view it does not."""
    calls = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv",
                        lambda hidden, groups: calls.append(groups) or real(hidden, groups))
    base = tiny_model("llama")
    tokens = torch.randint(0, VOCAB, (1, NODES), generator=torch.Generator().manual_seed(2))
    mask = dict(attention_mask=TREE.attention_mask(40, base.dtype, base.device))
    forward_after_prompt(base, tokens, 40, **mask)
    assert calls, "transformers' sdpa no longer repeats key/value heads under a mask: the grouped view may be moot"
    calls.clear()
    forward_after_prompt(grouped_attention_view(base), tokens, 40, **mask)
    assert calls == []


@pytest.mark.parametrize("strict", [False, True])
def test_cpu_decoding_views_attend_grouped_but_strict_ones(strict):
    model = fresh_model("llama", "eagle3", randomize=True, num_heads=3)
    view = model.decoding_view(strict=strict)
    assert attn_implementation(model.base.config) == "sdpa"
    assert (attn_implementation(view.base.config) == GROUPED_ATTENTION) != strict
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, strict=strict)
    assert torch.equal(out, reference("llama"))
