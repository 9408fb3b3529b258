"""Tiny random decoders of several architectures, built from configs (nothing is downloaded)."""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 96
EOS = 2
PAD = 0

_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=256, bos_token_id=1, eos_token_id=EOS,
               pad_token_id=PAD)

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

# Where the suite runs its tiny models and prompts: CERBERUS_TEST_DEVICE=cuda runs the same tests on the GPU
# (the models and prompts move there; everything the library builds must follow them).
DEVICE = torch.device(os.environ.get("CERBERUS_TEST_DEVICE", "cpu"))


def tiny_model(arch: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoConfig

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
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g).to(DEVICE)
