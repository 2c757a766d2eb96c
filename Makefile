# make test: the whole gate CI runs. make plan STACK=<stack>: render what `pulumi up` would create, offline.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# checkov's pins clash with the project's: it gets a virtualenv of its own.
CHECKOV_VENV := .venv-checkov
# NeMo RL's config loader (omegaconf, hydra-core at the versions NeMo RL locks) clashes with the project's pins too.
NEMORL_VENV := .venv-nemorl
# The Ray of NeMo RL v0.7.0's image, for the submitter tests against that version; .venv has v0.5.0's.
RAY_V070_VENV := .venv-ray2551
STACK ?= dev
# Every stack with both an infra and a job stack file (Pulumi.<stack>.yaml and jobs/Pulumi.<stack>.yaml).
STACKS := $(sort $(filter $(patsubst Pulumi.%.yaml,%,$(wildcard Pulumi.*.yaml)),$(patsubst jobs/Pulumi.%.yaml,%,$(wildcard jobs/Pulumi.*.yaml))))

.PHONY: test lint typecheck unit checkov plan golden clean

$(BIN)/.installed: requirements.txt requirements-dev.txt constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

$(NEMORL_VENV)/.installed: requirements-nemorl.txt
	$(PYTHON) -m venv $(NEMORL_VENV)
	$(NEMORL_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-nemorl.txt
	touch $@

$(RAY_V070_VENV)/.installed: requirements-ray2551.txt
	$(PYTHON) -m venv $(RAY_V070_VENV)
	$(RAY_V070_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-ray2551.txt
	touch $@

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.installed
	$(BIN)/mypy .
	cd jobs && ../$(BIN)/mypy --config-file ../pyproject.toml __main__.py

# The NeMo RL loader tests run tools/nemorl_config.py with $(NEMORL_VENV)'s Python.
unit: $(BIN)/.installed $(NEMORL_VENV)/.installed $(RAY_V070_VENV)/.installed
	$(BIN)/pytest

# Renders every stack's plan into build/<stack>/ and fails on any checkov finding not in checkov-skips.yaml.
checkov: $(BIN)/.installed $(CHECKOV_VENV)/.installed
	$(BIN)/python tools/checkov_gate.py --stacks $(STACKS)

test: lint typecheck unit checkov

# Both programs under mocks for one stack: build/$(STACK)/ (manifests, Helm values, pipeline, resource tree,
# outputs, timeline) and a summary. Exit 2, with the reason, on an unknown stack or invalid config. WANDB=off renders
# the run of a user without a W&B key (TensorBoard on Lustre instead).
plan: $(BIN)/.installed
	$(BIN)/python tools/plan.py --stack $(STACK) $(if $(filter off,$(WANDB)),--no-wandb)

# Refresh the checked-in plans the tests compare with; review the diff (git diff tests/golden) before committing.
golden: $(BIN)/.installed
	@for stack in $(STACKS); do $(BIN)/python tools/plan.py --stack $$stack --out tests/golden --quiet || exit 1; done
	@git status --short tests/golden || true

clean:
	rm -rf build .mypy_cache .pytest_cache .ruff_cache
