"""generate() from many threads on one model: every output is the base's own greedy output, no call raises, the
base and its generation config are left as they were, and each call's statistics are its own.

Several threads share one `CerberusForCausalLM` (and its base), each decoding prompts of its own with lengths of
its own, while other threads run the plain base on the same module. Every configuration that changes how the base
is run during a call is covered: capturing states (every family), Kangaroo's first-layers drafting and its
verification from the exit layer, the neural lattice rescorer (which runs the base's first layers too), strict
verification (another attention function) and the model's own generation config (the base's generate() reads
it), with static, dynamic and rescored trees, the gate and prompt lookup.
"""

from __future__ import annotations

import copy
import random
import threading

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.modeling_cerberus import CerberusGenerateOutput
from helpers import fresh_model, get_base, install_oracle, tiny_ngram
from tiny_models import prompt_ids

THREADS = 6
ROUNDS = 3
PROMPTS = [prompt_ids(seed, length=6 + seed % 4) for seed in range(5)]
LENGTHS = (9, 16, 23)
STATIC_TREE = [[0], [1], [0, 0], [1, 0], [0, 0, 0]]
DYNAMIC = {"nodes": 6, "depth": 3, "top_k": 2}
RESCORED = {"nodes": 6, "depth": 3, "top_k": 2, "candidates": 4, "weight": 1.0}

# (family, generate() options): a tree of each kind, the gate on and off, prompt lookup on and off
CASES = {
    "medusa-chain": ("medusa", dict(draft_tree=None, gate_threshold=None, prompt_lookup_num_tokens=0)),
    "cerberus-static-gate": ("cerberus", dict(draft_tree=STATIC_TREE, gate_threshold=1.5, prompt_lookup_num_tokens=0)),
    "hydra-dynamic-lookup": ("hydra", dict(dynamic_tree=DYNAMIC, gate_threshold=None, prompt_lookup_num_tokens=3)),
    "hydra+prefix-static": ("hydra+prefix", dict(draft_tree=STATIC_TREE, gate_threshold=None, prompt_lookup_num_tokens=2)),
    "clover-dynamic-gate": ("clover", dict(dynamic_tree=DYNAMIC, gate_threshold=1.5, prompt_lookup_num_tokens=0)),
    "medusa-rescored": ("medusa", dict(rescoring=RESCORED, gate_threshold=None, prompt_lookup_num_tokens=0)),
    "medusa-lm-rescored": ("medusa", dict(rescoring={**RESCORED, "weight": 0.0, "lm_weight": 1.0},
                                          gate_threshold=None, prompt_lookup_num_tokens=0)),
    "kangaroo-chain": ("kangaroo", dict(gate_threshold=None, prompt_lookup_num_tokens=0)),
    "kangaroo-lookup": ("kangaroo", dict(gate_threshold=None, prompt_lookup_num_tokens=3)),
}


def greedy(base: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    with torch.no_grad():
        return base.generate(prompt, max_new_tokens=new_tokens, do_sample=False)[0].tolist()


def run_threads(work, threads: int = THREADS) -> list:
    """Run ``work(thread_index)`` in ``threads`` threads at once (released together); the exceptions raised."""
    barrier, errors = threading.Barrier(threads), []

    def target(index: int) -> None:
        barrier.wait()
        try:
            work(index)
        except BaseException as error:  # noqa: BLE001 - every failure of a call is the test's finding
            errors.append(error)

    pool = [threading.Thread(target=target, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return errors


def decode_concurrently(model, base, options: dict, references: dict, plain_threads: int = 1) -> list[str]:
    """Every thread decodes random (prompt, length) pairs ``ROUNDS`` times; ``plain_threads`` of them run the plain
    base's generate() instead. Returns what went wrong (wrong tokens, foreign statistics, exceptions)."""
    problems = []

    def work(index: int) -> None:
        chooser = random.Random(index)
        for _ in range(ROUNDS):
            prompt_index, length = chooser.randrange(len(PROMPTS)), chooser.choice(LENGTHS)
            prompt, expected = PROMPTS[prompt_index], references[prompt_index, length]
            if index < plain_threads:
                if greedy(base, prompt, length) != expected:
                    problems.append(f"plain base.generate() in thread {index}: wrong tokens")
                continue
            out = model.generate(prompt, max_new_tokens=length, return_dict_in_generate=True, **options)
            tokens = out.sequences[0].tolist()
            if tokens != expected:
                problems.append(f"thread {index}: {len(tokens) - prompt.shape[1]} tokens, not the base's greedy "
                                f"{length}")
            stats = out.generation_stats
            if not isinstance(out, CerberusGenerateOutput) or stats is None:
                problems.append(f"thread {index}: no statistics on the output")
            elif stats.new_tokens != len(tokens) - prompt.shape[1] or sum(stats.tokens_per_step) != stats.new_tokens:
                problems.append(f"thread {index}: statistics of another call ({stats.new_tokens} new tokens)")
            elif model.generation_stats is not stats:
                problems.append(f"thread {index}: model.generation_stats is not this thread's latest call's")

    errors = run_threads(work)
    return problems + [f"{type(error).__name__}: {error}" for error in errors]


@pytest.fixture(scope="module")
def references() -> dict:
    base = get_base("llama")
    return {(i, n): greedy(base, prompt, n) for i, prompt in enumerate(PROMPTS) for n in LENGTHS}


# `make test` runs random and oracle drafts (every draft rejected, most accepted); untrained heads are marked slow
# (`make test-slow`; CI runs both).
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("drafts", [pytest.param("untrained", marks=pytest.mark.slow), "random", "oracle"])
def test_concurrent_generate_is_exact_and_isolated(case, drafts, references):
    family, options = CASES[case]
    base = get_base("llama")
    model = fresh_model("llama", family, randomize=drafts != "untrained", seed=7, num_heads=3)
    if "lm_weight" in options.get("rescoring", {}):
        model.load_rescorer(fresh_model("llama", "kangaroo", randomize=True, seed=2))
    if "rescoring" in options:
        model.ngram = tiny_ngram(model.config.vocab_size, sequences=[references[0, 23]])
    if drafts == "oracle":  # accepted drafts: the cache reorder, acceptance and rollback run under threads too
        install_oracle(model, [torch.tensor(references[i, max(LENGTHS)]) for i in range(len(PROMPTS))],
                       corrupt=lambda p, k: (p + k) % 5 == 0)
    config_before = base.generation_config
    content_before = config_before.to_dict()
    problems = decode_concurrently(model, base, options, references)
    assert problems == []
    assert base.generation_config is config_before and base.generation_config.to_dict() == content_before
    assert model.generation_stats is None  # this thread made no call


@pytest.mark.parametrize("family", ["hydra", "kangaroo"])
def test_concurrent_strict_generate_equals_plain_bf16(family):
    """strict=True runs another attention function through a view of the base: threads decoding strictly and
    threads running the plain bf16 base at once each get exactly plain bf16 generate()'s tokens."""
    base = copy.deepcopy(get_base("llama")).to(torch.bfloat16)
    model = CerberusForCausalLM.from_base(base, head_type=family, num_heads=3,
                                          **({"exit_layer": 1} if family == "kangaroo" else {}))
    references = {(i, n): greedy(base, prompt, n) for i, prompt in enumerate(PROMPTS) for n in LENGTHS}
    problems = decode_concurrently(model, base, dict(strict=True, gate_threshold=None, prompt_lookup_num_tokens=2),
                                   references, plain_threads=2)
    assert problems == []
    assert base.config._attn_implementation == "sdpa"


def test_the_base_generation_config_is_never_swapped():
    """The heads' generation config reaches the base's generate() through a view: during a call, another thread
    reading the base's generation config sees the base's own, and a plain base call made after is unchanged."""
    base = get_base("llama")
    own = base.generation_config
    plain = base.generate(PROMPTS[0])
    model = fresh_model("llama", "hydra", num_heads=3)
    model.generation_config.max_new_tokens = plain.shape[1] - PROMPTS[0].shape[1] + 7  # differs from the base's
    seen, stop = set(), threading.Event()

    def watch() -> None:  # samples every half millisecond (a busy loop would starve the decoding thread of the GIL)
        while not stop.wait(0.0005):
            seen.add(id(base.generation_config))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for prompt in PROMPTS:
            assert model.generate(prompt).shape[1] == prompt.shape[1] + model.generation_config.max_new_tokens
    finally:
        stop.set()
        watcher.join()
    assert seen == {id(own)} and base.generation_config is own
    assert torch.equal(base.generate(PROMPTS[0]), plain)
