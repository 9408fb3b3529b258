"""Host reads of device values per decoding step: each one is a synchronisation on a GPU, where a step that waits
on the host several times costs about as much as the forward itself (docs/cuda.md).

`blocks.profiling.HostReads` counts them on any device through a torch function mode (value reads such as
``item``, ``tolist`` and ``bool``, outputs whose shape depends on values such as ``nonzero``, and copies of host
values that wait for the device's queue: a tensor built from Python values on a named device, ``new_tensor``, indexing
with a Python list). Greedy decoding of a static tree or a chain reads once a step (the accepted branch,
`loop._greedy_walk`), of a dynamic tree twice (its shape, `drafting.dynamic_selection`, and the accepted branch), plus
about 16 per call, 7 of them generate()'s own preparation; the bounds below are today's counts for every kind of step,
so that no change adds reads unnoticed.

The host copies were first counted after an H200 run (2026-11-27) found 19 synchronisations a step where this counter
saw 1.4: indexing by Python lists and tensors built from host values on the device, 17 of the 19. They now go through
`transfer.to_device` (pinned memory, a copy that does not wait) or stay on the device.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor

from cerberus_hf.blocks.profiling import HostReads
from cerberus_hf.blocks.transfer import positions_index, to_device
from helpers import ANY_BASE_TYPES, NEW_TOKENS, fresh_model, get_base, get_prompt, reference

STATIC_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
CHAIN = dict(draft_tree=None, dynamic_tree=None, gate_threshold=None)
# Reads per step (random heads: every draft rejected, one token a step; tiny llama, 24 new tokens, 3 heads), and why
# a kind of step reads more than once.
CASES = {
    # one read a step: the accepted branch; about 16 more per call (generate()'s preparation, the prefill)
    "chain": (CHAIN, 1.7),
    "static": (dict(CHAIN, draft_tree=STATIC_TREE), 1.7),
    # the same tree verified through a static cache (`decoding.static_cache`): its padding and mask add no read
    "static+static_cache": (dict(CHAIN, draft_tree=STATIC_TREE, cache_implementation="static"), 1.5),
    # a gate on the base's logits decides for every position in the walk's read (`EntropyGate.draft_rows`)
    "chain+gate": (dict(CHAIN, gate_threshold=10.0), 1.7),
    # a dynamic tree is searched on the device and its shape read once (`drafting.dynamic_selection`)
    "dynamic": (dict(CHAIN, dynamic_tree={"nodes": 6, "depth": 3, "top_k": 3}), 2.6),
    "budgeted": (dict(CHAIN, dynamic_tree={"nodes": 6, "depth": 3, "top_k": 3, "top_p": 0.9, "min_ratio": 0.2}), 2.6),
    # prompt lookup matches the context's n-grams on the host
    "chain+lookup": (dict(CHAIN, prompt_lookup_num_tokens=3), 5.7),
    # sampling walks the tree token by token (each token drawn, then matched against the drafted children): two reads
    # per emitted token
    "chain+sampling": (dict(CHAIN, do_sample=True), 5.0),
}
# Kangaroo drafts its chain token by token and ends it on the host when a token's probability falls below its exit
# confidence.
KANGAROO_BOUND = 7.1


def reads_per_step(model, **kwargs) -> tuple[float, HostReads]:
    prompt = get_prompt("llama")
    torch.manual_seed(0)
    with HostReads() as reads:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, **kwargs)
    if not kwargs.get("do_sample"):
        assert out.tolist() == reference("llama").tolist()
    assert model.generation_stats.drafted_tokens > 0
    return reads.total / model.generation_stats.steps, reads


def test_the_counter_sees_every_kind_of_read():
    x = torch.arange(6)
    with HostReads() as reads:
        x[2].item(), x.tolist(), bool(x[1] > 0), int(x[3]), float(x[4]), x.nonzero(), x[x > 2], torch.unique(x)
        x + 1, x.sum(), x[1:3]  # no read
        x[[1, 2]], x.new_tensor([1]), torch.tensor([1], device=x.device)  # host values copied to the device
        x[[0]] = 5
        to_device([1, 2], x.device), x[positions_index([0, 1], x.device)], torch.full((2,), 3, device=x.device)  # none
    assert reads.by_kind == {"item": 1, "tolist": 1, "bool": 1, "int": 1, "float": 1, "nonzero": 1,
                             "bool_index": 1, "unique": 1, "list_index": 2, "host_copy": 2}
    # each read is charged to the line that asked (torch.unique asks through torch's own Python wrapper)
    assert sum(n for line, n in reads.by_line.items() if "test_host_syncs.py" in line) >= 11


def test_plain_generate_reads_about_once_a_token():
    base, prompt = get_base("llama"), get_prompt("llama")
    with HostReads(where=False) as reads:
        base.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    # once a token (the stopping criteria), plus 11 in generate()'s preparation (on an H200: 55 syncs for 48 tokens)
    assert reads.total <= NEW_TOKENS + 11


@pytest.mark.parametrize("head_type", [h for h in ANY_BASE_TYPES if h != "kangaroo"])
@pytest.mark.parametrize("case", CASES)
def test_reads_per_step_stay_within_todays_bound(head_type, case):
    options, bound = CASES[case]
    per_step, reads = reads_per_step(fresh_model("llama", head_type, randomize=True, seed=5, num_heads=3), **options)
    assert per_step <= bound, (per_step, reads.by_kind, sorted(reads.by_line.items(), key=lambda x: -x[1])[:5])


def test_greedy_chain_and_static_tree_read_once_a_step_from_the_loop():
    """Per step, the loop itself reads the accepted branch once and nothing else (the rest is per call)."""
    model = fresh_model("llama", "hydra", randomize=True, seed=5, num_heads=3)
    for options in (CASES["chain"][0], CASES["static"][0]):
        _, reads = reads_per_step(model, **options)
        per_line = {line: n for line, n in reads.by_line.items() if n >= model.generation_stats.steps - 2}
        assert len(per_line) == 1 and "_greedy_walk" in next(iter(per_line)), reads.by_line


@pytest.mark.parametrize("signal, bound", [("base_entropy", 1.6), ("base_top1", 1.6), ("head_entropy", 2.5)])
def test_a_gate_on_the_base_reads_nothing_more_and_one_on_the_heads_once(signal, bound):
    """A gate on the base's logits decides for every position within the walk's read (`EntropyGate.draft_rows`); one
    on the first head's entropy decides after the heads ran, with a read of its own."""
    model = fresh_model("llama", "hydra", randomize=True, seed=5, num_heads=3, gate_signal=signal)
    per_step, reads = reads_per_step(model, **dict(CHAIN, gate_threshold=10.0))
    assert per_step <= bound, (per_step, reads.by_kind)


# generate()'s own row-wise logits processors (`loop.ROW_PROCESSORS`): applied to every fed position on the device
PROCESSORS = dict(repetition_penalty=1.3, min_new_tokens=NEW_TOKENS - 4, bad_words_ids=[[7]], suppress_tokens=[9])


@pytest.mark.parametrize("case", ["chain", "static", "dynamic"])
def test_generates_own_logits_processors_keep_one_read_a_step(case):
    """With repetition penalty, a minimum length, bad words and suppressed tokens a greedy step still reads once (twice
    for a dynamic tree); a processor of the user's own is called token by token, reading each token."""
    options, bound = CASES[case]
    model = fresh_model("llama", "hydra", randomize=True, seed=5, num_heads=3)
    prompt = get_prompt("llama")
    expected = get_base("llama").generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **PROCESSORS)
    assert expected.tolist() != reference("llama").tolist()
    with HostReads() as reads:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **options, **PROCESSORS)
    assert out.tolist() == expected.tolist()
    # the processors' own preparation reads a few times a call (bad words' bias, built on the first call)
    assert (reads.total - 4) / model.generation_stats.steps <= bound, (reads.by_kind, reads.by_line)
    banned = LogitsProcessorList([SuppressTokensLogitsSubclass([9])])
    with HostReads() as reads:
        model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, logits_processor=banned, **options)
    assert reads.total / model.generation_stats.steps > bound + 0.5


class SuppressTokensLogitsSubclass(SuppressTokensLogitsProcessor):
    """A processor of the user's (a subclass of a row-wise one): the loop cannot know it is row-wise."""


def test_kangaroo_reads_per_step_stay_within_todays_bound():
    per_step, reads = reads_per_step(fresh_model("llama", "kangaroo", randomize=True, seed=5, num_heads=3), **CHAIN)
    assert per_step <= KANGAROO_BOUND, (per_step, reads.by_kind)
