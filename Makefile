# Two commands do all set-up on a fresh machine:
#   make demo   -> quick standard vs canonical comparison on WikiText-2 (CPU)
#   make test   -> the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= $(if $(IATTN_DATA_DIR),$(IATTN_DATA_DIR),../shared/data)

.PHONY: setup demo test lint clean

$(BIN)/iattn: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# Install the CPU build of torch first when none is present; an unpinned torch
	# would pull several GB of CUDA wheels.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[hf,dev]"
	touch $(BIN)/iattn

setup: $(BIN)/iattn

demo: setup
	IATTN_DATA_DIR=$(DATA_DIR) $(BIN)/iattn compare --preset cpu-quick --out runs/demo

test: setup
	$(BIN)/ruff check src tests
	IATTN_DATA_DIR=$(DATA_DIR) $(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs
