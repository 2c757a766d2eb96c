"""Shared fixtures: run the infra program offline for a stack file, with its Pulumi.yaml defaults applied."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tools.offline import ProgramRun, load_stack_config, run_program
from tools.plan import INFRA_EXAMPLE_STACKS

# One real Ray head per session, on loopback, for the tests that need one (tests/ray_head.py).
pytest_plugins = ["ray_head"]

ROOT = Path(__file__).resolve().parent.parent
# Only the shipped example stacks: a user's own Pulumi.<stack>.yaml is theirs, never a test's.
INFRA_STACKS = INFRA_EXAMPLE_STACKS
HF_TOKEN = "hf_TESTTOKEN_do_not_leak_8c1f"
WANDB_KEY = "wandb_TESTKEY_do_not_leak_51aa"

RunInfra = Callable[..., ProgramRun]


@pytest.fixture(autouse=True, scope="session")
def loopback_only():
    """Tests talk to servers they start themselves, on loopback only: Ray keeps every listener on 127.0.0.1
    (instead of the host's outward address) and gloo binds its sockets to `lo`."""
    saved = {key: os.environ.get(key) for key in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "GLOO_SOCKET_IFNAME")}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
