# make test: the whole gate CI runs. make plan STACK=<stack>: render what `pulumi up` would create, offline.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STACK ?= dev

.PHONY: test lint typecheck unit plan golden clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy .
	cd jobs && ../$(BIN)/mypy --config-file ../pyproject.toml __main__.py

unit: $(BIN)/.installed
	$(BIN)/pytest

test: lint typecheck unit

clean:
	rm -rf build .mypy_cache .pytest_cache .ruff_cache
