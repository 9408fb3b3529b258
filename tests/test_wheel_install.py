"""The package as a user gets it: a wheel built from this checkout, installed in a fresh virtual environment outside
it, where every default a command reads must come from the package itself (`cerberus_hf.files.packaged_file`).

The environment's own packages (torch, transformers) are reached through a ``.pth`` file naming this interpreter's
site-packages, added after the wheel is installed: ``venv --system-site-packages`` would reach the base interpreter's,
not this environment's, where this runs from a virtual environment. The checkout itself, installed editable there, is
not imported: a ``.pth`` line adds a folder to the path without running the editable install's finder, and the
commands run from a folder outside the checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from tokenizers import models

import cerberus_hf
from cerberus_hf.modeling_cerberus import CerberusForCausalLM
from tiny_models import tiny_model, tiny_tokenizer

ROOT = Path(cerberus_hf.__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "cerberus_hf")  # what the build reads
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"

# Run inside the installed environment: where the package is, and every default path its commands read.
CHECK = """
import argparse, json, sys
from pathlib import Path

import cerberus_hf
from cerberus_hf.tools import bench, cli, demo
from cerberus_hf.training import data
from transformers import AutoTokenizer

parser = cli.build_parser()
commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
defaults = {f"{name} --{action.dest}": action.default for name, command in commands.items()
            for action in command._actions if isinstance(action.default, str) and Path(action.default).is_absolute()}
defaults.update(PACKAGED_PROMPTS=data.PACKAGED_PROMPTS, MT_BENCH_QUESTIONS=data.MT_BENCH_QUESTIONS,
                DEFAULT_PROMPTS=bench.DEFAULT_PROMPTS)
package = Path(cerberus_hf.__file__).parent
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps({
    "package": str(package),
    "data": sorted(p.name for p in (package / "data").iterdir()),
    "defaults": {name: [str(path), Path(path).is_file()] for name, path in defaults.items()},
    "bench_prompts": len(bench.load_bench_prompts(bench.DEFAULT_PROMPTS)),
    "demo_prompts": [ids.shape[1] for ids in bench.encode_prompts(tokenizer, list(demo.DEMO_PROMPTS))],
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment holding the wheel of this checkout, with the environment's packages beside it."""
    folder = tmp_path_factory.mktemp("wheel")
    (folder / "src").mkdir()
    for name in SOURCES:  # built from a copy: the build writes build/ and *.egg-info beside its sources
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, folder / "src" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, folder / "src" / name)
    # the environment's setuptools where it has one (no index needed), else pip fetches it for the build
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", *offline, str(folder / "src"), "-w", str(folder / "dist")],
                   check=True, cwd=folder)
    wheel = next((folder / "dist").glob("cerberus_hf-*.whl"))
    environment = folder / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps",
                    "--no-index", str(wheel)], check=True, cwd=folder)
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True, cwd=folder).stdout.strip()
    Path(own, "environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return environment


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """A tiny random Llama and its word-level tokenizer in a folder, with a chat template (bench encodes chats) and
    every word it does not know read as 'w3' (not as padding): MT-Bench's English is a prompt of real tokens."""
    folder = tmp_path_factory.mktemp("base")
    tiny_model("llama").save_pretrained(folder)
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.model = models.WordLevel(vocab=tokenizer.get_vocab(), unk_token="w3")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def run_installed(installed: Path, *command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` (a script of the environment's bin/ and its arguments) run in ``cwd``, outside the checkout."""
    environment = {**os.environ, "HF_HOME": str(cwd / "hf_home"), "HF_HUB_OFFLINE": "1",  # no cache or Hub of the user's
                   "OMP_NUM_THREADS": "1"}  # one thread, as every test runs (conftest.py)
    done = subprocess.run([str(installed / "bin" / command[0]), *command[1:]], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_every_default_a_command_reads_is_in_the_installed_package(installed, tiny_base, tmp_path):
    found = json.loads(run_installed(installed, "python", "-c", CHECK, str(tiny_base), cwd=tmp_path).stdout)
    package = Path(found["package"])
    assert package.is_relative_to(installed), f"imported {package}, not the wheel's copy"
    assert found["data"] == sorted(p.name for p in (ROOT / "cerberus_hf" / "data").iterdir())  # all shipped
    assert {"bench --prompts", "distill --prompts", "DEFAULT_PROMPTS"} <= set(found["defaults"])
    for name, (path, exists) in found["defaults"].items():
        assert exists and Path(path).is_relative_to(package / "data"), f"{name}: {path}"
    assert found["bench_prompts"] == 80 and len(found["demo_prompts"]) == 4 and min(found["demo_prompts"]) > 0


def test_bench_runs_from_the_wheel_on_the_packaged_mt_bench_questions(installed, tiny_base, tmp_path):
    heads = CerberusForCausalLM.from_base(tiny_model("llama"), head_type="hydra", num_heads=2,
                                          base_model_name_or_path=str(tiny_base))
    heads.save_pretrained(tmp_path / "heads")
    result = tmp_path / "bench.json"
    run_installed(installed, "cerberus-hf", "bench", "--base", str(tiny_base), "--heads", str(tmp_path / "heads"),
                  "--limit", "1", "--max-new-tokens", "4", "--no-prompt-lookup", "--no-packed-peer",
                  "--json", str(result), cwd=tmp_path)
    figures = json.loads(result.read_text())
    assert Path(figures["prompts_file"]).is_relative_to(installed)
    assert Path(figures["prompts_file"]).name == "mt_bench_questions.jsonl" and figures["n_prompts"] == 1
    assert [row["identical"] for row in figures["methods"]] == [1.0, 1.0]
