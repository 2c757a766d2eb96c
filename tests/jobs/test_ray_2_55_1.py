"""The submitter and the worker wait on NeMo RL v0.7.0's Ray: a real 2.55.1 head on loopback, driven by the scripts
run with a 2.55.1 client (.venv-ray2551), as in the v0.7.0 image where the submitter pod and the cluster share one
Ray. The full behaviour is tested on the default image's Ray in test_ray_submit.py and test_wait_for_workers.py;
this module covers the calls every run makes: submit and follow, a failure, a repeated id, the worker count."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from ray_head import HEAD_GPUS, ray_head

from infra.nemo_rl_releases import NEMO_RL_RELEASES

pytestmark = pytest.mark.timeout(300)

VENV = ROOT / ".venv-ray2551"
RAY_VERSION = NEMO_RL_RELEASES["v0.7.0"].ray_version


@pytest.fixture(scope="module")
def python() -> Path:
    """.venv-ray2551's Python, holding the Ray of the v0.7.0 row; skip (fail under CI) when it was not created."""
    python = VENV / "bin" / "python"
    if not python.is_file():
        reason = f"no {VENV.name}: create it with `make {VENV.name}/.installed`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI must run these tests, not skip them)")
        pytest.skip(reason)
    found = subprocess.run(
        [str(python), "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == RAY_VERSION, "requirements-ray2551.txt must pin the Ray of the v0.7.0 row"
    return python


@pytest.fixture(scope="module")
def address(python: Path) -> Iterator[str]:
    with ray_head(python.parent / "ray") as address:
        yield address


def run(python: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [str(python), str(ROOT / "jobs" / script), *args], capture_output=True, text=True, timeout=180, env=env
    )


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_the_head_is_the_v0_7_0_ray(address: str) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{address}/api/version", timeout=10) as response:
        assert json.load(response)["ray_version"] == RAY_VERSION


def test_submit_follow_and_repeat(python: Path, address: str, tmp_path: Path) -> None:
    sid = f"t-v070-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "runs.txt"
    entry = ["--", "sh", "-c", f"echo answer-$((6*7)); echo ran >> {marker}"]
    first = run(python, "ray_submit.py", "--address", address, "--submission-id", sid, *entry)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("answer-42") == 1, first.stdout
    assert last_line(first.stdout) == f"ray_submit: job {sid} SUCCEEDED"
    again = run(python, "ray_submit.py", "--address", address, "--submission-id", sid, *entry)
    assert again.returncode == 0 and "already SUCCEEDED" in again.stdout, again.stdout + again.stderr
    assert marker.read_text().splitlines() == ["ran"]


def test_a_failed_job_exits_1(python: Path, address: str) -> None:
    sid = f"t-v070-fail-{uuid.uuid4().hex[:8]}"
    result = run(python, "ray_submit.py", "--address", address, "--submission-id", sid, "--", "sh", "-c", "exit 7")
    assert result.returncode == 1, result.stdout + result.stderr
    assert last_line(result.stdout) == f"ray_submit: job {sid} FAILED (driver exit code 7)"


def test_the_worker_wait_counts_gpu_nodes(python: Path, address: str) -> None:
    ready = run(python, "wait_for_workers.py", "--address", address, "--nodes", "1", "--gpus-per-node", str(HEAD_GPUS))
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert f"1 of 1 Ray GPU workers ({HEAD_GPUS} GPUs each) are up" in ready.stdout
    short = ("--timeout-s", "2", "--poll-s", "0.5")
    too_big = run(python, "wait_for_workers.py", "--address", address, "--nodes", "1", "--gpus-per-node", "8", *short)
    assert too_big.returncode != 0 and "0 of 1 Ray GPU workers (8 GPUs each) are up" in too_big.stdout
