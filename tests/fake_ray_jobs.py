"""An in-process stand-in for the Ray Jobs API calls our submitter makes, for the tests of its own decisions (retries,
resume, reattaching, stopping, queueing on entrypoint resources): no Ray processes, so a scenario costs the
submitter's own run and its shell jobs, not a head's start and a job supervisor per job.

It serves the HTTP API a head's dashboard serves (version, submit, info, list, stop, delete, logs and the websocket
tail) to Ray's own JobSubmissionClient and to jobs/submitter's plain requests, and does what a head does with a job:
the entrypoint runs in a shell of its own session with the runtime env's variables and its output in the job's log;
a job waits PENDING until its entrypoint resources fit what the head offers and fails past the start timeout; a stop
sends SIGTERM and SIGKILL after Ray's grace time, and a queued job's stop takes effect once it has started at its
turn; a stopped fake forgets every job, as a head restarted without GCS fault tolerance does.
tests/jobs/test_jobs_api_contract.py holds each of these to a real head of every Ray version we pin: what the fake
does and a real head does not fails there.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from ray_head import HEAD_GPUS, closed_port

from workloads.ray_values import JOB_START_TIMEOUT_S, PLACE_RESOURCE

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# What Ray's JobInfo says of a status when nothing more particular is known (ray/dashboard/modules/job/common.py).
_MESSAGES = {
    "RUNNING": "Job is currently running.",
    "STOPPED": "Job was intentionally stopped.",
    "SUCCEEDED": "Job finished successfully.",
    "FAILED": "Job failed.",
}
# Ray's job supervisor: SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by default); it polls every 0.1 s.
STOP_WAIT_S = 3.0
# How long a call into the fake's thread (a start or a stop) may take before the test fails with what it was doing.
CALL_TIMEOUT_S = 60.0
# The line a head's job manager opens every job's log with.
RUNTIME_ENV_LINE = "Runtime env is setting up."
POLL_S = 0.1
# What a test head offers (tests/ray_head.py): two CPUs and HEAD_GPUS logical GPUs.
DEFAULT_RESOURCES = {"CPU": 2.0, "GPU": float(HEAD_GPUS)}


@dataclass
class _Job:
    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    resources: dict[str, float]
    log: Path
    start_time: int = field(default_factory=lambda: int(time.time() * 1000))
    status: str = "PENDING"
    message: str | None = None
    end_time: int | None = None
    driver_exit_code: int | None = None
    started: bool = False
    stop_requested: bool = False
    process: subprocess.Popen[bytes] | None = None

    def details(self) -> dict[str, Any]:
        return {
            "type": "SUBMISSION",
            "job_id": None,
            "submission_id": self.submission_id,
            "driver_info": None,
            "status": self.status,
            "entrypoint": self.entrypoint,
            "message": self.message or self._pending_message(),
            "error_type": None,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "metadata": self.metadata,
            "runtime_env": self.runtime_env,
            "driver_agent_http_address": "http://127.0.0.1" if self.started else None,
            "driver_node_id": "fake-node" if self.started else None,
            "driver_exit_code": self.driver_exit_code,
        }  # the entrypoint's resources are not among them: Ray's details leave them out

    def _pending_message(self) -> str:
        if self.status != "PENDING":
            return _MESSAGES[self.status]
        message = "Job has not started yet."
        if self.resources:
            message += " It may be waiting for resources (CPUs, GPUs, memory, custom resources) to become available."
        if self.runtime_env:
            message += " It may be waiting for the runtime environment to be set up."
        return message


def _resources(request: Mapping[str, Any]) -> dict[str, float]:
    """What the job's supervisor holds while it runs, in Ray's resource names."""
    held = {name: float(amount) for name, amount in (request.get("entrypoint_resources") or {}).items()}
    for key, name in (("entrypoint_num_cpus", "CPU"), ("entrypoint_num_gpus", "GPU"), ("entrypoint_memory", "memory")):
        if request.get(key):
            held[name] = held.get(name, 0.0) + float(request[key])
    return {name: amount for name, amount in held.items() if amount > 0}


class FakeJobsApi:
    """The Jobs API of one fake head on 127.0.0.1, served from a thread of its own; `address` is its URL."""

    def __init__(
        self,
        resources: Mapping[str, float] | None = None,
        start_timeout_s: float = JOB_START_TIMEOUT_S,
        ray_version: str = "2.49.2",
    ) -> None:
        self.resources = dict(DEFAULT_RESOURCES if resources is None else resources)
        self.start_timeout_s = start_timeout_s
        self.ray_version = ray_version
        self.port = closed_port()
        self.address = f"http://127.0.0.1:{self.port}"
        self.session_name = ""
        self._jobs: dict[str, _Job] = {}
        self._logs = Path(tempfile.mkdtemp(prefix="fake-ray-jobs-"))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    # -- the head's life ------------------------------------------------------------------------------------------

    def start(self) -> FakeJobsApi:
        if not self._thread.is_alive():
            self._thread.start()
        self._call(self._serve())
        return self

    def stop(self) -> None:
        """The head goes away: its jobs die with it and its port stops answering."""
        self._call(self._shutdown())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        for log in self._logs.glob("*"):
            log.unlink()
        self._logs.rmdir()

    def statuses(self) -> dict[str, str]:
        """Each job's status now, read from the head's thread's table (a copy of a dict is one step under the GIL)."""
        return {submission_id: job.status for submission_id, job in dict(self._jobs).items()}

    def _call(self, coroutine: Any) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=CALL_TIMEOUT_S)
        except TimeoutError:  # say where the fake's thread is: a hang here is otherwise a bare TimeoutError
            stacks = io.StringIO()
            for task in asyncio.all_tasks(self._loop):
                task.print_stack(file=stacks)
            print(f"fake_ray_jobs: a call timed out after {CALL_TIMEOUT_S:g} s; its tasks:\n{stacks.getvalue()}",
                  file=sys.stderr)  # fmt: skip
            raise

    async def _serve(self) -> None:
        self.session_name = f"session_fake_{uuid.uuid4().hex[:8]}"
        app = web.Application()
        app.add_routes(
            [
                web.get("/api/version", self._version),
                web.post("/api/jobs/", self._submit),
                web.get("/api/jobs/", self._list),
                web.get("/api/jobs/{id}", self._info),
                web.post("/api/jobs/{id}/stop", self._stop),
                web.delete("/api/jobs/{id}", self._delete),
                web.get("/api/jobs/{id}/logs", self._full_log),
                web.get("/api/jobs/{id}/logs/tail", self._tail),
            ]
        )
        # A head that dies drops its connections at once: no wait for a handler (a log tail) to finish.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
        self._scheduler = asyncio.create_task(self._schedule())

    async def _shutdown(self) -> None:
        if self._scheduler:
            self._scheduler.cancel()
        for job in self._jobs.values():
            if job.process and job.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.process.pid, signal.SIGKILL)
                job.process.wait(timeout=10)
        self._jobs.clear()
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    # -- what a head does with its jobs ---------------------------------------------------------------------------

    def _free(self) -> dict[str, float]:
        free = dict(self.resources)
        for job in self._jobs.values():
            if job.started and job.status not in TERMINAL:
                for name, amount in job.resources.items():
                    free[name] = free.get(name, 0.0) - amount
        return free

    async def _schedule(self) -> None:
        """Every POLL_S: end the jobs whose entrypoint exited, then start the queued ones that fit, in order."""
        while True:
            now = time.time()
            for job in list(self._jobs.values()):
                if job.status == "RUNNING" and job.process and (code := job.process.poll()) is not None:
                    self._exited(job, code)
            for job in sorted(self._jobs.values(), key=lambda job: job.start_time):
                if job.status != "PENDING":
                    continue
                free = self._free()
                if all(free.get(name, 0.0) >= amount for name, amount in job.resources.items()):
                    self._run(job)
                    if job.stop_requested and job.process:  # a stop given while queued: at its turn, as Ray does
                        self._background(self._terminate(job.process))
                elif now - job.start_time / 1000 > self.start_timeout_s:
                    self._end(job, "FAILED", message=_start_timeout_message(self.start_timeout_s))
            await asyncio.sleep(POLL_S)

    def _run(self, job: _Job) -> None:
        env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
        env.update({str(k): str(v) for k, v in (job.runtime_env.get("env_vars") or {}).items()})
        env["PYTHONUNBUFFERED"] = "1"
        # Polled by the scheduler, as Ray's supervisor polls its entrypoint: no child watcher (asyncio's runs a
        # thread per child) between the process's exit and the job's status.
        with job.log.open("ab") as log:
            job.process = subprocess.Popen(
                job.entrypoint, shell=True, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        job.started, job.status = True, "RUNNING"

    def _exited(self, job: _Job, code: int) -> None:
        if job.stop_requested:
            self._end(job, "STOPPED")
        elif code == 0:
            self._end(job, "SUCCEEDED", exit_code=0)
        else:
            tail = job.log.read_text(errors="replace")[-20_000:]
            message = (
                f"Job entrypoint command failed with exit code {code}, last available logs (truncated to 20,000 "
                f"chars):\n{tail}"
                if tail
                else f"Job entrypoint command failed with exit code {code}. No logs available."
            )
            self._end(job, "FAILED", message=message, exit_code=code)

    def _end(self, job: _Job, status: str, message: str | None = None, exit_code: int | None = None) -> None:
        job.status, job.message, job.driver_exit_code = status, message, exit_code
        job.end_time = int(time.time() * 1000)

    def _background(self, coroutine: Any) -> None:
        """A task of the head's own, kept until done (the loop holds only a weak reference to it)."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _terminate(self, process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    # -- the HTTP API ---------------------------------------------------------------------------------------------

    def _found(self, request: web.Request) -> _Job:
        job = self._jobs.get(request.match_info["id"])
        if job is None:
            raise web.HTTPNotFound(text=f"Job {request.match_info['id']} does not exist")
        return job

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"version": "2", "ray_version": self.ray_version, "ray_commit": "fake", "session_name": self.session_name}
        )

    async def _submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        submission_id = body.get("submission_id") or f"raysubmit_{uuid.uuid4().hex[:16]}"
        if submission_id in self._jobs:
            raise web.HTTPInternalServerError(
                text=f"ValueError: Job with submission_id {submission_id} already exists. "
                "Please use a different submission_id."
            )
        self._jobs[submission_id] = _Job(
            submission_id=submission_id,
            entrypoint=body["entrypoint"],
            runtime_env=body.get("runtime_env") or {},
            metadata=body.get("metadata") or {},
            resources=_resources(body),
            log=self._logs / f"{uuid.uuid4().hex}.log",
        )
        # A job's log opens with Ray's own line, before the entrypoint's output.
        stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
        self._jobs[submission_id].log.write_text(f"{stamp}\tINFO job_manager.py:531 -- {RUNTIME_ENV_LINE}\n")
        return web.json_response({"job_id": submission_id, "submission_id": submission_id})

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self._found(request).details())

    async def _list(self, _request: web.Request) -> web.Response:
        return web.json_response([job.details() for job in self._jobs.values()])

    async def _stop(self, request: web.Request) -> web.Response:
        job = self._found(request)
        if job.status in TERMINAL:
            return web.json_response({"stopped": False})
        job.stop_requested = True
        if job.process is not None:
            self._background(self._terminate(job.process))
        return web.json_response({"stopped": True})

    async def _delete(self, request: web.Request) -> web.Response:
        job = self._found(request)
        if job.status not in TERMINAL:
            raise web.HTTPInternalServerError(
                text=f"RuntimeError: Attempted to delete job '{job.submission_id}', but it is in a non-terminal "
                f"state {job.status}."
            )
        del self._jobs[job.submission_id]
        return web.json_response({"deleted": True})

    async def _full_log(self, request: web.Request) -> web.Response:
        job = self._found(request)
        return web.json_response({"logs": job.log.read_text(errors="replace") if job.log.exists() else ""})

    async def _tail(self, request: web.Request) -> web.StreamResponse:
        job = self._found(request)
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        while not job.started:
            if job.status in TERMINAL:
                return socket
            await asyncio.sleep(POLL_S)
        sent = 0
        while True:
            done = job.status in TERMINAL
            text = job.log.read_bytes()[sent:] if job.log.exists() else b""
            if text:
                await socket.send_str(text.decode(errors="replace"))
                sent += len(text)
            if done:
                await socket.close()
                return socket
            await asyncio.sleep(POLL_S)


def _start_timeout_message(timeout_s: float) -> str:
    return (
        f"Job supervisor actor failed to start within {float(timeout_s)} seconds. This timeout can be configured by "
        "setting the environment variable RAY_JOB_START_TIMEOUT_SECONDS. This may be because the job entrypoint's "
        "specified resources (entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources, entrypoint_memory)"
        "aren't available on the cluster. Try checking the cluster's available resources with `ray status` and "
        "specifying fewer resources for the job entrypoint."
    )


@contextlib.contextmanager
def fake_jobs_api(**kwargs: Any) -> Iterator[FakeJobsApi]:
    api = FakeJobsApi(**kwargs).start()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def jobs_address() -> Iterator[str]:
    """The Jobs API of a fake head shared by the session's scenario tests, offering what the session's real head
    offers (tests/ray_head.py): the machine's CPUs, HEAD_GPUS logical GPUs and as many places."""
    with fake_jobs_api(resources={**DEFAULT_RESOURCES, PLACE_RESOURCE: float(HEAD_GPUS)}) as api:
        yield api.address
