"""``generate(cache_implementation="static")``: verification through a pre-allocated cache, rolled back in place, its
forward compiled per bucket of step sizes where transformers compiles plain decoding (`decoding.static_cache`).

Greedy output must stay the base's token for token whatever the drafts; where a base or a drafter cannot use a static
cache the call says so in one line and decodes with the dynamic one. Compilation is checked on the CPU with dynamo's
eager backend (the graphs and guards of a real compile, without code generation), and once with inductor (slow).
"""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig, StaticCache

from cerberus_hf.compat import output_cache
from cerberus_hf.decoding import paths, static_cache
from cerberus_hf.decoding.static_cache import BUCKETS, ROOM_MULTIPLE, bucket
from helpers import (ANY_BASE_TYPES, NEW_TOKENS, VARIANTS, check_stats, fresh_model, get_base, get_prompt,
                     install_oracle, reference)
from test_exactness import CORRUPTIONS, TREE, longer_reference
from test_sampling import CHECKS, assert_follows_the_base, base  # noqa: F401  (base: a fixture)

STATIC = dict(cache_implementation="static")
# the tiny architectures a static cache serves (mistral and gemma2 have sliding-window layers)
STATIC_ARCHS = ["llama", "qwen2", "phi3", "gpt2"]
FAMILIES = [h for h in (*ANY_BASE_TYPES, *VARIANTS) if h != "kangaroo"]


def generate_static(model, arch: str, **kwargs):
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, **STATIC,
                         **kwargs)
    assert isinstance(output_cache(out), StaticCache)
    return out.sequences


class StepSizes:
    """The number of positions each forward of ``module`` is fed (its ``input_ids``' length)."""

    def __init__(self, module: torch.nn.Module):
        self.sizes: list[int] = []
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.sizes.append(kwargs["input_ids"].shape[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.mark.parametrize("heads", ["untrained", "random"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("arch", STATIC_ARCHS)
def test_greedy_output_equals_base(arch, family, heads):
    model = fresh_model(arch, family, randomize=heads == "random", num_heads=3)
    assert generate_static(model, arch).tolist() == reference(arch).tolist()
    check_stats(model, NEW_TOKENS)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("arch", STATIC_ARCHS)
def test_rolled_back_in_place_after_partly_accepted_chains(arch, corruption):
    """Right drafts up to some depth: the accepted prefix stays in the static cache, the rest is overwritten later."""
    model = fresh_model(arch, "cerberus", num_heads=4)
    oracle = install_oracle(model, [longer_reference(arch)], corrupt=CORRUPTIONS[corruption])
    assert generate_static(model, arch).tolist() == reference(arch).tolist()
    assert oracle["misses"] == 0
    check_stats(model, NEW_TOKENS)
    if corruption != "first_draft_always":
        assert model.generation_stats.tau > 1.5


@pytest.mark.parametrize("swap_first", [False, True])
@pytest.mark.parametrize("arch", STATIC_ARCHS)
def test_accepted_tree_branches_are_moved_in_place(arch, swap_first):
    """With the right token ranked second, only the tree's rank-1 branch is accepted: its slots move to the front."""
    model = fresh_model(arch, "cerberus", num_heads=3, draft_tree=TREE)
    corrupt = (lambda p, k: k == 0) if swap_first else None
    install_oracle(model, [longer_reference(arch)], corrupt=corrupt)
    assert generate_static(model, arch).tolist() == reference(arch).tolist()
    assert model.generation_stats.tau > 1.5


@pytest.mark.parametrize("options", [
    dict(dynamic_tree={"nodes": 6, "depth": 3, "top_k": 3}),
    dict(gate_threshold=1.5),
    dict(prompt_lookup_num_tokens=3),
], ids=["dynamic", "gate", "lookup"])
@pytest.mark.parametrize("family", ["hydra", "eagle3", "dflash"])
def test_trees_gate_and_lookup(family, options):
    model = fresh_model("llama", family, randomize=True, num_heads=3)
    assert generate_static(model, "llama", **options).tolist() == reference("llama").tolist()


@pytest.mark.parametrize("compiled", [False, True])
def test_compiled_forwards_are_fed_a_bucket_and_the_cache_is_sized_for_reuse(compiled):
    arch = "llama"
    model = fresh_model(arch, "cerberus", num_heads=4)
    install_oracle(model, [longer_reference(arch)], corrupt=CORRUPTIONS["third_draft_always"])
    prompt = get_prompt(arch)
    options = dict(compile_config=eager_compile()) if compiled else dict(disable_compile=True)  # (CUDA compiles)
    with StepSizes(model.base) as fed:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, **STATIC, **options)
    assert out.sequences.tolist() == reference(arch).tolist()
    assert fed.sizes[0] == prompt.shape[1]  # the prefill, as generate() runs it
    if compiled:
        assert set(fed.sizes[1:]) <= set(BUCKETS) and 8 in fed.sizes  # 1 + 4 drafts, padded to 8
    else:  # uncompiled, padding would only cost
        assert 5 in fed.sizes[1:] and 8 not in fed.sizes[1:]
    room = output_cache(out).get_max_length()
    assert room % ROOM_MULTIPLE == 0 and room >= prompt.shape[1] + NEW_TOKENS + BUCKETS[-1]
    assert [bucket(n) for n in (1, 3, 5, 16, 17, 64, 70)] == [1, 4, 8, 16, 32, 64, 70]


def test_on_an_accelerator_steps_are_padded_up_to_the_widest_bucket_so_one_graph_serves_the_call(monkeypatch):
    """Near max_length a chain of 4 is cut short (here to 3 drafts: 1 + 3 positions); on an accelerator that step is fed
    at the bucket the call already compiled (8), not at a bucket of its own (4), and the output stays the base's."""
    from cerberus_hf.decoding.static_cache import StaticVerification

    arch = "llama"
    model = fresh_model(arch, "cerberus", num_heads=4)
    install_oracle(model, [longer_reference(arch)])
    prompt = get_prompt(arch)
    options = dict(compile_config=eager_compile())
    expected = reference(arch).tolist()  # before the hooks: a first reference() runs the base's own generate()
    monkeypatch.setattr(StaticVerification, "pads_up", staticmethod(lambda device: False))  # as on a CPU
    with StepSizes(model.base) as fed:
        assert model.generate(prompt, max_new_tokens=NEW_TOKENS, **STATIC, **options).tolist() == expected
    assert {bucket(n) for n in fed.sizes[1:]} == {4, 8}  # the cut step at its own bucket
    monkeypatch.setattr(StaticVerification, "pads_up", staticmethod(lambda device: True))  # as on an accelerator
    with StepSizes(model.base) as fed:
        assert model.generate(prompt, max_new_tokens=NEW_TOKENS, **STATIC, **options).tolist() == expected
    assert set(fed.sizes[1:]) == {8}


def test_a_tree_wider_than_the_buckets_runs_at_its_own_size_and_is_cut_to_the_room_left():
    """A 90-node tree is fed unpadded (no bucket holds it); near the end of the cache it is cut to fit."""
    arch = "llama"
    plain = get_base(arch)
    prompt = torch.randint(3, plain.config.vocab_size, (1, ROOM_MULTIPLE - BUCKETS[-1] - NEW_TOKENS - 8),
                           generator=torch.Generator().manual_seed(3))
    expected = plain.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    wide = [[i] for i in range(10)] + [[i, j] for i in range(10) for j in range(8)]
    model = fresh_model(arch, "cerberus", num_heads=2, draft_tree=wide)
    install_oracle(model, [plain.generate(prompt, max_new_tokens=NEW_TOKENS + 8, do_sample=False)])
    with StepSizes(model.base) as fed:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, **STATIC)
    assert out.tolist() == expected.tolist()
    assert model.generation_stats.tau > 1.5
    # cut where the cache's room ran short (a cut to the length limit would leave at most 1 + 10 positions)
    assert fed.sizes[1] == 91 and any(11 < size < 91 for size in fed.sizes[1:])


@pytest.mark.parametrize("case, reason", [
    ("sliding_window", "sliding-window layers"), ("kangaroo", "kangaroo drafts through the base's own cache"),
    ("batch", "a batch decodes with the dynamic cache"), ("strict", "strict verification"),
])
def test_what_cannot_use_a_static_cache_says_so_and_stays_exact(case, reason, monkeypatch):
    arch = "mistral" if case == "sliding_window" else "llama"
    model = fresh_model(arch, "kangaroo" if case == "kangaroo" else "hydra", randomize=True, num_heads=3)
    prompt = get_prompt(arch)
    kwargs = dict(STATIC, strict=True) if case == "strict" else dict(STATIC)
    if case == "batch":
        prompt = torch.cat([prompt, prompt.flip(-1)])
    said = []
    monkeypatch.setattr(static_cache.logger, "warning_once", said.append)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, **kwargs)
    assert len(said) == 1 and reason in said[0] and "\n" not in said[0]
    assert not isinstance(output_cache(out), StaticCache)
    plain = get_base(arch)
    for row, ids in zip(out.sequences, prompt):
        assert row.tolist() == plain.generate(ids[None], max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()


def test_other_cache_implementations_are_refused_in_one_line():
    model = fresh_model("llama", "hydra")
    with pytest.raises(ValueError, match="cache_implementation='offloaded' is not supported") as error:
        model.generate(get_prompt("llama"), max_new_tokens=4, cache_implementation="offloaded")
    assert "\n" not in str(error.value)


def eager_compile() -> CompileConfig:
    """Dynamo's graphs and guards without code generation, on the CPU (transformers compiles only on accelerators
    unless told)."""
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True
    return config


@pytest.mark.parametrize("family", ["hydra", "eagle3", "clover+prenorm"])
def test_compiled_forward_is_exact_and_not_recompiled(family):
    """The compiled verification forward gives the same tokens; after one call has compiled every bucket it met, a
    second call compiles nothing (the forward is compiled on the base, not on the call's view of it)."""
    torch._dynamo.reset()
    arch = "llama"
    model = fresh_model(arch, family, num_heads=4)
    install_oracle(model, [longer_reference(arch)], corrupt=CORRUPTIONS["odd_positions_second_draft"])
    stats = torch._dynamo.utils.counters["stats"]
    graphs = []
    for call in range(2):
        out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, compile_config=eager_compile(), **STATIC)
        assert out.tolist() == reference(arch).tolist()
        assert model.generation_stats.tau > 1.5
        graphs.append(stats["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[0]  # the second call (new hooks, a new view) compiled nothing


def test_fullgraph_is_turned_off_in_one_line(monkeypatch):
    said = []
    monkeypatch.setattr(static_cache.logger, "warning_once", said.append)
    torch._dynamo.reset()
    model = fresh_model("llama", "hydra", randomize=True, num_heads=3)
    config = eager_compile()
    config.fullgraph = True
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, compile_config=config, **STATIC)
    assert out.tolist() == reference("llama").tolist()
    assert len(said) == 1 and "fullgraph" in said[0] and config.fullgraph  # the caller's config stays as it was


def test_a_compiled_call_keeps_the_largest_room_so_later_calls_reuse_its_graphs():
    torch._dynamo.reset()
    model = fresh_model("llama", "hydra", randomize=True, num_heads=3)
    rooms = []
    for new_tokens in (ROOM_MULTIPLE, NEW_TOKENS):
        out = model.generate(get_prompt("llama"), max_new_tokens=new_tokens, compile_config=eager_compile(),
                             return_dict_in_generate=True, **STATIC)
        rooms.append(output_cache(out).get_max_length())
    assert rooms == [2 * ROOM_MULTIPLE, 2 * ROOM_MULTIPLE]
    assert out.sequences.tolist() == reference("llama").tolist()


@pytest.mark.parametrize("layer, reason", [
    # before 5.24 a static layer has no ``crop`` (checked on 5.18.0)
    (type("OldStaticLayer", (), {}), "5.24 or later"),
    # a layer type the roll-back does not know (a sliding window, an indexer, linear attention)
    (type("OnlyKnownLayer", (), {"is_croppable": True}), "other than plain attention"),
], ids=["not_croppable", "other_layers"])
def test_a_static_cache_it_cannot_roll_back_in_place_falls_back(layer, reason, monkeypatch):
    """The call says so in one line and uses the dynamic cache."""
    monkeypatch.setattr(static_cache, "StaticLayer", layer)
    monkeypatch.setattr(paths, "StaticLayer", layer)  # where a call's path is chosen (`decoding.paths`)
    said = []
    monkeypatch.setattr(static_cache.logger, "warning_once", said.append)
    model = fresh_model("llama", "hydra", randomize=True, num_heads=3)
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, **STATIC)
    assert out.sequences.tolist() == reference("llama").tolist()
    assert not isinstance(output_cache(out), StaticCache)
    assert len(said) == 1 and reason in said[0]


@pytest.mark.slow  # inductor generates and builds C++ for every graph: about a minute on two cores
def test_inductor_compiled_forward_is_exact():
    torch._dynamo.reset()
    arch = "llama"
    model = fresh_model(arch, "hydra", randomize=True, num_heads=3)
    config = CompileConfig(mode=None)
    config._compile_all_devices = True
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, compile_config=config, **STATIC)
    assert out.tolist() == reference(arch).tolist()


# `make test` runs EAGLE-3 (a drafter with a cache of its own); Hydra's case is marked slow (`make test-slow`)
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("head_type", [pytest.param("hydra", marks=pytest.mark.slow), "eagle3"])
def test_sampling_follows_the_base(base, head_type, check):  # noqa: F811  (the fixture)
    from cerberus_hf import CerberusForCausalLM

    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=1)
    assert_follows_the_base(model, base, check, draft_tree=[[0], [1], [2], [3]], dynamic_tree=None, **STATIC)
