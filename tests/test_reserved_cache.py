"""A dynamic cache that grows in place (`blocks.reserved_cache`): the same keys, values and logits as transformers'
`DynamicLayer` through every way the loop changes a cache, no copy of the cache a step, and the CPU loop's cache."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import DynamicCache

from cerberus_hf.blocks.reserved_cache import MIN_ROOM, ReservedLayer, reserve_room
from cerberus_hf.compat import cache_argument
from cerberus_hf.decoding.verification import keep_cache_positions

from helpers import NEW_TOKENS, fresh_model, get_prompt, reference
from tiny_models import ARCHITECTURES, DEVICE, VOCAB, tiny_model


def caches(config) -> tuple[DynamicCache, DynamicCache]:
    """(a plain dynamic cache, one whose plain layers are reserved) for ``config``."""
    reserved = DynamicCache(config=config)
    reserve_room(reserved)
    return DynamicCache(config=config), reserved


def assert_same(plain: DynamicCache, reserved: DynamicCache) -> None:
    for expected, layer in zip(plain.layers, reserved.layers):
        assert torch.equal(layer.keys, expected.keys) and torch.equal(layer.values, expected.values)


def test_updates_crops_and_kept_positions_hold_what_a_dynamic_layer_holds():
    """Random steps as the loop takes them (feed 1-9 positions, keep some of them in place, cut the rest), the buffer
    moved only when the room runs out, and a deep copy independent of the original."""
    plain, reserved = caches(tiny_model("llama").config)
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    moves = 0
    for step in range(120):
        fed = 40 if step == 0 else rng.randint(1, 9)
        before = reserved.layers[0].key_buffer
        for layer_index in range(len(plain.layers)):
            keys, values = (torch.randn(1, 2, fed, 8, generator=generator) for _ in range(2))
            plain.layers[layer_index].update(keys, values)
            reserved.layers[layer_index].update(keys, values)
        moves += reserved.layers[0].key_buffer is not before
        kept = sorted(rng.sample(range(fed), rng.randint(1, fed)))
        assert keep_cache_positions(plain, fed, [kept]) == keep_cache_positions(reserved, fed, [kept])
        assert_same(plain, reserved)
    length = reserved.get_seq_length()
    assert length > MIN_ROOM and moves <= 2  # the first step's buffer, and at most one move past MIN_ROOM
    twin = copy.deepcopy(reserved)
    twin.layers[0].update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    assert reserved.get_seq_length() == length and torch.equal(reserved.layers[0].keys, plain.layers[0].keys)


def test_a_layer_given_tensors_of_its_own_moves_to_new_buffers():
    plain, reserved = caches(tiny_model("llama").config)
    for cache in (plain, reserved):
        cache.layers[0].update(torch.ones(2, 2, 5, 8), torch.ones(2, 2, 5, 8))
        cache.layers[0].batch_select_indices(torch.tensor([1]))
        cache.layers[0].update(torch.full((1, 2, 2, 8), 2.0), torch.full((1, 2, 2, 8), 2.0))
    assert torch.equal(reserved.layers[0].keys, plain.layers[0].keys) and reserved.layers[0].keys.shape[0] == 1


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_forwards_through_a_reserved_cache_give_the_same_bits(arch):
    """Prefill, then steps of 1-6 positions, each cut back by half: logits bit-identical (the keys are strided over the
    room; sliding-window layers stay dynamic)."""
    base = tiny_model(arch)
    plain, reserved = caches(base.config)
    generator = torch.Generator().manual_seed(3)
    past = 0
    with torch.no_grad():
        for fed in (30, 1, 4, 6, 1, 2, 5):
            tokens = torch.randint(0, VOCAB, (1, fed), generator=generator).to(DEVICE)
            positions = torch.arange(past, past + fed, device=DEVICE)[None]
            outputs = [base(input_ids=tokens, position_ids=positions, **cache_argument(cache), use_cache=True).logits
                       for cache in (plain, reserved)]
            assert torch.equal(outputs[0], outputs[1])
            cut = fed // 2 if past else 0  # the loop never cuts the prefill back
            for cache in (plain, reserved):
                getattr(cache, "activate_past_recording", lambda: None)()  # as the loop does: windows roll back
                cache.crop(-cut)
            past += fed - cut


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the loop reserves room on the CPU only")
def test_the_cpu_loop_decodes_through_a_reserved_cache():
    model = fresh_model("llama", "eagle3", randomize=True, num_heads=3)
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference("llama"))
    assert all(isinstance(layer, ReservedLayer) for layer in out.past_key_values.layers)
