# Two commands on a fresh machine (see README):
#   make demo   - set everything up and run the live demo
#   make test   - set everything up and run lint, type checks and the tests
# Both install the server extra (collector, API, database) beside the agent, the tests the development
# extras too; a GPU node needs only
# `pip install gpufleet`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HASH := $(shell cksum pyproject.toml | cut -d' ' -f1)
# The demo installs what the product runs (agent and server); the tests add the development extras.
RUN_STAMP := $(VENV)/.installed-run-$(HASH)
STAMP := $(VENV)/.installed-dev-$(HASH)

.PHONY: demo test lint typecheck unit coverage reliability bench install clean system-deps

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[server]"
	rm -f $(VENV)/.installed-*
	touch $(RUN_STAMP)

# The checkout's development packages (bench/, testsupport/) importable by name in this environment only:
# they never ship in the wheel, and scripts import them without editing sys.path.
$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[server,dev]"
	$(BIN)/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'gpufleet-checkout.pth').write_text(str(pathlib.Path.cwd()) + '\n')"
	touch $(STAMP)

install: $(STAMP)

demo: $(RUN_STAMP)
	$(BIN)/gpufleet demo

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

system-deps:
	@tools/system-deps.sh

# system-deps installs the Debian tools some tests drive; with them required, a
# missing one fails its test instead of skipping it.  The suite mostly waits (on
# PostgreSQL, subprocesses, servers), so it runs in TEST_WORKERS workers, each with
# a database of its own; tests marked `serial` run afterwards on the quiet machine.
TEST_WORKERS ?= 4
PYTEST_COV ?=
unit: $(STAMP) system-deps
	GPUFLEET_REQUIRE_SYSTEM_TOOLS=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not serial" $(PYTEST_COV)
	GPUFLEET_REQUIRE_SYSTEM_TOOLS=1 $(BIN)/pytest -q -m serial $(PYTEST_COV)

# The same suite with line coverage of the product (the test processes only; services the tests start
# as subprocesses are not traced).  Tracing costs a third to a half more CPU on the simulating tests, so `make test`
# leaves it out; the total is printed last.
coverage: $(STAMP) system-deps
	$(BIN)/coverage erase
	$(MAKE) unit PYTEST_COV="--cov --cov-append --cov-report="
	$(BIN)/coverage report --skip-covered --sort=cover | tail -25

test: lint typecheck unit

reliability: $(STAMP)
	$(BIN)/pytest -q tests/reliability

clean:
	rm -rf $(VENV) .gpufleet .pytest_cache .mypy_cache .ruff_cache
