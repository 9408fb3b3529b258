"""What one `generate()` call hands the base's own `generate()`, which runs the draft-verify loop as its decoding
method (``custom_generate``): what the call asks for that drafting cannot do, refused in one line
(`refuse_unsupported`); each sequence it decodes, without its left padding (`call_rows`); its stopping criteria with
its stop strings (`call_stopping_criteria`); and the base's generate() run over those rows, together or one at a
time, with prompt-lookup settings kept out of its reach (`run_base`, `without_lookup`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria

from ..blocks.batching import pad_batch, unpadded_length_limits, unpadded_rows
from ..errors import UserError, check_int
from ..module_views import module_view


# Prompt-lookup settings are ours to honour (grafted into the heads' drafts): left in what the base's
# generate() reads, they would switch it to its own prompt-lookup decoding.
LOOKUP_FIELDS = ("prompt_lookup_num_tokens", "max_matching_ngram_size")


def without_lookup(config: GenerationConfig | None) -> GenerationConfig | None:
    """``config``, or a copy of it without prompt-lookup settings when it has any."""
    if config is None or all(getattr(config, name, None) is None for name in LOOKUP_FIELDS):
        return config
    config = copy.deepcopy(config)
    for name in LOOKUP_FIELDS:
        setattr(config, name, None)
    return config


def refuse_unsupported(config: GenerationConfig, model_kwargs: dict) -> None:
    """Refuse, in one line, what a call asks for that drafting cannot do or that is malformed."""
    check_int("max_matching_ngram_size", config.max_matching_ngram_size, 1, optional=True)
    if config.num_beams and config.num_beams > 1:
        raise UserError("Beam search is not supported with draft heads; use greedy or sampling (num_beams=1).")
    if model_kwargs.get("assistant_model") is not None or config.assistant_early_exit is not None:
        raise UserError("assistant_model / assistant_early_exit cannot be combined with draft heads (they are the drafter).")
    if model_kwargs.get("custom_generate") is not None:
        raise UserError("CerberusForCausalLM.generate supplies its own decoding loop; custom_generate is not accepted.")
    if config.cache_implementation not in (None, "dynamic", "static"):
        raise UserError(
            f"cache_implementation={config.cache_implementation!r} is not supported: the draft-verify loop rolls the "
            "cache back after each step; use the default dynamic cache or 'static'."
        )
    if model_kwargs.get("inputs_embeds") is not None:
        raise UserError("inputs_embeds is not supported with draft heads: pass input_ids.")


def call_rows(input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, effective: GenerationConfig,
              streamer) -> list[torch.Tensor]:
    """Each sequence a call decodes without its left padding (``num_return_sequences`` copies of each prompt); what
    a batch cannot do is refused."""
    if input_ids is None or input_ids.dim() != 2:
        raise UserError("CerberusForCausalLM.generate needs input_ids of shape (batch, length).")
    copies = effective.num_return_sequences or 1
    rows = [row for row in unpadded_rows(input_ids, attention_mask, effective) for _ in range(copies)]
    if len(rows) > 1 and streamer is not None:
        raise UserError("A streamer takes one sequence: stream with batch size 1.")
    if len(rows) > 1 and effective.return_dict_in_generate and (effective.output_scores or effective.output_logits):
        raise UserError(
            "output_scores / output_logits with batch size > 1 are not supported yet (rows are decoded one "
            "at a time); generate each row on its own to get its scores."
        )
    return rows


def call_stopping_criteria(effective: GenerationConfig, criteria: StoppingCriteriaList | None,
                           kwargs: dict) -> StoppingCriteriaList:
    """The call's stopping criteria, its stop strings among them: generate() does not hand the tokenizer to a custom
    decoding method, so the criterion is built here (the tokenizer and the stop strings leave ``kwargs``)."""
    criteria = StoppingCriteriaList(criteria or [])
    tokenizer = kwargs.pop("tokenizer", None)
    if effective.stop_strings:
        if tokenizer is None:
            raise UserError("stop_strings needs the tokenizer: call generate(..., tokenizer=tokenizer).")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=effective.stop_strings))
        kwargs["stop_strings"] = None
    return criteria


def run_base(base: nn.Module, defaults: GenerationConfig, input_ids: torch.LongTensor, rows: list[torch.Tensor],
             together: bool, effective: GenerationConfig, generation_config: GenerationConfig | None, streamer,
             kwargs: dict):
    """The base's generate() running our decoding method (in ``kwargs``) over the call's ``rows``: together, as
    one left-padded batch, or one at a time, then padded back as the base pads a batch. ``base``: the base as the
    call decodes it (`CerberusForCausalLM.decoding_view`'s); ``defaults``: the model's generation config."""
    for name in LOOKUP_FIELDS:
        kwargs.pop(name, None)
    if not together and any(row.shape[1] != input_ids.shape[1] for row in rows):
        kwargs.update(unpadded_length_limits(effective, input_ids.shape[1]))
    kwargs["num_return_sequences"] = 1
    # The base's generate() fills unset settings from this model's generation config (greedy by default), as
    # it would from its own: it runs on a view of the base whose generation config is ours, so the base and
    # its generation config stay as they are for other threads (`module_views`).
    base = module_view(base, generation_config=without_lookup(defaults))
    generation_config = without_lookup(generation_config)
    if generation_config is not None:
        # the call's generation settings (and those set above) go into its config, as generate() would put them:
        # passing both is deprecated from transformers 5.24 on (one warning per call)
        generation_config = copy.deepcopy(generation_config)
        kwargs = generation_config.update(**kwargs)
    padded = input_ids.repeat_interleave(len(rows) // input_ids.shape[0], dim=0)
    if together:
        mask = torch.zeros_like(padded)
        for b, row in enumerate(rows):
            mask[b, padded.shape[1] - row.shape[1]:] = 1
        return base.generate(padded, attention_mask=mask, generation_config=generation_config, **kwargs)
    results = [base.generate(row, generation_config=generation_config, streamer=streamer, **kwargs) for row in rows]
    return results[0] if len(results) == 1 else pad_batch(padded, rows, results, effective)
