# Two commands on a fresh machine (see README):
#   make demo   - set everything up and run the live demo
#   make test   - set everything up and run lint, type checks and the tests
# Both install the server extra (collector, API, database) beside the agent; a GPU node needs only
# `pip install gpufleet`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test lint typecheck unit reliability bench install clean system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[server,dev]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufleet demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

system-deps:
	@tools/system-deps.sh

# system-deps installs the Debian tools some tests drive; with them required, a
# missing one fails its test instead of skipping it.
unit: $(STAMP) system-deps
	GPUFLEET_REQUIRE_SYSTEM_TOOLS=1 $(BIN)/pytest -q

test: lint typecheck unit

reliability: $(STAMP)
	$(BIN)/pytest -q tests/reliability

clean:
	rm -rf $(VENV) .gpufleet .pytest_cache .mypy_cache .ruff_cache
