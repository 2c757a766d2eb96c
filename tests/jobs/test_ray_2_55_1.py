"""The submitter and the worker wait on NeMo RL v0.7.0's Ray: a real 2.55.1 head on loopback, driven by the scripts
run with a 2.55.1 client (.venv-ray2551), as in the v0.7.0 image where the submitter pod and the cluster share one
Ray. The full behaviour is tested on the default image's Ray in test_ray_submit.py and test_wait_for_workers.py;
this module covers the calls every run makes: submit and follow, a repeated id, the worker count, and each v0.7.0
step submitted as the pipeline submits it running v0.7.0's own init_ray (test_runtime_env_on_ray.py does the same
for v0.5.0 on 2.49.2), with the job-level runtime env the pipeline no longer passes shown to fail it. The head
requires a token, as the stack's 2.55.1 clusters do, and every client here sends it (tests/ray_v0_7_0.py)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, shared_infra_run
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job_settings import build_job_settings
from launcher.script import submit_command
from launcher.steps import pipeline_steps
from ray_head import HEAD_GPUS, place_held
from ray_v0_7_0 import RAY_VERSION, TOKEN, WITH_TOKEN
from test_runtime_env_on_ray import DRIVER, OLD_RUNTIME_ENV, as_submitted, submit, submit_all, submit_flags
from upstream import reference

pytestmark = pytest.mark.timeout(300)


def run(python: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONUNBUFFERED="1", **WITH_TOKEN)
    return subprocess.run(
        [str(python), str(ROOT / "jobs" / script), *args], capture_output=True, text=True, timeout=180, env=env
    )


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_the_head_is_the_v0_7_0_ray(v070_address: str) -> None:
    request = urllib.request.Request(f"{v070_address}/api/version", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.load(response)["ray_version"] == RAY_VERSION


def test_submit_follow_and_repeat(v070_python: Path, v070_address: str, tmp_path: Path) -> None:
    sid = f"t-v070-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "runs.txt"
    entry = ["--", "sh", "-c", f"echo answer-$((6*7)); echo ran >> {marker}"]
    first = run(v070_python, "ray_submit.py", "--address", v070_address, "--submission-id", sid, *entry)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("answer-42") == 1, first.stdout
    assert last_line(first.stdout) == f"ray_submit: job {sid} SUCCEEDED"
    again = run(v070_python, "ray_submit.py", "--address", v070_address, "--submission-id", sid, *entry)
    assert again.returncode == 0 and "already SUCCEEDED" in again.stdout, again.stdout + again.stderr
    assert marker.read_text().splitlines() == ["ran"]


def test_the_worker_wait_counts_gpu_nodes(v070_python: Path, v070_address: str) -> None:
    ready = run(
        v070_python, "wait_for_workers.py", "--address", v070_address, "--nodes", "1", "--gpus-per-node", str(HEAD_GPUS)
    )
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert f"1 of 1 Ray GPU workers ({HEAD_GPUS} GPUs each) are up" in ready.stdout
    short = ("--timeout-s", "2", "--poll-s", "0.5")
    too_big = run(
        v070_python, "wait_for_workers.py", "--address", v070_address, "--nodes", "1", "--gpus-per-node", "8", *short
    )
    assert too_big.returncode != 0 and "0 of 1 Ray GPU workers (8 GPUs each) are up" in too_big.stdout


@pytest.fixture(scope="module")
def v070_h200() -> InfraOutputs:
    return build_infra_outputs(shared_infra_run("h200", {"nemoRlImage": "nvcr.io/nvidia/nemo-rl:v0.7.0"}).outputs)


@pytest.fixture(scope="module")
def driver(v070_python: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The entrypoint Ray runs: NeMo RL v0.7.0's init_ray from the reference, with the 2.55.1 interpreter."""
    init_ray_source = reference("nemo-rl-v0.7.0") / "nemo_rl" / "distributed" / "virtual_cluster.py"
    path = tmp_path_factory.mktemp("driver") / "init_ray_driver.py"
    path.write_text(DRIVER)
    return [str(v070_python), str(path), str(init_ray_source)]


def on_2_55_1(
    command: list[str], python: Path, address: str, driver: list[str], records: Path, extra: tuple[str, ...] = ()
):
    """The pipeline's submit command with this module's head and the 2.55.1 interpreter running ray_submit.py."""
    with place_held(address, f"t-v070-{uuid.uuid4().hex[:6]}", WITH_TOKEN) as run:
        args = as_submitted(command, address, driver, records, run, extra)
        return submit([str(python), *args[1:]], WITH_TOKEN)


def test_every_v0_7_0_step_as_submitted_lets_init_ray_attach(
    v070_python, v070_address, v070_h200, driver, tmp_path
) -> None:
    job = build_job_settings({"infraStack": "organization/nemo-rl-gke/h200"}, v070_h200)
    steps = pipeline_steps(job, v070_h200)
    distinct = {submit_flags(submit_command(step, job, v070_h200)): step for step in steps}
    evals = [step for step in steps if step.name.startswith("eval-")]
    assert [step.name for step in evals] == ["eval-base", "eval-final"]
    submitted = [*distinct.values(), *evals]
    with place_held(v070_address, f"t-v070-{uuid.uuid4().hex[:6]}", WITH_TOKEN) as run:
        commands = [
            as_submitted(submit_command(s, job, v070_h200), v070_address, driver, tmp_path, run) for s in submitted
        ]
        results = submit_all([[str(v070_python), *args[1:]] for args in commands], WITH_TOKEN)  # on_2_55_1, at once
    for step, result in zip(submitted, results, strict=True):
        assert result.returncode == 0, f"{step.name}:\n{result.stdout}{result.stderr}"
        assert f"init_ray attached; GPUs: {float(HEAD_GPUS)}" in result.stdout, result.stdout


def test_a_job_level_runtime_env_still_fails_init_ray_on_2_55_1(
    v070_python, v070_address, v070_h200, driver, tmp_path
) -> None:
    """Why the steps pass none on v0.7.0 either: Ray 2.55.1 refuses the merge as 2.49.2 does (and exits 1)."""
    job = build_job_settings({"infraStack": "organization/nemo-rl-gke/h200"}, v070_h200)
    train = next(step for step in pipeline_steps(job, v070_h200) if step.name == "train")
    # One attempt shows the failure: the train step's retries (maxRestarts, 3 by default) would only repeat it.
    old = ("--runtime-env-json", json.dumps(OLD_RUNTIME_ENV), "--max-retries=0")
    result = on_2_55_1(submit_command(train, job, v070_h200), v070_python, v070_address, driver, tmp_path, extra=old)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Failed to merge the Job's runtime env" in result.stdout
    assert "init_ray attached" not in result.stdout
