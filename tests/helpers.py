"""Test helpers: cached tiny bases, reference continuations, stats invariants, an oracle drafter.

The tiny models and the oracle drafter live in `cerberus_hf.testing` (scripts and drafter authors use them too);
they are re-exported here for the tests.

The tiny bases are built once per session and shared; tests must never modify a base (only heads,
which each test builds fresh with `CerberusForCausalLM.from_base`).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.gate import entropy
from cerberus_hf.blocks.ngram import NgramModel
from cerberus_hf.configuration_cerberus import HEAD_TYPES
from cerberus_hf.drafters import DRAFTER_CLASSES
from cerberus_hf.drafters.eagle3 import FeatureLayersDrafter
from cerberus_hf.testing import (ARCHITECTURES, EOS, MTP_ARCHITECTURES, PAD, VOCAB, install_oracle, prompt_ids,
                                 randomize_heads, tiny_model, tiny_mtp_model)

PROMPT_LEN = 8
NEW_TOKENS = 24


# ------------------------------------------------------------------------------------------------ bases
def here(dtype: torch.dtype = torch.float32) -> str:
    """The calibration key of the test device in ``dtype`` on this machine (its instruction class included): an
    entry stored under it serves the tiny models' calls."""
    from cerberus_hf.hardware import HardwareKey
    from tiny_models import DEVICE

    return str(HardwareKey.of(DEVICE, dtype))


@functools.lru_cache(maxsize=None)
def _session_folder() -> tempfile.TemporaryDirectory:
    """A folder for the session's saved bases, removed when the process exits."""
    return tempfile.TemporaryDirectory(prefix="cerberus-tests-")


@functools.lru_cache(maxsize=None)
def get_base(arch: str) -> torch.nn.Module:
    """The session's tiny base of ``arch`` (shared: do not modify it); an MTP architecture's (`MTP_ARCHITECTURES`)
    ships three MTP layers, one per depth of the family-parametrised tests' heads, in a folder of the session's."""
    if arch in MTP_ARCHITECTURES:
        return tiny_mtp_model(arch, os.path.join(_session_folder().name, arch), num_mtp_layers=3)
    return tiny_model(arch)


@functools.lru_cache(maxsize=None)
def _prompt_seed(arch: str) -> int:
    """A prompt whose greedy continuation is varied (not one token repeated) and has no EOS early on,
    so that exactness is a real check and stopping tests control where generation ends."""
    base = get_base(arch)
    for seed in range(50):
        ids = prompt_ids(seed, length=PROMPT_LEN)
        new = base.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, PROMPT_LEN:].tolist()
        if len(new) == NEW_TOKENS and EOS not in new and PAD not in new and len(set(new)) >= 6:
            return seed
    raise AssertionError(f"no varied continuation for {arch}")


def get_prompt(arch: str) -> torch.Tensor:
    return prompt_ids(_prompt_seed(arch), length=PROMPT_LEN)


@functools.lru_cache(maxsize=None)
def _reference(arch: str, max_new_tokens: int) -> torch.Tensor:
    return get_base(arch).generate(get_prompt(arch), max_new_tokens=max_new_tokens, do_sample=False)


def reference(arch: str, max_new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    """The base's greedy output (prompt + continuation) for the arch's prompt."""
    return _reference(arch, max_new_tokens).clone()


# The families any base can have, which the family-parametrised tests run on every tiny architecture; the others
# (head_type="mtp": the base's own MTP layers) run on the tiny bases that ship their layers (tests/test_mtp.py, and
# `get_base` of an MTP architecture where a matrix lists them, as tests/test_device_step.py does).
ANY_BASE_TYPES = tuple(h for h in HEAD_TYPES if not DRAFTER_CLASSES[h].needs_base_layers)

# Drafter variants that the family-parametrised tests run beside the head types: a name, its head type and options.
VARIANTS = {
    "hydra+prefix": dict(head_type="hydra", prefix_layer=True, context_window=4, adapter_heads=2, adapter_head_dim=8),
    "clover+prenorm": dict(head_type="clover", state_source="final_norm_input"),  # reads the state before the final norm
}


def family_options(family: str) -> dict:
    """``head_type`` and options of a head type or of one of `VARIANTS`."""
    return dict(VARIANTS.get(family, {"head_type": family}))


def fresh_model(arch: str, head_type: str = "cerberus", randomize: bool = False, seed: int = 0, **kwargs):
    """New heads on the shared base; ``randomize`` gives every head parameter random normal values.
    ``head_type`` may name one of `VARIANTS`. Kangaroo drafts through the tiny bases' first layer (of two) unless
    told otherwise."""
    kwargs = {**family_options(head_type), **kwargs}
    head_type = kwargs.pop("head_type")
    if head_type == "kangaroo":
        kwargs.setdefault("exit_layer", 1)
    model = CerberusForCausalLM.from_base(get_base(arch), head_type=head_type, **kwargs)
    if randomize:
        randomize_heads(model, seed)
    return model


def tiny_ngram(vocab_size: int, seed: int = 0, sequences: list[list[int]] = (), order: int = 3) -> NgramModel:
    """An n-gram model over random token sequences (plus ``sequences``), for rescoring on the tiny models."""
    generator = torch.Generator().manual_seed(seed)
    data = [(torch.randint(0, vocab_size, (40,), generator=generator).tolist(), 2) for _ in range(20)]
    return NgramModel.build(data + [(list(s), 1) for s in sequences], vocab_size, order)


def gate_entropies(arch: str, full: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Entropy of the base's raw distribution at every position that predicted a generated token
    (what the gate reads after emitting that token)."""
    with torch.no_grad():
        logits = get_base(arch)(full).logits[0, prompt_len - 1 : full.shape[1] - 1]
    return entropy(logits)


class ForwardCounter:
    """Counts calls of a module's forward (top-level calls only). Call get_prompt()/reference() before
    entering it: their first call per architecture runs the base."""

    def __init__(self, module: torch.nn.Module):
        self.count = 0
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.count += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def check_stats(model: CerberusForCausalLM, new_tokens: int, forwards: int | None = None) -> None:
    """Invariants of `generation_stats` after a single-sequence generate()."""
    s = model.generation_stats
    assert s is not None
    assert s.new_tokens == new_tokens
    assert s.steps >= 1
    assert len(s.tokens_per_step) == s.steps
    assert sum(s.tokens_per_step) == new_tokens
    assert all(t >= 1 for t in s.tokens_per_step)
    assert s.accepted_draft_tokens == new_tokens - s.steps
    assert 0 <= s.accepted_draft_tokens <= s.drafted_tokens
    assert s.tau == pytest.approx(new_tokens / s.steps)
    # Every forward pass after the prefill follows a gate decision, except one with no room left for a
    # draft (the last token before max_length); the last step may end generation.
    assert s.steps - 2 <= s.gate_decisions <= s.steps
    assert 0 <= s.draft_steps <= s.gate_decisions
    assert all(0.0 <= a <= 1.0 for a in s.head_acceptance)
    if forwards is not None:
        assert s.steps == forwards, "steps must count the base's forward passes"


def save_with_base(folder: Path, head_type: str = "hydra", **kwargs) -> str:
    """Fresh ``head_type`` heads saved in ``folder``, naming the tiny Llama saved beside it (``folder``'s sibling
    ``base``) as their base, so that ``from_pretrained(folder)`` and the commands load them; returns the folder."""
    base = folder.parent / "base"
    if not base.is_dir():
        get_base("llama").save_pretrained(base)
    fresh_model("llama", head_type, base_model_name_or_path=str(base), **kwargs).save_pretrained(folder)
    return str(folder)


def write_greedy_records(base, path: Path, count: int = 16) -> Path:
    """``count`` records in the distill format at ``path``: random prompts and ``base``'s own greedy answers."""
    with path.open("w") as f:
        for i in range(count):
            prompt = prompt_ids(seed=i, length=6 + i % 3)
            out = base.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
            f.write(json.dumps({"id": f"p{i:03d}", "mode": "greedy", "prompt": f"prompt {i}",
                                "input_ids": prompt[0].tolist(), "output_ids": out[0, prompt.shape[1]:].tolist(),
                                "finished": False}) + "\n")
    return path


def check_rows_against_states(family: str, compare, arch: str = "llama") -> None:
    """A family's device rows (`device_rows`) against its sequence state (`Drafter.start`) row by row on ``arch``: two
    rows, one left-padded to a one-token prompt (a single verified state), extended by different counts; ``compare(drafter, rows, states, sequences)`` checks each
    step's drafts (each state brought up to date by ``heads_input`` there)."""
    drafter = fresh_model(arch, family, num_heads=3).heads
    feature_layers = isinstance(drafter, FeatureLayersDrafter)
    width = drafter.hidden_size * (len(drafter.feature_layers) if feature_layers else 1)

    def captured(states: torch.Tensor) -> dict:  # what the drafter's capture records of a forward
        return {"features" if feature_layers else "normed": states}

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 5, width, generator=generator)
    tokens = torch.randint(3, 90, (2, 6), generator=generator)  # each row's prompt, then its first new token
    valid = torch.tensor([[True] * 5, [False] * 4 + [True]])
    rows = drafter.device_rows(2, 32, features.device)
    rows.start(features, tokens[:, 1:], valid)
    states, sequences = [], []
    for b in range(2):
        state = drafter.start(None, None)
        state.observe(captured(features[b: b + 1, valid[b]]), None)
        states.append(state)
        sequences.append(tokens[b: b + 1, torch.cat([valid[b], torch.tensor([True])])])
    for counts in ([1, 3], [2, 1], [3, 2]):
        compare(drafter, rows, states, sequences)
        step_features = torch.randn(2, 3, width, generator=generator)
        step_tokens = torch.randint(3, 90, (2, 3), generator=generator)
        rows.extend(step_features, step_tokens, torch.tensor(counts))
        for b, count in enumerate(counts):
            states[b].observe(captured(step_features[b: b + 1]), list(range(count)))
            sequences[b] = torch.cat([sequences[b], step_tokens[b: b + 1, :count]], dim=1)
    compare(drafter, rows, states, sequences)

__all__ = [
    "ANY_BASE_TYPES", "ARCHITECTURES", "check_rows_against_states", "EOS", "NEW_TOKENS", "PAD", "PROMPT_LEN", "VOCAB", "ForwardCounter",
    "check_stats", "fresh_model", "gate_entropies", "get_base", "get_prompt", "install_oracle", "randomize_heads",
    "reference", "write_greedy_records",
]


# A chat template over the tiny vocabulary: what distillation and the commands that apply one need of a tiny base.
CHAT_TEMPLATE = ("{% for m in messages %}<s> w3 {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}<s> w4 {% endif %}")


def save_chat_base(folder: Path) -> Path:
    """A tiny random Llama base saved to ``folder`` with a tokenizer that has `CHAT_TEMPLATE`: a base folder every
    command (distill, calibrate without data, make-heads) loads as it loads a real one."""
    from cerberus_hf.testing import tiny_model, tiny_tokenizer

    tiny_model("llama").save_pretrained(folder)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder
