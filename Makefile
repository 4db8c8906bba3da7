# Two entry points on a fresh clone: `make repro` (install + rebuild the capstone report) and `make test`
# (everything; `make test-fast`: the unit tests on small fixtures, while you work).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install repro test test-fast bench check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

repro: $(STAMP)
	$(BIN)/dvc repro

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python -m agentrl bench

check: $(STAMP)
	$(BIN)/python -m agentrl check
