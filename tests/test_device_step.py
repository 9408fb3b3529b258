"""The device step (`decoding.device_step`): draft, verify, accept and commit as one function of device buffers.

Greedy in float32 every row equals plain `generate()`'s output, for every family with a static tree on every tiny
architecture the batched path serves (and a base's own MTP layers on the tiny bases that ship them), at batch 1 and 4,
with untrained, random and oracle drafts (the oracle corrupted at some depths, so that rows accept different lengths). The step compiles with ``fullgraph=True`` (no
graph break) and gives the eager step's tokens compiled; it reads nothing back to the host; prompts of other lengths
reuse its graph. Where a call cannot take it, it says so in one line and decodes with the loop.
"""

from __future__ import annotations

import logging

import pytest
import torch

from transformers import GenerationConfig

from cerberus_hf.blocks.profiling import HostReads
from cerberus_hf.blocks.tree import TreeSpec
from cerberus_hf.decoding.device_step import DeviceStep
from cerberus_hf.decoding.paths import device_step_refusal
from cerberus_hf.testing import MTP_ARCHITECTURES
from helpers import PAD, check_rows_against_states, fresh_model, get_base
from test_batched import heads, model_settings, new_tokens
from test_generate import padded_batch

BATCH_ARCHS = ("llama", "qwen2", "phi3", "gpt2")  # the tiny mistral and gemma2 have sliding-window layers
FAMILIES = ("medusa", "cerberus", "hydra", "clover", "hydra+prefix", "eagle3", "dflash")  # every family with a fixed tree
# each family on each architecture, and the base's own MTP layers (head_type="mtp") on the bases that ship them
ARCH_FAMILIES = [(arch, family) for arch in BATCH_ARCHS for family in FAMILIES] + [
    (arch, "mtp") for arch in MTP_ARCHITECTURES]
LLAMA_FAMILIES = [("llama", family) for family in FAMILIES] + [(arch, "mtp") for arch in MTP_ARCHITECTURES]
TREES = {"chain": None, "static": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}
NEW = 20


def batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` left-padded prompts of different lengths (1: the first alone)."""
    ids, mask = padded_batch()
    if rows == 1:
        keep = mask[0].bool()
        return ids[:1, keep], mask[:1, keep]
    index = torch.arange(rows) % ids.shape[0]
    return ids[index], mask[index]


def plain(arch: str, ids: torch.Tensor, mask: torch.Tensor, new: int = NEW) -> list:
    return get_base(arch).generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False).tolist()


def took_device_step(model) -> bool:
    return bool(model.__dict__.get("_cerberus_device_steps"))


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("drafter", ["untrained", "random", "oracle"])
@pytest.mark.parametrize("arch,family", ARCH_FAMILIES)
@pytest.mark.parametrize("tree", [pytest.param("chain", marks=pytest.mark.slow), "static"])
def test_greedy_output_equals_plain_generate(tree, arch, family, drafter, rows):
    ids, mask = batch(rows)
    model = heads(arch, family, drafter, ids, mask)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, device_step=True, draft_tree=TREES[tree])
    assert took_device_step(model)
    assert out.tolist() == plain(arch, ids, mask)
    stats = model.generation_stats
    assert stats.new_tokens == sum(len(row) for row in new_tokens(out, ids.shape[1]))
    if drafter == "oracle":
        assert stats.tau > 1.5  # the drafts were accepted: the step's acceptance and commit ran


def test_end_of_sequence_and_length_stop_each_row_where_plain_generate_does():
    ids, mask = batch(4)
    base = get_base("llama")
    eos = plain("llama", ids, mask)[1][ids.shape[1] + 5]  # a token row 1 emits mid-way: an end of sequence there
    model = heads("llama", "hydra", "oracle", ids, mask)
    for new in (1, 2, 7):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=eos, pad_token_id=PAD,
                             device_step=True, draft_tree=TREES["static"])
        expected = base.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=eos, pad_token_id=PAD,
                                 do_sample=False)
        assert out.tolist() == expected.tolist()


def new_step(arch: str, family: str, drafter: str, rows: int, compile_mode: str | None = None, backend=None):
    ids, mask = batch(rows)
    model = heads(arch, family, drafter, ids, mask)
    step = DeviceStep(get_base(arch), model.heads, TreeSpec.from_paths(TREES["static"]), rows, 128)
    if backend is not None:
        torch._dynamo.reset()  # each test's step is a new object: without a reset they add up to dynamo's limit
        step.step = torch.compile(step._step, fullgraph=True, backend=backend)
    return step, ids, mask


def decoded(step: DeviceStep, ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    with torch.no_grad():
        new, _ = step.decode(ids, mask, NEW, torch.tensor([2]))
    return new


@pytest.mark.parametrize("arch,family", [pair if pair in LLAMA_FAMILIES else pytest.param(*pair, marks=pytest.mark.slow)
                                         for pair in ARCH_FAMILIES])
def test_the_step_compiles_whole_and_gives_the_eager_tokens(arch, family):
    """``fullgraph=True`` raises on any graph break; aot_eager traces and functionalizes the step as inductor does."""
    eager, ids, mask = new_step(arch, family, "random", 4)
    compiled, _, _ = new_step(arch, family, "random", 4, backend="aot_eager")
    assert decoded(compiled, ids, mask) == decoded(eager, ids, mask)


@pytest.mark.parametrize("arch,family", [pair if pair == ("llama", "hydra") else pytest.param(*pair, marks=pytest.mark.slow)
                                         for pair in LLAMA_FAMILIES])
def test_the_step_compiled_by_inductor_gives_the_eager_tokens(arch, family):
    eager, ids, mask = new_step(arch, family, "random", 4)
    compiled, _, _ = new_step(arch, family, "random", 4, backend="inductor")
    assert decoded(compiled, ids, mask) == decoded(eager, ids, mask)


@pytest.mark.parametrize("arch,family", LLAMA_FAMILIES)
def test_a_step_reads_nothing_back_to_the_host(arch, family):
    step, ids, mask = new_step(arch, family, "random", 4)
    with torch.no_grad():
        step.start(ids, mask, NEW, torch.tensor([2]))
        with HostReads() as reads:
            for _ in range(3):
                step.step()
    assert reads.total == 0, reads.by_line


def test_prompts_of_other_lengths_reuse_the_compiled_step():
    step, ids, mask = new_step("llama", "hydra", "random", 1, backend="aot_eager")
    ids, mask = ids[:, -8:], mask[:, -8:]
    decoded(step, ids, mask)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for length in (3, 5, 11):
            decoded(step, ids[:, :length], mask[:, :length])


def test_a_call_the_step_cannot_serve_says_why_and_decodes_with_the_loop(caplog):
    ids, mask = batch(1)
    model = heads("llama", "hydra", "random", ids, mask)
    with caplog.at_level(logging.WARNING):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, device_step=True,
                             dynamic_tree={"nodes": 4, "depth": 2, "top_k": 2})
    assert "device_step=True is not used here (the tree is grown each step)" in caplog.text
    assert not took_device_step(model)
    assert out.tolist() == plain("llama", ids, mask)


def test_off_cuda_the_loop_stays_the_default():
    ids, mask = batch(1)
    model = heads("llama", "hydra", "random", ids, mask)
    model.generate(ids, attention_mask=mask, max_new_tokens=4)
    assert not took_device_step(model) or model.device.type == "cuda"


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_sliding_window_bases_are_refused(arch):
    model = fresh_model(arch, "hydra")
    settings = model_settings(model)
    assert device_step_refusal(model.base, model.heads, settings, GenerationConfig()) == (
        "the base has sliding-window layers")


def recorded_drafts(model, ids: torch.Tensor, mask: torch.Tensor, **call) -> list[torch.Tensor]:
    """The drafter's logits at every depth it drafted, in order, over one greedy call (gate and prompt lookup off)."""
    calls = []
    real = type(model.heads)

    class Recorder(real):
        def draft_level(self, k, hidden, tokens, previous, context=None):
            state, logits = real.draft_level(self, k, hidden, tokens, previous, context)
            calls.append(logits.detach().float().clone())
            return state, logits

    model.heads.__class__ = Recorder
    try:
        model.generate(ids, attention_mask=mask, max_new_tokens=NEW, gate_threshold=None, prompt_lookup_num_tokens=0,
                       packed_weights=False, draft_tree=TREES["static"], **call)
    finally:
        model.heads.__class__ = real
    return calls


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("arch,family", LLAMA_FAMILIES)
def test_the_step_drafts_what_the_loop_drafts(arch, family, rows):
    """The same drafts as the loop's, depth by depth, over the steps both take before the loop cuts its tree near the
    end: the step's states, windows and caches follow acceptance as the loop's do; in a batch, each row (prompts of
    different lengths, left-padded) drafts what the loop drafts for its prompt alone."""
    ids, mask = batch(rows)
    model = heads(arch, family, "random", ids, mask)
    step = recorded_drafts(model, ids, mask, device_step=True)
    for b in range(rows):
        keep = mask[b].bool()
        loop = recorded_drafts(model, ids[b: b + 1, keep], mask[b: b + 1, keep], device_step=False)
        compared = len(loop) // 2
        assert compared >= 6
        for ours, theirs in zip(step[:compared], loop[:compared]):
            per = ours.shape[0] // rows  # the step's nodes come row by row
            ours = ours[b * per: (b + 1) * per]
            assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-4)


def test_eagle3_rows_keep_what_the_sequence_state_keeps():
    """`Eagle3Rows` against `Eagle3State` row by row: two rows, one left-padded, extended by different counts."""
    def compare(drafter, rows, states, sequences):
        for b in range(2):
            states[b].heads_input(sequences[b], None)
            torch.testing.assert_close(rows.read(None)[b], states[b].newest[0], atol=1e-5, rtol=1e-5)
            previous, _ = drafter.draft_level(0, rows.read(None)[b: b + 1], sequences[b][:, -1:], None)
            ours, _ = drafter.draft_level(1, rows.read(None), sequences[b][:, -1:].repeat(2, 2), previous.repeat(2, 1, 1),
                                          rows.context())
            theirs, _ = drafter.draft_level(1, states[b].newest, sequences[b][:, -1:].repeat(1, 2), previous,
                                            states[b].context())
            torch.testing.assert_close(ours[b], theirs[0], atol=1e-5, rtol=1e-5)

    check_rows_against_states("eagle3", compare)


def test_threads_share_the_step_and_each_gets_its_own_answer():
    """Calls from several threads on one model take turns on the step's buffers."""
    from concurrent.futures import ThreadPoolExecutor

    ids, mask = batch(4)
    model = heads("llama", "hydra", "random", ids, mask)
    rows = [(ids[i: i + 1, mask[i].bool()], torch.ones(1, int(mask[i].sum()), dtype=torch.long)) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda row: model.generate(row[0], attention_mask=row[1], max_new_tokens=NEW,
                                                        device_step=True, draft_tree=TREES["static"]), rows * 2))
    assert [out.tolist() for out in outs] == [plain("llama", *row) for row in rows * 2]
