"""Each pipeline step submitted exactly as the submitter pod submits it (the same ray_submit.py flags and runtime
env), to the real Ray 2.49.2 head of the tests, with a driver that runs NeMo RL v0.5.0's own `init_ray()` (loaded
from ../shared/reference/): it must attach to the cluster. The job-level runtime env the pipeline used to pass
(HF_HOME) makes the same driver fail there, which is what burnt the train step's submission id."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, shared_infra_run
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job_settings import build_job_settings
from launcher.script import SUBMITTER, submit_command
from launcher.steps import pipeline_steps
from ray_head import place_held
from upstream import reference

pytestmark = pytest.mark.timeout(300)

# What NeMo RL's GRPO entrypoint does first: init_ray() (nemo_rl/distributed/virtual_cluster.py, imported by path;
# it needs only Ray). Starting a fresh local cluster instead of attaching would be a failure too.
DRIVER = """
import importlib.util, sys
import ray

spec = importlib.util.spec_from_file_location("nemo_rl_virtual_cluster", sys.argv[1])
virtual_cluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(virtual_cluster)

attach = ray.init
def only_attach(*args, **kwargs):
    if kwargs.get("address") != "auto":
        raise SystemExit("init_ray did not attach to the running cluster; it would start a local one")
    return attach(*args, **kwargs)
ray.init = only_attach

virtual_cluster.init_ray()
print("init_ray attached; GPUs:", ray.cluster_resources().get("GPU"))
"""
OLD_RUNTIME_ENV = {"env_vars": {"HF_HOME": "/data/hf-cache"}}


@pytest.fixture(scope="module")
def h200() -> InfraOutputs:
    return build_infra_outputs(shared_infra_run("h200").outputs)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The entrypoint Ray runs: NeMo RL's init_ray from the reference, with this interpreter (it has Ray 2.49.2)."""
    init_ray_source = reference("nemo-rl-v0.5.0") / "nemo_rl" / "distributed" / "virtual_cluster.py"
    path = tmp_path_factory.mktemp("driver") / "init_ray_driver.py"
    path.write_text(DRIVER)
    return [sys.executable, str(path), str(init_ray_source)]


def as_submitted(
    command: list[str], ray_address: str, driver: list[str], records: Path, run: str, extra: tuple[str, ...] = ()
) -> list[str]:
    """The pipeline's submit command, run here: this interpreter and the repository's ray_submit.py, the test head's
    address, a fresh submission id (one head serves the whole session) with its outcome record under `records`
    (not /data), the place of `run` (held by the test, as the pipeline holds its own: ray_head.place_held), the
    driver as the entrypoint. Every other flag stays exactly as the pipeline wrote it."""
    cut = command.index("--")
    assert command[:2] == ["python", SUBMITTER]
    suffix = uuid.uuid4().hex[:6]
    flags = []
    for word in command[2:cut]:
        if word.startswith("--address="):
            word = f"--address={ray_address}"
        elif word.startswith("--submission-id="):
            word = f"{word}-{suffix}"
        elif word.startswith("--record="):
            word = f"--record={records / suffix / Path(word.split('=', 1)[1]).name}"
        elif word.startswith("--place-of="):
            word = f"--place-of={run}"
        flags.append(word)
    return [sys.executable, str(ROOT / "jobs" / "ray_submit.py"), *flags, *extra, "--", *driver]


def submit(args: list[str], credentials: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a submit command; `credentials` (RAY_AUTH_MODE, RAY_AUTH_TOKEN) for a head that requires a token."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(credentials or {})
    return subprocess.run(args, capture_output=True, text=True, timeout=240, env=env, check=False)


def submit_all(
    commands: list[list[str]], credentials: Mapping[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """submit() for each command, all at once (each its own submission id and Ray job, on the one head): the
    submitters mostly wait on Ray, so the steps of a test need not take turns."""
    with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        return list(pool.map(lambda command: submit(command, credentials), commands))


def submit_flags(command: list[str]) -> tuple[str, ...]:
    """What a step's submission adds beyond its own address and id (a runtime env, for one)."""
    own = ("--address=", "--submission-id=", "--record=")
    return tuple(w for w in command[2 : command.index("--")] if not w.startswith(own))


def test_every_step_as_submitted_lets_init_ray_attach(
    ray_address: str, h200: InfraOutputs, driver: list[str], tmp_path: Path
):
    job = build_job_settings({"infraStack": "organization/nemo-rl-gke/h200"}, h200)
    steps = pipeline_steps(job, h200)
    assert {"prepare-data", "eval-base", "train", "convert-hf", "eval-final"} <= {step.name for step in steps}
    # One submission per distinct way of submitting (steps submitted alike behave alike on Ray; today all are), and
    # each evaluation (it runs NeMo RL's run_eval.py, whose init_ray attaches the same way).
    distinct = {submit_flags(submit_command(step, job, h200)): step for step in steps}
    evals = [step for step in steps if step.name.startswith("eval-")]
    submitted = [*distinct.values(), *evals]
    with place_held(ray_address, f"t-env-{uuid.uuid4().hex[:6]}") as run:
        commands = [as_submitted(submit_command(s, job, h200), ray_address, driver, tmp_path, run) for s in submitted]
        results = submit_all(commands)
    for step, result in zip(submitted, results, strict=True):
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{step.name}:\n{output}"
        assert "init_ray attached; GPUs: 2.0" in result.stdout, f"{step.name}:\n{output}"
        # The pipeline's --record, moved off /data: the outcome is recorded with the command Ray ran.
        records = list(tmp_path.glob(f"*/{step.name}.json"))
        assert records and all(json.loads(r.read_text())["command"] == shlex.join(driver) for r in records)


def test_the_old_job_runtime_env_fails_init_ray(
    ray_address: str, h200: InfraOutputs, driver: list[str], tmp_path: Path
):
    """The check above can fail: with the job-level HF_HOME the pipeline passed before, init_ray's own runtime env
    (the driver's environment, HF_HOME included) cannot be merged and the job FAILS."""
    job = build_job_settings({"infraStack": "organization/nemo-rl-gke/h200"}, h200)
    train = next(step for step in pipeline_steps(job, h200) if step.name == "train")
    # One attempt shows the failure: the train step's retries (maxRestarts, 3 by default) would only repeat it.
    old = ("--runtime-env-json", json.dumps(OLD_RUNTIME_ENV), "--max-retries=0")
    with place_held(ray_address, f"t-env-{uuid.uuid4().hex[:6]}") as run:
        result = submit(as_submitted(submit_command(train, job, h200), ray_address, driver, tmp_path, run, extra=old))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Failed to merge the Job's runtime env" in result.stdout
    assert "init_ray attached" not in result.stdout
