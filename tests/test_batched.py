"""Batched speculative decoding (`decoding.batched`): the rows of a left-padded batch verified in one forward.

Greedy in float32: every row equals the base's greedy output for that prompt alone, and the batch equals plain
batched `generate()` (left padding kept, finished rows padded). Every family that drafts depth by depth, on every tiny
architecture the batched path serves, with untrained, random and oracle drafts (the oracle corrupted at some depths,
so that rows accept different lengths and the cache gets empty slots), with chains, static and dynamic trees, the gate
and prompt lookup. Where the batched path cannot serve (sliding-window layers, Kangaroo, strict verification) the
rows are decoded one at a time, with a one-line warning, and the results are the same.
"""

from __future__ import annotations

import pytest
import torch

from cerberus_hf.decoding import paths
from cerberus_hf.drafters import DRAFTER_CLASSES
from helpers import (
    ANY_BASE_TYPES,
    PAD,
    VARIANTS,
    ForwardCounter,
    family_options,
    fresh_model,
    gate_entropies,
    get_base,
    install_oracle,
    randomize_heads,
)
from test_generate import padded_batch

BATCH_ARCHS = ("llama", "qwen2", "phi3", "gpt2")  # the tiny mistral and gemma2 have sliding-window layers
FAMILIES = [h for h in (*ANY_BASE_TYPES, *VARIANTS)
            if not DRAFTER_CLASSES[family_options(h)["head_type"]].drafts_chains]
TREES = {
    "chain": dict(draft_tree=None, dynamic_tree=None, gate_threshold=None),
    "static": dict(draft_tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], dynamic_tree=None, gate_threshold=None),
    "dynamic": dict(dynamic_tree={"nodes": 6, "depth": 3, "top_k": 3}, gate_threshold=None),
}
NEW = 20


def alone(arch: str, ids: torch.Tensor, mask: torch.Tensor, new: int = NEW) -> list[list[int]]:
    """Each row's greedy continuation decoded by the base alone, without its padding."""
    base = get_base(arch)
    return [base.generate(row[m.bool()][None], max_new_tokens=new, do_sample=False)[0, int(m.sum()):].tolist()
            for row, m in zip(ids, mask)]


def heads(arch: str, family: str, drafter: str, ids: torch.Tensor, mask: torch.Tensor):
    model = fresh_model(arch, family, num_heads=3)
    if drafter == "random":
        randomize_heads(model, seed=7)
    elif drafter == "oracle":
        base = get_base(arch)
        references = [base.generate(row[m.bool()][None], max_new_tokens=NEW + 8, do_sample=False)
                      for row, m in zip(ids, mask)]
        install_oracle(model, references, corrupt=lambda p, k: (p * 7 + k) % 5 == 0)
    return model


def new_tokens(out: torch.Tensor, width: int, pad: int = PAD) -> list[list[int]]:
    """Each row's new tokens, without the padding after a row that ended early."""
    rows = [row[width:].tolist() for row in out]
    return [row[: max((i + 1 for i, t in enumerate(row) if t != pad), default=0)] for row in rows]


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("drafter", ["untrained", "random", "oracle"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("arch", BATCH_ARCHS)
def test_every_row_equals_its_greedy_output_alone(arch, family, drafter, tree):
    ids, mask = padded_batch()
    model = heads(arch, family, drafter, ids, mask)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, **TREES[tree])
    assert new_tokens(out, ids.shape[1]) == alone(arch, ids, mask)
    expected = get_base(arch).generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert out.tolist() == expected.tolist()
    stats = model.generation_stats
    assert stats.new_tokens == sum(len(r) for r in alone(arch, ids, mask))
    # one forward serves every row: fewer than the rows' steps together (the prefill counted once per row)
    assert forwards.count < stats.steps - len(ids) + 1
    if drafter == "oracle":
        assert stats.tau > 1.5


@pytest.mark.parametrize("family", ["hydra", "eagle3", "dflash"])
def test_gate_and_lookup_per_row(family):
    """The gate decides for each row from its own logits, prompt lookup copies from each row's own context."""
    ids, mask = padded_batch(lengths=(9, 4, 6, 2), seed=5)
    ids[0, 5:9] = ids[0, 1:5].clone()  # a repeated stretch for lookup to find in the first row
    model = heads("llama", family, "oracle", ids, mask)
    expected = alone("llama", ids, mask)
    # a threshold between the base's entropies along the rows: some steps draft, some do not
    entropies = torch.cat([gate_entropies("llama", torch.tensor([row[m.bool()].tolist() + new]), int(m.sum()))
                           for row, m, new in zip(ids, mask, expected)])
    threshold = float(entropies.median())
    for options in (dict(gate_threshold=threshold), dict(prompt_lookup_num_tokens=3, gate_threshold=None),
                    dict(prompt_lookup_num_tokens=2, gate_threshold=threshold, draft_tree=[[0], [1], [0, 0]])):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, **options)
        assert new_tokens(out, ids.shape[1]) == expected
        stats = model.generation_stats
        if options["gate_threshold"] is not None:
            assert stats.gate_decisions > stats.draft_steps > 0
        if "prompt_lookup_num_tokens" in options:
            assert stats.context_steps > 0


def test_rows_finishing_early_leave_the_batch():
    """A row that meets its end-of-sequence token is padded, the others go on exactly; num_return_sequences repeats
    rows in the batch."""
    ids, mask = padded_batch(lengths=(8, 5, 3, 6), seed=2)
    references = alone("llama", ids, mask, new=NEW)
    eos = references[1][3]  # ends the second row after four tokens (sooner if it comes earlier)
    model = heads("llama", "hydra", "oracle", ids, mask)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    expected = get_base("llama").generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos,
                                          pad_token_id=0, do_sample=False)
    assert out.tolist() == expected.tolist()
    assert (out[1, ids.shape[1] + 4:] == 0).all() and len(set(out[:, -1].tolist())) > 1  # row 1 ended, others not
    torch.manual_seed(0)
    twice = model.generate(ids[1:3], attention_mask=mask[1:3], max_new_tokens=8, num_return_sequences=2,
                           do_sample=True)
    assert twice.shape == (4, ids.shape[1] + 8)
    assert twice[:, : ids.shape[1]].tolist() == ids[1:3].repeat_interleave(2, dim=0).tolist()


def test_where_the_batch_cannot_be_verified_together_rows_go_one_by_one(caplog):
    ids, mask = padded_batch()
    cases = [("mistral", "hydra", {}), ("llama", "kangaroo", {})]
    for arch, family, options in cases:
        model = fresh_model(arch, family, num_heads=3)
        reason = paths.batch_refusal(model.base, model.heads, model_settings(model))
        assert reason is not None
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, **options)
        assert new_tokens(out, ids.shape[1]) == alone(arch, ids, mask)


def model_settings(model):
    from cerberus_hf.blocks.settings import resolve_settings

    return resolve_settings(model.decoding_settings(), model.config.num_heads)



def test_pipeline_batches_are_verified_together():
    """`pipeline(..., batch_size=3)` pads a batch to the left and calls generate() once: every text is the base's."""
    from transformers import pipeline

    from tiny_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    texts = ["w5 w17 w33 w41 w8 w60", "w9 w12", "w70 w71 w72 w3"]
    model = fresh_model("llama", "hydra", num_heads=3)
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, batch_size=3)
    base_pipe = pipeline("text-generation", model=get_base("llama"), tokenizer=tokenizer, batch_size=3)
    with ForwardCounter(model.base) as forwards:
        got = pipe(texts, max_new_tokens=10, return_full_text=False)
    expected = base_pipe(texts, max_new_tokens=10, return_full_text=False, do_sample=False)
    assert [g[0]["generated_text"] for g in got] == [e[0]["generated_text"] for e in expected]
    assert forwards.count < model.generation_stats.steps  # one call for the three rows, not three


@pytest.mark.parametrize("family", ["medusa", "hydra", "clover"])
@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_each_depth_is_drafted_for_every_row_in_one_call(family, tree):
    """The rows' guesses at one depth come from one call of the drafter, not one call per row."""
    ids, mask = padded_batch(lengths=(8, 5, 3, 6), seed=4)
    model = heads("llama", family, "random", ids, mask)
    calls = []
    real = type(model.heads).draft_level

    def counted(self, k, hidden, tokens, previous, context=None):
        calls.append(hidden.shape[0])
        return real(self, k, hidden, tokens, previous, context)

    model.heads.draft_level = counted.__get__(model.heads)
    with ForwardCounter(model.base) as forwards:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, **TREES[tree])
    assert new_tokens(out, ids.shape[1]) == alone("llama", ids, mask)
    depth = 3
    assert len(calls) <= depth * forwards.count  # at most one call per depth and step, whatever the rows
    assert max(calls) >= len(ids)  # a call drafted for several rows


@pytest.mark.parametrize("tree", ["chain", "static"])
def test_a_batched_step_reads_the_device_once(tree):
    """Greedy decoding of a batch reads every row's accepted branch in one read a step (on a GPU each read is a
    synchronisation): at most about one read per base forward, plus a few per call, whatever the rows."""
    from cerberus_hf.blocks.profiling import HostReads

    ids, mask = padded_batch(lengths=(8, 5, 3, 6), seed=4)
    model = fresh_model("llama", "hydra", randomize=True, seed=5, num_heads=3)
    with HostReads() as reads, ForwardCounter(model.base) as forwards:
        model.generate(ids, attention_mask=mask, max_new_tokens=NEW, **TREES[tree])
    walk = sum(n for line, n in reads.by_line.items() if "walk_rows" in line)
    assert walk == forwards.count  # one read a forward for all rows' acceptance (the prefill's included)
    assert reads.total <= forwards.count + 30, sorted(reads.by_line.items(), key=lambda x: -x[1])[:5]


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5])
def test_short_limits_end_every_row_where_the_base_does(max_new_tokens):
    """Limits that end the batch at the prefill, or inside what one step's drafts would cover."""
    ids, mask = padded_batch()
    model = heads("llama", "hydra", "oracle", ids, mask)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, **TREES["static"])
    expected = get_base("llama").generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("drafter", ["untrained", "oracle"])
@pytest.mark.parametrize("arch", BATCH_ARCHS)
def test_row_processors_in_a_batch(arch, drafter, tree):
    """generate()'s row-wise processors (`loop.ROW_PROCESSORS`) in a batch: each row's fed positions are processed
    with that row's sequence and paths, on the device, and the batch equals plain batched `generate()`'s."""
    ids, mask = padded_batch()
    options = dict(repetition_penalty=1.3, suppress_tokens=[5])
    model = heads(arch, "hydra", drafter, ids, mask)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, **TREES[tree], **options)
    expected = get_base(arch).generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **options)
    assert expected.tolist() != get_base(arch).generate(ids, attention_mask=mask, max_new_tokens=NEW,
                                                        do_sample=False).tolist()
    assert out.tolist() == expected.tolist()
