"""The Ray Jobs API as our submitter relies on it, held to a real head of each Ray version we pin (2.49.2 of NeMo RL
v0.5.0's image, the shared test head; 2.55.1 of v0.7.0's, with token authentication) and to the fake the submitter's
scenario tests run against (tests/fake_ray_jobs.py): each test here runs against all three, over the wire, so the
fake cannot drift from what a head does. A test the fake passes and a real head fails is a failing test.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fake_ray_jobs import RUNTIME_ENV_LINE, FakeJobsApi, fake_jobs_api
from ray_head import CONTRACT_RESOURCE
from ray_v0_7_0 import RAY_VERSION as V070_RAY_VERSION
from ray_v0_7_0 import TOKEN

pytestmark = pytest.mark.timeout(240)

# The fields of a job's details, as both heads answer them (ray/dashboard/modules/job/pydantic_models.py JobDetails)
# for a job submitted without entrypoint resources (whose fields are then left out).
DETAIL_FIELDS = {
    "type", "job_id", "submission_id", "driver_info", "status", "entrypoint", "message", "error_type", "start_time",
    "end_time", "metadata", "runtime_env", "driver_agent_http_address", "driver_node_id", "driver_exit_code",
}  # fmt: skip
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class Head:
    """One Jobs API under contract: its address and the headers its clients send."""

    name: str
    address: str
    headers: dict[str, str]
    ray_version: str

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """(HTTP status, JSON answer or the error's text)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self.headers, **({"Content-Type": "application/json"} if data else {})}
        request = urllib.request.Request(f"{self.address}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode(errors="replace")

    def submit(self, entrypoint: str, **fields: Any) -> str:
        submission_id = f"contract-{uuid.uuid4().hex[:10]}"
        status, answer = self.request("POST", "/api/jobs/", {"entrypoint": entrypoint, "submission_id": submission_id,
                                                              **fields})  # fmt: skip
        assert status == 200, answer
        assert answer["submission_id"] == submission_id
        return submission_id

    def info(self, submission_id: str) -> dict[str, Any]:
        status, answer = self.request("GET", f"/api/jobs/{submission_id}")
        assert status == 200, answer
        return dict(answer)

    def until(self, submission_id: str, statuses: tuple[str, ...], timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.info(submission_id)
            if info["status"] in statuses or time.monotonic() > deadline:
                assert info["status"] in statuses, info
                return info
            time.sleep(0.2)

    def logs(self, submission_id: str) -> str:
        status, answer = self.request("GET", f"/api/jobs/{submission_id}/logs")
        assert status == 200, answer
        return str(answer["logs"])


def entrypoint_lines(log: str) -> list[str]:
    """The entrypoint's own lines of a job's log, which opens with a line of Ray's job manager (and in 2.55.1 also
    holds the supervisor's "Running entrypoint" line, written as the entrypoint starts)."""
    first, *rest = log.splitlines()
    assert re.fullmatch(rf"\S+ \S+\tINFO job_manager\.py:\d+ -- {re.escape(RUNTIME_ENV_LINE)}", first), first
    return [line for line in rest if not line.startswith("Running entrypoint for job ")]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeJobsApi]:
    with fake_jobs_api(resources={"CPU": 2.0, "GPU": 2.0, CONTRACT_RESOURCE: 1.0}) as api:
        yield api


@pytest.fixture(params=["fake", "ray-2.49.2", f"ray-{V070_RAY_VERSION}"])
def head(request: pytest.FixtureRequest) -> Head:
    if request.param == "fake":
        api: FakeJobsApi = request.getfixturevalue("fake")
        return Head("fake", api.address, {}, api.ray_version)
    if request.param == "ray-2.49.2":
        return Head(request.param, request.getfixturevalue("ray_address"), {}, "2.49.2")
    address = request.getfixturevalue("v070_address")
    return Head(request.param, address, {"Authorization": f"Bearer {TOKEN}"}, V070_RAY_VERSION)


def test_the_version_names_the_ray_version_and_a_session(head: Head):
    status, answer = head.request("GET", "/api/version")
    assert status == 200
    assert answer["ray_version"] == head.ray_version
    assert answer["session_name"]


def test_a_job_runs_in_a_shell_with_its_runtime_env_variables_and_succeeds(head: Head):
    marker = uuid.uuid4().hex
    job = head.submit('echo "seen-$CONTRACT_VALUE"; echo second', runtime_env={"env_vars": {"CONTRACT_VALUE": marker}})
    info = head.until(job, TERMINAL)
    assert set(info) == DETAIL_FIELDS
    assert (info["status"], info["driver_exit_code"], info["message"]) == ("SUCCEEDED", 0, "Job finished successfully.")
    assert info["type"] == "SUBMISSION" and info["submission_id"] == job
    assert info["runtime_env"]["env_vars"] == {"CONTRACT_VALUE": marker}
    assert info["start_time"] <= info["end_time"]
    assert entrypoint_lines(head.logs(job)) == [f"seen-{marker}", "second"]


def test_a_failing_entrypoint_fails_with_its_exit_code_and_its_last_lines(head: Head):
    job = head.submit("echo broken-$((2+3)); exit 7")
    info = head.until(job, TERMINAL)
    assert (info["status"], info["driver_exit_code"]) == ("FAILED", 7)
    assert info["message"].startswith("Job entrypoint command failed with exit code 7, last available logs")
    assert "broken-5" in info["message"]


def test_an_id_is_taken_once_and_unknown_ids_are_404(head: Head):
    job = head.submit("true")
    status, refusal = head.request("POST", "/api/jobs/", {"entrypoint": "true", "submission_id": job})
    assert status == 500 and f"Job with submission_id {job} already exists" in refusal
    head.until(job, TERMINAL)
    status, listed = head.request("GET", "/api/jobs/")
    assert [entry["status"] for entry in listed if entry["submission_id"] == job] == ["SUCCEEDED"]
    unknown = f"contract-none-{uuid.uuid4().hex[:6]}"
    for method, path in (("GET", ""), ("POST", "/stop"), ("GET", "/logs")):
        status, answer = head.request(method, f"/api/jobs/{unknown}{path}")
        assert (status, answer) == (404, f"Job {unknown} does not exist")


def test_stop_sends_sigterm_and_the_job_is_stopped(head: Head, tmp_path: Path):
    started = tmp_path / "started"
    job = head.submit(f"trap 'echo got-term; exit 0' TERM; touch {started}; while true; do sleep 0.1; done")
    head.until(job, ("RUNNING",))
    _wait_for(started.exists, 60)
    status, answer = head.request("POST", f"/api/jobs/{job}/stop")
    assert (status, answer) == (200, {"stopped": True})
    info = head.until(job, TERMINAL, timeout=30)
    assert (info["status"], info["message"]) == ("STOPPED", "Job was intentionally stopped.")
    assert "got-term" in head.logs(job)
    status, refusal = head.request("DELETE", f"/api/jobs/{job}")
    assert status == 200, refusal
    assert head.request("GET", f"/api/jobs/{job}")[0] == 404


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_time(head: Head, tmp_path: Path):
    started = tmp_path / "started"
    job = head.submit(f"trap '' TERM; touch {started}; while true; do sleep 0.1; done")
    _wait_for(started.exists, 60)
    asked = time.monotonic()
    assert head.request("POST", f"/api/jobs/{job}/stop") == (200, {"stopped": True})
    assert head.until(job, TERMINAL, timeout=30)["status"] == "STOPPED"
    assert time.monotonic() - asked >= 2.5  # Ray's RAY_JOB_STOP_WAIT_TIME_S, 3 s, before the SIGKILL


def test_a_running_job_cannot_be_deleted(head: Head, tmp_path: Path):
    release = tmp_path / "release"
    job = head.submit(f"until [ -e {release} ]; do sleep 0.1; done")
    head.until(job, ("RUNNING",))
    status, refusal = head.request("DELETE", f"/api/jobs/{job}")
    assert status == 500 and "non-terminal state" in refusal
    release.touch()
    head.until(job, TERMINAL)


def test_a_job_waits_for_its_entrypoint_resources_and_a_queued_stop_stops_it_at_its_turn(head: Head, tmp_path: Path):
    release = tmp_path / "release"
    one = {"entrypoint_resources": {CONTRACT_RESOURCE: 1}}
    holder = head.submit(f"until [ -e {release} ]; do sleep 0.1; done", **one)
    head.until(holder, ("RUNNING",))
    queued = head.submit("echo ran", **one)
    # Ray starts a job stopped while queued at its turn and then stops it (one that ended by then fails instead, on
    # Ray's own error): this one runs long enough to be stopped.
    stopped = head.submit("echo ran; sleep 60", **one)
    time.sleep(2)  # a queued job stays PENDING however long it waits (the heads' start timeout is a week)
    for job in (queued, stopped):
        info = head.info(job)
        assert info["status"] == "PENDING", info
        assert "It may be waiting for resources" in info["message"]
        assert "entrypoint_resources" not in info  # Ray does not show what a job waits for
    assert head.request("POST", f"/api/jobs/{stopped}/stop")[0] == 200
    time.sleep(1)
    assert head.info(stopped)["status"] == "PENDING"  # the stop waits for the job's turn
    release.touch()
    assert head.until(holder, TERMINAL)["status"] == "SUCCEEDED"
    ended = {job: head.until(job, TERMINAL) for job in (queued, stopped)}
    assert ended[queued]["status"] == "SUCCEEDED"
    assert ended[stopped]["status"] == "STOPPED", ended[stopped]["message"]
    assert entrypoint_lines(head.logs(queued)) == ["ran"]


def test_the_log_tail_replays_and_follows_the_log_and_closes_at_the_end(head: Head, tmp_path: Path):
    release = tmp_path / "release"
    job = head.submit(f"echo first; until [ -e {release} ]; do sleep 0.1; done; echo last")
    head.until(job, ("RUNNING",))

    async def tail() -> str:
        seen = ""
        url = f"{head.address.replace('http', 'ws', 1)}/api/jobs/{job}/logs/tail"
        async with aiohttp.ClientSession(headers=head.headers) as session, session.ws_connect(url) as socket:
            async for message in socket:
                seen += message.data
                if "first" in seen:
                    release.touch()
        return seen

    streamed = asyncio.run(asyncio.wait_for(tail(), 120))
    assert entrypoint_lines(streamed) == ["first", "last"]
    assert head.until(job, TERMINAL)["status"] == "SUCCEEDED"


def _wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
