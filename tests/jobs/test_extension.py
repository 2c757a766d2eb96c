"""Extending a run (ray_submit.py --extendable, submitter/extension.py): a larger grpo.max_num_steps continues a
finished or stopped run as new attempts, after any old attempt has ended; any other change is still refused, with
what changed. The launcher passes the flag for the train step only. Against the session's fake Jobs API
(tests/fake_ray_jobs.py, held to the real heads by tests/jobs/test_jobs_api_contract.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from ray_head import wait_for
from submitter import errors
from submitter.extension import changed_words, extended_to

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "ray_submit.py"
KEY = "grpo.max_num_steps"

pytestmark = pytest.mark.timeout(600)


def test_only_a_larger_value_of_the_key_is_an_extension() -> None:
    base = "bash -c 'cd /opt/nemo-rl && uv run python run_grpo.py --config=a.yaml grpo.max_num_steps=10 x=1'"
    assert extended_to(base, base.replace("steps=10", "steps=20"), KEY) == 20
    assert extended_to(base, base.replace("steps=10", "steps=5"), KEY) is None
    assert extended_to(base, base, KEY) is None
    changed = base.replace("steps=10", "steps=20").replace("a.yaml", "b.yaml")
    assert extended_to(base, changed, KEY) is None
    assert (
        changed_words(base, changed)
        == "--config=a.yaml -> --config=b.yaml; grpo.max_num_steps=10 -> grpo.max_num_steps=20"
    )
    assert extended_to(base, base.replace("x=1", "x=1 y=2"), KEY) is None


def test_the_launcher_lets_the_train_step_alone_be_extended() -> None:
    from conftest import shared_infra_run
    from launcher.infra_outputs import build_infra_outputs
    from launcher.job_settings import build_job_settings
    from launcher.script import submit_command

    infra = build_infra_outputs(shared_infra_run("h200").outputs)
    job = build_job_settings({"infraStack": "organization/nemo-rl-gke/h200"}, infra)
    from launcher.steps import pipeline_steps

    for step in pipeline_steps(job, infra):
        words = submit_command(step, job, infra)
        assert (f"--extendable={KEY}" in words) == (step.name == "train"), step.name
        if step.name == "train":
            assert f"{KEY}=10" in words[-1].split()


def _args(address: str, sid: str, record: Path, marker: Path, steps: int, extra: str = "") -> list[str]:
    # The run writes its step count ($0, the key's word) to the marker: the command differs only in that word.
    work = f'echo "${{0##*=}}" >> {marker}; while [ -e {marker}.hold ]; do sleep 0.2; done; echo trained {extra}'

    return [sys.executable, str(SCRIPT), f"--address={address}", f"--submission-id={sid}", "--max-retries=1",
            f"--record={record}", f"--extendable={KEY}",
            "--", "sh", "-c", work, f"{KEY}={steps}"]  # fmt: skip


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONUNBUFFERED": "1"}


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=240, env=_env(), check=False)


def _status(address: str, sid: str) -> str | None:
    from ray.job_submission import JobSubmissionClient

    try:
        return str(JobSubmissionClient(address).get_job_status(sid))
    except Exception:
        return None


def test_a_finished_run_goes_on_with_more_steps_and_other_changes_are_refused(
    jobs_address: str, tmp_path: Path
) -> None:
    sid = f"t-ext-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    marker = tmp_path / "runs.txt"
    assert _run(_args(jobs_address, sid, record, marker, 2)).returncode == errors.EXIT_SUCCEEDED

    more = _run(_args(jobs_address, sid, record, marker, 4))
    assert more.returncode == errors.EXIT_SUCCEEDED, more.stdout
    assert f"{sid} ran with {KEY}=2; extending the run to 4: its next attempts are {sid}-steps4" in more.stdout
    assert more.stdout.splitlines()[-1] == f"ray_submit: job {sid}-steps4 SUCCEEDED"
    assert marker.read_text().split() == ["2", "4"]
    now = json.loads(record.read_text())
    assert (now["submission_id"], now["job"]) == (f"{sid}-steps4", f"{sid}-steps4") and f"{KEY}=4" in now["command"]
    kept = json.loads(Path(f"{record}.before-{KEY}-4").read_text())
    assert kept["job"] == sid and f"{KEY}=2" in kept["command"]
    ledger = json.loads((record.parent / "train.steps4.attempts.json").read_text())
    assert [(a["job"], a["outcome"]) for a in ledger["attempts"]] == [(f"{sid}-steps4", "SUCCEEDED")]

    again = _run(_args(jobs_address, sid, record, marker, 4))  # a new pod of the extended run
    assert again.returncode == errors.EXIT_SUCCEEDED and "nothing was run again" in again.stdout
    assert marker.read_text().split() == ["2", "4"]

    fewer = _run(_args(jobs_address, sid, record, marker, 3))
    assert fewer.returncode == errors.EXIT_USAGE, fewer.stdout
    assert f"Changed: {KEY}=4 -> {KEY}=3. Only a larger {KEY} extends a run." in fewer.stdout
    other = _run(_args(jobs_address, sid, record, marker, 8, extra="other-data"))
    assert other.returncode == errors.EXIT_USAGE, other.stdout
    assert "-> other-data" in other.stdout and "rerun" in other.stdout
    assert marker.read_text().split() == ["2", "4"]


def test_a_stopped_run_is_extended_from_rays_table(jobs_address: str, tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    sid = f"t-ext-stop-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    marker = tmp_path / "runs.txt"
    Path(f"{marker}.hold").touch()
    first = subprocess.Popen(_args(jobs_address, sid, record, marker, 2), stdout=subprocess.PIPE, text=True, env=_env())
    try:
        wait_for(lambda: marker.exists() and _status(jobs_address, sid) == "RUNNING", 90, f"{sid} to run")
        JobSubmissionClient(jobs_address).stop_job(sid)
        assert first.wait(timeout=120) == errors.EXIT_STOPPED
    finally:
        first.kill()
    Path(f"{marker}.hold").unlink()
    more = _run(_args(jobs_address, sid, record, marker, 4))
    assert more.returncode == errors.EXIT_SUCCEEDED, more.stdout
    assert more.stdout.splitlines()[-1] == f"ray_submit: job {sid}-steps4 SUCCEEDED"
    assert marker.read_text().split() == ["2", "4"]


def test_the_extension_waits_for_an_old_attempt_that_still_trains(jobs_address: str, tmp_path: Path) -> None:
    """The Job replaced while training (its pod killed, the Ray job running on): the new pod, asked for more steps,
    starts no attempt until the old one has ended, so two never write one checkpoint dir."""
    sid = f"t-ext-live-{uuid.uuid4().hex[:8]}"
    record = tmp_path / "run" / "step-outcomes" / "train.json"
    marker = tmp_path / "runs.txt"
    hold = Path(f"{marker}.hold")
    hold.touch()
    old = subprocess.Popen(_args(jobs_address, sid, record, marker, 2), stdout=subprocess.DEVNULL, env=_env())
    try:
        wait_for(lambda: marker.exists() and _status(jobs_address, sid) == "RUNNING", 90, f"{sid} to run")
    finally:
        old.send_signal(signal.SIGKILL)
        old.wait()
    new = subprocess.Popen(
        _args(jobs_address, sid, record, marker, 4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(),
    )  # fmt: skip
    waiting = f"{sid} still runs with the old command; the extension starts when it ends"
    lines: list[str] = []

    def read() -> None:
        for line in new.stdout or []:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # The old attempt is let finish only once the new submitter (however long it took to start on loaded cores)
        # has taken the dead one's lock over, looked, and said it waits.
        wait_for(lambda: any(waiting in line for line in lines) or new.poll() is not None, 240, "the wait to be said")
        assert _status(jobs_address, sid) == "RUNNING" and marker.read_text().split() == ["2"], "".join(lines)
        assert _status(jobs_address, f"{sid}-steps4") is None
        hold.unlink()  # the old attempt finishes
        new.wait(timeout=240)
        reader.join(timeout=10)
    finally:
        hold.unlink(missing_ok=True)
        new.kill()
    out = "".join(lines)
    assert new.returncode == errors.EXIT_SUCCEEDED, out
    assert waiting in out
    assert out.splitlines()[-1] == f"ray_submit: job {sid}-steps4 SUCCEEDED"
    assert marker.read_text().split() == ["2", "4"]
