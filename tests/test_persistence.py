"""Saving and loading head checkpoints: what is written, exact round trips, the Auto classes, remote code
without cerberus_hf installed, pipelines, and Hub ids served from an offline cache."""

from __future__ import annotations

import glob
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

import cerberus_hf
from cerberus_hf.remote_code import LOADING_CODE, custom_generate_code
from cerberus_hf import CerberusConfig, CerberusForCausalLM
from helpers import NEW_TOKENS, PROMPT_LEN, randomize_heads
from tiny_models import DEVICE, tiny_model, tiny_tokenizer, prompt_ids

ARCH = "llama"
HEADS_FILE = "cerberus_heads.safetensors"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cerberus_hf.__file__)))


@pytest.fixture(scope="module")
def base():
    """A private copy of the tiny base (saving may touch its config)."""
    return tiny_model(ARCH)


@pytest.fixture(scope="module")
def base_dir(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    base.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def build(base, base_dir, **kwargs) -> CerberusForCausalLM:
    kwargs.setdefault("num_heads", 3)
    model = CerberusForCausalLM.from_base(base, base_model_name_or_path=base_dir, **kwargs)
    randomize_heads(model, seed=5)
    return model


@pytest.fixture(scope="module")
def saved(base, base_dir, tmp_path_factory):
    """(model, folder): random cerberus heads with a gate, saved without a tokenizer: AutoTokenizer and pipeline()
    find the base's through the folder's stub."""
    model = build(base, base_dir, head_type="cerberus", gate_threshold=10.0)
    folder = str(tmp_path_factory.mktemp("heads"))
    model.save_pretrained(folder)
    return model, folder


def prompt() -> torch.Tensor:
    return prompt_ids(3, length=PROMPT_LEN)


def greedy(base, n: int = NEW_TOKENS) -> list:
    return base.generate(prompt(), max_new_tokens=n, do_sample=False).tolist()


def assert_same_heads(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


# ---------------------------------------------------------------------------------------------- what is written
def test_save_writes_heads_config_code_and_generation_config(saved, base_dir):
    model, folder = saved
    files = set(os.listdir(folder))
    assert {HEADS_FILE, "config.json", "generation_config.json"} <= files
    # the stubs that import the installed package (trust_remote_code) and transformers' custom_generate folder
    assert {"modeling_cerberus.py", "configuration_cerberus.py", "custom_generate"} <= files
    # never the base's weights
    weights = [f for f in files if f.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json"))]
    assert weights == [HEADS_FILE]

    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["model_type"] == "cerberus"
    assert config["architectures"] == ["CerberusForCausalLM"]
    assert config["auto_map"]["AutoConfig"] == "configuration_cerberus.CerberusConfig"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_cerberus.CerberusForCausalLM"
    assert config["base_model_name_or_path"] == base_dir
    assert config["base_model_type"] == ARCH
    assert (config["hidden_size"], config["vocab_size"]) == (32, 96)
    assert (config["head_type"], config["num_heads"], config["gate_threshold"]) == ("cerberus", 3, 10.0)

    generation = json.load(open(os.path.join(folder, "generation_config.json")))
    assert generation["do_sample"] is False
    base_generation = model.base.generation_config
    assert generation["eos_token_id"] == base_generation.eos_token_id
    assert generation["pad_token_id"] == base_generation.pad_token_id


def test_heads_file_holds_only_heads(saved):
    model, folder = saved
    path = os.path.join(folder, HEADS_FILE)
    with safe_open(path, framework="pt") as f:
        names = set(f.keys())
        tensors = {name: f.get_tensor(name) for name in names}
    assert names == set(model.heads.state_dict())
    assert all(name.startswith(("blocks.", "lm_heads.")) for name in names)
    head_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    base_bytes = sum(p.numel() * p.element_size() for p in model.base.parameters())
    assert head_bytes <= os.path.getsize(path) < head_bytes + 16_384  # tensors plus a small header
    assert os.path.getsize(path) < base_bytes / 2
    for name, tensor in model.heads.state_dict().items():
        assert torch.equal(tensors[name].to(tensor.device), tensor), name


def _assert_is_the_loading_code(folder: str, custom_generate: bool = True) -> None:
    """``folder`` holds the stub modules of `remote_code` and, with ``custom_generate``, its
    ``custom_generate/`` folder, exactly, and no other code: the package's code lives in the package."""
    code = sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.suffix in (".py", ".txt"))
    head_type = json.loads((Path(folder) / "config.json").read_text()).get("head_type", "cerberus")
    expected = {**LOADING_CODE, **(custom_generate_code(head_type) if custom_generate else {})}
    assert code == sorted(expected)
    for name, text in expected.items():
        assert (Path(folder) / name).read_text() == text, name
    for name in LOADING_CODE:  # each stub imports one name from the package, nothing relative
        imports = re.findall(r"^\s*(?:from|import)\s+(\S+)", expected[name], flags=re.M)
        assert imports == [f"cerberus_hf.{name[:-3]}"], (name, imports)


def test_saved_code_is_the_stubs_and_custom_generate(saved):
    """No package module is copied into a saved folder."""
    _assert_is_the_loading_code(saved[1])


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize(
    "kwargs",
    [dict(head_type="medusa"), dict(head_type="cerberus", num_layers=2), dict(head_type="medusa", head_projection="own"),
     dict(head_type="cerberus", draft_tree=[[0], [1], [0, 0], [1, 0], [0, 0, 0]], gate_threshold=0.0),
     dict(head_type="kangaroo", exit_layer=1, adapter_heads=1, adapter_head_dim=8, exit_confidence=0.3),
     dict(head_type="clover", adapter_heads=1, adapter_head_dim=8, context_window=5),
     dict(head_type="hydra", prefix_layer=True, adapter_heads=2, adapter_head_dim=8, context_window=5, head_dropout=0.2)],
    ids=["medusa", "cerberus-2-layers", "medusa-own-projection", "cerberus-tree-gate", "kangaroo", "clover",
         "hydra-prefix-dropout"],
)
def test_round_trip_with_given_base(base, base_dir, tmp_path, kwargs):
    model = build(base, base_dir, **kwargs)
    model.save_pretrained(tmp_path)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.base is base
    assert not loaded.training
    assert_same_heads(loaded.heads, model.heads)
    for key in ("head_type", "num_heads", "num_layers", "head_projection", "gate_threshold", "draft_tree",
                "exit_layer", "adapter_heads", "adapter_head_dim", "exit_confidence", "context_window", "prefix_layer",
                "head_dropout"):
        assert getattr(loaded.config, key) == getattr(model.config, key), key
    out = loaded.generate(prompt(), max_new_tokens=NEW_TOKENS)
    assert out.tolist() == model.generate(prompt(), max_new_tokens=NEW_TOKENS).tolist() == greedy(base)
    assert loaded.generation_stats.drafted_tokens == model.generation_stats.drafted_tokens


def test_load_without_base_loads_the_named_base(saved, base):
    model, folder = saved
    loaded = CerberusForCausalLM.from_pretrained(folder).to(DEVICE)  # loaded where from_pretrained puts it: the CPU
    assert loaded.base is not base
    base_state, loaded_state = base.state_dict(), loaded.base.state_dict()
    assert base_state.keys() == loaded_state.keys()
    assert all(torch.equal(base_state[k], loaded_state[k]) for k in base_state)
    assert_same_heads(loaded.heads, model.heads)
    assert loaded.generate(prompt(), max_new_tokens=NEW_TOKENS).tolist() == greedy(base)
    assert loaded.generation_config.do_sample is False


def test_loading_keywords_apply_to_the_base(saved, base_dir):
    _, folder = saved
    loaded = CerberusForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(DEVICE)
    assert {p.dtype for p in loaded.base.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in loaded.heads.parameters()} == {torch.bfloat16}
    base16 = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16).to(DEVICE)
    assert loaded.generate(prompt(), max_new_tokens=12).tolist() == greedy(base16, 12)


def test_saved_generation_config_is_used(base, base_dir, tmp_path):
    model = build(base, base_dir)
    model.generation_config.max_new_tokens = 7
    model.save_pretrained(tmp_path)
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.generation_config.max_new_tokens == 7
    assert loaded.generate(prompt()).shape[1] == PROMPT_LEN + 7


def test_auto_classes_without_trust_remote_code(saved, base):
    model, folder = saved
    config = AutoConfig.from_pretrained(folder)
    assert type(config) is CerberusConfig
    loaded = AutoModelForCausalLM.from_pretrained(folder).to(DEVICE)
    assert type(loaded) is CerberusForCausalLM
    assert_same_heads(loaded.heads, model.heads)
    assert loaded.generate(prompt(), max_new_tokens=NEW_TOKENS).tolist() == greedy(base)
    given = AutoModelForCausalLM.from_pretrained(folder, base_model=base)
    assert given.base is base


# ---------------------------------------------------------------------------------------------- subprocesses
def run_python(script: str, cwd: str, env_extra: dict, *args: str, timeout: int = 240) -> dict:
    """Run ``script`` in a fresh interpreter; it writes a JSON result to the path given as its last arg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "HF_", "TRANSFORMERS_"))}
    env.update({"HF_HOME": os.path.join(cwd, "hf_home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(env_extra)
    script_path = os.path.join(cwd, "script.py")
    result_path = os.path.join(cwd, "result.json")
    with open(script_path, "w") as f:
        f.write(textwrap.dedent(script))
    proc = subprocess.run([sys.executable, script_path, *args, result_path], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.load(open(result_path))


def kept_on_path(entry: str, repo_root: str) -> bool:
    """Whether the blocked-import script keeps ``sys.path`` entry ``entry``: it drops the working directory and the
    checkout (cerberus_hf's source), compared as resolved paths, but keeps a site-packages or dist-packages folder in
    it (``python -m venv .venv`` inside the checkout holds torch and transformers there)."""
    if entry in ("", "."):
        return False
    path, root = Path(entry).resolve(), Path(repo_root).resolve()
    if not path.is_relative_to(root):
        return True
    return any(part in ("site-packages", "dist-packages") for part in path.relative_to(root).parts)


BLOCKED_SCRIPT = "from pathlib import Path\n\n\n" + inspect.getsource(kept_on_path) + textwrap.dedent("""
    import json, sys

    class BlockCerberus:  # as if cerberus_hf were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "cerberus_hf" or name.startswith("cerberus_hf."):
                raise ImportError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, BlockCerberus())
    repo_root = sys.argv[3]
    sys.path[:] = [p for p in sys.path if kept_on_path(p, repo_root)]
    import torch
    from transformers import AutoModelForCausalLM

    heads_dir, base_dir, _, result_path = sys.argv[1:5]
    errors = {}
    try:
        AutoModelForCausalLM.from_pretrained(heads_dir, trust_remote_code=True)
    except ImportError as error:
        errors["auto"] = str(error)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    try:
        base.generate(torch.tensor([[5, 17, 33]]), custom_generate=heads_dir, trust_remote_code=True)
    except ImportError as error:
        errors["custom_generate"] = str(error)
    json.dump(errors, open(result_path, "w"))
""")


def test_remote_code_without_cerberus_hf_says_what_to_install(saved, base_dir, tmp_path):
    """Without the package, trust_remote_code and custom_generate stop at transformers' import check, which names it."""
    result = run_python(BLOCKED_SCRIPT, str(tmp_path), {}, saved[1], base_dir, ROOT)
    assert set(result) == {"auto", "custom_generate"}
    for message in result.values():
        assert "pip install cerberus_hf" in message, message


def test_path_filter_keeps_a_venv_inside_the_checkout(tmp_path):
    """The blocked-import script drops the checkout from sys.path as a path, not as a string prefix: a venv inside the
    checkout (``python -m venv .venv``) or beside it (``<checkout>-venv``) keeps its site-packages, or torch is gone."""
    repo = tmp_path / "main"
    (repo / "cerberus_hf").mkdir(parents=True)
    (tmp_path / "link").symlink_to(repo)
    kept = {entry: kept_on_path(str(entry), str(repo)) for entry in [
        repo / ".venv/lib/python3.11/site-packages",
        repo / ".venv/lib/python3.11/site-packages/extra",
        repo / "env/lib/python3/dist-packages",
        tmp_path / "main-venv/lib/python3.11/site-packages",
        tmp_path / "main2",
        repo,
        repo / "cerberus_hf",
        repo / "tests",
        tmp_path / "link",
        repo / "cerberus_hf/..",
    ]}
    assert [entry for entry, keep in kept.items() if keep] == list(kept)[:5]
    assert not kept_on_path("", str(repo)) and not kept_on_path(".", str(repo))


REMOTE_CODE_SCRIPT = """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, pipeline

    heads_dir, base_dir, result_path = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(heads_dir, trust_remote_code=True)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    prompt = torch.tensor([PROMPT])
    out = model.generate(prompt, max_new_tokens=NEW)
    ref = base.generate(prompt, max_new_tokens=NEW, do_sample=False)
    custom = base.generate(prompt, max_new_tokens=NEW, custom_generate=heads_dir, trust_remote_code=True)
    from cerberus_hf.custom_generate import heads_for

    pipe = pipeline("text-generation", model=heads_dir, trust_remote_code=True)
    text = pipe("w5 w17 w33 w41 w8 w60", max_new_tokens=12, return_full_text=False)[0]["generated_text"]
    base_pipe = pipeline("text-generation", model=base_dir)
    base_text = base_pipe("w5 w17 w33 w41 w8 w60", max_new_tokens=12, return_full_text=False,
                          do_sample=False)[0]["generated_text"]
    json.dump({
        "model_module": type(model).__module__,
        "pipe_model_module": type(pipe.model).__module__,
        "out": out.tolist(), "ref": ref.tolist(), "custom": custom.tolist(),
        "steps": model.generation_stats.steps, "drafted": model.generation_stats.drafted_tokens,
        "custom_drafted": heads_for(base, heads_dir).generation_stats.drafted_tokens,
        "pipe_steps": pipe.model.generation_stats.steps,
        "text": text, "base_text": base_text,
    }, open(result_path, "w"))
"""


def test_remote_code_runs_the_installed_package(saved, base_dir, tmp_path):
    """AutoModelForCausalLM(..., trust_remote_code=True), pipeline() and base.generate(custom_generate=...) in a fresh
    interpreter that never imported cerberus_hf: the stubs load the installed package, which decodes exactly."""
    _, folder = saved
    script = REMOTE_CODE_SCRIPT.replace("PROMPT", str(prompt()[0].tolist())).replace("NEW", str(NEW_TOKENS))
    result = run_python(script, str(tmp_path), {"PYTHONPATH": ROOT}, folder, base_dir)
    assert result["model_module"] == result["pipe_model_module"] == "cerberus_hf.modeling_cerberus"
    assert result["out"] == result["ref"] == result["custom"]
    assert len(result["out"][0]) == PROMPT_LEN + NEW_TOKENS
    assert result["drafted"] > 0 and result["steps"] >= 1  # it decoded with drafts
    assert result["custom_drafted"] > 0
    assert result["pipe_steps"] >= 1  # the pipeline went through the wrapper's generate()
    assert result["text"] == result["base_text"]
    assert len(result["text"].split()) >= 6


def test_a_folder_of_heads_tokenizes_with_its_base(saved, base, base_dir, tmp_path):
    """AutoTokenizer on a folder of heads, which holds no tokenizer, gives the base's (through the folder's stub,
    with trust_remote_code); a tokenizer the user saved in the folder, before or after the heads, is kept."""
    from transformers import AutoTokenizer

    model, folder = saved
    ours, theirs = AutoTokenizer.from_pretrained(folder, trust_remote_code=True), AutoTokenizer.from_pretrained(base_dir)
    assert type(ours) is type(theirs) and ours.get_vocab() == theirs.get_vocab()
    assert ours("w5 w17 w33").input_ids == theirs("w5 w17 w33").input_ids
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    own = tiny_tokenizer()
    own.add_tokens(["<own>"])
    own.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    assert "<own>" in AutoTokenizer.from_pretrained(tmp_path).get_vocab()


def test_refreshing_a_folder_keeps_the_release_its_family_needs(base, base_dir, tmp_path):
    """`refresh-folder` on an EAGLE-3 folder keeps its custom_generate requirement on the release that runs EAGLE-3
    (it wrote the first release's, which cannot run it)."""
    from cerberus_hf.tools.cli import main

    build(base, base_dir, head_type="eagle3").save_pretrained(tmp_path)
    assert main(["refresh-folder", str(tmp_path)]) == 0
    _assert_is_the_loading_code(str(tmp_path))
    assert (tmp_path / "custom_generate" / "requirements.txt").read_text() == "cerberus-hf>=0.3.0\n"


def test_custom_generate_on_a_loaded_base(saved, base):
    """base.generate(custom_generate=<heads>, trust_remote_code=True) equals the same call without it, greedy and
    sampled with one seed, reuses one wrapper around the very base, and needs trust_remote_code."""
    from cerberus_hf.custom_generate import generate as custom_generate_function, heads_for

    _, folder = saved
    out = base.generate(prompt(), max_new_tokens=NEW_TOKENS, custom_generate=folder, trust_remote_code=True)
    assert out.tolist() == greedy(base)
    wrapper = heads_for(base, folder)
    assert wrapper.base is base and wrapper.generation_stats.drafted_tokens > 0
    assert heads_for(base, folder) is wrapper
    with pytest.raises(ValueError, match="trust_remote_code"):
        base.generate(prompt(), max_new_tokens=NEW_TOKENS, custom_generate=folder, trust_remote_code=False)
    with pytest.raises(ValueError, match="custom_generate="):
        custom_generate_function(base, prompt())


def test_a_folder_of_the_previous_layout_loads_and_refreshes(saved, base, tmp_path, capsys):
    """A folder saved by 0.1 (package modules copied into it) loads with from_pretrained, with a note that names the
    command to refresh it; ``cerberus-hf refresh-folder`` swaps the copies for the stubs and keeps the rest."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    from cerberus_hf.tools.cli import main

    old = tmp_path / "old"
    shutil.copytree(saved[1], old)
    shutil.rmtree(old / "custom_generate")
    for name in ("tokenization_cerberus.py", "tokenizer_config.json"):  # newer than 0.1
        (old / name).unlink()
    for name in ("decoding_loop.py", "drafters_base.py", "compat.py", "modeling_cerberus.py"):
        (old / name).write_text("raise ImportError('a frozen 0.1 copy')\n")
    (old / "notes.py").write_text("# the user's own file\n")
    with CaptureLogger(logging.get_logger("cerberus_hf.modeling_cerberus")) as captured:
        loaded = CerberusForCausalLM.from_pretrained(old, base_model=base)
    assert f"cerberus-hf refresh-folder {old}" in captured.out
    assert "4 modules" in captured.out
    assert loaded.generate(prompt(), max_new_tokens=NEW_TOKENS).tolist() == greedy(base)

    assert main(["refresh-folder", str(old)]) == 0
    assert "removed 4 copied modules, wrote 6 files" in capsys.readouterr().out
    (old / "notes.py").unlink()
    _assert_is_the_loading_code(str(old))
    for name in (HEADS_FILE, "config.json", "generation_config.json"):
        assert (old / name).read_bytes() == (Path(saved[1]) / name).read_bytes(), name
    refreshed = AutoModelForCausalLM.from_pretrained(old, base_model=base, trust_remote_code=True)
    assert type(refreshed) is CerberusForCausalLM
    assert refreshed.generate(prompt(), max_new_tokens=NEW_TOKENS).tolist() == greedy(base)


HUB_SCRIPT = """
    import json, sys
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from cerberus_hf import CerberusForCausalLM

    heads_file, result_path = sys.argv[1:3]
    model = CerberusForCausalLM.from_pretrained("org-heads/tiny-cerberus")
    base = AutoModelForCausalLM.from_pretrained("org-base/tiny-llama")
    prompt = torch.tensor([PROMPT])
    out = model.generate(prompt, max_new_tokens=NEW)
    ref = base.generate(prompt, max_new_tokens=NEW, do_sample=False)
    saved = load_file(heads_file)
    state = model.heads.state_dict()
    same_heads = saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in saved)
    same_base = all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), model.base.state_dict().values()))
    auto = AutoModelForCausalLM.from_pretrained("org-heads/tiny-cerberus")
    json.dump({"out": out.tolist(), "ref": ref.tolist(), "same_heads": same_heads, "same_base": same_base,
               "auto_type": type(auto).__name__, "auto_out": auto.generate(prompt, max_new_tokens=NEW).tolist()},
              open(result_path, "w"))
"""


def fake_hub_repo(cache: str, repo_id: str, commit: str) -> str:
    """The snapshot folder of ``repo_id`` in a Hub cache laid out as huggingface_hub lays it out."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(snapshot)
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    return snapshot


def test_hub_ids_load_offline_from_the_cache(base, tmp_path):
    cache = str(tmp_path / "hub")
    base_snapshot = fake_hub_repo(cache, "org-base/tiny-llama", "a" * 40)
    base.save_pretrained(base_snapshot)
    heads_snapshot = fake_hub_repo(cache, "org-heads/tiny-cerberus", "0123456789abcdef0123456789abcdef01234567")
    model = CerberusForCausalLM.from_base(base, head_type="medusa", num_heads=3,
                                          base_model_name_or_path="org-base/tiny-llama")
    randomize_heads(model, seed=9)
    model.save_pretrained(heads_snapshot)
    work = tmp_path / "work"
    work.mkdir()
    script = HUB_SCRIPT.replace("PROMPT", str(prompt()[0].tolist())).replace("NEW", str(NEW_TOKENS))
    result = run_python(script, str(work), {"HF_HUB_CACHE": cache, "PYTHONPATH": ROOT},
                        os.path.join(heads_snapshot, HEADS_FILE))
    assert result["same_heads"] and result["same_base"]
    assert result["out"] == result["ref"] == greedy(base)
    assert result["auto_type"] == "CerberusForCausalLM"
    assert result["auto_out"] == result["ref"]


SHIPPED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "model_cards", "*", "config.json")))


@pytest.mark.parametrize("config_path", SHIPPED, ids=[os.path.basename(os.path.dirname(p)) for p in SHIPPED])
def test_shipped_folders_hold_no_package_code(config_path):
    """A shipped folder holds weights, config, calibration, card and the stubs of `remote_code`, not a copy of the
    package (after changing the stubs: cerberus-hf refresh-folder model_cards/*/)."""
    _assert_is_the_loading_code(os.path.dirname(config_path))
