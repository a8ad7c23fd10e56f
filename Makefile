# Two entry points on a fresh machine (see README):  make demo   |   make test
# TORCH_SPEC picks the torch build; torch==2.13.0 is the CPU wheel on this project's machines.
# Elsewhere on a CPU-only Linux box add PyTorch's CPU index, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url <pytorch-cpu-index>"
# GPU users: install the CUDA torch build for their driver first, then `make demo`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN = $(VENV)/bin

.PHONY: install demo test test-fast lint bench

$(BIN)/rlhf: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[test,postgres,lora,auth]'
	touch $@

install: $(BIN)/rlhf

demo: install
	$(BIN)/rlhf run

# Two pytest workers (pytest-xdist), one test module per worker at a time (`--dist loadfile`:
# a module's fixtures, e.g. its servers and pipeline runs, are made once), modules handed out
# in file order. Many flow tests wait on subprocesses and servers or run single-threaded
# Python, so two workers keep both cores busy. TEST_WORKERS=0 runs in one process.
# The project's own modules are byte-compiled first: with PYTHONDONTWRITEBYTECODE set (as on
# this project's machines) every test's subprocess (CLI runs, flow runs, ranks) would otherwise
# compile them again (about 0.3 s of CPU each, some hundred processes).
PRECOMPILE = $(BIN)/python -m compileall -q flows tasks rlhf_core data_checks tests bench >/dev/null
TEST_WORKERS ?= 2
test: install
	$(PRECOMPILE)
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder

# The fast lane (under 2 minutes): the core math and models, the data gate, the task-level
# units and the layering rules; no Prefect server, no end-to-end pipeline, no test marked
# slow (bit-for-bit resume of whole stages). `make test` (CI) runs everything.
FAST_TESTS = tests/rlhf_core tests/data_checks tests/tasks tests/test_layering.py tests/test_sources.py
test-fast: install
	$(PRECOMPILE)
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder $(FAST_TESTS)

lint: install
	$(BIN)/ruff check .
