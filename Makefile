# Tidelog: every target sets up what it needs from a fresh clone, then does its job.
SHELL   := /bin/bash
PYTHON  ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.tidelog-installed

.PHONY: venv run test test-fast bench clean

venv: $(STAMP)

# Re-runs only when pyproject.toml changes (or the venv is missing).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[platform,dev]'
	@touch $@

run: venv
	$(BIN)/tidelog demo

test: venv
	$(BIN)/python -m pytest

test-fast: venv
	$(BIN)/python -m pytest -m 'not slow'

bench: venv
	@$(BIN)/tidelog bench  # stdout: only the JSON lines

clean:
	rm -rf $(VENV) run-data bench-data .pytest_cache
