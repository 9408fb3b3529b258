"""generate() features behave as the base's generate(): lengths, stopping, processors, batches, streamers,
dict outputs, sampling; unsupported options are refused with a message naming them."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, TextIteratorStreamer, TextStreamer
from transformers.generation.streamers import BaseStreamer

from helpers import (
    ARCHITECTURES,
    NEW_TOKENS,
    PAD,
    PROMPT_LEN,
    VOCAB,
    check_stats,
    fresh_model,
    get_base,
    get_prompt,
    install_oracle,
    reference,
)
from tiny_models import prompt_ids

FEATURE_ARCHS = ("llama", "gemma2", "gpt2")
DRAFTERS = ("untrained", "oracle")


def make_model(arch: str, drafter: str, references=None, **kwargs):
    """Heads that draft their untrained guesses, or the known continuation (so that drafts get accepted
    and a feature must work in the middle of multi-token steps)."""
    model = fresh_model(arch, "cerberus", num_heads=4, **kwargs)
    if drafter == "oracle":
        install_oracle(model, references if references is not None else [reference(arch, NEW_TOKENS + 8)])
    return model


def base_generate(arch: str, inputs: torch.Tensor, **kwargs):
    return get_base(arch).generate(inputs, do_sample=kwargs.pop("do_sample", False), **kwargs)


def new_tokens_of(arch: str) -> list[int]:
    return reference(arch)[0, PROMPT_LEN:].tolist()


# ---------------------------------------------------------------------------------------------- lengths
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 6, 7, 13])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_max_new_tokens_is_exact(arch, max_new_tokens, drafter):
    """Including limits that fall inside what a 4-token draft would cover."""
    model = make_model(arch, drafter)
    out = model.generate(get_prompt(arch), max_new_tokens=max_new_tokens)
    expected = base_generate(arch, get_prompt(arch), max_new_tokens=max_new_tokens)
    assert out.shape == (1, PROMPT_LEN + max_new_tokens)
    assert out.tolist() == expected.tolist()
    check_stats(model, max_new_tokens)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("max_length", [PROMPT_LEN + 1, PROMPT_LEN + 5, PROMPT_LEN + 12])
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_max_length_is_exact(arch, max_length, drafter):
    model = make_model(arch, drafter)
    out = model.generate(get_prompt(arch), max_length=max_length)
    assert out.shape == (1, max_length)
    assert out.tolist() == base_generate(arch, get_prompt(arch), max_length=max_length).tolist()


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_default_length_and_explicit_generation_config(arch):
    prompt = get_prompt(arch)
    model = make_model(arch, "oracle")
    # nothing said: the base's default max_length (20)
    assert model.generate(prompt).tolist() == base_generate(arch, prompt).tolist()
    config = GenerationConfig(max_new_tokens=9, do_sample=False, eos_token_id=None, pad_token_id=PAD)
    out = model.generate(prompt, generation_config=config)
    assert out.tolist() == get_base(arch).generate(prompt, generation_config=config).tolist()
    assert out.shape[1] == PROMPT_LEN + 9
    assert model.generate(input_ids=prompt, max_new_tokens=5).tolist() == reference(arch)[:, : PROMPT_LEN + 5].tolist()


# ---------------------------------------------------------------------------------------------- stopping
def eos_in_continuation(arch: str, at_least: int = 3) -> tuple[int, int]:
    """(token, index): a token of the reference continuation whose first occurrence is at index >= at_least."""
    new = new_tokens_of(arch)
    for i, token in enumerate(new):
        if i >= at_least and token not in new[:i]:
            return token, i
    raise AssertionError("no token to stop on")


def unused_token(arch: str) -> int:
    new = new_tokens_of(arch)
    return next(t for t in range(3, VOCAB) if t not in new)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_single_eos_stops_like_base(arch, drafter):
    eos, index = eos_in_continuation(arch)
    prompt = get_prompt(arch)
    expected = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    assert expected.shape[1] == PROMPT_LEN + index + 1 and expected[0, -1] == eos  # the base does stop there
    model = make_model(arch, drafter)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    assert out.tolist() == expected.tolist()
    check_stats(model, index + 1)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_eos_list_stops_on_any_of_them(arch, drafter):
    first, i = eos_in_continuation(arch, at_least=4)
    second, j = eos_in_continuation(arch, at_least=i + 2)
    prompt = get_prompt(arch)
    model = make_model(arch, drafter)
    for eos in ([unused_token(arch), second], [second, first], [first]):
        expected = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
        assert out.tolist() == expected.tolist()
        assert out.shape[1] == PROMPT_LEN + (i if first in eos else j) + 1


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_stop_strings(arch, drafter, tokenizer):
    token, index = eos_in_continuation(arch, at_least=5)
    stop = tokenizer.convert_ids_to_tokens(token)  # e.g. "w58"
    prompt = get_prompt(arch)
    expected = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, stop_strings=[stop], tokenizer=tokenizer)
    assert expected.shape[1] < PROMPT_LEN + NEW_TOKENS  # the stop string does stop the base early
    model = make_model(arch, drafter)
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, stop_strings=stop, tokenizer=tokenizer)
    assert out.tolist() == expected.tolist()
    # the model's generation config is not left holding the stop string
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS).tolist() == reference(arch).tolist()


def test_stop_strings_without_tokenizer_is_refused():
    model = make_model("llama", "untrained")
    with pytest.raises(ValueError, match="tokenizer"):
        model.generate(get_prompt("llama"), max_new_tokens=5, stop_strings=["w5"])


class BanToken(LogitsProcessor):
    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] = -float("inf")
        return scores


PROCESSOR_SETTINGS = {
    "repetition_penalty": lambda arch: dict(repetition_penalty=1.8),
    "no_repeat_ngram": lambda arch: dict(no_repeat_ngram_size=1),
    "custom_processor": lambda arch: dict(logits_processor=LogitsProcessorList([BanToken(new_tokens_of(arch)[2])])),
    "bad_words": lambda arch: dict(bad_words_ids=[[new_tokens_of(arch)[4]]]),
    "min_new_tokens": lambda arch: dict(min_new_tokens=eos_in_continuation(arch)[1] + 4,
                                        eos_token_id=eos_in_continuation(arch)[0]),
    "temperature_top_k_greedy": lambda arch: dict(temperature=0.5, top_k=5),  # no effect on greedy picks
}


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("setting", list(PROCESSOR_SETTINGS))
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_logits_processors(arch, setting, drafter):
    kwargs = PROCESSOR_SETTINGS[setting](arch)
    prompt = get_prompt(arch)
    expected = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, **kwargs)
    if setting != "temperature_top_k_greedy":
        assert expected.tolist() != reference(arch).tolist()  # the setting matters for this prompt
    longer = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS + 8, **kwargs)
    model = make_model(arch, drafter, references=[longer])
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, **kwargs)
    assert out.tolist() == expected.tolist()
    if drafter == "oracle":
        assert model.generation_stats.tau > 1.5


TREE_KINDS = {
    "chain": dict(draft_tree=None, dynamic_tree=None),
    "static": dict(draft_tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]], dynamic_tree=None),
    "dynamic": dict(dynamic_tree={"nodes": 7, "depth": 4, "top_k": 3}),
}


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("tree", list(TREE_KINDS))
@pytest.mark.parametrize("setting", ["repetition_penalty", "bad_words", "min_new_tokens"])
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_row_processors_over_every_tree_kind(arch, setting, tree, drafter):
    """generate()'s own row-wise processors (`loop.ROW_PROCESSORS`) are applied to every fed position at once, each
    node's row being the sequence followed by the drafted tokens on its path: greedy output stays plain generate()'s
    for chains, static trees and dynamic trees, drafts accepted or not."""
    kwargs = PROCESSOR_SETTINGS[setting](arch)
    prompt = get_prompt(arch)
    expected = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, **kwargs)
    assert expected.tolist() != reference(arch).tolist()
    longer = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS + 8, **kwargs)
    model = make_model(arch, drafter, references=[longer], gate_threshold=None, **TREE_KINDS[tree])
    assert model.generate(prompt, max_new_tokens=NEW_TOKENS, **kwargs).tolist() == expected.tolist()
    if drafter == "oracle":
        assert model.generation_stats.tau > 1.5


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_explicit_attention_mask(arch):
    prompt = get_prompt(arch)
    model = make_model(arch, "oracle")
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS)
    assert out.tolist() == reference(arch).tolist()


# ---------------------------------------------------------------------------------------------- batches
def padded_batch(lengths=(8, 5, 3), seed: int = 11):
    """Left-padded rows of different lengths and their attention mask."""
    width = max(lengths)
    ids = prompt_ids(seed, length=width, batch=len(lengths))
    mask = torch.ones_like(ids)
    for row, length in enumerate(lengths):
        ids[row, : width - length] = PAD
        mask[row, : width - length] = 0
    return ids, mask


def row_references(arch: str, ids: torch.Tensor, mask: torch.Tensor, extra: int = NEW_TOKENS + 8, **kwargs):
    refs = []
    for row, m in zip(ids, mask.bool()):
        refs.append(base_generate(arch, row[m][None], max_new_tokens=extra, **kwargs))
    return refs


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_left_padded_batch_equals_batched_base(arch, drafter):
    ids, mask = padded_batch()
    expected = base_generate(arch, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    model = make_model(arch, drafter, references=row_references(arch, ids, mask))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert out.tolist() == expected.tolist()
    stats = model.generation_stats
    rows_alone = row_references(arch, ids, mask, extra=NEW_TOKENS)
    assert stats.new_tokens == sum(r.shape[1] - int(m.sum()) for r, m in zip(rows_alone, mask))
    if drafter == "oracle":
        assert stats.tau > 1.5


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_batch_rows_stopping_at_different_times_are_padded_like_base(arch):
    ids, mask = padded_batch()
    refs = row_references(arch, ids, mask)
    # stop on a token that ends the first row early and leaves the others running longer
    first_row_new = refs[0][0, 8:].tolist()
    eos = next(t for i, t in enumerate(first_row_new) if i >= 2 and t not in first_row_new[:i])
    expected = base_generate(arch, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    assert (expected[0, ids.shape[1]:] == PAD).any()  # the first row did finish early and was padded
    model = make_model(arch, "oracle", references=refs)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_batch_without_attention_mask_infers_padding_like_base(arch):
    ids, mask = padded_batch()
    expected = base_generate(arch, ids, max_new_tokens=NEW_TOKENS)
    model = make_model(arch, "untrained")
    assert model.generate(ids, max_new_tokens=NEW_TOKENS).tolist() == expected.tolist()


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_batch_with_max_length(arch):
    """max_length counts the padded prompt width in a batch, as in the base's generate()."""
    ids, mask = padded_batch()
    max_length = ids.shape[1] + 12
    expected = base_generate(arch, ids, attention_mask=mask, max_length=max_length)
    model = make_model(arch, "untrained")
    out = model.generate(ids, attention_mask=mask, max_length=max_length)
    assert out.shape == expected.shape == (3, max_length)
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_batch_with_min_length(arch):
    """min_length, like max_length, counts the padded prompt width in a batch."""
    ids, mask = padded_batch()
    refs = row_references(arch, ids, mask)
    short_row_new = refs[2][0, 3:].tolist()  # the 3-token row
    eos, index = next((t, i) for i, t in enumerate(short_row_new) if i >= 2 and t not in short_row_new[:i])
    # In the batch, the short row may end at `index` (the sequence is then width + index long); alone,
    # it is 5 tokens shorter, and the same min_length would forbid that eos.
    min_length = ids.shape[1] + index
    expected = base_generate(arch, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                             min_length=min_length)
    model = make_model(arch, "untrained")
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, min_length=min_length)
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_batch_return_dict(arch):
    ids, mask = padded_batch()
    expected = base_generate(arch, ids, attention_mask=mask, max_new_tokens=10, return_dict_in_generate=True)
    out = make_model(arch, "untrained").generate(ids, attention_mask=mask, max_new_tokens=10,
                                                 return_dict_in_generate=True)
    assert out.sequences.tolist() == expected.sequences.tolist()


def test_right_padding_and_empty_rows_are_refused():
    ids, mask = padded_batch()
    model = make_model("llama", "untrained")
    with pytest.raises(ValueError, match="left padding"):
        model.generate(ids, attention_mask=mask.flip(-1), max_new_tokens=3)
    empty = mask.clone()
    empty[1] = 0
    with pytest.raises(ValueError, match="all padding"):
        model.generate(ids, attention_mask=empty, max_new_tokens=3)


def test_num_return_sequences():
    arch = "llama"
    prompt = get_prompt(arch)
    model = make_model(arch, "oracle")
    # greedy: refused exactly as the base refuses it
    with pytest.raises(ValueError, match="num_return_sequences"):
        base_generate(arch, prompt, max_new_tokens=5, num_return_sequences=2)
    with pytest.raises(ValueError, match="num_return_sequences"):
        model.generate(prompt, max_new_tokens=5, num_return_sequences=2)
    # sampling that can only pick the top token: every copy is the greedy output
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=1, num_return_sequences=3)
    assert out.tolist() == reference(arch).repeat(3, 1).tolist()
    # a batch of two prompts, two sequences each: rows come out grouped by prompt, as the base orders them
    ids, mask = padded_batch(lengths=(8, 5))
    expected = base_generate(arch, ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=1,
                             num_return_sequences=2)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=1, num_return_sequences=2)
    assert out.tolist() == expected.tolist()


# ---------------------------------------------------------------------------------------------- streamers
class Collector(BaseStreamer):
    def __init__(self):
        self.values: list[list[int]] = []
        self.ended = 0

    def put(self, value):
        assert self.ended == 0, "put after end"
        self.values.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_streamer_gets_prompt_then_every_token_once(arch, drafter):
    prompt = get_prompt(arch)
    model = make_model(arch, drafter)
    streamer = Collector()
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, streamer=streamer)
    assert streamer.values[0] == prompt[0].tolist()
    assert [t for value in streamer.values[1:] for t in value] == out[0, PROMPT_LEN:].tolist()
    assert streamer.ended == 1
    # the same calls as the base makes
    base_streamer = Collector()
    base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, streamer=base_streamer)
    assert streamer.values == base_streamer.values


def test_streamer_with_eos_stops_streaming():
    arch = "llama"
    eos, index = eos_in_continuation(arch)
    model = make_model(arch, "oracle")
    streamer = Collector()
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, eos_token_id=eos, streamer=streamer)
    streamed = [t for value in streamer.values[1:] for t in value]
    assert streamed == out[0, PROMPT_LEN:].tolist() and streamed[-1] == eos and len(streamed) == index + 1


@pytest.mark.parametrize("skip_prompt", [True, False])
def test_text_streamer_prints_what_the_base_prints(tokenizer, capsys, skip_prompt):
    arch = "llama"
    prompt = get_prompt(arch)
    model = make_model(arch, "oracle")
    out = model.generate(prompt, max_new_tokens=NEW_TOKENS, streamer=TextStreamer(tokenizer, skip_prompt=skip_prompt))
    printed = capsys.readouterr().out
    base_generate(arch, prompt, max_new_tokens=NEW_TOKENS, streamer=TextStreamer(tokenizer, skip_prompt=skip_prompt))
    assert printed == capsys.readouterr().out
    shown = out[0, PROMPT_LEN:] if skip_prompt else out[0]
    assert printed.strip() == tokenizer.decode(shown).strip()
    assert len(printed.split()) == shown.shape[0]


def test_text_iterator_streamer(tokenizer):
    arch = "gpt2"
    prompt = get_prompt(arch)
    model = make_model(arch, "oracle")
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("out", model.generate(prompt, max_new_tokens=NEW_TOKENS, streamer=streamer))
    )
    thread.start()
    text = "".join(streamer)
    thread.join(timeout=60)
    assert text.strip() == tokenizer.decode(result["out"][0, PROMPT_LEN:]).strip()
    assert result["out"].tolist() == reference(arch).tolist()


# ---------------------------------------------------------------------------------------------- dict outputs
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_scores_and_logits_match_base(arch, drafter):
    prompt = get_prompt(arch)
    kwargs = dict(max_new_tokens=NEW_TOKENS, return_dict_in_generate=True, output_scores=True, output_logits=True,
                  repetition_penalty=1.3)
    expected = base_generate(arch, prompt, **kwargs)
    longer = base_generate(arch, prompt, max_new_tokens=NEW_TOKENS + 8, repetition_penalty=1.3)
    model = make_model(arch, drafter, references=[longer])
    out = model.generate(prompt, **kwargs)
    assert out.sequences.tolist() == expected.sequences.tolist()
    generated = expected.sequences.shape[1] - PROMPT_LEN  # eos may come before NEW_TOKENS
    assert len(out.scores) == len(expected.scores) == generated
    assert len(out.logits) == len(expected.logits) == generated
    for mine, theirs in zip(out.scores, expected.scores):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(out.logits, expected.logits):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    # processed scores differ from raw logits here (repetition penalty), so both were really compared
    assert not all(torch.equal(s, l) for s, l in zip(out.scores, out.logits))


def test_return_dict_without_scores():
    arch = "qwen2"
    out = make_model(arch, "oracle").generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    assert out.sequences.tolist() == reference(arch).tolist()
    assert out.scores is None and out.logits is None


# ---------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_sampling_with_top_k_1_is_greedy(arch, drafter):
    out = make_model(arch, drafter).generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, do_sample=True, top_k=1)
    assert out.tolist() == reference(arch).tolist()


@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_sampling_smoke(arch):
    prompt = get_prompt(arch)
    model = make_model(arch, "untrained")
    outputs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.5, eos_token_id=None)
        assert out.shape == (1, PROMPT_LEN + NEW_TOKENS)
        assert out.dtype == torch.long
        assert torch.equal(out[:, :PROMPT_LEN], prompt)
        assert int(out.min()) >= 0 and int(out.max()) < VOCAB
        check_stats(model, NEW_TOKENS)
        outputs.append(out)
    assert outputs[0].tolist() != outputs[1].tolist()  # it does sample
    torch.manual_seed(0)
    again = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.5, eos_token_id=None)
    assert again.tolist() == outputs[0].tolist()  # and a seed makes it reproducible


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("arch", FEATURE_ARCHS)
def test_sampling_draws_what_the_base_draws_for_a_seed(arch, drafter):
    """Each emitted token is one multinomial draw from the distribution the base would sample from, in
    the same order, and drafting draws nothing: with the same seed the base and the model sample the
    same tokens (drafts accepted or not)."""
    prompt = get_prompt(arch)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=True, temperature=0.7, top_p=0.95, eos_token_id=None)
    torch.manual_seed(1234)
    expected = get_base(arch).generate(prompt, **kwargs)
    longer = torch.cat([expected, torch.full((1, 8), 3, device=expected.device)], dim=1)  # the oracle knows these samples
    model = make_model(arch, drafter, references=[longer])
    torch.manual_seed(1234)
    out = model.generate(prompt, **kwargs)
    assert out.tolist() == expected.tolist()
    if drafter == "oracle":
        assert model.generation_stats.tau > 1.5


# ---------------------------------------------------------------------------------------------- refusals
REFUSALS = {
    "beam search": (dict(num_beams=2), "[Bb]eam"),
    "assistant model": (dict(assistant_model="BASE"), "assistant_model"),
    "assistant early exit": (dict(assistant_early_exit=2), "assistant_early_exit"),
    "offloaded cache": (dict(cache_implementation="offloaded"), "offloaded"),
    "no cache": (dict(use_cache=False), "use_cache"),
    "custom_generate": (dict(custom_generate=lambda *a, **k: None), "custom_generate"),
    "inputs_embeds": (dict(inputs_embeds="EMBEDS"), "inputs_embeds"),
    "output_attentions": (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_unsupported_options_are_refused(case):
    arch = "llama"
    kwargs, message = REFUSALS[case]
    kwargs = dict(kwargs)
    if kwargs.get("assistant_model") == "BASE":
        kwargs["assistant_model"] = get_base(arch)
    if kwargs.get("inputs_embeds") == "EMBEDS":
        kwargs["inputs_embeds"] = get_base(arch).get_input_embeddings()(get_prompt(arch))
    with pytest.raises(ValueError, match=message):
        make_model(arch, "untrained").generate(get_prompt(arch), max_new_tokens=5, **kwargs)


def test_streamer_with_batch_is_refused():
    ids, mask = padded_batch()
    with pytest.raises(ValueError, match="streamer"):
        make_model("llama", "untrained").generate(ids, attention_mask=mask, max_new_tokens=3, streamer=Collector())


def test_scores_with_batch_are_refused():
    ids, mask = padded_batch()
    with pytest.raises(ValueError, match="output_scores"):
        make_model("llama", "untrained").generate(ids, attention_mask=mask, max_new_tokens=3,
                                                  return_dict_in_generate=True, output_scores=True)


def test_generate_leaves_configs_unchanged():
    """Per-call settings do not stick to the model's or the base's generation config."""
    arch = "llama"
    model = make_model(arch, "untrained")
    base = get_base(arch)
    before_model, before_base = model.generation_config.to_dict(), base.generation_config.to_dict()
    model.generate(get_prompt(arch), max_new_tokens=4, eos_token_id=5, repetition_penalty=1.2, do_sample=True)
    assert model.generation_config.to_dict() == before_model
    assert base.generation_config.to_dict() == before_base
    assert model.generation_config.do_sample is False
