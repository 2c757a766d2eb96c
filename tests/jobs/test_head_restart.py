"""Fault injection: the Ray head restarts under jobs/ray_submit.py, and the step outcome records on "Lustre".

A head restarted without GCS fault tolerance (a head pod recreated) answers at the same address with a new session
and an empty job table. The module's own head (tests/ray_head.py RayHead) is stopped mid-step and started again on
the same ports, which is exactly that; the session head (ray_address) serves the cases where the head stays up.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_head import RAY_BIN, RayHead, closed_port, wait_for
from script_loader import load_script
from submitter import errors, ray_api
from submitter import records as step_records

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "ray_submit.py"

pytestmark = pytest.mark.timeout(600)

rs = load_script("jobs/ray_submit.py", "ray_submit_under_test")


@pytest.fixture(scope="module")
def restartable_head() -> Iterator[RayHead]:
    head = RayHead(RAY_BIN)
    try:
        head.start()
        yield head
    finally:
        head.close()


def _client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def _status(address: str, sid: str) -> str | None:
    try:
        return str(_client(address).get_job_status(sid))
    except Exception:  # unknown id, or the head is down
        return None


def _session(address: str) -> str:
    return ray_api.probe_version(address)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _args(address: str, sid: str, words: list[str], *flags: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--address", address, "--submission-id", sid, *flags, "--", *words]


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _first_run_hangs(marker: Path, done: str) -> list[str]:
    """A step whose first run hangs (until the head restart kills it) and whose next run finishes: what a train
    attempt resuming from its checkpoint looks like."""
    script = f"echo run >> {marker}; if [ $(wc -l < {marker}) -lt 2 ]; then echo first-run; sleep 300; fi; echo {done}"
    return ["sh", "-c", script]


def _restart_while_running(head: RayHead, args: list[str], sid: str, marker: Path) -> tuple[int, str]:
    """Run the submitter; once the job runs, stop the head and start it again at the same address."""
    proc = _start(args)
    try:
        wait_for(lambda: _status(head.address, sid) == "RUNNING" and marker.exists(), 90, "the job to run")
        before = _session(head.address)
        head.stop()
        head.start()
        assert _session(head.address) != before  # a new head: new session, empty job table
        assert _status(head.address, sid) is None
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    return proc.returncode, out


def test_head_restart_mid_step_is_survived_and_recorded_steps_are_skipped(
    restartable_head: RayHead, tmp_path: Path
) -> None:
    head = restartable_head
    records = tmp_path / "run1" / "step-outcomes"

    # 1. A train-like step with retries: the attempt lost in the restart counts as one, ID-r1 runs and succeeds.
    train = f"t-train-{uuid.uuid4().hex[:8]}"
    train_marker = tmp_path / "train-runs.txt"
    train_words = _first_run_hangs(train_marker, "trained-$((6*7))")
    train_record = records / "train.json"
    train_args = _args(
        head.address, train, train_words, "--max-retries=2", "--max-resubmits=0", f"--record={train_record}"
    )
    code, out = _restart_while_running(head, train_args, train, train_marker)
    assert code == errors.EXIT_SUCCEEDED, out
    assert f"the Ray head restarted while job {train} ran" in out
    assert f"attempt 1 of 3 ({train}) was lost in the head restart; retrying as {train}-r1 (retry 1 of 2)" in out
    assert out.count("trained-42") == 1, out
    assert _last_line(out) == f"ray_submit: job {train}-r1 SUCCEEDED"
    assert train_marker.read_text().splitlines() == ["run", "run"]
    assert (_status(head.address, train), _status(head.address, f"{train}-r1")) == (None, "SUCCEEDED")
    record = json.loads(train_record.read_text())
    assert record["submission_id"] == train and record["job"] == f"{train}-r1"
    assert record["status"] == "SUCCEEDED" and record["command"] == shlex.join(train_words)
    assert record["ray_session"] == _session(head.address)
    assert [p.name for p in records.iterdir()] == ["train.json"]  # the temporary file was renamed, none is left

    # 2. A step without retries (prepare-data): submitted again under its own id on the restarted head.
    data = f"t-data-{uuid.uuid4().hex[:8]}"
    data_marker = tmp_path / "data-runs.txt"
    data_args = _args(
        head.address, data, _first_run_hangs(data_marker, "prepared-$((2+2))"), f"--record={records / 'data.json'}"
    )
    code, out = _restart_while_running(head, data_args, data, data_marker)
    assert code == errors.EXIT_SUCCEEDED, out
    assert f"submitting {data} again on the restarted head (resubmission 1 of 3)" in out
    assert _last_line(out) == f"ray_submit: job {data} SUCCEEDED"
    assert data_marker.read_text().splitlines() == ["run", "run"]
    assert (records / "data.json").is_file()

    # 3. A new submitter pod after that restart: the head knows nothing of the train step; its record does.
    assert _status(head.address, train) is None and _status(head.address, f"{train}-r1") is None
    again = _run(train_args)
    assert again.returncode == errors.EXIT_SUCCEEDED, again.stdout + again.stderr
    assert f"the step record {train_record} says job {train}-r1 SUCCEEDED" in again.stdout
    assert "submitting job" not in again.stdout and "connecting" not in again.stdout  # Ray is not even asked
    assert _last_line(again.stdout) == f"ray_submit: job {train}-r1 SUCCEEDED"
    assert train_marker.read_text().splitlines() == ["run", "run"]
    assert _status(head.address, train) is None

    # A changed command under the recorded id is refused, with nothing submitted.
    changed = _run(
        _args(head.address, train, ["sh", "-c", "echo other"], "--max-retries=2", f"--record={train_record}")
    )
    assert changed.returncode == errors.EXIT_USAGE, changed.stdout + changed.stderr
    assert f"the step record {train_record} says {train} SUCCEEDED with another command" in changed.stdout
    assert _last_line(changed.stdout) == f"ray_submit: job {train}: not run (the id is taken by another command)"
    assert _status(head.address, train) is None


def test_retries_spent_on_head_restarts_end_the_run(restartable_head: RayHead, tmp_path: Path) -> None:
    """No retry and no resubmission left (the train step with maxRestarts 0): the run ends, saying why."""
    head = restartable_head
    sid = f"t-spent-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "runs.txt"
    record = tmp_path / "train.json"
    args = _args(head.address, sid, _first_run_hangs(marker, "never"), "--max-resubmits=0", f"--record={record}")
    code, out = _restart_while_running(head, args, sid, marker)
    assert code == errors.EXIT_FAILED, out
    assert "this step is not retried" in out
    assert _last_line(out) == f"ray_submit: job {sid} FAILED (lost in a Ray head restart, no retries left)"
    assert marker.read_text().splitlines() == ["run"]
    assert not record.exists()


def test_a_record_deleted_while_the_head_stays_up_ends_the_run(ray_address: str, tmp_path: Path) -> None:
    """`ray job delete` only takes finished jobs: the submitter is paused while its job finishes and is deleted,
    as a submitter between two polls would be."""
    sid = f"t-deleted-{uuid.uuid4().hex[:8]}"
    go = tmp_path / "go"
    words = ["sh", "-c", f"echo started; while [ ! -e {go} ]; do sleep 0.2; done; echo finished"]
    proc = _start(_args(ray_address, sid, words, "--max-retries=2", f"--record={tmp_path / 'r.json'}"))
    try:
        wait_for(lambda: _status(ray_address, sid) == "RUNNING", 60, "the job to run")
        session = _session(ray_address)
        proc.send_signal(signal.SIGSTOP)
        go.touch()
        wait_for(lambda: _status(ray_address, sid) == "SUCCEEDED", 60, "the job to finish")
        assert _client(ray_address).delete_job(sid) is True
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == errors.EXIT_FAILED, out
    assert f"and the head did not restart (its session {session} is the one the job ran on)" in out
    assert "was deleted (`ray job delete`) while the head stayed up" in out
    assert (
        _last_line(out)
        == f"ray_submit: job {sid} FAILED (vanished: its record was deleted while the Ray head stayed up)"
    )
    assert "retrying" not in out and _status(ray_address, f"{sid}-r1") is None
    assert not (tmp_path / "r.json").exists()


def test_a_new_submitter_finds_an_attempt_past_a_gap(ray_address: str) -> None:
    """After a head restart the new head may know ID-r1 and not ID: a new submitter attaches to ID-r1 instead of
    submitting ID beside it."""
    sid = f"t-gap-{uuid.uuid4().hex[:8]}"
    words = ["sh", "-c", "sleep 2; echo gap-$((3*3))"]
    _client(ray_address).submit_job(entrypoint=shlex.join(words), submission_id=f"{sid}-r1")
    result = _run(_args(ray_address, sid, words, "--max-retries=2"))
    assert result.returncode == errors.EXIT_SUCCEEDED, result.stdout + result.stderr
    assert f"{sid}-r1 is the latest attempt of {sid}" in result.stdout
    assert "submitting job" not in result.stdout
    assert result.stdout.count("gap-9") == 1
    assert _status(ray_address, sid) is None


# ---------------------------------------------------------------------------------------------------------------
# Outcome records without Ray


def test_a_recorded_step_needs_no_ray(tmp_path: Path) -> None:
    record = tmp_path / "step.json"
    words = ["python", "prepare.py", "--out=/data/x y"]
    step_records.write_record(
        str(record),
        {"submission_id": "r-prep", "job": "r-prep", "status": "SUCCEEDED", "command": shlex.join(words)},
    )
    assert oct(record.stat().st_mode & 0o777) == "0o644"
    started = time.monotonic()
    result = _run(_args(f"http://127.0.0.1:{closed_port()}", "r-prep", words, f"--record={record}"), timeout=60)
    assert result.returncode == errors.EXIT_SUCCEEDED, result.stdout + result.stderr
    assert time.monotonic() - started < 20
    assert _last_line(result.stdout) == "ray_submit: job r-prep SUCCEEDED"
    # Another id under the same record (a record copied from another run) is no proof either.
    other = _run(_args(f"http://127.0.0.1:{closed_port()}", "r-other", words, f"--record={record}"), timeout=60)
    assert other.returncode == errors.EXIT_USAGE, other.stdout
    assert "says r-prep SUCCEEDED with another command" in other.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "is not valid JSON"),
        ('{"submission_id": "r"}', "lacks submission_id, job, status, command"),
        ('{"submission_id": "r", "job": "r", "status": "FAILED", "command": "true"}', "only SUCCEEDED"),
    ],
)
def test_an_unreadable_record_is_refused_not_ignored(tmp_path: Path, content: str, expected: str) -> None:
    record = tmp_path / "step.json"
    record.write_text(content)
    result = _run(_args(f"http://127.0.0.1:{closed_port()}", "r", ["true"], f"--record={record}"), timeout=60)
    assert result.returncode == errors.EXIT_USAGE, result.stdout + result.stderr
    assert expected in result.stdout
    assert _last_line(result.stdout) == "ray_submit: job r: not run (unreadable step record)"


def test_a_failed_record_write_leaves_the_old_record_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "step.json"
    old = {"submission_id": "a", "job": "a", "status": "SUCCEEDED", "command": "old"}
    step_records.write_record(str(record), old)

    def broken_dump(*args: Any, **kwargs: Any) -> None:
        args[1].write('{"submission_id": "half')
        raise OSError("disk full")

    monkeypatch.setattr(step_records.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        step_records.write_record(str(record), {**old, "command": "new"})
    assert json.loads(record.read_text()) == old
    assert [p.name for p in tmp_path.iterdir()] == ["step.json"]
