"""`cerberus-hf calibrate` without --data: a drafter brought from elsewhere (imported, or an export loaded back) comes
without the base's answers it was trained on; the base answers prompts now, and the folder gets fitted settings and
calibration positions as a shipped one has."""

from __future__ import annotations

import json

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.calibration.statistics import POSITIONS_NAME
from cerberus_hf.hardware import HardwareKey
from cerberus_hf.testing import tiny_model
from cerberus_hf.tools.cli import main
from helpers import save_chat_base



def test_calibrate_without_data_answers_prompts_and_fits_the_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    base_folder = save_chat_base(tmp_path / "base")
    heads = tmp_path / "heads"
    CerberusForCausalLM.from_base(tiny_model("llama"), head_type="hydra", num_heads=3,
                                  base_model_name_or_path=str(base_folder)).save_pretrained(heads)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "turns": [f"w{5 + i} w{9 + i} w{20 + i}"]}) + "\n"
                               for i in range(6)))
    assert main(["calibrate", "--heads", str(heads), "--prompts", str(prompts), "--limit", "6", "--repeats", "1",
                 "--max-nodes", "6", "--dynamic-max-nodes", "6", "--dynamic-budgets", "--write"]) == 0
    assert "the base answers 6 prompts" in capsys.readouterr().out
    assert (heads / POSITIONS_NAME).is_file()
    loaded = CerberusForCausalLM.from_pretrained(heads)
    assert loaded.decoding_settings()["calibration"] == str(HardwareKey.of("cpu", torch.float32))
