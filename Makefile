# Two entry points (README quick start): `make demo` runs the main job, `make test` the tests.
# Both create or reuse .venv and install torch from the pinned versions *before* the package, and
# pass the pins again with it, so pip never picks a torch by itself (nnunetv2 asks only for some torch).
# What the pins bring: from pip's default index on Linux, torch 2.14.1 is a CUDA build
# (2.14.1+cu130) with about 3.2 GB of nvidia-* wheels, a venv of about 6 GB. Where PyTorch's CPU
# index is reachable, the CPU-only build of the same versions (under 1 GB):
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (on a new .venv: the install runs once per setup.py, so `rm -rf .venv` to switch builds).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nnunet_dro_installed
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# empty: pip's configured index; a URL: torch and torchvision from that index only (--index-url)
TORCH_INDEX ?=

.PHONY: install lint test test-lab demo demo-full

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PINS)
	$(BIN)/python -m pip install -e ".[test]" $(TORCH_PINS)
	$(BIN)/python -c "import torch; print('installed torch', torch.__version__, f'(CUDA {torch.version.cuda} build)' if torch.version.cuda else '(CPU-only build)')"
	touch $(STAMP)

install: $(STAMP)

# ruff's rules of pyproject.toml (pyflakes F, import order I); it changes no file
lint: $(STAMP)
	$(BIN)/ruff check .

# one pytest worker per core (at most 4), whole test files per worker: tests/conftest.py
PYTEST := $(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadgroup --no-loadscope-reorder --durations=25

# the product's suite (target: at most 10 minutes on 2 cores); the lab tier is `make test-lab`
test: $(STAMP)
	$(PYTEST) -m "not lab"

# the lab's integration runs: benchmark, tutorial, demo, GPU check, the scripts (tests/conftest.py)
test-lab: $(STAMP)
	$(PYTEST) -m lab

# about 20 minutes on 2 cores: the workflow, and whether nnU-Net's budget sufficed (its last line)
demo: $(STAMP)
	$(BIN)/nnunet_dro demo --quick

# about an hour: 177 training cases, 120 epochs per arm (seed 0 of the benchmark's first budget)
demo-full: $(STAMP)
	$(BIN)/nnunet_dro demo
