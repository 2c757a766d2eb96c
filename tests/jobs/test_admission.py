"""Several runs on one cluster (jobs/admission.py, jobs/submitter/admission.py): admitted side by side when their GPU
nodes fit, queued first come first served when not, a deleted run's place freed at once, a run whose submitter is
gone kept while its Ray job runs, and the autoscaler request the sum of the admitted runs' nodes.

The holders and the worker waits run as the pipeline runs them (their scripts, as processes) against a Ray head of
this module's own: the autoscaler's standing request is one value per cluster, so no other test may share it."""

from __future__ import annotations

import functools
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
from ray_head import RAY_BIN, RayHead, wait_for
from submitter.admission import Entry, counted, queue, status_lines, why_queued

ROOT = Path(__file__).resolve().parents[2]
ADMISSION = ROOT / "jobs" / "admission.py"
WAIT_FOR_WORKERS = ROOT / "jobs" / "wait_for_workers.py"
TTL_S = 4

pytestmark = pytest.mark.timeout(600)


# --- the rules, pure --------------------------------------------------------------------------------------------


def entry(run: str, nodes: int = 1, queued_at: str = "2026-12-02T00:00:00Z", **kw: object) -> Entry:
    return Entry(run, nodes, [f"{run}-train", f"{run}-eval-final"], f"pod of {run}", queued_at, **kw)  # type: ignore[arg-type]


def test_a_runs_jobs_are_its_steps_their_retries_and_reruns_and_no_other_runs() -> None:
    exp = entry("exp")
    assert exp.owns("exp-train") and exp.owns("exp-train-r2") and exp.owns("exp-eval-final-rerun1-r1")
    assert exp.owns("exp-train-steps20") and exp.owns("exp-train-steps20-r1")  # an extended run's attempts
    assert not exp.owns("exp-2-train") and not exp.owns("exp-trainer") and not exp.owns("other-train")


def test_a_silent_entry_counts_only_while_a_ray_job_of_its_run_is_live() -> None:
    renewed, silent, released = entry("a"), entry("b", age_s=TTL_S + 1), entry("c", released=True)
    keep, drop = counted([renewed, silent, released], TTL_S, ["b-train-r1"])
    assert [e.run for e in keep] == ["a", "b"] and [e.run for e in drop] == ["c"]
    keep, drop = counted([renewed, silent, released], TTL_S, [])
    assert [e.run for e in keep] == ["a"] and [e.run for e in drop] == ["b", "c"]
    # Ray could not be asked: nothing is freed on a guess.
    keep, drop = counted([renewed, silent, released], TTL_S, None)
    assert [e.run for e in keep] == ["a", "b", "c"] and drop == []


def test_the_queue_is_first_come_first_served_and_says_whom_it_waits_behind() -> None:
    running = entry("a", 2, admitted_at="2026-12-02T00:00:01Z")
    late, early = entry("late", 1, "2026-12-02T00:05:00Z"), entry("early", 2, "2026-12-02T00:01:00Z")
    entries = [running, late, early]
    assert [e.run for e in queue(entries)] == ["early", "late"]
    assert why_queued(late, entries, 3) == (
        "queued behind early: needs 1 GPU node(s), 1 free of 3 (admitted: a (2); queued ahead: 1)"
    )
    assert why_queued(early, entries, 3).startswith("queued behind a: needs 2 GPU node(s), 1 free of 3")


def test_a_request_that_did_not_reach_the_cluster_marks_no_wait(tmp_path: Path) -> None:
    """The wait's flag is written only once the autoscaler has the request: a failed call (Ray Client not reachable
    yet) must not leave a standing 'waiting' that would keep the next withdrawal from clearing the request."""
    from submitter.admission import Admission, read_entries
    from submitter.output import Output

    admission = Admission(str(tmp_path), "exp", Output(), "http://127.0.0.1:9", live_jobs=lambda _address: [])
    admission.join(1, ["exp-train"])
    assert admission.try_admit(1) == (True, "")

    def unreachable(_bundles: list[dict[str, int]]) -> None:
        raise ConnectionError("ray client connection timeout")

    with pytest.raises(ConnectionError):
        admission.set_waiting(True, unreachable, 8)
    assert [e.waiting for e in read_entries(str(tmp_path))] == [False]
    asked: list[list[dict[str, int]]] = []
    assert admission.set_waiting(True, asked.append, 8) == (1, True)
    assert [e.waiting for e in read_entries(str(tmp_path))] == [True]
    assert admission.set_waiting(False, asked.append, 8) == (1, False)
    assert asked == [[{"GPU": 8}], []]


# --- on a real Ray head -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    own = RayHead(RAY_BIN)
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

    def says(self, words: str) -> bool:
        return words in self.output()

    def end(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


class Cluster:
    """An admission folder and the holders started on it (each killed at the end)."""

    def __init__(self, head: RayHead, tmp: Path, capacity: int) -> None:
        self.head, self.tmp, self.capacity = head, tmp, capacity
        self.directory = tmp / "data" / ".run-admission"
        self.holders: list[Holder] = []

    def hold(self, name: str, nodes: int = 1) -> Holder:
        run = f"{name}-{uuid.uuid4().hex[:6]}"
        ready, log = self.tmp / f"{run}.ready", self.tmp / f"{run}.log"
        args = [
            sys.executable, str(ADMISSION), "hold", f"--dir={self.directory}", f"--run={run}", f"--nodes={nodes}",
            f"--capacity={self.capacity}", f"--address={self.head.address}", f"--submission-id={run}-train",
            f"--submission-id={run}-eval-final", f"--ready-file={ready}", f"--ttl-s={TTL_S}", "--poll-s=0.3",
        ]  # fmt: skip
        with log.open("w") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, env=_env())
        holder = Holder(run, proc, ready, log)
        self.holders.append(holder)
        return holder

    def status(self) -> str:
        return "\n".join(status_lines(str(self.directory), self.capacity))

    def close(self) -> None:
        for holder in self.holders:
            if holder.proc.poll() is None:
                holder.proc.kill()
                holder.proc.wait()


@pytest.fixture
def cluster_of(head: RayHead, tmp_path: Path) -> Iterator[functools.partial[Cluster]]:
    made: list[Cluster] = []

    def make(capacity: int) -> Cluster:
        made.append(Cluster(head, tmp_path, capacity))
        return made[-1]

    yield make  # type: ignore[misc]
    for cluster in made:
        cluster.close()


def test_runs_that_fit_run_side_by_side_and_a_third_queues_until_one_ends(cluster_of) -> None:
    cluster = cluster_of(2)
    a, b = cluster.hold("a"), cluster.hold("b")
    wait_for(lambda: a.admitted() and b.admitted(), 60, "a and b to be admitted side by side")
    c = cluster.hold("c")
    wait_for(lambda: c.says("queued behind"), 60, "c to say it is queued")
    assert not c.admitted()
    assert "needs 1 GPU node(s), 0 free of 2" in c.output() and f"{a.run} (1)" in c.output()
    assert f"{c.run}: 1 GPU node(s), queued since" in cluster.status()
    assert a.end() == 0 and a.says(f"released the place of {a.run}")
    wait_for(c.admitted, 60, "c to be admitted once a ended")
    assert c.says(f"admitted: {c.run} runs on 1 GPU node(s) of 2")
    status = cluster.status()
    assert (
        a.run not in status and f"{b.run}: 1 GPU node(s), admitted" in status and "2 of 2 GPU nodes admitted" in status
    )


def test_a_deleted_queued_run_leaves_the_queue_at_once(cluster_of) -> None:
    cluster = cluster_of(1)
    a = cluster.hold("a")
    wait_for(a.admitted, 60, "a to be admitted")
    b = cluster.hold("b")
    wait_for(lambda: b.says("queued behind"), 60, "b to queue")
    c = cluster.hold("c")
    wait_for(lambda: c.says(f"queued behind {b.run}"), 60, "c to queue behind b")
    # Its Job deleted while queued: SIGTERM to the pod, passed on to the holder.
    assert b.end() == 128 + signal.SIGTERM
    assert b.says(f"released the place of {b.run} in the queue")
    wait_for(lambda: b.run not in cluster.status(), 30, "b's entry to go")
    assert not c.admitted()
    a.end()
    wait_for(c.admitted, 60, "c to be admitted, b no longer ahead of it")


def test_a_run_whose_submitter_is_gone_keeps_its_place_while_its_ray_job_runs(cluster_of, head: RayHead) -> None:
    from ray.job_submission import JobSubmissionClient

    cluster = cluster_of(1)
    a = cluster.hold("a")
    wait_for(a.admitted, 60, "a to be admitted")
    client = JobSubmissionClient(head.address)
    training = client.submit_job(entrypoint="sleep 300", submission_id=f"{a.run}-train-r1")
    wait_for(lambda: str(client.get_job_status(training)) == "RUNNING", 90, "a's training to run")
    a.end(signal.SIGKILL)  # the submitter pod lost with its node: its entry is never released
    b = cluster.hold("b")
    wait_for(lambda: b.says(f"queued behind {a.run}"), 60, "b to queue behind a")
    # Well past the ttl: a's entry is silent, but Ray lists a's job as RUNNING.
    time.sleep(3 * TTL_S)
    assert not b.admitted() and f"{a.run}: 1 GPU node(s), admitted" in cluster.status()
    client.stop_job(training)
    wait_for(b.admitted, 90, "b to be admitted once a's job stopped")
    assert b.says(f"{a.run} no longer holds GPU nodes")


def _says(log: Path, words: str) -> bool:
    return words in log.read_text()


def _wait_args(head: RayHead, cluster: Cluster, holder: Holder, nodes: int) -> list[str]:
    from ray_head import _CLIENT_ADDRESS

    return [
        sys.executable, str(WAIT_FOR_WORKERS), f"--address={head.address}", f"--nodes={nodes}", "--gpus-per-node=8",
        f"--request-address={_CLIENT_ADDRESS[head.address]}", f"--admission-dir={cluster.directory}",
        f"--run={holder.run}", "--timeout-s=600", "--poll-s=1",
    ]  # fmt: skip


def test_the_autoscaler_request_is_the_sum_of_the_admitted_runs_and_each_runs_request_is_kept(
    cluster_of, head: RayHead, tmp_path: Path
) -> None:
    from ray_head import _GCS_ADDRESS
    from test_wait_for_workers import standing_request

    gcs = _GCS_ADDRESS[head.address]
    cluster = cluster_of(3)
    a, b = cluster.hold("a", 1), cluster.hold("b", 2)
    wait_for(lambda: a.admitted() and b.admitted(), 60, "a and b to be admitted")
    three = [{"GPU": 8}] * 3
    logs = {name: tmp_path / f"wait-{name}.log" for name in ("a", "b")}
    waits = {}
    try:
        for name, holder, nodes in (("a", a, 1), ("b", b, 2)):
            with logs[name].open("w") as out:
                waits[name] = subprocess.Popen(
                    _wait_args(head, cluster, holder, nodes), stdout=out, stderr=subprocess.STDOUT, env=_env()
                )
            asked = functools.partial(_says, logs[name], "asked the Ray autoscaler")
            wait_for(asked, 180, f"{name}'s request")
            assert standing_request(gcs) == three  # both runs' nodes, whichever asked
        assert "0 of 3 Ray GPU workers (8 GPUs each) are up" in logs["a"].read_text()  # b's nodes are not a's
        waits["a"].send_signal(signal.SIGTERM)
        assert waits["a"].wait(timeout=180) == 128 + signal.SIGTERM
        assert "the autoscaler request stays at 3 workers" in logs["a"].read_text()
        assert standing_request(gcs) == three  # a's wait ended; b's still stands
        waits["b"].send_signal(signal.SIGTERM)
        assert waits["b"].wait(timeout=180) == 128 + signal.SIGTERM
        assert standing_request(gcs) == []
    finally:
        for proc in waits.values():
            if proc.poll() is None:
                proc.kill()


# --- whole pipelines: the launcher's own script, stand-in steps ---------------------------------------------------


FAKE_PYTHON = """#!/bin/bash
# admission.py is the real one; the worker wait is met at once; each step's submitter logs its id, and a train step
# holds until the test releases it.
case "$1" in
  */admission.py) shift; exec {python} {admission} "$@";;
  */ray_submit.py)
    for a; do case "$a" in --submission-id=*) id="${{a#*=}}";; esac; done
    echo "start $id" >> "$TMPDIR/steps.log"
    case "$id" in *-train) until [ -e "$TMPDIR/release" ]; do sleep 0.2; done;; esac
    exit 0;;
  *) exit 0;;
esac
"""


@dataclass
class Pipeline:
    run: str
    proc: subprocess.Popen[str]
    home: Path  # its pod's TMPDIR: the ready file, the steps it started, the release of its train step

    def steps(self) -> list[str]:
        log = self.home / "steps.log"
        return log.read_text().split("\n") if log.exists() else []

    def training(self) -> bool:
        return f"start {self.run}-train" in self.steps()

    def output(self) -> str:
        return (self.home / "pod.log").read_text()


def test_three_pipelines_side_by_side_queued_and_a_deleted_one_gone(head: RayHead, tmp_path: Path) -> None:
    """The launcher's pipeline.sh for four runs of one GPU node each on a cluster of two: two train side by side, the
    third waits visibly (no step started) and starts when the first ends, the fourth, deleted while queued (SIGTERM
    to the pod), leaves the queue at once and is never admitted."""
    from conftest import shared_infra_run
    from launcher.pipeline import pipeline_script, pipeline_steps
    from launcher.settings import build_infra_outputs, build_job_settings

    infra = build_infra_outputs(
        {**shared_infra_run("h200").outputs, "lustreMountPath": str(tmp_path / "data"), "rayAddress": head.address,
         "rayWorkerReplicas": 2}
    )  # fmt: skip
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python").write_text(FAKE_PYTHON.format(python=sys.executable, admission=ADMISSION))
    (fake_bin / "python").chmod(0o755)
    for tool in ("mkdir", "cp"):
        (fake_bin / tool).write_text("#!/bin/bash\nexit 0\n")
        (fake_bin / tool).chmod(0o755)

    def start(name: str) -> Pipeline:
        run = f"{name}-{uuid.uuid4().hex[:6]}"
        values = {"infraStack": "organization/nemo-rl-gke/h200", "runName": run, "numNodes": 1, "generationNodes": 0,
                  "preflight": False}  # fmt: skip
        job = build_job_settings(values, infra)
        home = tmp_path / run
        home.mkdir()
        env = {**_env(), "PATH": f"{fake_bin}:/usr/bin:/bin", "TMPDIR": str(home)}
        with (home / "pod.log").open("w") as log:
            proc = subprocess.Popen(
                ["bash", "-c", pipeline_script(job, infra, pipeline_steps(job, infra))],
                stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
            )  # fmt: skip
        return Pipeline(run, proc, home)

    pipelines: list[Pipeline] = []
    try:
        a = start("a")
        pipelines.append(a)
        b = start("b")
        pipelines.append(b)
        wait_for(lambda: a.training() and b.training(), 90, "a and b to train side by side")
        c = start("c")
        pipelines.append(c)
        wait_for(lambda: "admission: queued behind" in c.output(), 60, "c to say it is queued")
        d = start("d")
        pipelines.append(d)
        wait_for(lambda: f"admission: queued behind {c.run}" in d.output(), 60, "d to queue behind c")
        assert c.steps() == [] and d.steps() == []  # no step of a queued run started
        d.proc.send_signal(signal.SIGTERM)  # its Job deleted while queued
        assert d.proc.wait(timeout=60) == 128 + signal.SIGTERM
        directory = str(tmp_path / "data" / ".run-admission")
        wait_for(lambda: d.run not in "\n".join(status_lines(directory)), 30, "d to leave the queue")
        (a.home / "release").touch()
        assert a.proc.wait(timeout=120) == 0
        wait_for(c.training, 90, "c to train once a ended")
        assert "admission: admitted" in c.output() and d.steps() == []
        for rest in (b, c):
            (rest.home / "release").touch()
            assert rest.proc.wait(timeout=120) == 0
        # Every pipeline that ended gave its place back (a released entry counts only while a job of it runs).
        assert all("(released)" in line or line.startswith("no run") for line in status_lines(directory))
    finally:
        for pipeline in pipelines:
            if pipeline.proc.poll() is None:
                pipeline.proc.kill()
