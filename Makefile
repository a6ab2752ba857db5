# specrag: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck pytest services clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to the CPU build that lies on local disk (see pyproject.toml).
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

services:
	@scripts/ensure-services.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

pytest: venv services
	HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -ra $(PYTEST_ARGS)

test: lint typecheck pytest

demo: venv
	HF_HUB_OFFLINE=1 $(PY) scripts/demo.py

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
