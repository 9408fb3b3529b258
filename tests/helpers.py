"""Test helpers: cached tiny bases, reference continuations, stats invariants, an oracle drafter.

The tiny bases are built once per session and shared; tests must never modify a base (only heads,
which each test builds fresh with `CerberusForCausalLM.from_base`).
"""

from __future__ import annotations

import functools

import pytest
import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.decoding.gate import entropy
from cerberus_hf.decoding.ngram import NgramModel
from tiny_models import ARCHITECTURES, EOS, PAD, VOCAB, prompt_ids, tiny_model

PROMPT_LEN = 8
NEW_TOKENS = 24


# ------------------------------------------------------------------------------------------------ bases
@functools.lru_cache(maxsize=None)
def get_base(arch: str) -> torch.nn.Module:
    """The session's tiny base of ``arch`` (shared: do not modify it)."""
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


def randomize_heads(model: CerberusForCausalLM, seed: int = 0, std: float = 0.5) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


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


# ------------------------------------------------------------------------------------------------ oracle
def install_oracle(model: CerberusForCausalLM, references, corrupt=None, tolerance: float = 1e-3) -> dict:
    """Make ``model``'s heads draft the known continuation: an oracle that knows the future.

    Only the heads' logits are replaced (per depth, whatever the drafted tokens above it), so the gate,
    the room left before max_length, the draft tree, verification and the statistics are all the real ones. The oracle recognises where it is by the
    base's last hidden state (as the heads get it, or the newest of a windowed drafter's window) among those of the ``references`` (full sequences,
    prompt included): at the state of position ``p``, head ``k`` is made to rank token ``p + k + 2``
    first. When ``corrupt(p, k)`` is true the right token is ranked second instead, behind a wrong one.
    States that match no reference position keep the real heads' logits. Returns counters
    ``{"hits", "misses"}`` (per hidden state the heads were called on). A state matches a reference position
    when it is the nearest within ``tolerance`` of its norm (loosen it in bf16, whose rounding depends on how
    many positions a forward computes).
    """
    heads = model.heads
    if heads.drafts_chains:
        return _install_chain_oracle(model, references, corrupt)
    num_heads = heads.num_heads
    states, targets, positions = [], [], []
    for ref in references:
        ref = ref.reshape(1, -1)
        with torch.no_grad(), heads.capture(model.base) as captured:  # the state the heads read
            model.base(ref)
        length = ref.shape[1]
        tokens = torch.full((length, num_heads), -1, dtype=torch.long)
        for p in range(length):
            for k in range(num_heads):
                if p + k + 2 < length:
                    tokens[p, k] = ref[0, p + k + 2]
        states.append(captured["hidden"][0].float())
        targets.append(tokens)
        positions.append(torch.arange(length))
    table, targets, positions = torch.cat(states), torch.cat(targets), torch.cat(positions)
    counters = {"hits": 0, "misses": 0}
    real_class = type(heads)

    contextualized = []  # (what the heads read, the base's state it was made from) of a windowed drafter

    def base_state(h: torch.Tensor) -> torch.Tensor:
        for read, state in reversed(contextualized):
            match = (read == h).all(-1).nonzero()
            if len(match):
                return state[int(match[0, 0])]
        return h

    class OracleHeads(real_class):
        def contextualize(self, hidden, next_tokens, valid):  # training's and calibration's path
            read = real_class.contextualize(self, hidden, next_tokens, valid)
            contextualized.append((read.float(), hidden[:, -1].float()))
            return read

        def start(self, model, cache):  # decoding's path
            state = real_class.start(self, model, cache)
            heads_input = state.heads_input

            def recorded(input_ids, hidden):  # what the heads read may be made from the state (a window, a layer)
                read = heads_input(input_ids, hidden)
                contextualized.append((read.float(), hidden.float()))
                return read

            state.heads_input = recorded
            return state

        def teacher_forced(self, captured, ids, first):  # calibration's path
            hidden, logits, context = real_class.teacher_forced(self, captured, ids, first)
            if self.trains_on_sequences:  # (EAGLE-3) its logits come from unrolled steps, not from draft_level
                contextualized.append((hidden.float(), captured["hidden"][0].float()))
                logits = torch.stack([ranked(k, hidden, logits[:, k]) for k in range(logits.shape[1])], dim=1)
            return hidden, logits, context

        def draft_level(self, k, hidden, tokens, previous, context=None):
            state, logits = real_class.draft_level(self, k, hidden, tokens, previous, context)
            return state, ranked(k, hidden, logits)

    def ranked(k, hidden, logits):
        """``logits`` ``[n, V]`` of depth ``k`` with the true token first wherever ``hidden`` is a known position."""
        logits = logits.clone()
        for i, h in enumerate(hidden.float()):
            h = base_state(h)
            distance = (table - h).norm(dim=-1)
            row = int(distance.argmin())
            if float(distance[row]) > tolerance * (float(h.norm()) + 1.0):
                counters["misses"] += 1
                continue
            counters["hits"] += 1
            p = int(positions[row])
            target = int(targets[row, k])
            if target < 0:
                continue
            scores = logits[i]
            scores -= scores.max() + 10.0  # every other token well below 0, their order kept
            if corrupt is not None and corrupt(p, k):
                scores[(target + 1) % scores.shape[0]] = 0.0
                scores[target] = -1.0
            else:
                scores[target] = 0.0
        return logits

    heads.__class__ = OracleHeads
    return counters


def _install_chain_oracle(model: CerberusForCausalLM, references, corrupt=None) -> dict:
    """`install_oracle` for a drafter that drafts its own chain: it recognises where it is by the tokens
    so far (drafted ones included), which must be a prefix of a reference; a draft ``k`` tokens deep
    (0-based) after position ``p`` is corrupted when ``corrupt(p, k)``."""
    references = [ref.reshape(-1).tolist() for ref in references]
    counters = {"hits": 0, "misses": 0}
    heads = model.heads
    real_class = type(heads)
    drafting_from = {}

    class OracleChain(real_class):
        def draft_chain(self, state, input_ids, max_tokens, confidence):
            drafting_from["length"] = input_ids.shape[1]
            return real_class.draft_chain(self, state, input_ids, max_tokens, confidence)

        def next_logits(self, adapted, sequence):
            logits = real_class.next_logits(self, adapted, sequence).clone()
            ref = next((r for r in references if r[: len(sequence)] == sequence), None)
            if ref is None:
                counters["misses"] += 1
                return logits
            counters["hits"] += 1
            if len(sequence) >= len(ref):
                return logits
            target = ref[len(sequence)]
            index = target if self.draft_vocab is None else int((self.draft_vocab == target).nonzero()[0])
            logits -= logits.max() + 10.0
            if corrupt is not None and corrupt(drafting_from["length"] - 2, len(sequence) - drafting_from["length"]):
                logits[(index + 1) % logits.shape[0]] = 0.0
                logits[index] = -1.0
            else:
                logits[index] = 0.0
            return logits

    heads.__class__ = OracleChain
    return counters


__all__ = [
    "ARCHITECTURES", "EOS", "NEW_TOKENS", "PAD", "PROMPT_LEN", "VOCAB", "ForwardCounter", "check_stats",
    "fresh_model", "gate_entropies", "get_base", "get_prompt", "install_oracle", "randomize_heads", "reference",
]
