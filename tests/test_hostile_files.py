"""Every file a checkpoint folder holds is checked before the base loads: a draft vocabulary out of range or with
repeats, tensors of the wrong kind or with NaN, a calibration entry generate() could not use, an unreadable n-gram
file. Each gives one error naming the file and the problem, and nothing is loaded."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.hardware import HardwareKey
from test_errors import HEADS_FILE, base_loads, save_heads  # noqa: F401 - a fixture
from tiny_models import VOCAB


def rewrite_heads(folder: str, **tensors: torch.Tensor) -> str:
    path = os.path.join(folder, HEADS_FILE)
    state = load_file(path)
    state.update(tensors)
    save_file(state, path)
    return path


def write_calibration(folder: str, entry: dict) -> str:
    path = os.path.join(folder, "generation_config.json")
    config = json.load(open(path))
    config["cerberus_calibration"] = {str(HardwareKey.of("cpu", torch.float32)): entry}
    json.dump(config, open(path, "w"))
    return path


@pytest.mark.parametrize("ids, problem", [
    ([5, VOCAB, 7], "outside"),
    ([5, -1, 7], "outside"),
    ([5, 9, 5], "twice"),
])
def test_a_draft_vocabulary_is_checked_on_load(base, tmp_path, base_loads, ids, problem):  # noqa: F811
    model = CerberusForCausalLM.from_base(base, num_heads=3)
    model.set_draft_vocab(torch.tensor([5, 9, 7]))
    model.save_pretrained(tmp_path)
    path = rewrite_heads(str(tmp_path), draft_vocab=torch.tensor(ids))
    with pytest.raises(ValueError, match=problem) as raised:
        CerberusForCausalLM.from_pretrained(tmp_path)
    assert path in str(raised.value) and "\n" not in str(raised.value)
    assert base_loads == []


def test_set_draft_vocab_refuses_repeats(base):  # noqa: F811
    model = CerberusForCausalLM.from_base(base, num_heads=2)
    with pytest.raises(ValueError, match="twice"):
        model.set_draft_vocab(torch.tensor([4, 4, 6]))


@pytest.mark.parametrize("tensor, problem", [
    (lambda w: w.to(torch.int32), "config implies a floating dtype"),
    (lambda w: w.clone().fill_(float("nan")), "NaN"),
    (lambda w: w.clone().fill_(float("inf")), "NaN or infinite"),
])
def test_weights_of_the_wrong_kind_are_refused(base, tmp_path, base_loads, tensor, problem):  # noqa: F811
    folder = save_heads(base, tmp_path)
    name = next(k for k in load_file(os.path.join(folder, HEADS_FILE)) if k.endswith("weight"))
    path = rewrite_heads(folder, **{name: tensor(load_file(os.path.join(folder, HEADS_FILE))[name])})
    with pytest.raises(ValueError, match=problem) as raised:
        CerberusForCausalLM.from_pretrained(folder)
    assert path in str(raised.value) and name in str(raised.value)
    assert base_loads == []


@pytest.mark.parametrize("entry, problem", [
    ({"draft_tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}, "4 deep but there are only 3 heads"),
    ({"draft_tree": [[0, 1]]}, "no parent path"),
    ({"gate_threshold": "high"}, "gate_threshold"),
    ({"gate_signal": "loudness"}, "gate signal"),
    ({"dynamic_tree": {"nodes": 0, "depth": 2, "top_k": 2}}, "nodes must be an integer"),
    ({"tree_kind": "forest"}, "tree_kind"),
    ({"prompt_lookup_num_tokens": -2}, "prompt_lookup_num_tokens"),
    ({"packed_weights": "sometimes"}, "packed_weights must be true, false, 'multi-row' or null"),
    ({"packed_weights": 1}, "packed_weights must be"),
    ({"rescoring": {"nodes": 4, "depth": 9, "top_k": 2, "candidates": 3, "weight": 1.0}}, "depth 9 exceeds"),
    ({"strict": {"draft_tree": [[-1]]}}, r"\(strict\).*ranks >= 0"),
    ("fast", "must be a mapping"),
])
def test_a_bad_calibration_entry_is_refused_on_load(base, tmp_path, base_loads, entry, problem):  # noqa: F811
    folder = save_heads(base, tmp_path)
    path = write_calibration(folder, entry)
    with pytest.raises(ValueError, match=problem) as raised:
        CerberusForCausalLM.from_pretrained(folder)
    assert path in str(raised.value) and "cpu/float32" in str(raised.value) and "\n" not in str(raised.value)
    assert base_loads == []


def test_a_good_calibration_entry_loads(base, tmp_path):  # noqa: F811
    folder = save_heads(base, tmp_path)
    write_calibration(folder, {"draft_tree": [[0], [1], [0, 0]], "gate_threshold": 2.5, "tree_kind": "static",
                               "packed_weights": "multi-row", "strict": {"draft_tree": [[0]], "gate_threshold": None}})
    model = CerberusForCausalLM.from_pretrained(folder, base_model=base)
    settings = model.decoding_settings(device="cpu", dtype=torch.float32)
    assert settings["draft_tree"] == [[0], [1], [0, 0]] and settings["packed_weights"] == "multi-row"


@pytest.mark.parametrize("content", [b"", b"\x00" * 40, b"not an n-gram file at all"])
def test_an_unreadable_ngram_file_is_refused_before_the_base_loads(base, tmp_path, base_loads, content):  # noqa: F811
    folder = save_heads(base, tmp_path)
    path = os.path.join(folder, "ngram.safetensors")
    open(path, "wb").write(content)
    with pytest.raises(OSError, match="not a readable n-gram file") as raised:
        CerberusForCausalLM.from_pretrained(folder)
    assert path in str(raised.value)
    assert base_loads == []


def test_a_broken_link_to_an_optional_file_is_refused_before_the_base_loads(base, tmp_path, base_loads):  # noqa: F811
    """A folder copied without what its n-gram link pointed to (the shipped Medusa folder links Cerberus's) must not
    load as a folder with no n-gram: its calibrated rescored tree would then silently fall back to a static one."""
    folder = save_heads(base, tmp_path / "heads")
    path = os.path.join(folder, "ngram.safetensors")
    os.symlink(os.path.join("..", "elsewhere", "ngram.safetensors"), path)
    with pytest.raises(FileNotFoundError, match="is a link to .*which does not exist") as raised:
        CerberusForCausalLM.from_pretrained(folder)
    assert path in str(raised.value)
    assert base_loads == []
