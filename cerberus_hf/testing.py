"""Tiny models and oracle drafts, to test a drafter without downloading anything.

Two things a drafter's author (and the package's own tests and scripts) needs to check a drafter:

- **Tiny random decoders** of several architectures, built from configs: `tiny_model`, `tiny_tokenizer` and
  `prompt_ids`, over a vocabulary of `VOCAB` tokens. They are small enough that a test runs in seconds, and their
  output head is sharpened so that greedy continuations are not near-ties, which makes exactness a real check.
  ``CERBERUS_TEST_DEVICE=cuda`` puts them (and the prompts) on the GPU (`DEVICE`).
- **Oracle drafts**: `install_oracle` makes a model's heads draft a known continuation, so that every draft (or a
  chosen few, corrupted) is accepted while the loop, the verification and the statistics stay the real ones. That
  tests the loop's bookkeeping with acceptance under control, and measures the loop's ceiling on a real base.
  `randomize_heads` gives untrained heads random weights, so that they draft something other than one token.

Nothing here is needed to decode; it imports only the package and what the package itself depends on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from .files import save_safetensors

if TYPE_CHECKING:
    from .modeling_cerberus import CerberusForCausalLM

__all__ = [
    "ARCHITECTURES", "CONFIGS", "DEVICE", "EOS", "MTP_ARCHITECTURES", "MTP_CONFIGS", "PAD", "VOCAB", "install_oracle",
    "prompt_ids", "randomize_heads", "tiny_model", "tiny_mtp_model", "tiny_tokenizer",
]

# ------------------------------------------------------------------------------------------------ tiny models
VOCAB = 96
EOS = 2
PAD = 0

_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=256, bos_token_id=1, eos_token_id=EOS,
               pad_token_id=PAD)

# The config of each tiny architecture, as `AutoConfig.for_model` keywords (with the model type).
CONFIGS = {
    "llama": dict(model_type="llama", num_key_value_heads=2, **_COMMON),
    "qwen2": dict(model_type="qwen2", num_key_value_heads=2, **_COMMON),
    "mistral": dict(model_type="mistral", num_key_value_heads=2, sliding_window=16, **_COMMON),
    # Untied output embeddings for the architectures that tie them by default: scaling a tied lm_head
    # (below) also scales the input embeddings, and the model then just repeats its last token.
    "gemma2": dict(model_type="gemma2", num_key_value_heads=2, head_dim=8, sliding_window=16,
                   final_logit_softcapping=30.0, tie_word_embeddings=False, **_COMMON),
    "phi3": dict(model_type="phi3", num_key_value_heads=2, **_COMMON),
    "gpt2": dict(model_type="gpt2", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                 bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False),
}
ARCHITECTURES = tuple(CONFIGS)

# Where the tiny models and prompts are put: CERBERUS_TEST_DEVICE=cuda runs the same tests on the GPU
# (the models and prompts move there; everything the library builds must follow them).
DEVICE = torch.device(os.environ.get("CERBERUS_TEST_DEVICE", "cpu"))


def tiny_model(arch: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random decoder of ``arch`` (a key of `CONFIGS`), in eval mode on `DEVICE`, greedy by default.

    The same ``seed`` gives the same weights. Its output head is scaled up so that greedy continuations are not
    near-ties and repeat often enough for untrained drafts to be accepted sometimes.
    """
    kwargs = dict(CONFIGS[arch])
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager" if arch == "gemma2" else None)
    # Sharper than the default init so greedy continuations are not near-ties and repeat often enough
    # for untrained drafts to be accepted sometimes.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.do_sample = False
    return model.to(DEVICE).eval()


# Tiny bases that ship multi-token-prediction layers (`drafters.mtp`), in the layout transformers' ``use_mtp`` reads:
# DeepSeek-V3 (multi-head latent attention) and GLM-4.5 (grouped-query attention), dense (their MoE layers start
# after ``first_k_dense_replace``), with two MTP layers each. The MTP layers are mixtures of experts, kept tiny too:
# at the configs' defaults (128 or 256 experts of width 1408 or 2048) one weighs 200 MB in every folder holding it.
_TINY_MOE = dict(n_routed_experts=4, moe_intermediate_size=32, num_experts_per_tok=2, n_group=1, topk_group=1)
MTP_CONFIGS = {
    "deepseek_v3": dict(model_type="deepseek_v3", num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=8,
                        num_mtp_layers=2, **_TINY_MOE, **_COMMON),
    "glm4_moe": dict(model_type="glm4_moe", num_key_value_heads=2, head_dim=8, first_k_dense_replace=8,
                     num_mtp_layers=2, **_TINY_MOE, **_COMMON),
}
MTP_ARCHITECTURES = tuple(MTP_CONFIGS)


def tiny_mtp_model(arch: str, folder: str, seed: int = 0, **config_overrides) -> torch.nn.Module:
    """A tiny random base of ``arch`` (a key of `MTP_CONFIGS`) with random MTP layers, saved to ``folder`` (the MTP
    layers in its checkpoint as the base's layers ``num_hidden_layers + j``, where transformers' `MtpModel` finds them)
    and loaded from there, like `tiny_model` otherwise. The same ``seed`` gives the same weights.

    DeepSeek-V3 and GLM-4.5 name the MTP layers of their published checkpoints (layer 61; 46 or 92) in the pattern
    transformers' MTP loader searches; the tiny base names its own (layer 2 on) on the loaded model. A folder that any
    loader reads as it is (``cerberus-hf bench --base FOLDER --mtp``) takes the published depths: ``num_hidden_layers``
    61 (DeepSeek-V3) or 46 (GLM-4.5-Air), ``num_mtp_layers`` 1 (``config_overrides`` replace `MTP_CONFIGS` fields)."""
    from safetensors.torch import load_file
    from transformers.modeling_layers import MtpModel

    kwargs = {**MTP_CONFIGS[arch], **config_overrides}
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.do_sample = False
    model.save_pretrained(folder)
    layers = MtpModel(model, config.num_mtp_layers)
    generator = torch.Generator().manual_seed(seed + 1)
    first = config.num_hidden_layers
    weights = load_file(os.path.join(folder, "model.safetensors"))
    for key, value in layers.layers.state_dict().items():
        index, name = key.split(".", 1)
        if value.dim() > 1:  # matrices drawn at random, norms left at one
            value = torch.randn(value.shape, generator=generator) * 0.3
        if name == "eh_proj.weight":  # near the identity on the state it reads: it guesses the base's own next
            value[:, config.hidden_size:] += torch.eye(config.hidden_size)  # token often, as fresh heads do
            value[:, :config.hidden_size] *= 4.0
        weights[f"model.layers.{first + int(index)}.{name.removeprefix('mtp_block.')}"] = value.contiguous()
    save_safetensors(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with _quiet_loading():  # the base's own loading skips the MTP layers (and would list them all)
        model = AutoModelForCausalLM.from_pretrained(folder)
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{first + j}\." for j in range(config.num_mtp_layers)]
    return model.to(DEVICE).eval()


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers' loading report at errors only, for the time of a load."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def tiny_tokenizer(stop_string_ready: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny vocabulary: token i is the word 'w{i}'.

    ``stop_string_ready`` adds the word 'abcdef' (id VOCAB, which the models never produce): transformers'
    `StopStringCriteria` tokenizes 'abcdef' to learn how token strings join, and fails otherwise.
    """
    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab.update({"<pad>": PAD, "<s>": 1, "</s>": EOS})
    del vocab["w0"], vocab["w1"], vocab["w2"]
    if stop_string_ready:
        vocab["abcdef"] = VOCAB
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   padding_side="left")


def prompt_ids(seed: int = 0, length: int = 8, batch: int = 1) -> torch.Tensor:
    """Random prompt ids ``[batch, length]`` on `DEVICE`, with no special token (ids 3 and up); the same ``seed``
    gives the same prompt on every device."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g).to(DEVICE)


# ------------------------------------------------------------------------------------------------ heads
def randomize_heads(model: CerberusForCausalLM, seed: int = 0, std: float = 0.5) -> None:
    """Give every parameter of ``model``'s heads random normal values (``std``), in place.

    Freshly built heads often draft the same token at every depth; random weights make their drafts vary, so that
    tests see drafts rejected at every depth. The values are drawn on the CPU, so a seed gives the same heads on
    every device.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


# ------------------------------------------------------------------------------------------------ oracle
def install_oracle(model: CerberusForCausalLM, references: Iterable[torch.Tensor],
                   corrupt: Callable[[int, int], bool] | None = None, tolerance: float = 1e-3) -> dict[str, int]:
    """Make ``model``'s heads draft the known continuation: an oracle that knows the future.

    Only the heads' logits are replaced (per depth, whatever the drafted tokens above it), so the gate,
    the room left before max_length, the draft tree, verification and the statistics are all the real ones. The
    oracle recognises where it is by the base's last hidden state (as the heads get it, or the newest of a windowed
    drafter's window) among those of the ``references`` (full sequences, prompt included): at the state of position
    ``p``, head ``k`` is made to rank token ``p + k + 2`` first. When ``corrupt(p, k)`` is true the right token is
    ranked second instead, behind a wrong one. States that match no reference position keep the real heads' logits.
    Returns counters ``{"hits", "misses"}`` (per hidden state the heads were called on). A state matches a reference
    position when it is the nearest within ``tolerance`` of its norm (loosen it in bf16, whose rounding depends on how
    many positions a forward computes).

    A drafter that drafts its own chain (``heads.drafts_chains``) is recognised by its tokens instead (see
    `_install_chain_oracle`). The heads' class is swapped for a subclass in place; build fresh heads to undo it.
    """
    heads = model.heads
    if heads.drafts_chains:
        return _install_chain_oracle(model, references, corrupt)
    oracle = _Oracle(model, references, corrupt, tolerance)
    heads.__class__ = _oracle_heads(type(heads), oracle)
    return oracle.counters


class _Oracle:
    """What `install_oracle`'s heads know: the base's state at every position of the references (as the heads read
    it), the token each depth must rank first there, and the counters of states found and not."""

    def __init__(self, model: CerberusForCausalLM, references: Iterable[torch.Tensor],
                 corrupt: Callable[[int, int], bool] | None, tolerance: float):
        heads = model.heads
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
        self.table, self.targets, self.positions = torch.cat(states), torch.cat(targets), torch.cat(positions)
        self.corrupt, self.tolerance = corrupt, tolerance
        self.counters = {"hits": 0, "misses": 0}
        self.contextualized = []  # (what the heads read, the base's state it was made from) of a windowed drafter

    def base_state(self, h: torch.Tensor) -> torch.Tensor:
        """The base's state that what the heads read, ``h``, was made from (``h`` itself if none was recorded)."""
        for read, state in reversed(self.contextualized):
            match = (read == h).all(-1).nonzero()
            if len(match):
                return state[int(match[0, 0])]
        return h

    def ranked(self, k: int, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``[n, V]`` of depth ``k`` with the true token first wherever ``hidden`` is a known position."""
        logits = logits.clone()
        for i, h in enumerate(hidden.float()):
            h = self.base_state(h)
            distance = (self.table - h).norm(dim=-1)
            row = int(distance.argmin())
            if float(distance[row]) > self.tolerance * (float(h.norm()) + 1.0):
                self.counters["misses"] += 1
                continue
            self.counters["hits"] += 1
            p = int(self.positions[row])
            target = int(self.targets[row, k])
            if target < 0:
                continue
            _rank_first(logits[i], target, self.corrupt is not None and self.corrupt(p, k))
        return logits


def _oracle_heads(real_class: type, oracle: _Oracle) -> type:
    """A subclass of the heads' class whose drafts ``oracle`` ranks, recording on every path the heads take (training
    and calibration, decoding, the device step) what a windowed drafter read and the state it was made from."""

    class OracleHeads(real_class):
        def contextualize(self, hidden, next_tokens, valid):  # training's and calibration's path
            read = real_class.contextualize(self, hidden, next_tokens, valid)
            oracle.contextualized.append((read.float(), hidden[:, -1].float()))
            return read

        def start(self, model, cache):  # decoding's path
            state = real_class.start(self, model, cache)
            heads_input = state.heads_input

            def recorded(input_ids, hidden):  # what the heads read may be made from the state (a window, a layer)
                read = heads_input(input_ids, hidden)
                oracle.contextualized.append((read.float(), hidden.float()))
                return read

            state.heads_input = recorded
            return state

        def device_rows(self, batch, room, device):  # the device step's path (`decoding.device_step`)
            rows = real_class.device_rows(self, batch, room, device)
            if rows is not None:
                read = rows.read

                def recorded(hidden):
                    out = read(hidden)
                    oracle.contextualized.append((out.float(), hidden.float()))
                    return out

                rows.read = recorded
            return rows

        def teacher_forced(self, captured, ids, first):  # calibration's path
            hidden, logits, context = real_class.teacher_forced(self, captured, ids, first)
            if self.trains_on_sequences:  # (EAGLE-3) its logits come from unrolled steps, not from draft_level
                oracle.contextualized.append((hidden.float(), captured["hidden"][0].float()))
                logits = torch.stack([oracle.ranked(k, hidden, logits[:, k]) for k in range(logits.shape[1])], dim=1)
            return hidden, logits, context

        def draft_level(self, k, hidden, tokens, previous, context=None):
            state, logits = real_class.draft_level(self, k, hidden, tokens, previous, context)
            return state, oracle.ranked(k, hidden, logits)

    return OracleHeads


def _rank_first(scores: torch.Tensor, target: int, corrupted: bool) -> None:
    """``scores`` ``[V]`` changed in place so that ``target`` ranks first, or second behind a wrong token where
    ``corrupted``; every other token well below both, their order kept."""
    scores -= scores.max() + 10.0
    if corrupted:
        scores[(target + 1) % scores.shape[0]] = 0.0
        scores[target] = -1.0
    else:
        scores[target] = 0.0


def _install_chain_oracle(model: CerberusForCausalLM, references: Iterable[torch.Tensor],
                          corrupt: Callable[[int, int], bool] | None = None) -> dict[str, int]:
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
            _rank_first(logits, index, corrupt is not None and corrupt(drafting_from["length"] - 2,
                                                                       len(sequence) - drafting_from["length"]))
            return logits

    heads.__class__ = OracleChain
    return counters
