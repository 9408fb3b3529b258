"""Clear errors for bad checkpoints, mismatched bases and invalid settings, raised before anything heavy
is loaded."""

from __future__ import annotations

import json
import math
import os
import random
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

import cerberus_hf.modeling_cerberus as modeling
from cerberus_hf import CerberusConfig, CerberusForCausalLM
from cerberus_hf.checkpoint import resolve_file
from cerberus_hf.blocks.gate import EntropyGate
from cerberus_hf.errors import UserError
from helpers import get_prompt
from tiny_models import CONFIGS, tiny_model

HEADS_FILE = "cerberus_heads.safetensors"


def variant_base(**overrides):
    """A tiny llama with some config fields changed."""
    kwargs = dict(CONFIGS["llama"])
    kwargs.pop("model_type")
    kwargs.update(overrides)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **kwargs)).eval()


def save_heads(base, folder, **kwargs) -> str:
    kwargs.setdefault("num_heads", 3)
    CerberusForCausalLM.from_base(base, **kwargs).save_pretrained(folder)
    return str(folder)


def edit_config(folder, **changes) -> None:
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    config.update(changes)
    json.dump(config, open(path, "w"))


@pytest.fixture
def base_loads(monkeypatch):
    """Records every attempt to load a base model from a config."""
    calls = []
    real = modeling.load_base_model

    def spy(config, **kwargs):
        calls.append(config.base_model_name_or_path)
        return real(config, **kwargs)

    monkeypatch.setattr(modeling, "load_base_model", spy)
    return calls


# ---------------------------------------------------------------------------------------------- wrong base
def test_hidden_size_mismatch(base, tmp_path):
    folder = save_heads(base, tmp_path)
    with pytest.raises(ValueError, match=r"hidden size 32 \(heads\) vs 48 \(base\)"):
        CerberusForCausalLM.from_pretrained(folder, base_model=variant_base(hidden_size=48))


def test_vocab_size_mismatch(base, tmp_path):
    folder = save_heads(base, tmp_path)
    with pytest.raises(ValueError, match=r"vocabulary size 96 \(heads\) vs 128 \(base\)"):
        CerberusForCausalLM.from_pretrained(folder, base_model=variant_base(vocab_size=128))


def test_both_sizes_mismatch_are_named(base, tmp_path):
    folder = save_heads(base, tmp_path)
    with pytest.raises(ValueError, match=r"hidden size 32 \(heads\) vs 48 \(base\).*vocabulary size 96 \(heads\) vs 128"):
        CerberusForCausalLM.from_pretrained(folder, base_model=variant_base(hidden_size=48, vocab_size=128))


def test_model_type_mismatch(base, tmp_path):
    folder = save_heads(base, tmp_path)
    with pytest.raises(ValueError, match=r"model type 'llama' \(heads\) vs 'qwen2' \(base\)"):
        CerberusForCausalLM.from_pretrained(folder, base_model=tiny_model("qwen2"))


def test_missing_base_is_named(base, tmp_path):
    missing = str(tmp_path / "no_such_base")
    folder = save_heads(base, tmp_path / "heads", base_model_name_or_path=missing)
    with pytest.raises(OSError, match=re.escape(missing)) as error:
        CerberusForCausalLM.from_pretrained(folder)
    assert "base_model=" in str(error.value)  # says what to do about it


def test_config_naming_no_base(base, tmp_path):
    folder = save_heads(base, tmp_path)
    edit_config(folder, base_model_name_or_path=None)
    with pytest.raises(ValueError, match="names no base model"):
        CerberusForCausalLM.from_pretrained(folder)


# ---------------------------------------------------------------------------------------------- bad files
def test_truncated_heads_file(base, tmp_path, base_loads):
    folder = save_heads(base, tmp_path)
    path = os.path.join(folder, HEADS_FILE)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(OSError, match="not a readable safetensors file") as error:
        CerberusForCausalLM.from_pretrained(folder)
    assert HEADS_FILE in str(error.value)
    assert base_loads == []


@pytest.mark.parametrize("garbage", [b"", b"not a safetensors file at all" * 10, random.Random(0).randbytes(2048),
                                     (2**62).to_bytes(8, "little") + b"{}"])
def test_garbage_heads_file(base, tmp_path, base_loads, garbage):
    folder = save_heads(base, tmp_path)
    open(os.path.join(folder, HEADS_FILE), "wb").write(garbage)
    with pytest.raises(OSError, match="not a readable safetensors file"):
        CerberusForCausalLM.from_pretrained(folder)
    assert base_loads == []


class _Payload:
    """Unpickling this creates a folder: proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pickle_only_checkpoint_is_refused(base, tmp_path, base_loads):
    folder = save_heads(base, tmp_path / "heads")
    model = CerberusForCausalLM.from_base(base, num_heads=3)
    os.remove(os.path.join(folder, HEADS_FILE))
    marker = str(tmp_path / "unpickled")
    torch.save({**model.heads.state_dict(), "payload": _Payload(marker)}, os.path.join(folder, "pytorch_model.bin"))
    with pytest.raises(OSError, match="pickle") as error:
        CerberusForCausalLM.from_pretrained(folder, base_model=base)
    assert "pytorch_model.bin" in str(error.value)
    assert "safetensors" in str(error.value)
    assert not os.path.exists(marker), "the pickle was loaded"
    assert base_loads == []


def test_folder_without_heads_file(base, tmp_path):
    folder = save_heads(base, tmp_path)
    os.remove(os.path.join(folder, HEADS_FILE))
    with pytest.raises(OSError, match=HEADS_FILE):
        CerberusForCausalLM.from_pretrained(folder, base_model=base)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_layers=2), r"does not match its config.*missing blocks\.0\.1\."),
        (dict(num_heads=4), r"does not match its config.*missing blocks\.3\."),
        (dict(num_heads=2), r"does not match its config.*unexpected blocks\.2\."),
        (dict(head_type="medusa"), r"does not match its config.*blocks\.1\.0\.linear\.weight has shape \(32, 64\), config implies \(32, 32\)"),
        (dict(head_projection="own"), r"does not match its config.*missing lm_heads\.0\.weight"),
    ],
    ids=["num_layers", "more_heads", "fewer_heads", "head_type", "projection"],
)
def test_heads_file_disagreeing_with_config(base, tmp_path, base_loads, changes, message):
    folder = save_heads(base, tmp_path, head_type="cerberus")
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=message):
        CerberusForCausalLM.from_pretrained(folder, base_model=base)
    assert base_loads == []


def test_heads_are_checked_before_the_base_is_loaded(base, tmp_path, base_loads):
    """A bad heads file next to a config naming a base that does not exist: the heads' error is the one
    raised, and no base load is attempted."""
    folder = save_heads(base, tmp_path / "heads", base_model_name_or_path=str(tmp_path / "no_such_base"))
    open(os.path.join(folder, HEADS_FILE), "wb").write(b"\x00" * 100)
    with pytest.raises(OSError, match="not a readable safetensors file"):
        CerberusForCausalLM.from_pretrained(folder)
    edit_config(folder, num_layers=3)
    save_heads(base, tmp_path / "other")
    os.replace(os.path.join(tmp_path / "other", HEADS_FILE), os.path.join(folder, HEADS_FILE))
    with pytest.raises(ValueError, match="does not match its config"):
        CerberusForCausalLM.from_pretrained(folder)
    assert base_loads == []


def test_wrong_config_type(base, tmp_path):
    folder = save_heads(base, tmp_path)
    with pytest.raises(TypeError, match="CerberusConfig"):
        CerberusForCausalLM.from_pretrained(folder, config=LlamaConfig(), base_model=base)


# ---------------------------------------------------------------------------------------------- invalid settings
def test_unknown_head_type(base, tmp_path):
    with pytest.raises(ValueError, match="Unknown head_type 'eagle'"):
        CerberusForCausalLM.from_base(base, head_type="eagle")
    folder = save_heads(base, tmp_path)
    edit_config(folder, head_type="eagle")
    with pytest.raises(ValueError, match="Unknown head_type 'eagle'"):
        CerberusForCausalLM.from_pretrained(folder, base_model=base)


def test_unknown_head_projection(base):
    with pytest.raises(ValueError, match="Unknown head_projection 'tied'"):
        CerberusForCausalLM.from_base(base, head_projection="tied")


@pytest.mark.parametrize("field", ["num_heads", "num_layers"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_invalid_head_counts(base, field, value):
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 1"):
        CerberusForCausalLM.from_base(base, **{field: value})


def test_nan_gate_threshold_is_refused_when_configured(base):
    with pytest.raises(ValueError, match="NaN"):
        CerberusConfig(hidden_size=32, vocab_size=96, gate_threshold=float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        CerberusForCausalLM.from_base(base, gate_threshold=math.nan)


def test_config_fields_with_a_fixed_set_of_values_refuse_others():
    with pytest.raises(ValueError, match="needs the draft vocabulary"):
        CerberusConfig(hidden_size=32, vocab_size=96, draft_vocab_trained=True)
    with pytest.raises(ValueError, match="true or false"):
        CerberusConfig(hidden_size=32, vocab_size=96, draft_vocab_size=8, draft_vocab_trained="yes")
    with pytest.raises(ValueError, match="Unknown state_source 'logits'"):
        CerberusConfig(hidden_size=32, vocab_size=96, state_source="logits")


def test_nan_gate_threshold_is_refused_per_call(base):
    model = CerberusForCausalLM.from_base(base)
    with pytest.raises(ValueError, match="NaN"):
        model.generate(get_prompt("llama"), max_new_tokens=3, gate_threshold=float("nan"))


@pytest.mark.parametrize(
    "tree, message",
    [([[0, 0]], "no parent path"), ([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "only 3 heads"), ([[0], [-1]], "invalid"),
     ([], "at least one path")],
    ids=["orphan", "too_deep", "negative_rank", "empty"],
)
def test_invalid_draft_tree(base, tree, message):
    with pytest.raises(ValueError, match=message):
        CerberusForCausalLM.from_base(base, num_heads=3, draft_tree=tree)
    if tree:  # (an empty per-call tree means "no tree": the chain)
        model = CerberusForCausalLM.from_base(base, num_heads=3)
        with pytest.raises(ValueError, match=message):
            model.generate(get_prompt("llama"), max_new_tokens=3, draft_tree=tree)


def test_unknown_gate_signal(base):
    with pytest.raises(ValueError, match="Unknown gate_signal 'perplexity'"):
        CerberusForCausalLM.from_base(base, gate_signal="perplexity")


# ---------------------------------------------------------------------------------------------- not numbers
def test_non_numeric_gate_threshold_is_refused(base):
    message = "gate_threshold must be a number or None, got 'high'"
    with pytest.raises(ValueError, match=message):
        EntropyGate("high")
    with pytest.raises(ValueError, match="gate_threshold must be a number or None, got True"):
        EntropyGate(True)
    with pytest.raises(ValueError, match=message):
        CerberusConfig(hidden_size=32, vocab_size=96, gate_threshold="high")
    with pytest.raises(ValueError, match=message):
        CerberusForCausalLM.from_base(base).generate(get_prompt("llama"), max_new_tokens=3, gate_threshold="high")


@pytest.mark.parametrize("field, value, message", [
    ("exit_confidence", "high", "exit_confidence must be a number, got 'high'"),
    ("exit_confidence", None, "exit_confidence must be a number, got None"),
    ("exit_confidence", 1.5, r"exit_confidence must be a probability in \[0, 1\], got 1.5"),
    ("head_dropout", "0.2", "head_dropout must be a number, got '0.2'"),
    ("max_matching_ngram_size", 0, "max_matching_ngram_size must be an integer >= 1, got 0"),
    ("prompt_lookup_num_tokens", "5", "prompt_lookup_num_tokens must be an integer >= 1, got '5'"),
])
def test_config_numbers_of_the_wrong_type_or_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        CerberusConfig(hidden_size=32, vocab_size=96, **{field: value})


@pytest.mark.parametrize("option, value, message", [
    ("prompt_lookup_num_tokens", -1, "prompt_lookup_num_tokens must be an integer >= 0 or None, got -1"),
    ("prompt_lookup_num_tokens", 2.5, "prompt_lookup_num_tokens must be an integer >= 0 or None, got 2.5"),
    ("prompt_lookup_num_tokens", "3", "prompt_lookup_num_tokens must be an integer >= 0 or None, got '3'"),
    ("max_matching_ngram_size", 0, "max_matching_ngram_size must be an integer >= 1 or None, got 0"),
    ("max_matching_ngram_size", -2, "max_matching_ngram_size must be an integer >= 1 or None, got -2"),
    ("exit_confidence", "high", "exit_confidence must be a number or None, got 'high'"),
    ("exit_confidence", 1.5, r"exit_confidence must be in \[0, 1\], got 1.5"),
    ("exit_confidence", math.nan, "exit_confidence must be a number or None, not NaN"),
])
def test_generate_refuses_bad_numbers_in_one_line(base, option, value, message):
    model = CerberusForCausalLM.from_base(base)
    with pytest.raises(ValueError, match=message) as error:
        model.generate(get_prompt("llama"), max_new_tokens=3, **{option: value})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("option, value, says", [
    ("dynamic_tree", {"nodes": 4}, ["dynamic_tree is missing 'depth'", "e.g. dynamic_tree={'nodes': 16, 'depth': 3"]),
    ("dynamic_tree", "wide", ["dynamic_tree must be a dict", "got 'wide'", "e.g. dynamic_tree={"]),
    ("dynamic_tree", {"nodes": 4, "depth": "2"}, ["dynamic_tree depth must be an integer >= 1, got '2'", "e.g. "]),
    ("dynamic_tree", {"nodes": 4, "depth": 2, "width": 3}, ["dynamic_tree has unknown keys ['width']", "e.g. "]),
    ("rescoring", {"weight": 0.5}, ["rescoring is missing 'nodes', 'depth'", "e.g. rescoring={'nodes': 16, "]),
    ("rescoring", [5, 3], ["rescoring must be a dict, a Rescoring or None", "got [5, 3]", "e.g. rescoring={"]),
    ("rescoring", {"nodes": 4, "depth": 2, "weight": "high"}, ["rescoring weight must be a number >= 0", "e.g. "]),
    ("draft_tree", "abc", ["draft_tree must be a list of paths", "got 'abc'", "e.g. draft_tree=[[0], [0, 0], [1]]"]),
    ("draft_tree", [0, 1], ["draft_tree must be a list of paths", "got [0, 1]", "e.g. draft_tree=[["]),
    ("draft_tree", [[0], [0.5]], ["draft_tree must be a list of paths", "ranks (integers >= 0)"]),
    ("draft_tree", [[0, 1]], ["draft_tree path [0, 1] has no parent path [0]", "e.g. draft_tree=[["]),
    ("typical_acceptance", {"epsilon": 0.1}, ["typical_acceptance must be True, False or a TypicalAcceptance",
                                              "e.g. typical_acceptance=TypicalAcceptance("]),
], ids=["dynamic_missing_key", "dynamic_not_a_dict", "dynamic_wrong_type", "dynamic_unknown_key",
        "rescoring_missing_keys", "rescoring_not_a_dict", "rescoring_wrong_type", "tree_string", "tree_flat",
        "tree_float_rank", "tree_orphan", "typical_dict"])
def test_generate_refuses_a_bad_option_in_one_line_with_an_example(base, option, value, says):
    """A malformed dict or tree option is refused before decoding, as one `UserError` that names the option, says
    what is wrong and shows a valid value."""
    model = CerberusForCausalLM.from_base(base, num_heads=3)
    with pytest.raises(UserError) as error:
        model.generate(get_prompt("llama"), max_new_tokens=3, **{option: value})
    message = str(error.value)
    assert "\n" not in message and all(part in message for part in says), message


def test_a_bad_value_in_a_saved_config_names_the_file(base, tmp_path):
    folder = save_heads(base, tmp_path)
    edit_config(folder, gate_threshold="high")
    with pytest.raises(UserError, match=re.escape(os.path.join(folder, "config.json")) +
                       ": gate_threshold must be a number or None, got 'high'"):
        CerberusForCausalLM.from_pretrained(folder, base_model=base)


# ---------------------------------------------------------------------------------------------- where a checkpoint is
def test_folder_without_config_is_refused(base, tmp_path):
    """transformers would read a default config from a folder without config.json (then fail far away)."""
    (tmp_path / "empty").mkdir()
    for load in (CerberusConfig.from_pretrained, lambda p: CerberusForCausalLM.from_pretrained(p, base_model=base)):
        with pytest.raises(OSError, match=re.escape(f"no config.json in {tmp_path / 'empty'}")):
            load(str(tmp_path / "empty"))


def test_path_that_is_no_folder_nor_hub_id(base, tmp_path):
    missing = str(tmp_path / "no_such_heads")
    for load in (CerberusConfig.from_pretrained, lambda p: CerberusForCausalLM.from_pretrained(p, base_model=base)):
        with pytest.raises(OSError, match=re.escape(f"no folder or Hub id {missing}")):
            load(missing)
    with pytest.raises(OSError, match=re.escape(f"no folder or Hub id {missing}")):
        resolve_file(missing, "config.json")
    (tmp_path / "file").write_text("{}")
    with pytest.raises(OSError, match="is a file, not a folder or Hub id"):
        resolve_file(str(tmp_path / "file"), "config.json")
