"""Drafters that read a window of verified states (Clover's augmenting block, Hydra++'s prefix layer): the window is
the same in decoding, training and calibration; Clover's heads."""

from __future__ import annotations

import pytest
import torch

from cerberus_hf.drafters.base import capture_lm_head_input, context_windows
from cerberus_hf.drafters.layers import AttentionAdapter
from cerberus_hf.decoding.drafting import StepDrafts

from helpers import (ARCHITECTURES, NEW_TOKENS, PROMPT_LEN, fresh_model, get_base, get_prompt, install_oracle,
                     randomize_heads, reference)
from tiny_models import DEVICE

WINDOWED = ["clover", "hydra+prefix"]


@pytest.mark.parametrize("family", WINDOWED)
def test_fresh_windowed_drafter_guesses_the_base_next_token_at_every_depth(family):
    """A fresh drafter is harmless: whatever the window and the tokens, every depth guesses the token the base
    itself predicts from its newest state (the identity, up to scale, on ``h_t``)."""
    model = fresh_model("llama", family, num_heads=3, context_window=4)
    heads = model.heads
    generator = torch.Generator().manual_seed(0)
    window = torch.randn(2, 4, model.config.hidden_size, generator=generator).to(DEVICE)
    next_tokens = torch.randint(0, model.config.vocab_size, (2, 4), generator=generator).to(DEVICE)
    valid = torch.tensor([[True] * 4, [False, False, True, True]], device=DEVICE)
    expected = model.base.get_output_embeddings()(window[:, -1]).argmax(-1)
    read = heads.contextualize(window, next_tokens, valid)
    logits = heads(read, torch.randint(0, model.config.vocab_size, (2, 3), generator=generator).to(DEVICE))  # [2, heads, V]
    assert torch.equal(logits.argmax(-1), expected[:, None].expand(2, 3))


def test_padded_window_equals_the_short_window():
    """Training pads a window that reaches past its record's start; the masked keys change nothing."""
    adapter = AttentionAdapter(16, 2, 4)
    torch.nn.init.normal_(adapter.o_proj.weight, std=0.3)
    x = torch.randn(1, 5, 16)
    short = adapter(x[:, 2:], torch.arange(3), queries=1)[0]
    mask = torch.tensor([[False, False, True, True, True]])
    padded = adapter(x, torch.arange(5), key_mask=mask, queries=1)[0]
    torch.testing.assert_close(padded, short)
    assert short.shape == (1, 1, 16)
    full = adapter(x, torch.arange(5))[0]
    torch.testing.assert_close(adapter(x, torch.arange(5), queries=1)[0], full[:, -1:])


def test_context_windows_stop_at_the_first_row():
    index, valid = context_windows(torch.tensor([0, 3, 9]), torch.tensor([0, 2, 5]), 3)
    assert index.tolist() == [[0, 0, 0], [3, 2, 3], [7, 8, 9]]
    assert valid.tolist() == [[False, False, True], [False, True, True], [True, True, True]]


@pytest.mark.parametrize("family", WINDOWED)
def test_the_window_is_read_and_only_the_window(family):
    model = fresh_model("llama", family, randomize=True, seed=3, num_heads=2, context_window=3)
    heads = model.heads
    hidden = torch.randn(1, 5, model.config.hidden_size).to(DEVICE)
    tokens = torch.randint(0, model.config.vocab_size, (1, 5)).to(DEVICE)
    valid = torch.ones(1, 3, dtype=torch.bool, device=DEVICE)
    read = heads.contextualize(hidden[:, 2:], tokens[:, 2:], valid)
    changed = hidden.clone()
    changed[0, 2] += 1.0  # inside the window
    assert not torch.allclose(heads.contextualize(changed[:, 2:], tokens[:, 2:], valid), read)
    other_token = tokens.clone()
    other_token[0, 3] = (other_token[0, 3] + 1) % model.config.vocab_size  # a token that followed a state in it
    # Clover mixes each state with the token after it; Hydra's prefix layer reads the states alone
    mixes_tokens = not torch.allclose(heads.contextualize(hidden[:, 2:], other_token[:, 2:], valid), read)
    assert mixes_tokens == (family == "clover")


@pytest.mark.parametrize("family", WINDOWED)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_decoding_reads_the_window_that_training_and_calibration_read(arch, family):
    """What the heads read at each step of decoding (kept across acceptance and rollback by `ContextState`)
    equals `Drafter.heads_inputs` over the finished sequence with the window starting at the prompt's last
    state: the stored-state path that training and calibration take."""
    model = fresh_model(arch, family, num_heads=3, context_window=4)
    randomize_heads(model, seed=7, std=0.05)
    # drafts right at some depths and wrong at others, so steps keep and drop drafted positions variously
    install_oracle(model, [reference(arch, NEW_TOKENS + 8)], corrupt=lambda p, k: (p + 2 * k) % 3 == 0)
    heads = model.heads
    seen = []
    start = heads.start

    def recording(base, cache):
        state = start(base, cache)
        heads_input = state.heads_input

        def recorded(input_ids, hidden):
            read = heads_input(input_ids, hidden)
            seen.append(read[0].clone())
            return read

        state.heads_input = recorded
        return state

    heads.start = recording
    out = model.generate(get_prompt(arch), max_new_tokens=NEW_TOKENS, prompt_lookup_num_tokens=0)
    assert out.tolist() == reference(arch).tolist()
    with torch.no_grad(), capture_lm_head_input(get_base(arch)) as captured:
        get_base(arch)(out)
    rows = torch.arange(out.shape[1], device=out.device)
    expected = heads.heads_inputs(captured["hidden"][0], torch.cat([out[0, 1:], out[0, -1:]]),
                                  rows.clamp(max=PROMPT_LEN - 1), rows)
    steps = model.generation_stats.tokens_per_step
    # the step emitting tokens [n, n + s) drafted from the state at position n - 2, after the first one
    positions, n = [], PROMPT_LEN + 1
    for emitted in steps[1:]:
        positions.append(n - 2)
        n += emitted
    assert len(seen) >= len(positions) > 3 and len(set(steps[1:])) > 1
    for read, position in zip(seen, positions):
        torch.testing.assert_close(read, expected[position], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", WINDOWED)
def test_calibration_draft_time_pays_for_the_window(family):
    from cerberus_hf.calibration.measure import measure_draft_time

    model = fresh_model("llama", family, num_heads=3, context_window=4)
    calls = []
    real = type(model.heads).read_window
    type(model.heads).read_window = lambda self, *a: calls.append(a[0].shape) or real(self, *a)
    try:
        measure_draft_time(model, repeats=2)
    finally:
        type(model.heads).read_window = real
    assert len(calls) == 2 and all(shape[1] == 4 for shape in calls)


def test_state_refuses_a_sequence_it_was_not_told_about():
    model = fresh_model("llama", "clover", num_heads=2, context_window=3)
    state = model.heads.start(model.base, None)
    hidden = torch.randn(1, 6, model.config.hidden_size).to(DEVICE)
    with pytest.raises(RuntimeError, match="observe"):
        state.heads_input(torch.zeros(1, 7, dtype=torch.long, device=DEVICE), hidden[:, -1])
    state.observe({"hidden": hidden}, None)
    state.heads_input(torch.zeros(1, 7, dtype=torch.long, device=DEVICE), hidden[:, -1])
    state.observe({"hidden": hidden[:, :3]}, [0, 1])
    with pytest.raises(RuntimeError, match="observe"):
        state.heads_input(torch.zeros(1, 8, dtype=torch.long, device=DEVICE), hidden[:, -1])
    StepDrafts(model.heads, state.heads_input(torch.zeros(1, 9, dtype=torch.long, device=DEVICE), hidden[:, -1]), 0)


def test_window_starts_are_the_rows_records_first_rows_empty_records_included():
    from cerberus_hf.training.hidden_cache import HiddenStateCache

    offsets = torch.tensor([0, 3, 3, 7, 7, 7, 10, 12])
    cache = HiddenStateCache(hidden=torch.zeros(12, 4), tokens=torch.zeros(12, dtype=torch.long), teacher_ids=None,
                             teacher_logprobs=None, record_ids=[str(i) for i in range(7)], record_offsets=offsets)
    lengths = offsets[1:] - offsets[:-1]
    assert cache.first_rows(torch.arange(12)).tolist() == torch.repeat_interleave(offsets[:-1], lengths).tolist()
    assert cache.first_rows(torch.tensor([11, 3, 9])).tolist() == [10, 3, 7]
