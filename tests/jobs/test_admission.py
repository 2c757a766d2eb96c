"""Run admission by Ray's scheduler (jobs/submitter/admission.py, jobs/admission.py) on a fake head of its own
(tests/fake_ray_jobs.py, whose queueing on entrypoint resources tests/jobs/test_jobs_api_contract.py holds to the real
heads), which offers HEAD_GPUS places (`gpu_node`) as the infra stack's head offers one per GPU worker.

The faults that the lock files on Lustre had (two runs admitted where one fits, a live run losing its place to a
paused holder, two holders of one run, a step submitted twice) are driven here with the same pause (SIGSTOP) at the
same points; the decision is Ray's, so each holds by construction. tools/admission_bench.py repeats the two-runs and
two-submitters cases 100 times."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_ray_jobs import DEFAULT_RESOURCES, FakeJobsApi
from ray_head import HEAD_GPUS, RAY_BIN, wait_for
from submitter.admission import ENDED, Place, latest, list_places, place_id, status_lines, why_queued

from workloads.ray_values import PLACE_RESOURCE

JOBS = Path(__file__).resolve().parents[2] / "jobs"
ADMISSION = JOBS / "admission.py"
SUBMITTER = JOBS / "ray_submit.py"


def place(run: str, nodes: int, status: str, start: int, attempt: int = 1) -> Place:
    return Place(place_id(run, attempt), run, attempt, nodes, status, start)


def test_the_queue_is_rays_order_and_says_whom_it_waits_behind() -> None:
    places = [place("a", 2, "RUNNING", 1), place("c", 1, "PENDING", 3), place("b", 1, "PENDING", 2)]
    line = why_queued(places[1], places, 2)
    assert line == (
        "queued (c.place-1 is PENDING in Ray): needs 1 GPU node(s), 0 free of 2 (admitted: a (2); queued ahead: 1)"
    )
    assert latest([place("a", 1, "STOPPED", 1, 1), place("a", 1, "PENDING", 5, 2)], "a").attempt == 2  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def head() -> Iterator[FakeJobsApi]:
    own = FakeJobsApi(resources={**DEFAULT_RESOURCES, PLACE_RESOURCE: float(HEAD_GPUS)})
    try:
        own.start()
        yield own
    finally:
        own.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Holder:
    run: str
    proc: subprocess.Popen[str]
    ready: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def admitted(self) -> bool:
        return self.ready.exists()

    def end(self, sig: int = signal.SIGUSR1) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


class Cluster:
    def __init__(self, head: FakeJobsApi, tmp: Path) -> None:
        self.head, self.tmp = head, tmp
        self.holders: list[Holder] = []

    def hold(self, name: str, nodes: int = 1, run: str | None = None) -> Holder:
        run = run or f"{name}-{uuid.uuid4().hex[:6]}"
        tag = uuid.uuid4().hex[:4]
        ready, log = self.tmp / f"{run}-{tag}.ready", self.tmp / f"{run}-{tag}.log"
        args = [
            sys.executable, str(ADMISSION), "hold", f"--address={self.head.address}", f"--run={run}",
            f"--nodes={nodes}", f"--capacity={HEAD_GPUS}", f"--ready-file={ready}", "--poll-s=0.3",
        ]  # fmt: skip
        with log.open("w") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, env=_env())
        holder = Holder(run, proc, ready, log)
        self.holders.append(holder)
        return holder

    def places(self) -> list[Place]:
        return [p for p in list_places(self.head.address) if p.run in {h.run for h in self.holders}]

    def state(self, holder: Holder) -> str:
        mine = latest(self.places(), holder.run)
        return mine.status if mine else "absent"

    def admitted_nodes(self) -> int:
        return sum(p.nodes for p in self.places() if p.status == "RUNNING")

    def close(self) -> None:
        for holder in self.holders:
            if holder.proc.poll() is None:
                holder.proc.send_signal(signal.SIGCONT)
                holder.end()
        for mine in self.places():  # whatever a test left behind does not hold the next test's places
            if mine.status not in ENDED:
                subprocess.run([str(RAY_BIN), "job", "stop", "--address", self.head.address, mine.submission_id],
                               capture_output=True, timeout=60, check=False)  # fmt: skip


@pytest.fixture
def cluster(head: FakeJobsApi, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(head, tmp_path)
    yield made
    made.close()


def test_a_second_run_queues_and_starts_when_the_first_ends(cluster: Cluster) -> None:
    first = cluster.hold("first", nodes=2)
    wait_for(first.admitted, 90, "the first run's admission")
    second = cluster.hold("second", nodes=2)
    wait_for(lambda: "queued (" in second.output(), 60, "the second run to say it is queued")
    assert "admitted: first-" in second.output() and not second.admitted()
    assert cluster.state(second) == "PENDING" and cluster.admitted_nodes() == 2
    status = "\n".join(status_lines(cluster.head.address, HEAD_GPUS))
    assert f"{first.run}: 2 GPU node(s), admitted" in status and f"{second.run}: 2 GPU node(s), queued" in status
    assert first.end() == 0  # the pipeline ended: its place is released
    wait_for(second.admitted, 60, "the second run's admission once the first ended")
    assert cluster.state(first) == "STOPPED" and cluster.admitted_nodes() == 2


def test_a_paused_queued_run_cannot_be_admitted_beside_a_run_that_fills_the_cluster(cluster: Cluster) -> None:
    """Fault 1: a run paused inside its decision and resumed later was admitted beside the first. Here the run that
    waits is paused and resumed, and Ray still runs one place of 2 GPU nodes."""
    first = cluster.hold("first", nodes=2)
    wait_for(first.admitted, 90, "the first run's admission")
    second = cluster.hold("second", nodes=2)
    wait_for(lambda: cluster.state(second) == "PENDING", 60, "the second run's place")
    second.proc.send_signal(signal.SIGSTOP)
    time.sleep(2)  # longer than any look of the holders (0.3 s): the outcome must not depend on it
    second.proc.send_signal(signal.SIGCONT)
    for _ in range(10):
        assert cluster.admitted_nodes() <= HEAD_GPUS
        time.sleep(0.3)
    assert not second.admitted() and cluster.state(second) == "PENDING"


def test_a_paused_admitted_run_keeps_its_place(cluster: Cluster) -> None:
    """Fault 2: a holder paused while no Ray job of its run is live used to be dropped at the next decision, and
    another run admitted into its nodes. Its place is a Ray job: pausing the holder changes nothing."""
    first = cluster.hold("first", nodes=2)
    wait_for(first.admitted, 90, "the first run's admission")
    first.proc.send_signal(signal.SIGSTOP)
    second = cluster.hold("second", nodes=1)
    wait_for(lambda: cluster.state(second) == "PENDING", 60, "the second run's place")
    time.sleep(2)
    assert cluster.state(first) == "RUNNING" and cluster.state(second) == "PENDING" and not second.admitted()
    first.proc.send_signal(signal.SIGCONT)
    assert first.end() == 0
    wait_for(second.admitted, 60, "the second run's admission once the first ended")


def test_two_holders_of_one_run_share_one_place(cluster: Cluster) -> None:
    """Fault 3: two submitters of one run that both took over a stale lock both held the run. Two holders of one
    run (a Job made twice by hand) ask Ray for the same place id: Ray takes one, the other follows it."""
    run = f"twice-{uuid.uuid4().hex[:6]}"
    holders = [cluster.hold("twice", nodes=1, run=run) for _ in range(2)]
    wait_for(lambda: all(h.admitted() for h in holders), 90, "both holders to see the run admitted")
    mine = [p for p in cluster.places() if p.run == run]
    assert [p.submission_id for p in mine] == [place_id(run, 1)], mine
    assert cluster.admitted_nodes() == 1


def test_a_deleted_queued_run_leaves_the_queue_at_once(cluster: Cluster) -> None:
    first = cluster.hold("first", nodes=2)
    wait_for(first.admitted, 90, "the first run's admission")
    queued = cluster.hold("queued", nodes=1)
    wait_for(lambda: cluster.state(queued) == "PENDING", 60, "the queued run's place")
    behind = cluster.hold("behind", nodes=2)
    wait_for(lambda: cluster.state(behind) == "PENDING", 60, "the run queued behind it")
    # The pod's SIGTERM without --k8s-* (no way to tell a deletion from an eviction): the place goes with the pod,
    # at once (no wait for Ray, which ends a queued place when its turn comes).
    started = time.monotonic()
    assert queued.end(signal.SIGTERM) == 143
    assert time.monotonic() - started < 20 and "ends when its turn comes" in queued.output()
    assert first.end() == 0
    wait_for(behind.admitted, 90, "the run behind once the first ended")  # the deleted run held nothing
    assert cluster.admitted_nodes() == 2
    assert behind.end() == 0
    wait_for(lambda: cluster.state(queued) == "STOPPED", 60, "the deleted run's place to end at its turn")


def test_a_place_stopped_by_a_person_ends_the_holder(cluster: Cluster) -> None:
    holder = cluster.hold("stopped", nodes=1)
    wait_for(holder.admitted, 90, "the run's admission")
    subprocess.run([str(RAY_BIN), "job", "stop", "--address", cluster.head.address, place_id(holder.run, 1)],
                   capture_output=True, timeout=60, check=True)  # fmt: skip
    assert holder.proc.wait(timeout=60) == 4
    assert "ended STOPPED" in holder.output()


def test_a_new_pipeline_of_a_run_takes_the_next_place(cluster: Cluster) -> None:
    holder = cluster.hold("again", nodes=1)
    wait_for(holder.admitted, 90, "the run's admission")
    assert holder.end() == 0
    again = cluster.hold("again", nodes=1, run=holder.run)
    wait_for(again.admitted, 90, "the second pipeline's admission")
    assert latest(cluster.places(), holder.run).submission_id == place_id(holder.run, 2)  # type: ignore[union-attr]


def test_a_step_is_not_submitted_before_the_run_holds_its_place(cluster: Cluster, tmp_path: Path) -> None:
    """ray_submit.py --place-of waits while the run's place is queued, and submits once Ray runs it."""
    first = cluster.hold("first", nodes=2)
    wait_for(first.admitted, 90, "the first run's admission")
    second = cluster.hold("second", nodes=1)
    wait_for(lambda: cluster.state(second) == "PENDING", 60, "the second run's place")
    sid = f"{second.run}-step"
    args = [sys.executable, str(SUBMITTER), f"--address={cluster.head.address}", f"--submission-id={sid}",
            f"--record={tmp_path / 'step.json'}", f"--place-of={second.run}", "--", "echo", "trained"]  # fmt: skip
    log = tmp_path / "step.log"
    with log.open("w") as out:
        step = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        wait_for(lambda: "waiting for the run's place" in log.read_text(), 60, "the step to wait for its place")
        assert sid not in {str(j.get("submission_id")) for j in _jobs(cluster.head.address)}
        assert first.end() == 0
        assert step.wait(timeout=180) == 0, log.read_text()
    finally:
        if step.poll() is None:
            step.kill()
    assert f"job {sid} SUCCEEDED" in log.read_text()


def _jobs(address: str) -> list[dict[str, object]]:
    from submitter.ray_api import jobs_api

    return list(jobs_api(address, "GET", "/api/jobs/", 10) or [])


def test_an_attempt_begun_in_the_ledger_but_not_on_ray_is_submitted_under_the_same_id(
    head: FakeJobsApi, tmp_path: Path
) -> None:
    """Fault 4: a submitter paused between the ledger's entry and its submission made a second submitter of the run
    count that attempt as lost and submit the next one: the step ran twice. An entry begun on the same head that Ray
    does not know is not spent: the id is submitted, and Ray takes one submission of it."""
    from submitter.ray_api import probe_version

    sid = f"ledger-{uuid.uuid4().hex[:6]}"
    record = tmp_path / "step.json"
    session = probe_version(head.address)
    ledger = {"submission_id": sid, "attempts": [
        {"attempt": 0, "job": sid, "pod": "paused-pod", "ray_session": session, "started_at": "2026-12-06T00:00:00Z",
         "command": "echo once", "ended_at": None, "outcome": None}]}  # fmt: skip
    (tmp_path / "step.attempts.json").write_text(json.dumps(ledger))
    done = subprocess.run(
        [sys.executable, str(SUBMITTER), f"--address={head.address}", f"--submission-id={sid}", "--max-retries=2",
         f"--record={record}", "--", "echo", "once"],
        capture_output=True, text=True, timeout=180, env=_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not yet on this Ray head; submitting it under the same id" in done.stdout
    ran = [str(j.get("submission_id")) for j in _jobs(head.address) if str(j.get("submission_id")).startswith(sid)]
    assert ran == [sid], ran


def test_a_head_restart_with_a_queued_run_runs_each_once(cluster: Cluster) -> None:
    """The head restarts (its job table is lost) while one run holds the nodes and another waits: each holder asks
    again, Ray admits one of them, and the other waits until it ends: both run, one at a time."""
    first = cluster.hold("first", nodes=2)
    wait_for(first.admitted, 90, "the first run's admission")
    second = cluster.hold("second", nodes=2)
    wait_for(lambda: cluster.state(second) == "PENDING", 60, "the second run's place")
    cluster.head.stop()
    cluster.head.start()
    # Both holders see it: until then a holder's ready file may be one of the old head's (the queued run can even be
    # admitted there for a moment, while the head's processes are being killed).
    wait_for(lambda: all("the head restarted" in holder.output() for holder in (first, second)), 120, "both to see it")
    wait_for(lambda: cluster.admitted_nodes() == 2, 120, "one place RUNNING on the new head")
    running = [place.run for place in cluster.places() if place.status == "RUNNING"]
    winner, waiter = (first, second) if running == [first.run] else (second, first)
    assert running == [winner.run] and cluster.state(waiter) == "PENDING"
    wait_for(lambda: winner.admitted() and not waiter.admitted(), 60, "the holders to follow Ray's job table")
    assert winner.end() == 0
    wait_for(waiter.admitted, 60, "the other run's admission once the first ended")
