"""A batch of prompts decoded row by row, as `CerberusForCausalLM.generate` does today: each row without its left
padding, the length limits generate() counts over the padded width carried over to the unpadded rows, and the
results re-padded as batched `generate()` returns them."""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..compat import default_generation_params


def pad_token_id(config: GenerationConfig) -> int | None:
    """The pad id generate() uses: pad_token_id, else the first eos id."""
    if config.pad_token_id is not None:
        return config.pad_token_id
    eos = config.eos_token_id
    return eos[0] if isinstance(eos, list) and eos else eos


def unpadded_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: GenerationConfig):
    """Each row without its left padding. Without a mask, padding is inferred from the pad id as
    generate() infers it (only when the pad id is not also an eos id)."""
    pad = config.pad_token_id
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    if attention_mask is None and pad is not None and pad not in eos and bool((input_ids == pad).any()):
        attention_mask = (input_ids != pad).long()
    if attention_mask is None:
        return [row[None] for row in input_ids]
    if attention_mask.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must be 2D with the shape of input_ids {tuple(input_ids.shape)}.")
    rows = []
    for ids, mask in zip(input_ids, attention_mask.bool()):
        start = int((~mask).sum())
        if not bool(mask[start:].all()):
            raise ValueError("Only left padding is supported: set tokenizer.padding_side = 'left'.")
        if start == ids.shape[0]:
            raise ValueError("A row of the batch is all padding.")
        rows.append(ids[start:][None])
    return rows


def pad_batch(padded_inputs: torch.Tensor, rows: list, results: list, config: GenerationConfig):
    """Reassemble per-row results as batched generate() returns them: prompt (with its left padding),
    then the new tokens, right-padded with the pad id to the longest row."""
    as_dict = not isinstance(results[0], torch.Tensor)
    new_tokens = [(r.sequences if as_dict else r)[0, row.shape[1] :] for r, row in zip(results, rows)]
    width = max(t.shape[0] for t in new_tokens)
    pad = pad_token_id(config)
    out = padded_inputs.new_full((len(rows), padded_inputs.shape[1] + width), pad if pad is not None else 0)
    out[:, : padded_inputs.shape[1]] = padded_inputs
    for i, tokens in enumerate(new_tokens):
        out[i, padded_inputs.shape[1] : padded_inputs.shape[1] + tokens.shape[0]] = tokens
    return GenerateDecoderOnlyOutput(sequences=out) if as_dict else out



def unpadded_length_limits(config: GenerationConfig, padded_width: int) -> dict:
    """The generate() arguments that keep a row's length limits what they are for the padded batch: generate()
    counts ``max_length`` and ``min_length`` over the padded width, and rows decode without their padding."""
    limits = {}
    defaults = default_generation_params(config)
    max_length = config.max_length if config.max_length is not None else defaults["max_length"]
    if config.max_new_tokens is None:
        limits["max_new_tokens"] = max_length - padded_width
    if config.min_new_tokens is None and config.min_length:
        limits["min_new_tokens"] = max(0, config.min_length - padded_width)
        limits["min_length"] = 0
    return limits
