"""Shared fixtures: run the infra program offline for a stack file, with its Pulumi.yaml defaults applied."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tools.offline import ProgramRun, load_stack_config, run_program

ROOT = Path(__file__).resolve().parent.parent
INFRA_STACKS = ("dev", "h200", "b200")
HF_TOKEN = "hf_TESTTOKEN_do_not_leak_8c1f"
WANDB_KEY = "wandb_TESTKEY_do_not_leak_51aa"

RunInfra = Callable[..., ProgramRun]


def run_infra_stack(
    stack: str = "dev",
    overrides: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> ProgramRun:
    """Run the infra program for a stack file. Keys without ':' are project keys; an override of None removes
    the key. Secrets default to an HF token."""
    project, config = load_stack_config(ROOT, stack)
    for key, value in (overrides or {}).items():
        full = key if ":" in key else f"{project}:{key}"
        if value is None:
            config.pop(full, None)
        else:
            config[full] = value
    if secrets is None:
        secrets = {"hfToken": HF_TOKEN}
    return run_program(ROOT, config, secrets={f"{project}:{k}": v for k, v in secrets.items()}, stack=stack)


@pytest.fixture
def run_infra() -> RunInfra:
    return run_infra_stack


@pytest.fixture(scope="module", params=INFRA_STACKS)
def stack_run(request: pytest.FixtureRequest) -> tuple[str, ProgramRun]:
    """(stack name, its run) for every infra stack file."""
    return request.param, run_infra_stack(request.param)
