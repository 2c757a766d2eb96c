"""Fault injection: the Ray head restarts under jobs/ray_submit.py, and the step outcome records on "Lustre".

A head restarted without GCS fault tolerance (a head pod recreated) answers at the same address with a new session
and an empty job table. The module's own real head (tests/ray_head.py RayHead) is stopped mid-step and started again
on the same ports once, under three steps in flight (one_restart); the other scenarios restart a fake head
(tests/fake_ray_jobs.py), which forgets its jobs and its session the same way, and the session's fake Jobs API
(jobs_address) serves the cases where the head stays up.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_ray_jobs import FakeJobsApi
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


@pytest.fixture(scope="module")
def fake_head() -> Iterator[FakeJobsApi]:
    head = FakeJobsApi()
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


def _start_ms(address: str, sid: str) -> float | None:
    """When the head's job of this id was submitted (ms since the epoch), or None where it has none."""
    try:
        return _client(address).get_job_info(sid).start_time
    except Exception:  # unknown id
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
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)
    except subprocess.TimeoutExpired as exc:  # pytest's report cuts the output short: all of it, to see where it hung
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"the submitter did not end within {timeout:g} s; all it printed:\n{out}")


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _first_run_hangs(marker: Path, done: str) -> list[str]:
    """A step whose first run hangs (until the head restart kills it) and whose next run finishes: what a train
    attempt resuming from its checkpoint looks like."""
    script = f"echo run >> {marker}; if [ $(wc -l < {marker}) -lt 2 ]; then echo first-run; sleep 300; fi; echo {done}"
    return ["sh", "-c", script]


@dataclass
class Submitter:
    """One ray_submit.py run across the restart: its id, arguments, run marker, outcome record, and once it ended,
    its exit code and output."""

    sid: str
    args: list[str]
    marker: Path
    record: Path
    code: int | None = None
    out: str = ""


def _is_running(address: str, sid: str) -> bool:
    return _status(address, sid) == "RUNNING"


def _runs(address: str, submitter: Submitter) -> bool:
    return _status(address, submitter.sid) == "RUNNING" and submitter.marker.exists()


def _restart_while_running(head: RayHead, submitters: list[Submitter]) -> None:
    """Run the submitters at once; once all their jobs run, stop the head and start it again at the same address
    (one restart under several running jobs, as a head pod recreated mid-run looks to every step in flight)."""
    procs = [_start(s.args) for s in submitters]
    try:
        for s in submitters:
            wait_for(functools.partial(_runs, head.address, s), 90, f"{s.sid} to run")
        before, stopped_ms = _session(head.address), time.time() * 1000
        head.stop()
        head.start()
        assert _session(head.address) != before  # a new head: new session, empty job table
        # The old jobs went with the old head. A submitter may already have submitted its step again (it retries as
        # soon as the head answers): a job of its id now is one submitted after the stop.
        for s in submitters:
            resubmitted = _start_ms(head.address, s.sid)
            assert resubmitted is None or resubmitted >= stopped_ms, f"{s.sid} outlived the head restart"
        for s, proc in zip(submitters, procs, strict=True):
            s.out, _ = proc.communicate(timeout=240)
            s.code = proc.returncode
    finally:
        for proc in procs:
            proc.kill()


@dataclass
class OneRestart:
    """Three steps in flight when the head restarted once: a train step with retries (train), a step without retries
    (data) and a train step with neither retries nor resubmissions (spent)."""

    head: RayHead
    train: Submitter
    train_words: list[str]
    data: Submitter
    spent: Submitter
    records: Path


@pytest.fixture(scope="module")
def one_restart(restartable_head: RayHead, tmp_path_factory: pytest.TempPathFactory) -> OneRestart:
    head = restartable_head
    tmp = tmp_path_factory.mktemp("restart")
    records = tmp / "run1" / "step-outcomes"
    train_sid, data_sid, spent_sid = (f"t-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("train", "data", "spent"))
    train_marker, data_marker, spent_marker = (tmp / f"{kind}-runs.txt" for kind in ("train", "data", "spent"))
    train_words = _first_run_hangs(train_marker, "trained-$((6*7))")
    train_record = records / "train.json"
    train = Submitter(
        train_sid,
        _args(head.address, train_sid, train_words, "--max-retries=2", "--max-resubmits=0", f"--record={train_record}"),
        train_marker,
        train_record,
    )
    # Another run's step (one submitter holds a run at a time; the steps of one run never run at once).
    data_record = tmp / "run2" / "step-outcomes" / "data.json"
    data_words = _first_run_hangs(data_marker, "prepared-$((2+2))")
    data = Submitter(
        data_sid, _args(head.address, data_sid, data_words, f"--record={data_record}"), data_marker, data_record
    )
    spent_record = tmp / "spent.json"
    spent_words = _first_run_hangs(spent_marker, "never")
    spent = Submitter(
        spent_sid,
        _args(head.address, spent_sid, spent_words, "--max-resubmits=0", f"--record={spent_record}"),
        spent_marker,
        spent_record,
    )
    _restart_while_running(head, [train, data, spent])
    return OneRestart(head, train, train_words, data, spent, records)


def test_a_train_step_with_retries_survives_the_restart_as_its_next_attempt(one_restart: OneRestart) -> None:
    head, train = one_restart.head, one_restart.train
    sid, out = train.sid, train.out
    assert train.code == errors.EXIT_SUCCEEDED, out
    assert f"the Ray head restarted while job {sid} ran" in out
    assert f"attempt 1 of 3 ({sid}) was lost in the head restart; retrying as {sid}-r1 (retry 1 of 2)" in out
    assert out.count("trained-42") == 1, out
    assert _last_line(out) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert train.marker.read_text().splitlines() == ["run", "run"]
    assert (_status(head.address, sid), _status(head.address, f"{sid}-r1")) == (None, "SUCCEEDED")
    record = json.loads(train.record.read_text())
    assert record["submission_id"] == sid and record["job"] == f"{sid}-r1"
    assert record["status"] == "SUCCEEDED" and record["command"] == shlex.join(one_restart.train_words)
    assert record["ray_session"] == _session(head.address)
    # Every attempt, in the record and in the log.
    assert [(a["job"], a["outcome"]) for a in record["attempts"]] == [
        (sid, "LOST (the Ray head restarted)"),
        (f"{sid}-r1", "SUCCEEDED"),
    ]
    assert f"attempts of {sid}: {sid} (pod " in out and f"{sid}-r1 (pod " in out


def test_killed_submitters_and_head_restarts_never_reset_the_retry_budget(
    fake_head: FakeJobsApi, tmp_path: Path
) -> None:
    """Each submitter pod is killed (SIGKILL: lost with its node) while its attempt runs, and the head restarts before
    the next pod comes: the attempt ledger on "Lustre" carries the count across both, so the run starts
    maxRestarts + 1 attempts in all, and the third pod starts none."""
    head = fake_head
    sid = f"t-budget-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    args = _args(head.address, sid, ["sh", "-c", "sleep 300"], "--max-retries=1", "--max-resubmits=0",
                 f"--record={record}")  # fmt: skip
    outputs = []
    for attempt in (sid, f"{sid}-r1"):
        proc = _start(args)
        try:
            wait_for(functools.partial(_is_running, head.address, attempt), 90, f"{attempt} to run")
        finally:
            proc.kill()
            outputs.append(proc.communicate()[0])
        head.stop()
        head.start()
    assert f"{sid} was submitted but the Ray head does not know it" in outputs[1], outputs[1]
    assert f"retrying as {sid}-r1 (retry 1 of 1)" in outputs[1]
    result = _run(args, timeout=120)
    out = result.stdout
    assert result.returncode == errors.EXIT_FAILED, out
    assert "submitting job" not in out
    assert "the Ray head restarted since" in out and f"{sid}-r1 was submitted but the Ray head does not know it" in out
    assert f"the Ray head restarted between {sid} (session session_" in out  # the first restart, from the ledger
    assert _last_line(out) == f"ray_submit: job {sid}-r1 FAILED (lost in a Ray head restart, no retries left)"
    ledger = json.loads((record.parent / "train.attempts.json").read_text())
    assert [a["job"] for a in ledger["attempts"]] == [sid, f"{sid}-r1"]
    assert all(a["outcome"].startswith("LOST") and a["pod"] for a in ledger["attempts"])
    assert f"the attempt ledger {record.parent / 'train.attempts.json'} lists: {sid} (pod " in out
    assert _status(head.address, sid) is None and _status(head.address, f"{sid}-r1") is None


def test_a_head_down_past_the_connect_timeout_ends_the_pod_and_the_next_goes_on_from_the_ledger(
    fake_head: FakeJobsApi, tmp_path: Path
) -> None:
    """The head stays down longer than --connect-timeout (a head pod that takes longer than that to come back): the
    submitter exits 4, so the Job starts another pod, and leaves its attempt open in the ledger. The next pod, on the
    restarted head, logs the restart, counts the attempt as lost and goes on with the next one, within the budget."""
    head = fake_head
    sid = f"t-down-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    ledger_file = record.parent / "train.attempts.json"
    marker = tmp_path / "runs.txt"
    args = _args(head.address, sid, _first_run_hangs(marker, "trained-$((6*7))"), "--max-retries=1",
                 "--max-resubmits=0", f"--record={record}", "--connect-timeout=6")  # fmt: skip
    first = _start(args)
    try:
        wait_for(lambda: marker.exists() and _is_running(head.address, sid), 90, f"{sid} to run")
        head.stop()
        try:
            first_out, _ = first.communicate(timeout=120)
        finally:
            head.start()  # the module's other tests need it back, whatever happened
    finally:
        first.kill()
    assert first.returncode == errors.EXIT_UNREACHABLE, first_out
    assert f"Ray at {head.address} is not answering" in first_out
    open_entries = json.loads(ledger_file.read_text())["attempts"]
    assert [(a["job"], a["outcome"]) for a in open_entries] == [(sid, None)]

    second = _run(args, timeout=180)
    out = second.stdout
    assert second.returncode == errors.EXIT_SUCCEEDED, out
    assert "the Ray head restarted since" in out
    assert f"{sid} was submitted but the Ray head does not know it: lost with a head restart, and counted" in out
    assert f"retrying as {sid}-r1 (retry 1 of 1)" in out
    assert _last_line(out) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert marker.read_text().splitlines() == ["run", "run"]
    ledger = json.loads(ledger_file.read_text())["attempts"]
    assert [a["job"] for a in ledger] == [sid, f"{sid}-r1"]
    assert ledger[0]["outcome"].startswith("LOST") and ledger[1]["outcome"] == "SUCCEEDED"
    assert [a["job"] for a in json.loads(record.read_text())["attempts"]] == [sid, f"{sid}-r1"]


def test_two_submitters_of_one_run_never_run_train_at_once(fake_head: FakeJobsApi, tmp_path: Path) -> None:
    """A submitter is paused (SIGSTOP: a partitioned or frozen pod) while its attempt runs; the head restarts and a
    second submitter comes (the Job controller starts none while the first pod lives; a Job made twice by hand
    could). The second goes on from the ledger and submits the next attempt; the first, resumed, computes the same
    attempt id, finds it on Ray and follows it: Ray's submission ids, not a lock, keep it one. At no moment do two
    attempts of the step run."""
    head = fake_head
    sid = f"t-two-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    marker = tmp_path / "runs.txt"
    # The next attempt runs until released, once the first submitter follows it (the first run hangs as before).
    release = tmp_path / "release"
    words = _first_run_hangs(marker, f"trained-$((6*7)); until [ -e {release} ]; do sleep 0.2; done")
    args = _args(head.address, sid, words, "--max-retries=2", "--max-resubmits=0", f"--record={record}")
    attempts = [sid, f"{sid}-r1", f"{sid}-r2", f"{sid}-r3"]
    most_running = [0]
    watching = threading.Event()

    def watch() -> None:  # the fake head's own job table: no request that a restart could leave hanging
        while not watching.is_set():
            statuses = head.statuses()
            running = sum(statuses.get(a) == "RUNNING" for a in attempts)
            most_running[0] = max(most_running[0], running)
            time.sleep(0.05)

    first = _start(args)
    second: subprocess.Popen[str] | None = None
    watcher = threading.Thread(target=watch, daemon=True)
    try:
        # RUNNING comes before the entrypoint's first line: a restart before it leaves no run in the marker, and the
        # next attempt would take itself for the first (a clean-clone CI run hung so).
        wait_for(lambda: marker.exists() and _status(head.address, sid) == "RUNNING", 90, f"{sid} to run")
        watcher.start()
        first.send_signal(signal.SIGSTOP)
        head.stop()
        head.start()
        second = _start(args)
        wait_for(lambda: _status(head.address, f"{sid}-r1") is not None, 120, f"{sid}-r1 to be submitted")
        first.send_signal(signal.SIGCONT)
        first_lines: list[str] = []
        reader = threading.Thread(target=lambda: first_lines.extend(first.stdout or []), daemon=True)
        reader.start()
        follows = f"streaming the logs of job {sid}-r1"  # not attempt 0's line, still in the pipe from before
        wait_for(lambda: any(follows in line for line in first_lines) or first.poll() is not None,
                 120, "the first submitter to follow the next attempt")  # fmt: skip
        release.touch()
        try:  # a hang says where the first submitter was
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the first submitter did not end:\n" + "".join(first_lines))
        reader.join(timeout=10)
        first_out = "".join(first_lines)
        second_out, _ = second.communicate(timeout=180)
    finally:
        release.touch()
        watching.set()
        first.kill()
        if second is not None:
            second.kill()
    assert second.returncode == errors.EXIT_SUCCEEDED, second_out
    assert f"retrying as {sid}-r1 (retry 1 of 2)" in second_out
    assert _last_line(second_out) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert first.returncode == errors.EXIT_SUCCEEDED, first_out
    assert f"job {sid}-r1 exists and is" in first_out and "attaching to it" in first_out, first_out
    assert first_out.count("submitting job") == 1, first_out  # attempt 0 only
    assert most_running[0] == 1
    assert marker.read_text().splitlines() == ["run", "run"]


def test_the_resume_recipe_works_with_the_ledger(jobs_address: str, tmp_path: Path) -> None:
    """A stopped attempt resumed by hand with `ray job delete <id>` and a new submitter pod (the docs' way is a rerun,
    tests/jobs/test_rerun.py): the attempt ledger knows the attempt ended STOPPED on this very head, so the deletion
    was a person's, and the id runs again."""
    sid = f"t-resume-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    marker = tmp_path / "runs.txt"
    args = _args(jobs_address, sid, _first_run_hangs(marker, "resumed-$((7*7))"), "--max-retries=1",
                 f"--record={record}")  # fmt: skip
    first = _start(args)
    try:
        wait_for(lambda: marker.exists() and _status(jobs_address, sid) == "RUNNING", 90, f"{sid} to run")
        _client(jobs_address).stop_job(sid)
        first_out, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == errors.EXIT_STOPPED, first_out
    wait_for(lambda: bool(_client(jobs_address).delete_job(sid)), 30, f"{sid} to be deleted")
    again = _run(args)
    assert again.returncode == errors.EXIT_SUCCEEDED, again.stdout
    assert f"{sid} ended STOPPED and was deleted from the Ray head's table since; submitting it again" in again.stdout
    assert _last_line(again.stdout) == f"ray_submit: job {sid} SUCCEEDED"
    assert marker.read_text().splitlines() == ["run", "run"]
    ledger = json.loads((record.parent / "train.attempts.json").read_text())
    assert [(a["job"], a["outcome"]) for a in ledger["attempts"]] == [(sid, "STOPPED"), (sid, "SUCCEEDED")]


def test_a_step_without_retries_is_submitted_again_on_the_restarted_head(one_restart: OneRestart) -> None:
    data = one_restart.data
    assert data.code == errors.EXIT_SUCCEEDED, data.out
    assert f"submitting {data.sid} again on the restarted head (resubmission 1 of 3)" in data.out
    assert _last_line(data.out) == f"ray_submit: job {data.sid} SUCCEEDED"
    assert data.marker.read_text().splitlines() == ["run", "run"]
    # Each step's record and ledger were written whole: the temporary files were renamed, none is left, and the
    # run's lock was released.
    assert sorted(p.name for p in one_restart.records.iterdir()) == ["train.attempts.json", "train.json"]
    assert sorted(p.name for p in data.record.parent.iterdir()) == ["data.attempts.json", "data.json"]


def test_retries_spent_on_head_restarts_end_the_run(one_restart: OneRestart) -> None:
    """No retry and no resubmission left (the train step with maxRestarts 0): the run ends, saying why."""
    spent = one_restart.spent
    assert spent.code == errors.EXIT_FAILED, spent.out
    assert "this step is not retried" in spent.out
    assert _last_line(spent.out) == f"ray_submit: job {spent.sid} FAILED (lost in a Ray head restart, no retries left)"
    assert spent.marker.read_text().splitlines() == ["run"]
    assert not spent.record.exists()


def test_after_the_restart_a_new_submitter_skips_the_recorded_step(one_restart: OneRestart) -> None:
    """A new submitter pod after that restart: the head lost the train step's first attempt, and a head restarted
    once more would have lost ID-r1 too; the step record is what tells, and Ray is not even asked."""
    head, train = one_restart.head, one_restart.train
    sid, train_record = train.sid, train.record
    assert train.code == errors.EXIT_SUCCEEDED, train.out
    assert _status(head.address, sid) is None
    again = _run(train.args)
    assert again.returncode == errors.EXIT_SUCCEEDED, again.stdout + again.stderr
    assert f"the step record {train_record} says job {sid}-r1 SUCCEEDED" in again.stdout
    assert "submitting job" not in again.stdout and "connecting" not in again.stdout  # Ray is not even asked
    assert _last_line(again.stdout) == f"ray_submit: job {sid}-r1 SUCCEEDED"
    assert train.marker.read_text().splitlines() == ["run", "run"]
    assert _status(head.address, sid) is None

    # A changed command under the recorded id is refused, with nothing submitted.
    changed = _run(_args(head.address, sid, ["sh", "-c", "echo other"], "--max-retries=2", f"--record={train_record}"))
    assert changed.returncode == errors.EXIT_USAGE, changed.stdout + changed.stderr
    assert f"the step record {train_record} says {sid} SUCCEEDED with another command" in changed.stdout
    assert _last_line(changed.stdout) == f"ray_submit: job {sid}: not run (the id is taken by another command)"
    assert _status(head.address, sid) is None


def test_a_record_deleted_while_the_head_stays_up_ends_the_run(jobs_address: str, tmp_path: Path) -> None:
    """`ray job delete` only takes finished jobs: the submitter is paused while its job finishes and is deleted,
    as a submitter between two polls would be."""
    sid = f"t-deleted-{uuid.uuid4().hex[:8]}"
    go = tmp_path / "go"
    words = ["sh", "-c", f"echo started; while [ ! -e {go} ]; do sleep 0.2; done; echo finished"]
    proc = _start(_args(jobs_address, sid, words, "--max-retries=2", f"--record={tmp_path / 'r.json'}"))
    try:
        wait_for(lambda: _status(jobs_address, sid) == "RUNNING", 60, "the job to run")
        session = _session(jobs_address)
        proc.send_signal(signal.SIGSTOP)
        go.touch()
        wait_for(lambda: _status(jobs_address, sid) == "SUCCEEDED", 60, "the job to finish")
        assert _client(jobs_address).delete_job(sid) is True
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
    assert "retrying" not in out and _status(jobs_address, f"{sid}-r1") is None
    assert not (tmp_path / "r.json").exists()


def test_a_new_submitter_finds_an_attempt_past_a_gap(jobs_address: str, tmp_path: Path) -> None:
    """After a head restart the new head may know ID-r1 and not ID: a new submitter attaches to ID-r1 instead of
    submitting ID beside it."""
    sid = f"t-gap-{uuid.uuid4().hex[:8]}"
    # The job runs until the submitter has attached (however long a loaded machine takes to start it).
    attached = tmp_path / "attached"
    words = ["sh", "-c", f"until [ -e {attached} ]; do sleep 0.2; done; echo gap-$((3*3))"]
    _client(jobs_address).submit_job(entrypoint=shlex.join(words), submission_id=f"{sid}-r1")
    submitter = _start(_args(jobs_address, sid, words, "--max-retries=2"))
    assert submitter.stdout is not None
    seen = []
    for line in submitter.stdout:
        seen.append(line)
        if "streaming the logs" in line:
            break
    attached.touch()
    rest, _ = submitter.communicate(timeout=120)
    out = "".join(seen) + rest
    assert submitter.returncode == errors.EXIT_SUCCEEDED, out
    assert f"{sid}-r1 is the latest attempt of {sid}" in out
    assert "submitting job" not in out
    # Whole lines: the id itself (t-gap-<hex>) contains "gap-9" whenever its hex starts with a 9.
    assert out.splitlines().count("gap-9") == 1, out
    assert _status(jobs_address, sid) is None


# ---------------------------------------------------------------------------------------------------------------
# Outcome records without Ray


def test_an_unwritable_record_dir_stops_the_step_before_anything_is_submitted(
    jobs_address: str, tmp_path: Path
) -> None:
    """Records are required: a step whose record cannot be written is not run (here the record's directory cannot
    be created: its parent is a file; the tests run as root, for whom a directory's mode is no limit)."""
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run's directory should be")
    outcomes = blocker / "step-outcomes"
    sid = f"r-unwritable-{uuid.uuid4().hex[:8]}"
    result = _run(_args(jobs_address, sid, ["true"], f"--record={outcomes}/prep.json"), timeout=60)
    assert result.returncode == errors.EXIT_USAGE, result.stdout + result.stderr
    assert f"cannot write the step records in {outcomes} (" in result.stdout
    assert "Make the directory writable by the submitter pod" in result.stdout
    assert _last_line(result.stdout) == f"ray_submit: job {sid}: not run (its step record cannot be written)"
    assert "connecting to the Ray Jobs API" not in result.stdout
    assert _status(jobs_address, sid) is None


def test_the_record_check_leaves_nothing_behind(tmp_path: Path) -> None:
    outcomes = tmp_path / "run" / "step-outcomes"
    step_records.check_writable(str(outcomes / "prep.json"))
    assert outcomes.is_dir() and list(outcomes.iterdir()) == []


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
