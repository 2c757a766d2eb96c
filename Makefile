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
# Where torch comes from: PyTorch's CPU-only index, so `make test` never pulls the multi-GB CUDA build PyPI serves on
# Linux. Set it empty (TORCH_INDEX=) where pip already finds a CPU wheel, as on a machine with a local wheel cache.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The shipped example stacks (tools/plan_stacks.py EXAMPLE_STACKS): checkov and the golden plans cover these only, so a
# user's own stack file never breaks `make test`; `make plan STACK=<yours>` renders any stack.
STACKS := dev h200 b200 h200-4node h200-benchmark smoke

.PHONY: test lint typecheck unit checkov plan golden config-docs clean

# Two layers in one virtualenv (Pulumi.yaml runs the programs in .venv): `make plan` needs only the runtime set,
# `make test` adds the test tools, then torch.
$(BIN)/.runtime: requirements.txt constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(BIN)/.installed: $(BIN)/.runtime requirements-dev.txt requirements-torch.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) -r requirements-torch.txt
	touch $@

# Tools whose pins clash with the project's get a virtualenv each: .venv-NAME from requirements-NAME.txt
# ($(CHECKOV_VENV), $(NEMORL_VENV), $(RAY_V070_VENV)).
.venv-%/.installed: requirements-%.txt
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install --quiet --disable-pip-version-check -r $<
	touch $@

lint: $(BIN)/.installed
	$(NICE) $(BIN)/ruff check .
	$(NICE) $(BIN)/ruff format --check .

# The jobs run shares the first run's cache: the third-party packages (Pulumi's SDKs) are checked once.
typecheck: $(BIN)/.installed
	$(NICE) $(BIN)/mypy .
	cd jobs && $(NICE) ../$(BIN)/mypy --config-file ../pyproject.toml --cache-dir ../.mypy_cache __main__.py

# The NeMo RL loader tests run tools/nemorl_config.py with $(NEMORL_VENV)'s Python.
# Five workers on two cores: many tests wait on real Ray heads. --dist loadgroup as tests/conftest.py defines it: one
# test module at a time (module fixtures stay whole), but the tests of the slow modules that need only the session Ray
# head are spread one by one. The workers share that head: the controller starts it (tests/ray_head.py). Each run
# ends with its 20 slowest tests (docs/development.md keeps a measured list).
UNIT_WORKERS ?= 5
unit: $(BIN)/.installed $(NEMORL_VENV)/.installed $(RAY_V070_VENV)/.installed
	$(BIN)/pytest -n $(UNIT_WORKERS) --dist loadgroup --durations=20

# Renders every stack's plan into build/<stack>/ and fails on any checkov finding not in checkov-skips.yaml.
checkov: $(BIN)/.installed $(CHECKOV_VENV)/.installed
	$(NICE) $(BIN)/python tools/checkov_gate.py --stacks $(STACKS)

# The four gates at once, and the virtualenvs they need built side by side (make -j): the unit tests mostly wait on
# Ray heads, so the other gates fill the idle cores. -O keeps each gate's output together; any failure fails `make test`.
# The other gates run at a lower priority (GATE_NICENESS): the unit tests are the longest gate, and the Ray heads they
# start must come up within Ray's fixed windows.
GATE_NICENESS ?= 10
test:
	@$(MAKE) --no-print-directory -j4 -Otarget lint typecheck unit checkov NICE="nice -n $(GATE_NICENESS)"

# Pulumi.yaml's config blocks (both projects) and docs/configuration.md's key tables, from the settings models
# (tools/config_docs.py); tests/test_config_docs.py fails when they drift.
config-docs: $(BIN)/.runtime
	$(BIN)/python tools/config_docs.py

# Both programs under mocks for one stack: build/$(STACK)/ (manifests, Helm values, pipeline, resource tree,
# outputs, timeline) and a summary. Exit 2, with the reason, on an unknown stack or invalid config. WANDB=off renders
# the run of a user without a W&B key (TensorBoard on Lustre instead). PREVIOUS=<outputs.json> (what `pulumi stack
# output --json --show-secrets` prints for the deployed stack, or a plan's outputs.json) adds what the day-2 guard
# makes of each changed key: updated in place, rolled, replaced or refused (tools/day2_preview.py).
# The recipe and every override are checked against the image's release's index (tools/nemo_rl_index.json); a
# recipe the index cannot know (your own) with NeMo RL's loader (.venv-nemorl) on NEMO_RL_SOURCES, a folder holding
# nemo-rl-<tag>/ (default ~/.cache/nemo-rl-gke). See docs/configuration.md, "Recipe and override check".
plan: $(BIN)/.runtime
	$(BIN)/python tools/plan.py --stack $(STACK) $(if $(filter off,$(WANDB)),--no-wandb) $(if $(NEMO_RL_SOURCES),--nemo-rl-sources $(NEMO_RL_SOURCES)) $(if $(PREVIOUS),--previous $(PREVIOUS))

# Refresh the checked-in plans the tests compare with; review the diff (git diff tests/golden) before committing.
golden: $(BIN)/.installed
	@for stack in $(STACKS); do $(BIN)/python tools/plan.py --stack $$stack --out tests/golden --quiet || exit 1; done
	@$(BIN)/python tools/readme_cost.py
	@git status --short tests/golden README.md docs || true

clean:
	rm -rf build .mypy_cache .pytest_cache .ruff_cache
