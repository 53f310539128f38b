# Two commands do all set-up on a fresh machine:
#   make demo   -> quick standard vs canonical comparison on WikiText-2 (CPU)
#   make test   -> the test suite (all of it: tests/unit and tests/e2e; the hf-train extra too: peft, accelerate,
#                  lm-eval, for docs/transformers.md's tests)
#   make test-fast -> the unit tests not marked slow (a minute on an idle 2-core CPU)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= $(if $(IATTN_DATA_DIR),$(IATTN_DATA_DIR),../shared/data)
# pip arguments that install torch when the venv has none (always pinned: an unpinned torch pulls
# several GB of CUDA wheels). What the default gives depends on where pip looks: on Linux x86-64
# PyPI serves the CUDA build; a machine with a local CPU wheel (our CI) gets that. For the CPU build
# from the PyTorch index: make test TORCH_PIP="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP ?= torch==2.13.0

.PHONY: setup demo test test-fast test-gpu lint clean mutation mutation-sample

$(BIN)/iattn: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# Install the pinned torch first when none is present (see TORCH_PIP above).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_PIP)
	$(BIN)/pip install -q -e ".[hf,dev,hf-train]"
	# triton (the wide-head kernel and its interpreter tests) where a wheel exists (Linux x86-64); best effort,
	# with --no-deps so it never pulls another torch: its tests skip without it
	-$(BIN)/python -c "import triton" 2>/dev/null || $(BIN)/pip install -q --no-deps "triton==3.9.0"
	touch $(BIN)/iattn

# Remember the data folder for the user (like HF_HOME), so every README command finds it afterwards
# without IATTN_DATA_DIR: `iattn data where` shows it, `iattn data forget` drops it.
setup: $(BIN)/iattn
	@if [ -d "$(DATA_DIR)" ]; then $(BIN)/iattn data remember "$(DATA_DIR)"; \
	else echo "no data folder at $(DATA_DIR): set DATA_DIR=/path (or IATTN_DATA_DIR), or pip install 'iattention[data]' to download"; fi

demo: setup
	IATTN_DATA_DIR=$(DATA_DIR) $(BIN)/iattn compare --preset cpu-quick --out runs/demo

test: setup
	$(BIN)/ruff check src tests
	IATTN_DATA_DIR=$(DATA_DIR) $(BIN)/python -m pytest -n 2

# The unit layer without the tests marked slow: the quick loop while editing (CI runs `make test`).
test-fast: setup
	IATTN_DATA_DIR=$(DATA_DIR) $(BIN)/python -m pytest tests/unit -m "not slow"

# CUDA-only checks (tests/gpu/: they skip without a CUDA device): the wide-head kernel on the device, a tiny
# training on CUDA, eval agreeing with the CPU, cached generation. On a GPU machine, with a CUDA torch:
#   make test-gpu TORCH_PIP="torch==2.13.0"
test-gpu: setup
	IATTN_DATA_DIR=$(DATA_DIR) $(BIN)/python -m pytest tests/gpu -m gpu -rs

# Mutation testing of the core ([tool.mutmut] in pyproject.toml; scores in tests/mutation/SCORES.md).
# Slow (thousands of mutants), so not part of `make test` or CI. One module at a time:
#   make mutation MUTANTS='iattention.train.schedule*'     (default: every configured module)
# Niced, one child by default (MUTMUT_CHILDREN=2 on an otherwise idle 2-core machine): the tests of each
# mutant run in seconds, the whole core takes hours on 2 cores.
MUTANTS ?=
MUTMUT_CHILDREN ?= 1
mutation: setup
	$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q -e ".[mutation]"
	IATTN_DATA_DIR=$(DATA_DIR) nice -n 5 $(BIN)/mutmut run --max-children $(MUTMUT_CHILDREN) $(MUTANTS)
	$(BIN)/mutmut results --all true | $(BIN)/python tests/mutation/summarize.py

# A seeded random sample of each large module's mutants (tests/mutation/sample.py), for a machine where the
# whole core takes too long: the schedule's 41 mutants first (that run also generates every module's mutants).
PER_MODULE ?= 50
SAMPLE_MODULES ?= symmetry,checkpoint,attention,model
SAMPLE_SEED ?= 0
# e.g. SAMPLE_SEED=1 EXCLUDE_SEEDS=0: a fresh sample, disjoint from seed 0's
EXCLUDE_SEEDS ?=
mutation-sample: setup
	$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q -e ".[mutation]"
	IATTN_DATA_DIR=$(DATA_DIR) nice -n 5 $(BIN)/mutmut run --max-children $(MUTMUT_CHILDREN) 'iattention.train.schedule*'
	IATTN_DATA_DIR=$(DATA_DIR) nice -n 5 $(BIN)/mutmut run --max-children $(MUTMUT_CHILDREN) $$($(BIN)/mutmut results --all true | \
	    $(BIN)/python tests/mutation/sample.py --per-module $(PER_MODULE) --modules $(SAMPLE_MODULES) --seed $(SAMPLE_SEED) --exclude-seeds "$(EXCLUDE_SEEDS)")
	$(BIN)/mutmut results --all true | $(BIN)/python tests/mutation/summarize.py

clean:
	rm -rf $(VENV) runs
