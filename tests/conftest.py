"""Shared fixtures: run the infra program offline for a stack file, with its Pulumi.yaml defaults applied."""

from __future__ import annotations

import atexit
import collections
import copy
import functools
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tools.offline import ProgramRun, load_stack_config, run_program
from tools.plan_stacks import INFRA_EXAMPLE_STACKS

# One real Ray head per session, on loopback, for the tests that need one (tests/ray_head.py).
pytest_plugins = ["ray_head", "ray_v0_7_0", "fake_ray_jobs"]

ROOT = Path(__file__).resolve().parent.parent
# Only the shipped example stacks: a user's own Pulumi.<stack>.yaml is theirs, never a test's.
INFRA_STACKS = INFRA_EXAMPLE_STACKS
HF_TOKEN = "hf_TESTTOKEN_do_not_leak_8c1f"
WANDB_KEY = "wandb_TESTKEY_do_not_leak_51aa"

RunInfra = Callable[..., ProgramRun]

# `make unit` runs pytest-xdist with --dist loadgroup, which here means (pytest_xdist_make_scheduler below): each test
# module is one unit of work, run whole on one worker (its module fixtures, such as a Ray head of its own, are set up
# once), except these modules, whose tests need no more than the session Ray head and their own tmp_path:
# their tests are spread over the workers one by one.
SPREAD_MODULES = (
    "tests/jobs/test_ray_submit.py",
    "tests/jobs/test_runtime_env_on_ray.py",
    "tests/jobs/test_extension.py",
)
# Modules run as one unit with another: for a session fixture they share (the v0.7.0 Ray head, tests/ray_v0_7_0.py),
# or so that they never run at once.
RUN_WITH = {
    "tests/jobs/test_ray_token_auth.py": "tests/jobs/test_ray_2_55_1.py",
    "tests/jobs/test_jobs_api_contract.py": "tests/jobs/test_ray_2_55_1.py",
}
# The modules that take longest (mostly waiting on real Ray heads; pytest --durations), longest first, handed out
# before the rest so that no worker starts one of them near the end; every other module keeps its collection order
# after them. The worker wait leads: its tests mostly wait on a real head and on Ray Client connections, which
# the others fill with work. The spread modules' tests come last of these: each is short, and they fill the gaps.
SLOW_MODULES = (
    "tests/jobs/test_wait_for_workers.py",
    "tests/jobs/test_ray_2_55_1.py",
    "tests/jobs/test_ray_token_auth.py",
    "tests/jobs/test_head_restart.py",
    "tests/jobs/test_admission.py",
    "tests/preflight/test_nccl_allreduce.py",
    "tests/preflight/test_lustre_io.py",
    "tests/test_interrupted_run.py",
    "tests/test_plan.py",
    "tests/test_day2.py",
    "tests/jobs/test_ray_submit.py",
    "tests/jobs/test_runtime_env_on_ray.py",
    "tests/jobs/test_extension.py",
)


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of_work(nodeid: str) -> str:
    """What one xdist worker runs in one go: the test itself in a spread module, else its whole module (with the
    module it runs with, if any)."""
    module = _module(nodeid)
    return nodeid if module in SPREAD_MODULES else RUN_WITH.get(module, module)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow modules first; whole modules move (a stable sort), so module fixtures keep their lifetime."""
    rank = {name: index for index, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(_module(item.nodeid), len(rank)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadgroup: units of work as unit_of_work says, handed out in collection order. (xdist 3.8's own
    loadgroup, by xdist_group marks, groups nothing under pytest 9.2: it renames item._nodeid, which nodeid no longer
    reads.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    config.option.loadscopereorder = False  # keep the slow-first order of pytest_collection_modifyitems
    return ModuleScheduling(config, log)


def _exit_without_teardown() -> None:
    """The last exit handler of an xdist worker: its results reached the controller already (and its exit status is
    not read), so it leaves without tearing down the interpreter, which takes a worker with Ray, torch and Pulumi
    loaded over a second of CPU; five workers at once held the end of `make unit` up by about 3 s."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--count-real-heads",
        action="store_true",
        help="after collection, print how many tests use a real Ray head, by module (docs/development.md)",
    )


# What makes a test use a real Ray head: one of these fixtures, a parameter that picks the real head over the fake
# Jobs API (test_jobs_api_contract's `head`, test_ray_submit's `either_api`), or a head it starts in its own body.
REAL_HEAD_FIXTURES = {"ray_address", "ray_gcs_address", "ray_client_address", "v070_address", "restartable_head"}
REAL_HEAD_PARAMS = ("real head", "ray-")
REAL_HEAD_STARTS = ("RayHead(RAY_BIN)", "ray_head(RAY_BIN", "interrupted_heads")


def uses_a_real_head(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if set(getattr(item, "fixturenames", ())) & REAL_HEAD_FIXTURES:
        return True
    if any(isinstance(value, str) and value.startswith(REAL_HEAD_PARAMS) for value in params.values()):
        return True
    function = getattr(item, "function", None)
    return function is not None and any(start in inspect.getsource(function) for start in REAL_HEAD_STARTS)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.getoption("count_real_heads"):
        return
    modules = collections.Counter(_module(item.nodeid) for item in session.items if uses_a_real_head(item))
    print(f"\ntests that use a real Ray head: {sum(modules.values())} of {len(session.items)}")
    for module, count in modules.most_common():
        print(f"{count:5d} {module}")


def pytest_configure(config: pytest.Config) -> None:
    # Registered before any test module imports Ray or torch: their exit handlers run before this one (last in, first
    # out), so every cleanup a library registers still runs.
    if hasattr(config, "workerinput"):
        atexit.register(_exit_without_teardown)


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


@functools.cache
def _shared_run(stack: str, overrides_json: str) -> ProgramRun:
    return run_infra_stack(stack, json.loads(overrides_json))


def shared_infra_run(stack: str, overrides: Mapping[str, Any] | None = None) -> ProgramRun:
    """run_infra_stack(stack, overrides) with the default secrets, run once per test process for every module- or
    session-scoped fixture that asks for the same (a dozen modules run the same example stacks); each caller gets a
    copy of its own. For such fixtures only: a test may have patched the code a program runs."""
    return copy.deepcopy(_shared_run(stack, json.dumps(dict(overrides or {}), sort_keys=True)))


@pytest.fixture
def run_infra() -> RunInfra:
    return run_infra_stack


@pytest.fixture(scope="module", params=INFRA_STACKS)
def stack_run(request: pytest.FixtureRequest) -> tuple[str, ProgramRun]:
    """(stack name, its run) for every infra stack file."""
    return request.param, shared_infra_run(request.param)
