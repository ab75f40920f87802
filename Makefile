# Two entry points for a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
WORKERS ?= 4

.PHONY: setup demo test lint bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/edgeroute demo --port $(PORT) --workers $(WORKERS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

test: lint
	$(VENV)/bin/pytest -q

bench: setup
	$(VENV)/bin/edgeroute bench policies
	$(VENV)/bin/edgeroute bench overhead
	$(VENV)/bin/edgeroute bench worker-capacity
