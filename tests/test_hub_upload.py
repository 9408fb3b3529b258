"""push_to_hub goes through huggingface_hub's create_repo and upload_folder with the right files
(the network call itself is replaced: nothing leaves this machine)."""

from __future__ import annotations

import os

from huggingface_hub import HfApi
from safetensors.torch import load_file

from helpers import fresh_model


class _Repo:
    repo_id = "someone/heads"


def test_push_to_hub_uploads_heads_config_code_and_card(tmp_path, monkeypatch, tokenizer):
    seen = {}

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        seen["create"] = (repo_id, private, exist_ok)
        return _Repo()

    def upload_folder(self, repo_id, folder_path, commit_message=None, revision=None, create_pr=False, **kwargs):
        seen["upload"] = (repo_id, commit_message, revision, create_pr)
        seen["files"] = sorted(os.listdir(folder_path))
        seen["card"] = open(os.path.join(folder_path, "README.md")).read()
        seen["heads"] = sorted(load_file(os.path.join(folder_path, "cerberus_heads.safetensors")))
        return "https://example.invalid/commit"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    card = tmp_path / "card.md"
    card.write_text("---\nlibrary_name: cerberus-hf\n---\n# heads\n")
    model = fresh_model("llama", "medusa", num_heads=2)
    model.push_to_hub("heads", private=True, model_card=card, tokenizer=tokenizer, commit_message="first")
    assert seen["create"] == ("heads", True, True)
    assert seen["upload"] == ("someone/heads", "first", None, False)
    for name in ("cerberus_heads.safetensors", "config.json", "generation_config.json", "modeling_cerberus.py",
                 "configuration_cerberus.py", "README.md", "tokenizer.json"):
        assert name in seen["files"], seen["files"]
    assert seen["card"].startswith("---\nlibrary_name: cerberus-hf")
    assert seen["heads"] and all(k.startswith("blocks.") for k in seen["heads"])
