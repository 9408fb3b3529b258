"""pytest configuration: import paths (the package is not pip-installed) and shared fixtures."""

from __future__ import annotations

import os
import sys

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # pytest-xdist's worker name (`make test` runs one per core)
if WORKER:
    # Each worker compiles into a cache of its own, a subfolder of inductor's (TORCHINDUCTOR_CACHE_DIR, or its default
    # under the temporary directory): inductor's cache is not safe for two processes writing at once.
    import getpass
    import tempfile

    shared = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                                        f"torchinductor_{getpass.getuser()}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(shared, WORKER)

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

# The tiny models are far too small for intra-op parallelism to pay: one thread is faster, and much
# faster when the machine is busy. (The real-model tests raise it again for their module.)
torch.set_num_threads(1)


def pytest_report_header(config) -> str:
    from tiny_models import DEVICE

    name = f" ({torch.cuda.get_device_name(DEVICE)})" if DEVICE.type == "cuda" else ""
    return f"tiny models on {DEVICE}{name} (set CERBERUS_TEST_DEVICE=cuda to run them on the GPU)"


@pytest.fixture(scope="session", autouse=True)
def _private_hf_home(tmp_path_factory):
    """Calibrations on first use (`cerberus_hf.calibration.first_use`) go to a Hugging Face home of the session's own,
    never to the user's cache (the tiny models carry no calibration positions, so they calibrate nothing on first use
    unless a test gives them some)."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
        yield


@pytest.fixture(scope="module")
def base():
    """A tiny random Llama, one per module, for the modules that do not build their own base."""
    from tiny_models import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="module")
def data_path(base, tmp_path_factory):
    """16 records in the distill format: random prompts and the module's base's own greedy answers."""
    from helpers import write_greedy_records

    return write_greedy_records(base, tmp_path_factory.mktemp("data") / "selfdistill.jsonl")


@pytest.fixture
def tokenizer():
    """The tiny word-level tokenizer ('w5 w17 ...'), able to serve stop_strings."""
    from tiny_models import tiny_tokenizer

    return tiny_tokenizer(stop_string_ready=True)
