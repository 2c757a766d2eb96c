"""Tests for jobs/ray_submit.py against the Jobs API: the fake of tests/fake_ray_jobs.py (its contract with the real
heads is tests/jobs/test_jobs_api_contract.py) for the submitter's decisions, and a real Ray head (the session's, on
127.0.0.1 only) for one whole step end to end.

Most tests run the script as a subprocess, which is how the Kubernetes Job uses it. A few in-process tests load it
by path to drive paths a real cluster cannot produce on demand (the submit race, an outage past the timeout).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from api_proxy import DOWN, SILENT, UP, ApiProxy
from ray_head import closed_port, wait_for
from script_loader import load_script
from submitter import attempts as attempts_module
from submitter import errors, head_restart, log_follower, output, ray_api, stop_on_delete

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "ray_submit.py"

pytestmark = pytest.mark.timeout(300)


rs = load_script("jobs/ray_submit.py", "ray_submit_under_test")


@pytest.fixture(scope="session")
def client(jobs_address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(jobs_address)


@pytest.fixture(params=["fake", "real head"])
def either_api(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """The fake's Jobs API or the real head's, with Ray's client for it."""
    from ray.job_submission import JobSubmissionClient

    address = request.getfixturevalue("jobs_address" if request.param == "fake" else "ray_address")
    return address, JobSubmissionClient(address)


def _new_id(label: str) -> str:
    return f"t-{label}-{uuid.uuid4().hex[:8]}"


def _cmd(address: str, sid: str, *entrypoint: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(SCRIPT), "--address", address, "--submission-id", sid, *extra, "--", *entrypoint]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def _until(release: Path) -> str:
    """Shell that waits until `release` exists: a job that runs as long as a test needs, however loaded the machine."""
    return f"until [ -e {release} ]; do sleep 0.2; done"


def _run_attached(commands: list[list[str]], release: Path) -> list[tuple[int, str]]:
    """Run submitters at once; their job (waiting on `release`) is let finish once every one follows its log."""
    procs = [_start(args) for args in commands]
    outputs: list[list[str]] = [[] for _ in procs]
    following = [threading.Event() for _ in procs]

    def read(index: int) -> None:
        stdout = procs[index].stdout
        assert stdout is not None
        for line in stdout:
            outputs[index].append(line)
            if "streaming the logs" in line:
                following[index].set()
        following[index].set()  # ended without following: the assertions say why

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    try:
        for reader in readers:
            reader.start()
        for event in following:
            event.wait(120)
        release.touch()
        for proc, reader in zip(procs, readers, strict=True):
            proc.wait(timeout=120)
            reader.join(timeout=10)
    finally:
        release.touch()
        for proc in procs:
            proc.kill()
    return [(proc.returncode, "".join(out)) for proc, out in zip(procs, outputs, strict=True)]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _jobs_with_id(client: Any, sid: str) -> list[Any]:
    return [job for job in client.list_jobs() if job.submission_id == sid]


def _status(client: Any, sid: str) -> str | None:
    try:
        return str(client.get_job_status(sid))
    except RuntimeError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Against the real head


def test_succeeded_streams_logs_once_and_exits_0(either_api: tuple[str, Any]) -> None:
    jobs_address, client = either_api
    sid = _new_id("ok")
    # The job prints "answer-42"; the entrypoint text itself does not contain that string.
    result = _run(_cmd(jobs_address, sid, "sh", "-c", "echo answer-$((6*7)); echo second-$((1+1))"))
    assert result.returncode == errors.EXIT_SUCCEEDED == 0, result.stdout + result.stderr
    assert result.stdout.count("answer-42") == 1, result.stdout
    assert result.stdout.count("second-2") == 1, result.stdout
    assert result.stdout.index("answer-42") < result.stdout.index("second-2")
    assert _last_line(result.stdout) == f"ray_submit: job {sid} SUCCEEDED"
    assert str(client.get_job_status(sid)) == "SUCCEEDED"
    assert len(_jobs_with_id(client, sid)) == 1


def test_failed_job_exits_1(jobs_address: str, client: Any) -> None:
    sid = _new_id("fail")
    result = _run(_cmd(jobs_address, sid, "sh", "-c", "echo broken-$((2+3)); exit 7"))
    assert result.returncode == errors.EXIT_FAILED == 1, result.stdout + result.stderr
    # Streamed once; Ray's failure message (which repeats the last log lines) is not printed in full.
    assert result.stdout.count("broken-5") == 1, result.stdout
    assert _last_line(result.stdout) == f"ray_submit: job {sid} FAILED (driver exit code 7)"
    assert f"ray job delete {sid}" in result.stdout  # tells the user how to retry
    assert str(client.get_job_status(sid)) == "FAILED"


def _stopped_while_running(client: Any, sid: str, args: list[str], started: str = "") -> tuple[int, str]:
    """Run the submitter, `ray job stop` the job once it runs (and its log holds `started`: RUNNING comes before
    the entrypoint's first line); the submitter's exit code and output."""
    proc = _start(args)
    try:
        wait_for(lambda: _status(client, sid) == "RUNNING" and started in client.get_job_logs(sid), 60,
                 "the job to run")  # fmt: skip
        assert client.stop_job(sid) is True
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, out


def test_stopped_job_exits_3(jobs_address: str, client: Any) -> None:
    sid = _new_id("stop")
    code, out = _stopped_while_running(
        client, sid, _cmd(jobs_address, sid, "sh", "-c", "echo started-$((3*3)); sleep 60"), started="started-9"
    )
    assert code == errors.EXIT_STOPPED == 3, out
    assert _last_line(out) == f"ray_submit: job {sid} STOPPED"
    assert out.count("started-9") == 1, out
    assert str(client.get_job_status(sid)) == "STOPPED"


def test_already_succeeded_id_is_not_run_again(jobs_address: str, client: Any, tmp_path: Path) -> None:
    sid = _new_id("dup")
    marker = tmp_path / "runs.txt"
    entry = ("sh", "-c", f"echo ran >> {marker}")
    first = _run(_cmd(jobs_address, sid, *entry))
    assert first.returncode == 0, first.stdout + first.stderr
    second = _run(_cmd(jobs_address, sid, *entry))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already SUCCEEDED" in second.stdout
    assert "submitting job" not in second.stdout
    assert _last_line(second.stdout) == f"ray_submit: job {sid} SUCCEEDED"
    assert marker.read_text().splitlines() == ["ran"]
    # Same id, another command (a changed run under an old name): refused, nothing runs, nothing is reported as done.
    third = _run(_cmd(jobs_address, sid, "sh", "-c", f"echo other >> {marker}"))
    assert third.returncode == errors.EXIT_USAGE == 2, third.stdout + third.stderr
    assert "already exists with a different command" in third.stdout
    assert "SUCCEEDED" not in _last_line(third.stdout)
    assert marker.read_text().splitlines() == ["ran"]
    assert len(_jobs_with_id(client, sid)) == 1


def test_concurrent_submitters_share_one_job(jobs_address: str, client: Any, tmp_path: Path) -> None:
    sid = _new_id("race")
    marker = tmp_path / "runs.txt"
    release = tmp_path / "release"
    args = _cmd(jobs_address, sid, "sh", "-c", f"echo ran >> {marker}; {_until(release)}; echo finished-$((4+4))")
    results = _run_attached([args, args], release)
    outs = [out for _, out in results]
    for code, out in results:
        assert code == 0, out
        assert _last_line(out) == f"ray_submit: job {sid} SUCCEEDED"
        assert out.count("finished-8") == 1, out
    # Exactly one of them attached (after a lookup or after losing the submit race).
    assert sum("attaching" in out for out in outs) == 1, outs
    assert marker.read_text().splitlines() == ["ran"]
    assert len(_jobs_with_id(client, sid)) == 1


def test_restarted_submitter_reattaches_after_sigterm(jobs_address: str, client: Any, tmp_path: Path) -> None:
    sid = _new_id("pod")
    marker = tmp_path / "runs.txt"
    release = tmp_path / "release"
    args = _cmd(jobs_address, sid, "sh", "-c", f"echo ran >> {marker}; {_until(release)}; echo end-$((1+1))")
    first = _start(args)
    try:
        wait_for(lambda: marker.exists() and _status(client, sid) == "RUNNING", 60, "the job to start")
        first.send_signal(signal.SIGTERM)
        first_out, _ = first.communicate(timeout=20)
    finally:
        first.kill()
    assert first.returncode == errors.EXIT_SIGTERM == 143, first_out
    assert "WITHOUT stopping" in first_out
    assert _status(client, sid) == "RUNNING"  # the job survived its submitter

    [(code, out)] = _run_attached([args], release)
    assert code == 0, out
    assert "attaching to it instead of submitting again" in out
    assert out.count("end-2") == 1, out
    assert _last_line(out) == f"ray_submit: job {sid} SUCCEEDED"
    assert marker.read_text().splitlines() == ["ran"]
    assert len(_jobs_with_id(client, sid)) == 1


def test_runtime_env_secret_values_are_never_printed(jobs_address: str, client: Any) -> None:
    sid = _new_id("env")
    secret = "sk-" + uuid.uuid4().hex
    other = "plain-" + uuid.uuid4().hex
    runtime_env = {"env_vars": {"MY_TOKEN": secret, "PLAIN_FLAG": other}}
    result = _run(
        _cmd(
            jobs_address,
            sid,
            "sh",
            "-c",
            "echo token-length-${#MY_TOKEN}",
            extra=("--runtime-env-json", json.dumps(runtime_env)),
        )
    )
    combined = result.stdout + result.stderr
    assert result.returncode == 0, combined
    assert f"token-length-{len(secret)}" in result.stdout  # the job did receive the value
    assert secret not in combined and other not in combined
    assert "MY_TOKEN" in result.stdout and "PLAIN_FLAG" in result.stdout  # names are shown
    assert "env_vars=[MY_TOKEN, PLAIN_FLAG]" in result.stdout


# ---------------------------------------------------------------------------------------------------------------
# Without a head


def test_unreachable_address_exits_4_quickly() -> None:
    address = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = _run(_cmd(address, "t-unreachable", "true", extra=("--connect-timeout", "2")), timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == errors.EXIT_UNREACHABLE == 4, result.stdout + result.stderr
    # It gave up after --connect-timeout, not the default 600 s; starting Python and importing Ray take the rest,
    # which on two loaded cores was seen to reach 30 s.
    assert elapsed < 120
    assert "waiting up to 2 s" in result.stdout
    assert address in _last_line(result.stdout)
    assert "unreachable" in _last_line(result.stdout)


@pytest.mark.parametrize(
    ("label", "argv"),
    [
        ("no entrypoint after --", ["--address", "http://127.0.0.1:1", "--submission-id", "x", "--"]),
        ("no -- at all", ["--address", "http://127.0.0.1:1", "--submission-id", "x"]),
        ("unknown flag", ["--address", "http://127.0.0.1:1", "--submission-id", "x", "--bogus", "--", "true"]),
        ("missing address", ["--submission-id", "x", "--", "true"]),
        ("bad timeout", ["--address", "http://127.0.0.1:1", "--submission-id", "x", "--connect-timeout", "soon"]),
        ("bad id", ["--address", "http://127.0.0.1:1", "--submission-id", "a/b", "--", "true"]),
        ("bad address", ["--address", "127.0.0.1:8265", "--submission-id", "x", "--", "true"]),
        (
            "bad JSON",
            ["--address", "http://127.0.0.1:1", "--submission-id", "x", "--runtime-env-json", "{nope", "--", "true"],
        ),
        (
            "JSON not an object",
            ["--address", "http://127.0.0.1:1", "--submission-id", "x", "--runtime-env-json", "[1]", "--", "true"],
        ),
    ],
)
def test_usage_errors_exit_2(label: str, argv: list[str]) -> None:
    result = _run([sys.executable, str(SCRIPT), *argv], timeout=60)
    assert result.returncode == errors.EXIT_USAGE == 2, f"{label}: {result.stdout}{result.stderr}"
    assert "usage:" in result.stderr, label


def test_bad_json_error_does_not_echo_the_secret() -> None:
    secret = "sk-" + uuid.uuid4().hex
    bad = '{"env_vars": {"TOKEN": "' + secret + '"}'  # missing closing brace
    argv = ["--address", "http://127.0.0.1:1", "--submission-id", "x", "--runtime-env-json", bad, "--", "true"]
    result = _run([sys.executable, str(SCRIPT), *argv], timeout=60)
    assert result.returncode == 2
    assert "not valid JSON" in result.stderr
    assert secret not in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------
# In process: paths a real head does not produce on demand


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_outage_longer_than_timeout_raises_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    clock = _Clock()
    outage = ray_api.Outage(10.0, "http://head:8265", output.Output(), clock=clock)
    err = ConnectionError("refused")
    assert outage.failed(err, "polling") == ray_api.BACKOFF_FIRST_S
    clock.now = 9.0
    assert 0 < outage.failed(err, "polling") <= 1.0  # never sleeps past the deadline
    outage.ok()  # an answer resets the outage window
    clock.now = 15.0
    outage.failed(err, "polling")
    clock.now = 24.9
    outage.failed(err, "polling")
    clock.now = 25.0
    with pytest.raises(errors.UnreachableError, match="http://head:8265"):
        outage.failed(err, "polling")
    assert "answers again" in capsys.readouterr().out


def test_lost_connection_while_waiting_exits_4(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from ray.job_submission import JobStatus

    class HeadGoesAway:
        def __init__(self) -> None:
            self.calls = 0

        def get_job_info(self, sid: str) -> Any:
            self.calls += 1
            if self.calls <= 2:
                return SimpleNamespace(submission_id=sid, status=JobStatus.RUNNING, message="", driver_exit_code=None)
            raise ConnectionError("Failed to connect to Ray")

        async def tail_job_logs(self, sid: str) -> AsyncIterator[str]:
            yield "partial log\n"
            await asyncio.sleep(3600)

        def submit_job(self, **kwargs: Any) -> str:
            raise AssertionError("must not submit: the job exists")

    fake = HeadGoesAway()
    monkeypatch.setattr(attempts_module, "connect", lambda address, outage: fake)
    monkeypatch.setattr(head_restart, "probe_version", lambda address: "session-1")  # the head's identity
    monkeypatch.setattr(log_follower, "STATUS_POLL_S", 0.05)
    monkeypatch.setattr(ray_api, "BACKOFF_MAX_S", 0.1)
    monkeypatch.setattr(rs, "install_signal_handlers", lambda *args: None)  # keep pytest's own handlers
    started = time.monotonic()
    code = rs.main(["--address", "http://head:8265", "--submission-id", "j1", "--connect-timeout", "1", "--", "true"])
    out = capsys.readouterr().out
    assert code == errors.EXIT_UNREACHABLE
    assert time.monotonic() - started < 10
    assert out.count("partial log") == 1
    assert out.splitlines()[-1] == "ray_submit: job j1: Ray unreachable at http://head:8265"


def test_losing_the_submit_race_attaches_instead_of_failing(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from ray.job_submission import JobStatus

    class RaceLost:
        def __init__(self) -> None:
            self.lookups = 0
            self.submits = 0

        def get_job_info(self, sid: str) -> Any:
            self.lookups += 1
            if self.lookups == 1:  # not there yet when we look ...
                raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")
            status = JobStatus.RUNNING if self.lookups < 4 else JobStatus.SUCCEEDED
            return SimpleNamespace(submission_id=sid, status=status, message="ok", driver_exit_code=0)

        def submit_job(self, **kwargs: Any) -> str:  # ... but the other submitter wins
            self.submits += 1
            sid = kwargs["submission_id"]
            raise RuntimeError(
                f"Request failed with status code 500: ValueError: Job with submission_id {sid} already exists."
            )

        async def tail_job_logs(self, sid: str) -> AsyncIterator[str]:
            for chunk in ("one\n", "two\n"):
                yield chunk

        def get_job_logs(self, sid: str) -> str:
            return "one\ntwo\n"

    fake = RaceLost()
    monkeypatch.setattr(attempts_module, "connect", lambda address, outage: fake)
    monkeypatch.setattr(head_restart, "probe_version", lambda address: "session-1")  # the head's identity
    monkeypatch.setattr(log_follower, "STATUS_POLL_S", 0.05)
    monkeypatch.setattr(rs, "install_signal_handlers", lambda *args: None)  # keep pytest's own handlers
    code = rs.main(["--address", "http://head:8265", "--submission-id", "j2", "--", "python", "train.py"])
    out = capsys.readouterr().out
    assert code == errors.EXIT_SUCCEEDED
    assert fake.submits == 1
    assert "submitted by another submitter at the same time; attaching" in out
    assert out.count("one\n") == 1 and out.count("two\n") == 1
    assert out.splitlines()[-1] == "ray_submit: job j2 SUCCEEDED"


class _Scripted:
    """A fake Jobs API: the job is unknown until submitted, then RUNNING for a few lookups, then SUCCEEDED."""

    def __init__(self, submit_errors: list[str], streamed: list[str], full_log: str) -> None:
        self.submit_errors = submit_errors
        self.streamed = streamed
        self.full_log = full_log
        self.submitted = False
        self.submits = 0
        self.lookups_after_submit = 0

    def get_job_info(self, sid: str) -> Any:
        from ray.job_submission import JobStatus

        if not self.submitted:
            raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")
        self.lookups_after_submit += 1
        status = JobStatus.RUNNING if self.lookups_after_submit < 3 else JobStatus.SUCCEEDED
        return SimpleNamespace(submission_id=sid, status=status, message="ok", driver_exit_code=0)

    def submit_job(self, **kwargs: Any) -> str:
        self.submits += 1
        if self.submit_errors:
            raise RuntimeError(self.submit_errors.pop(0))
        self.submitted = True
        return str(kwargs["submission_id"])

    async def tail_job_logs(self, sid: str) -> AsyncIterator[str]:
        for chunk in self.streamed:
            yield chunk

    def get_job_logs(self, sid: str) -> str:
        return self.full_log


def _run_fake(monkeypatch: pytest.MonkeyPatch, fake: _Scripted, sid: str) -> int:
    monkeypatch.setattr(attempts_module, "connect", lambda address, outage: fake)
    monkeypatch.setattr(head_restart, "probe_version", lambda address: "session-1")  # the head's identity
    monkeypatch.setattr(log_follower, "STATUS_POLL_S", 0.05)
    monkeypatch.setattr(ray_api, "BACKOFF_FIRST_S", 0.01)
    monkeypatch.setattr(rs, "install_signal_handlers", lambda *args: None)  # keep pytest's own handlers
    return rs.main(["--address", "http://head:8265", "--submission-id", sid, "--", "python", "train.py"])


def test_a_stream_that_closes_early_still_prints_the_whole_log(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    # The websocket delivers the first line and closes without an error; the job goes on and finishes.
    fake = _Scripted(submit_errors=[], streamed=["one\n"], full_log="one\ntwo\nthree\n")
    assert _run_fake(monkeypatch, fake, "j3") == errors.EXIT_SUCCEEDED
    out = capsys.readouterr().out
    assert out.count("one\n") == 1 and out.count("two\n") == 1 and out.count("three\n") == 1
    assert out.index("one") < out.index("two") < out.index("three")


def test_a_gateway_error_on_submit_is_retried_not_fatal(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    # A proxy in front of a restarting head answers 502 once; the retry submits and the job runs.
    fake = _Scripted(
        submit_errors=["Request failed with status code 502: Bad Gateway"], streamed=["ok\n"], full_log="ok\n"
    )
    assert _run_fake(monkeypatch, fake, "j4") == errors.EXIT_SUCCEEDED
    assert fake.submits == 2
    assert capsys.readouterr().out.splitlines()[-1] == "ray_submit: job j4 SUCCEEDED"


def test_reopened_log_stream_skips_what_was_printed(capsys: pytest.CaptureFixture[str]) -> None:
    no_client: Any = None  # write_from and catch_up never call the client
    follower = log_follower.LogFollower(client=no_client, submission_id="j", out=output.Output())
    follower.write_from(0, "abc\n")
    follower.write_from(4, "de")
    # The stream was reopened: it replays from the start, in different chunks, then goes on.
    follower.write_from(0, "ab")
    follower.write_from(2, "c\nd")
    follower.write_from(5, "ef\n")
    follower.catch_up("abc\ndef\ng\n")
    assert capsys.readouterr().out == "abc\ndef\ng\n"


class _VersionOnly(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"version": "4", "ray_version": "2.49.2", "ray_commit": "x", "session_name": "s"})
        self.send_response(200 if self.path == "/api/version" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_waits_for_the_api_to_come_up() -> None:
    port = closed_port()
    address = f"http://127.0.0.1:{port}"
    servers: list[http.server.HTTPServer] = []

    def serve_later() -> None:
        time.sleep(1.5)
        server = http.server.HTTPServer(("127.0.0.1", port), _VersionOnly)
        servers.append(server)
        server.serve_forever(poll_interval=0.1)

    threading.Thread(target=serve_later, daemon=True).start()
    try:
        started = time.monotonic()
        client = ray_api.connect(address, ray_api.Outage(30.0, address, output.Output()))
        assert time.monotonic() - started >= 1.4
        assert client is not None
    finally:
        wait_for(lambda: bool(servers), 10, "the fake server")
        servers[0].shutdown()
        servers[0].server_close()


# ---------------------------------------------------------------------------------------------------------------
# Automatic retries (--max-retries), against the real head


def _statuses(client: Any, sid: str, attempts: int) -> list[str | None]:
    return [_status(client, attempts_module.attempt_id(sid, k)) for k in range(attempts)]


def test_a_driver_that_fails_once_is_retried_as_r1(jobs_address: str, client: Any, tmp_path: Path) -> None:
    sid = _new_id("retry")
    marker = tmp_path / "runs.txt"
    # Fails on its first run, succeeds on the second: what a lost node looks like to the train step.
    script = f"echo run >> {marker}; if [ $(wc -l < {marker}) -lt 2 ]; then echo boom-$((2*3)); exit 5; fi; echo ok"
    args = _cmd(jobs_address, sid, "sh", "-c", script, extra=("--max-retries", "2"))
    first = _run(args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert _statuses(client, sid, 3) == ["FAILED", "SUCCEEDED", None]
    assert f"attempt 1 of 3 ({sid}) FAILED (driver exit code 5)" in first.stdout
    assert f"retrying as {sid}-r1 (retry 1 of 2)" in first.stdout
    assert first.stdout.count("boom-6") == 1, first.stdout
    assert _last_line(first.stdout) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert marker.read_text().splitlines() == ["run", "run"]

    # A rerun (a new pod, same arguments) finds the succeeded attempt and submits nothing.
    again = _run(args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "submitting job" not in again.stdout
    assert f"{sid}-r1 is the latest attempt of {sid}" in again.stdout
    assert _last_line(again.stdout) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert marker.read_text().splitlines() == ["run", "run"]
    assert len(_jobs_with_id(client, f"{sid}-r2")) == 0

    # Another command under the same ids is refused, whichever attempt it would meet.
    other = _run(_cmd(jobs_address, sid, "sh", "-c", "echo other", extra=("--max-retries", "2")))
    assert other.returncode == errors.EXIT_USAGE, other.stdout + other.stderr
    assert "already exists with a different command" in other.stdout


def test_retries_are_bounded(jobs_address: str, client: Any) -> None:
    sid = _new_id("bound")
    args = _cmd(jobs_address, sid, "sh", "-c", "exit 9", extra=("--max-retries", "1"))
    result = _run(args)
    assert result.returncode == errors.EXIT_FAILED, result.stdout + result.stderr
    assert _statuses(client, sid, 3) == ["FAILED", "FAILED", None]  # N + 1 attempts, no more
    assert _last_line(result.stdout) == f"ray_submit: job {sid}-r1 FAILED (driver exit code 9)"
    assert "all 2 attempts failed" in result.stdout and "--max-retries" in result.stdout
    # Rerun with the same budget: nothing new is submitted, the same outcome is reported.
    again = _run(args)
    assert again.returncode == errors.EXIT_FAILED
    assert "submitting job" not in again.stdout
    assert _status(client, f"{sid}-r2") is None


def test_a_stopped_attempt_is_never_retried(jobs_address: str, client: Any) -> None:
    sid = _new_id("nostop")
    args = _cmd(jobs_address, sid, "sh", "-c", "sleep 60", extra=("--max-retries", "3"))
    code, out = _stopped_while_running(client, sid, args)
    assert code == errors.EXIT_STOPPED, out
    assert _last_line(out) == f"ray_submit: job {sid} STOPPED"
    again = _run(args)
    assert again.returncode == errors.EXIT_STOPPED, again.stdout + again.stderr
    assert "submitting job" not in again.stdout
    assert _status(client, f"{sid}-r1") is None


def test_a_submitter_killed_between_attempts_continues(jobs_address: str, client: Any, tmp_path: Path) -> None:
    sid = _new_id("between")
    marker = tmp_path / "runs.txt"
    release = tmp_path / "release"
    first_fails = f"if [ $(wc -l < {marker}) -lt 2 ]; then exit 4; fi"
    script = f"echo run >> {marker}; {first_fails}; {_until(release)}; echo done-$((5+5))"
    words = ("sh", "-c", script)
    # Attempt 0 ran and failed, and its submitter pod died before it could submit the retry.
    client.submit_job(entrypoint=shlex.join(words), submission_id=sid)
    wait_for(lambda: _status(client, sid) == "FAILED", 60, "attempt 0 to fail")
    args = _cmd(jobs_address, sid, *words, extra=("--max-retries", "1"))
    first = _start(args)
    try:  # the new pod submits attempt 1 ... and is itself killed while it runs
        wait_for(lambda: _status(client, f"{sid}-r1") == "RUNNING", 60, "attempt 1 to run")
        first.send_signal(signal.SIGTERM)
        first_out, _ = first.communicate(timeout=20)
    finally:
        first.kill()
    assert first.returncode == errors.EXIT_SIGTERM, first_out
    assert f"attempt 1 of 2 ({sid}) FAILED in an earlier run (driver exit code 4)" in first_out
    assert f"WITHOUT stopping Ray job {sid}-r1" in first_out
    [(code, out)] = _run_attached([args], release)  # the pod after that attaches to attempt 1
    assert code == 0, out
    assert "attaching to it instead of submitting again" in out
    assert out.count("done-10") == 1
    assert _last_line(out) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert marker.read_text().splitlines() == ["run", "run"]
    assert _statuses(client, sid, 3) == ["FAILED", "SUCCEEDED", None]


# ---------------------------------------------------------------------------------------------------------------
# Stop when the run is deleted: the real head, and a fake Kubernetes API on loopback


class _FakeKubeApi(http.server.BaseHTTPRequestHandler):
    """Answers GETs for one Job and one ConfigMap from `objects` (path -> object, None = 404)."""

    objects: ClassVar[dict[str, dict[str, Any] | None]] = {}
    tokens: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).tokens.append(self.headers.get("Authorization", ""))
        obj = type(self).objects.get(self.path)
        status = 404 if obj is None else 200
        if obj is not None and obj.get("status") == "Forbidden":
            status = 403
        body = json.dumps(obj or {"kind": "Status", "code": 404}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


JOB_PATH = "/apis/batch/v1/namespaces/ns1/jobs/run1-pipeline"
MARKER_PATH = "/api/v1/namespaces/ns1/configmaps/run1-run"
LIVE = {"metadata": {"name": "x", "uid": "u1"}}
DELETING = {"metadata": {"name": "x", "uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z"}}


@pytest.fixture
def kube_api(tmp_path: Path) -> Any:
    token_dir = tmp_path / "sa"
    token_dir.mkdir()
    (token_dir / "token").write_text("tok-123\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeKubeApi)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    _FakeKubeApi.tokens = []
    try:
        yield SimpleNamespace(address=f"http://127.0.0.1:{server.server_address[1]}", token_dir=token_dir)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("job", "marker", "deleted", "why"),
    [
        (LIVE, LIVE, False, "not being deleted"),  # eviction, drain, node loss
        (LIVE, None, False, "not being deleted"),  # the Job is untouched: its own word counts
        (DELETING, LIVE, False, "marker ConfigMap run1-run stays"),  # Job replaced by `pulumi up`
        (None, LIVE, False, "marker ConfigMap run1-run stays"),
        (DELETING, DELETING, True, "the run is being destroyed"),  # pulumi destroy (foreground deletion)
        (None, None, True, "the run is being destroyed"),  # pulumi destroy (background deletion)
        ({"status": "Forbidden"}, None, False, "could not ask"),  # RBAC broken: never stop on a guess
    ],
)
def test_run_deleted_decision(kube_api: Any, job: Any, marker: Any, deleted: bool, why: str) -> None:
    _FakeKubeApi.objects = {JOB_PATH: job, MARKER_PATH: marker}
    k8s = stop_on_delete.K8sRun("ns1", "run1-pipeline", "run1-run", kube_api.address, str(kube_api.token_dir))
    decision, reason = k8s.run_deleted()
    assert (decision, why in reason) == (deleted, True), reason
    assert _FakeKubeApi.tokens and set(_FakeKubeApi.tokens) == {"Bearer tok-123"}


def test_run_deleted_is_false_when_the_api_does_not_answer(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    k8s = stop_on_delete.K8sRun("ns1", "j", "m", f"http://127.0.0.1:{closed_port()}", str(tmp_path))
    decision, reason = k8s.run_deleted()
    assert decision is False and "could not ask" in reason


def _k8s_flags(kube_api: Any) -> tuple[str, ...]:
    return (
        "--k8s-job", "run1-pipeline", "--k8s-run-marker", "run1-run", "--k8s-namespace", "ns1",
        "--k8s-api", kube_api.address, "--k8s-token-dir", str(kube_api.token_dir), "--stop-timeout", "30",
    )  # fmt: skip


@pytest.mark.parametrize("destroyed", [True, False])
def test_sigterm_stops_the_ray_job_only_when_the_run_is_deleted(
    jobs_address: str, client: Any, kube_api: Any, destroyed: bool
) -> None:
    sid = _new_id("del" if destroyed else "evict")
    _FakeKubeApi.objects = {JOB_PATH: None, MARKER_PATH: None} if destroyed else {JOB_PATH: LIVE, MARKER_PATH: LIVE}
    proc = _start(_cmd(jobs_address, sid, "sh", "-c", "sleep 120", extra=_k8s_flags(kube_api)))
    try:
        wait_for(lambda: _status(client, sid) == "RUNNING", 60, "the job to run")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        proc.kill()
    assert proc.returncode == errors.EXIT_SIGTERM, out
    assert _FakeKubeApi.tokens, "the submitter never asked the Kubernetes API"
    if destroyed:
        assert _status(client, sid) == "STOPPED", out  # stopped before the submitter exited
        assert f"job {sid} is STOPPED" in out
        assert took < 30  # well inside the pod's termination grace period
    else:
        assert _status(client, sid) == "RUNNING", out
        assert "WITHOUT stopping" in out
        client.stop_job(sid)


@pytest.fixture
def proxy(jobs_address: str) -> Iterator[ApiProxy]:
    fronted = ApiProxy(jobs_address)
    try:
        yield fronted
    finally:
        fronted.close()


def _sigterm_while(proxy: ApiProxy, mode: str, client: Any, kube_api: Any, stop_timeout: str) -> tuple[str, str, float]:
    """A deleted run's submitter, following its job through the proxy, gets SIGTERM while the proxy is `mode`."""
    sid = _new_id(f"stop-{mode}")
    _FakeKubeApi.objects = {JOB_PATH: None, MARKER_PATH: None}
    flags = (*_k8s_flags(kube_api)[:-1], stop_timeout)
    proc = _start(_cmd(proxy.address, sid, "sh", "-c", "sleep 300", extra=flags))
    try:
        wait_for(lambda: _status(client, sid) == "RUNNING", 60, "the job to run")
        proxy.mode = mode
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if mode == DOWN:
            time.sleep(10)  # a 10 s outage of the head's API, then it answers again
            proxy.mode = UP
        out, _ = proc.communicate(timeout=90)
        took = time.monotonic() - started
    finally:
        proc.kill()
    assert proc.returncode == errors.EXIT_SIGTERM, out
    return sid, out, took


def test_sigterm_during_an_api_outage_still_stops_the_job(
    jobs_address: str, client: Any, kube_api: Any, proxy: ApiProxy
) -> None:
    from launcher.job import GRACE_SECONDS

    sid, out, took = _sigterm_while(proxy, DOWN, client, kube_api, "30")
    assert _status(client, sid) == "STOPPED", out
    assert f"stopping job {sid}: " in out and "trying again until 30 s have passed" in out
    assert f"job {sid} is STOPPED" in out and f"exiting after stopping Ray job {sid}" in out
    assert took < GRACE_SECONDS, out  # the pod's grace period


def test_an_api_that_never_answers_is_given_up_within_the_stop_timeout(
    jobs_address: str, client: Any, kube_api: Any, proxy: ApiProxy
) -> None:
    sid, out, took = _sigterm_while(proxy, SILENT, client, kube_api, "8")
    try:
        assert _status(client, sid) == "RUNNING", out
        assert f"could NOT stop job {sid} within 8 s" in out
        assert f"`ray job stop --address {proxy.address} {sid}`" in out
        assert f"Ray job {sid} was NOT stopped" in out and "exiting after stopping" not in out
        assert took < 8 + 2 * stop_on_delete.K8S_TIMEOUT_S + 5, out  # the deadline, the two API reads, start-up
    finally:
        client.stop_job(sid)


def test_the_printed_stop_command_stops_the_newest_attempt(jobs_address: str, client: Any) -> None:
    """The job stack's rayJobCommands, run as printed (address aside) with the real `ray` CLI: after a retry the
    running attempt is ID-r1, and that is the one stopped; ID itself is never looked for again."""
    from launcher.script import ray_job_command
    from launcher.steps import Step

    sid = _new_id("printed")
    client.submit_job(entrypoint="exit 3", submission_id=sid)
    wait_for(lambda: _status(client, sid) == "FAILED", 60, "attempt 0 to fail")
    client.submit_job(entrypoint="sleep 120", submission_id=f"{sid}-r1")
    wait_for(lambda: _status(client, f"{sid}-r1") == "RUNNING", 60, "attempt 1 to run")
    stop = ray_job_command(Step("train", sid, ["true"], max_retries=2), "stop", address=jobs_address)
    env = {**_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # this Ray's CLI
    done = subprocess.run(["bash", "-c", stop], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: _status(client, f"{sid}-r1") == "STOPPED", 60, "attempt 1 to stop")
    assert _status(client, sid) == "FAILED" and _status(client, f"{sid}-r2") is None
