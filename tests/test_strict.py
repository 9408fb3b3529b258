"""strict=True: every verified position is computed as a one-token forward computes it, so the output equals
plain generate()'s in bf16 too, where batched verification can flip a near tie (`cerberus_hf.blocks.strict`)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn
from transformers import DynamicCache

import cerberus_hf.settings_selection as settings_selection
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.decoding.proposer import Draft
from cerberus_hf.blocks.strict import row_invariant_rows, strict_view
from cerberus_hf.blocks.tree import TreeSpec
from cerberus_hf.compat import cache_argument
from cerberus_hf.drafters import DRAFTER_CLASSES
from helpers import (ANY_BASE_TYPES, NEW_TOKENS, PROMPT_LEN, check_stats, get_base, get_prompt, install_oracle,
                     randomize_heads)
from tiny_models import DEVICE

STRICT_ARCHITECTURES = ("llama", "qwen2", "phi3", "gpt2")  # sdpa attention, no sliding window
REFUSED = {"mistral": "sliding-window", "gemma2": "'sdpa'"}  # a sliding window; gemma2's tiny base runs eager
STATIC_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@functools.lru_cache(maxsize=None)
def base_in(arch: str, dtype: torch.dtype) -> nn.Module:
    """A copy of the session's tiny base in ``dtype`` (the shared one stays float32)."""
    return copy.deepcopy(get_base(arch)).to(dtype)


@functools.lru_cache(maxsize=None)
def plain_output(arch: str, dtype: torch.dtype, new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    return base_in(arch, dtype).generate(get_prompt(arch), max_new_tokens=new_tokens, do_sample=False)


def drafting_model(arch: str, dtype: torch.dtype, head_type: str, randomize: bool = False) -> CerberusForCausalLM:
    kwargs = {"exit_layer": 1} if head_type == "kangaroo" else {}
    model = CerberusForCausalLM.from_base(base_in(arch, dtype), head_type=head_type, num_heads=4,
                                          gate_threshold=None, **kwargs)
    if randomize:
        randomize_heads(model, seed=7)
    return model.to(dtype)


def tree_of(head_type: str) -> dict:
    return {} if DRAFTER_CLASSES[head_type].drafts_chains else {"draft_tree": STATIC_TREE}


@pytest.mark.parametrize("heads", ["untrained", "random"])
@pytest.mark.parametrize("head_type", ANY_BASE_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("arch", STRICT_ARCHITECTURES)
def test_strict_output_equals_plain_generate_in_its_dtype(arch, dtype, head_type, heads):
    model = drafting_model(arch, dtype, head_type, randomize=heads == "random")
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, strict=True, **tree_of(head_type))
    assert torch.equal(out, plain_output(arch, dtype))
    check_stats(model, NEW_TOKENS)
    stats = model.generation_stats
    assert 1 <= stats.strict_rows <= 64
    if stats.strict_rows > 1:  # a draft was verified at every step with room for one
        assert stats.draft_steps >= stats.gate_decisions - 1 > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("arch", STRICT_ARCHITECTURES)
def test_strict_accepts_oracle_drafts_and_stays_exact(arch, dtype):
    """Right drafts are accepted several per step (verification really runs many rows strictly)."""
    model = drafting_model(arch, dtype, "medusa")
    longer = plain_output(arch, dtype, NEW_TOKENS + 8)
    # bf16 rounds a full-sequence forward's states differently from decoding's: match states more loosely
    oracle = install_oracle(model, [longer], tolerance=5e-2 if dtype != torch.float32 else 1e-3)
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, strict=True)
    assert torch.equal(out, plain_output(arch, dtype))
    stats = model.generation_stats
    if stats.strict_rows >= 5:
        assert oracle["hits"] > 0 and stats.tau > 1.5 and max(stats.tokens_per_step) == 5
    else:  # drafts are cut to strict_rows - 1 nodes
        assert max(stats.tokens_per_step) <= stats.strict_rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("arch", STRICT_ARCHITECTURES)
def test_strict_verification_logits_are_bitwise_those_of_one_token_forwards(arch, dtype):
    """The property the mode rests on, checked directly: the continuation fed in chunks under strict attention
    (chunks no taller than the row-invariant height) gives every position the logits that one-token
    forwards give it, bit for bit."""
    base = base_in(arch, dtype)
    full = plain_output(arch, dtype)
    prompt, continuation = full[:, :PROMPT_LEN], full[:, PROMPT_LEN:]
    chunk = min(row_invariant_rows(base), 8)

    def logits(size: int, strict: bool) -> torch.Tensor:
        cache, rows = DynamicCache(config=base.config), []
        with torch.no_grad():
            base(prompt, **cache_argument(cache), use_cache=True)
            for start in range(0, continuation.shape[1], size):
                piece = continuation[:, start : start + size]
                rows.append((strict_view(base) if strict else base)(piece, **cache_argument(cache), use_cache=True).logits[0])
        return torch.cat(rows)

    assert torch.equal(logits(chunk, strict=True), logits(1, strict=False))
    assert base.config._attn_implementation == "sdpa"  # the base itself is never switched


def test_strict_attention_follows_a_tree_mask():
    """Under a tree mask each node sees the cache, its ancestors and itself: its logits equal those of one-token
    forwards along its own path."""
    arch, dtype = "llama", torch.bfloat16
    base = base_in(arch, dtype)
    prompt = get_prompt(arch)
    tree = TreeSpec.from_paths([[0], [1], [0, 0], [1, 0]])
    tokens = torch.tensor([[5, 7, 9, 11, 13]], device=prompt.device)  # root, then nodes (0,), (1,), (0, 0), (1, 0)
    with torch.no_grad():
        cache = DynamicCache(config=base.config)
        base(prompt, **cache_argument(cache), use_cache=True)
        mask = tree.attention_mask(prompt.shape[1], dtype, prompt.device)
        positions = (prompt.shape[1] + tree.position_offsets.to(prompt.device))[None]
        tree_logits = strict_view(base)(tokens, **cache_argument(cache), position_ids=positions, attention_mask=mask).logits[0]
        for path in ([0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4]):
            chain = DynamicCache(config=base.config)
            base(prompt, **cache_argument(chain), use_cache=True)
            for index in path:
                last = base(tokens[:, index : index + 1], **cache_argument(chain), use_cache=True).logits[0, -1]
            assert torch.equal(tree_logits[path[-1]], last)


def test_drafts_are_cut_to_the_row_invariant_height(monkeypatch):
    """Where the linear layers are row-invariant only up to 3 rows, each verification feeds at most 3 positions
    (the root and the chain's first 2 nodes) and the output is still exact."""
    monkeypatch.setattr(settings_selection, "row_invariant_rows", lambda base, limit: min(3, limit))
    model = drafting_model("llama", torch.bfloat16, "medusa")
    install_oracle(model, [plain_output("llama", torch.bfloat16, NEW_TOKENS + 8)], tolerance=5e-2)
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, strict=True)  # a chain of 4 heads
    assert torch.equal(out, plain_output("llama", torch.bfloat16))
    stats = model.generation_stats
    assert stats.strict_rows == 3 and max(stats.tokens_per_step) == 3 > stats.tau > 1.5
    assert stats.drafted_tokens <= 2 * stats.draft_steps


def test_no_row_invariance_means_plain_decoding(monkeypatch):
    monkeypatch.setattr(settings_selection, "row_invariant_rows", lambda base, limit: 1)
    model = drafting_model("llama", torch.bfloat16, "medusa")
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, strict=True, prompt_lookup_num_tokens=3)
    assert torch.equal(out, plain_output("llama", torch.bfloat16))
    assert model.generation_stats.tau == 1.0 and model.generation_stats.drafted_tokens == 0


class RowByRow(nn.Linear):
    """A linear layer computed one row at a time: row-invariant by construction, on any machine."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([super(RowByRow, self).forward(row[None]) for row in x])


class RowDependent(RowByRow):
    """A linear layer whose result depends on how many rows it computes (from 4 rows on)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + (1e-3 if x.shape[0] >= 4 else 0.0)


def test_row_invariant_rows_finds_the_first_height_that_differs():
    assert row_invariant_rows(nn.Sequential(RowByRow(8, 8), RowDependent(8, 16))) == 3
    assert row_invariant_rows(nn.Sequential(RowByRow(8, 8)), limit=16) == 16


class Tallest(RowByRow):
    """A row-invariant layer that records the most rows it was given at once."""

    tallest = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.tallest = max(self.tallest, x.shape[0])
        return super().forward(x)


def test_row_invariance_is_measured_only_as_tall_as_asked_and_remembered():
    layer = Tallest(8, 8)
    model = nn.Sequential(layer)
    assert row_invariant_rows(model, limit=5) == 5 and layer.tallest == 5
    layer.tallest = 0
    assert row_invariant_rows(model, limit=3) == 3 and layer.tallest == 0  # the taller measurement serves
    assert row_invariant_rows(model, limit=9) == 9 and layer.tallest == 9  # taller than measured: measured again
    beside = Tallest(8, 8)
    dependent = nn.Sequential(RowDependent(8, 8), beside)
    assert row_invariant_rows(dependent, limit=8) == 3
    beside.tallest = 0
    assert row_invariant_rows(dependent, limit=64) == 3 and beside.tallest == 0  # a height that differed serves all


def test_a_strict_call_measures_only_as_tall_as_it_verifies(monkeypatch):
    """A chain of 4 heads and 3 copied tokens verifies at most 8 positions: the measurement goes no taller."""
    limits = []
    monkeypatch.setattr(settings_selection, "row_invariant_rows", lambda base, limit: limits.append(limit) or limit)
    model = drafting_model("llama", torch.bfloat16, "medusa")
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, strict=True, prompt_lookup_num_tokens=3,
                         draft_tree=None, dynamic_tree=None)
    assert torch.equal(out, plain_output("llama", torch.bfloat16))
    assert limits == [1 + 4 + 3] and model.generation_stats.strict_rows == 8


class RarelyRowDependent(RowByRow):
    """A linear layer that differs in a batch only for rows with a large first input (about 2% of random rows): as a
    kernel whose other summation order rounds to the same value most of the time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + 1e-3 * (x[:, :1] > 2.0) if x.shape[0] > 1 else out


def test_row_invariant_rows_finds_a_difference_one_random_batch_would_miss():
    torch.manual_seed(0)
    layer = RarelyRowDependent(8, 8)
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(layer(x), torch.cat([layer(x[:1]), layer(x[1:])]))  # the first batch shows nothing
    assert row_invariant_rows(nn.Sequential(layer), limit=16) < 16


def test_first_nodes_keeps_every_kept_node_s_ancestors():
    tree = TreeSpec.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    draft = Draft(tree, torch.tensor([10, 11, 12, 13, 14]))
    cut = draft.first_nodes(3)
    assert cut.tree.paths == ((0,), (1,), (0, 0)) and cut.tokens.tolist() == [10, 11, 12]
    assert draft.first_nodes(9) is draft and draft.first_nodes(0) is None


@pytest.mark.parametrize("arch", list(REFUSED))
def test_strict_refuses_bases_whose_one_token_forward_it_cannot_reproduce(arch):
    model = CerberusForCausalLM.from_base(get_base(arch), head_type="medusa")
    with pytest.raises(ValueError, match=REFUSED[arch]):
        model.generate(get_prompt(arch), max_new_tokens=4, strict=True)


def test_strict_calibration_is_stored_beside_the_entry_and_used_by_strict_generate(monkeypatch):
    """`calibrate(strict=True)` fits trees no larger than strict verification can verify, stores them under the
    entry's "strict" key without touching the entry's own settings, and only generate(strict=True) reads them."""
    from cerberus_hf.calibration import calibrate, format_report
    from cerberus_hf.calibration import pipeline
    from cerberus_hf.calibration.pipeline import store_calibration
    from cerberus_hf.hardware import HardwareKey

    monkeypatch.setattr(pipeline, "row_invariant_rows", lambda base: 4)
    model = drafting_model("llama", torch.bfloat16, "medusa")
    sequence = plain_output("llama", torch.bfloat16, NEW_TOKENS + 8)
    install_oracle(model, [sequence], tolerance=5e-2)  # heads that are right, so that some tree pays
    own = {"draft_tree": [[0], [1]], "gate_threshold": None}
    key = str(HardwareKey.of(DEVICE, torch.bfloat16))
    model.generation_config.cerberus_calibration = {key: dict(own)}
    report = calibrate(model, [(sequence[0].tolist(), PROMPT_LEN - 1)], max_nodes=8,
                                      repeats=1, dynamic_budgets=(), strict=True)
    assert "strict verification: at most 4 positions a forward" in format_report(report)
    entry = model.generation_config.cerberus_calibration[key]
    assert {k: entry[k] for k in own} == own and entry["strict"]["strict_rows"] == 4
    assert len(entry["strict"]["draft_tree"]) <= 3 and entry["strict"]["dynamic_tree"]["nodes"] <= 3
    assert model.decoding_settings()["draft_tree"] == own["draft_tree"]
    strict = model.decoding_settings(strict=True)
    assert strict["calibration"] == f"{key} (strict)" and strict["draft_tree"] == entry["strict"]["draft_tree"]
    monkeypatch.setattr(settings_selection, "row_invariant_rows", lambda base, limit: min(4, limit))
    out = model.generate(get_prompt("llama"), max_new_tokens=NEW_TOKENS, strict=True)
    assert torch.equal(out, plain_output("llama", torch.bfloat16))
    assert model.generation_stats.calibration == f"{key} (strict)"
    store_calibration(model, {"draft_tree": [[0]]})  # calibrating again without --strict keeps the strict half
    assert model.generation_config.cerberus_calibration[key]["strict"] == entry["strict"]
