"""Ray token authentication on a real Ray 2.55.1 head (NeMo RL v0.7.0's Ray), started as the stack starts its Ray pods:
RAY_AUTH_MODE=token and the token in RAY_AUTH_TOKEN (tests/ray_v0_7_0.py; test_ray_2_55_1.py uses the same head).
Checked: the Jobs API answers 401 without a token and 403 to a wrong one; Ray's own client works only with both
variables set; the submitter and the worker wait succeed with the token and fail at once, clearly, without it or with
a wrong one, never printing a token; the `ray health-check` KubeRay's wait-gcs-ready init container runs needs the
token too; and NeMo RL v0.7.0's init_ray, run as a Ray job, attaches."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import ROOT
from ray_head import _GCS_ADDRESS, HEAD_GPUS
from ray_v0_7_0 import TOKEN, WITH_TOKEN
from test_runtime_env_on_ray import DRIVER
from upstream import reference

pytestmark = pytest.mark.timeout(300)

WRONG = f"wrong{uuid.uuid4().hex}"
NO_TOKEN: dict[str, str] = {}
ONLY_TOKEN = {"RAY_AUTH_TOKEN": TOKEN}  # without RAY_AUTH_MODE=token Ray's client sends nothing
WRONG_TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": WRONG}
RIGHT_TOKEN = WITH_TOKEN


def run(command: list[str], credentials: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env.update(PYTHONUNBUFFERED="1", **credentials)
    return subprocess.run(command, capture_output=True, text=True, timeout=200, env=env, check=False)


def script(python: Path, name: str, *args: str, credentials: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run([str(python), str(ROOT / "jobs" / name), *args], credentials)


def submit_echo(
    python: Path, address: str, sid: str, *flags: str, credentials: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """ray_submit.py running `echo hi` as job `sid`."""
    args = ("--address", address, "--submission-id", sid, *flags, "--", "echo", "hi")
    return script(python, "ray_submit.py", *args, credentials=credentials)


def http_status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_jobs_api_answers_401_without_a_token_and_403_to_a_wrong_one(v070_address: str):
    assert http_status(f"{v070_address}/api/jobs/", None) == 401
    assert http_status(f"{v070_address}/api/jobs/", WRONG) == 403
    assert http_status(f"{v070_address}/api/jobs/", TOKEN) == 200


CLIENT = """
import sys
from ray.job_submission import JobSubmissionClient
try:
    print("jobs:", len(JobSubmissionClient(sys.argv[1]).list_jobs()))
except Exception as exc:
    print("refused:", type(exc).__name__, str(exc).splitlines()[0])
    sys.exit(1)
"""


@pytest.mark.parametrize(
    ("credentials", "answer"),
    [
        (NO_TOKEN, "refused: AuthenticationError Authentication required: Unauthorized"),
        (ONLY_TOKEN, "refused: AuthenticationError Authentication required: Unauthorized"),
        (WRONG_TOKEN, "refused: AuthenticationError Authentication failed: Forbidden"),
        (RIGHT_TOKEN, "jobs:"),
    ],
    ids=["none", "token-without-mode", "wrong", "both"],
)
def test_rays_job_client_works_only_with_both_variables(v070_python: Path, v070_address: str, credentials, answer):
    result = run([str(v070_python), "-c", CLIENT, v070_address], credentials)
    assert result.stdout.startswith(answer), result.stdout + result.stderr
    assert (result.returncode == 0) == (credentials is RIGHT_TOKEN)


def test_the_submitter_succeeds_with_the_token(v070_python: Path, v070_address: str):
    sid = f"t-auth-{uuid.uuid4().hex[:8]}"
    result = submit_echo(v070_python, v070_address, sid, credentials=RIGHT_TOKEN)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"ray_submit: job {sid} SUCCEEDED"
    assert TOKEN not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("credentials", "says"),
    [
        (NO_TOKEN, "requires a token (HTTP 401) and this client sent none"),
        (ONLY_TOKEN, "requires a token (HTTP 401) and this client sent none: set both RAY_AUTH_MODE=token and "),
        (WRONG_TOKEN, "refused the token (HTTP 403): RAY_AUTH_TOKEN is not this cluster's token"),
    ],
    ids=["none", "token-without-mode", "wrong"],
)
def test_the_submitter_fails_at_once_and_says_why(v070_python: Path, v070_address: str, credentials, says):
    sid = f"t-auth-{uuid.uuid4().hex[:8]}"
    result = submit_echo(v070_python, v070_address, sid, "--connect-timeout", "120", credentials=credentials)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output  # final: the Job does not retry a pod that would be refused the same way
    assert says in output
    assert result.stdout.splitlines()[-1] == f"ray_submit: job {sid}: not run (Ray refused the client's token)"
    assert TOKEN not in output and WRONG not in output
    assert "Traceback" not in output


def test_the_worker_wait_succeeds_with_the_token(v070_python: Path, v070_address: str):
    args = ("--address", v070_address, "--nodes", "1", "--gpus-per-node", str(HEAD_GPUS), "--timeout-s", "60")
    result = script(v070_python, "wait_for_workers.py", *args, credentials=RIGHT_TOKEN)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"1 of 1 Ray GPU workers ({HEAD_GPUS} GPUs each) are up" in result.stdout
    assert TOKEN not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("credentials", "says"),
    [
        (NO_TOKEN, "the Ray cluster requires a token (HTTP 401) and this client sent none"),
        (WRONG_TOKEN, "the Ray cluster refused the token (HTTP 403): RAY_AUTH_TOKEN is not this cluster's token"),
    ],
    ids=["none", "wrong"],
)
def test_the_worker_wait_fails_at_once_and_says_why(v070_python: Path, v070_address: str, credentials, says):
    # A long timeout: the wait must end on the refusal, not run out.
    args = ("--address", v070_address, "--nodes", "1", "--gpus-per-node", "1", "--timeout-s", "600", "--poll-s", "1")
    result = script(v070_python, "wait_for_workers.py", *args, credentials=credentials)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert says in output and "not waiting" in output
    assert TOKEN not in output and WRONG not in output


def test_kuberays_gcs_wait_needs_the_token(v070_python: Path, v070_address: str):
    """wait-gcs-ready runs `ray health-check` against the head's GCS: refused without the token, so the worker's env
    (which KubeRay copies into that init container) must carry it."""
    health = [str(v070_python.parent / "ray"), "health-check", "--address", _GCS_ADDRESS[v070_address]]
    refused = run(health, NO_TOKEN)
    assert refused.returncode != 0 and "InvalidAuthToken" in refused.stdout + refused.stderr
    assert run(health, WRONG_TOKEN).returncode != 0
    ok = run(health, RIGHT_TOKEN)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_nemo_rl_v0_7_0_init_ray_attaches_on_the_token_cluster(v070_python: Path, v070_address: str, tmp_path: Path):
    """The driver runs on the head with the Ray pod's environment (the token), as a Ray job the submitter starts."""
    init_ray_source = reference("nemo-rl-v0.7.0") / "nemo_rl" / "distributed" / "virtual_cluster.py"
    driver = tmp_path / "init_ray_driver.py"
    driver.write_text(DRIVER)
    sid = f"t-auth-init-{uuid.uuid4().hex[:8]}"
    entry = ["--", str(v070_python), str(driver), str(init_ray_source)]
    result = script(
        v070_python, "ray_submit.py", "--address", v070_address, "--submission-id", sid, *entry, credentials=RIGHT_TOKEN
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"init_ray attached; GPUs: {float(HEAD_GPUS)}" in result.stdout
    assert TOKEN not in result.stdout + result.stderr
