"""The pipeline waits for its GPU workers before submitting anything; tested pure and against a real Ray head."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time as _time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from launcher.steps import wait_for_workers
from ray_head import HEAD_GPUS, closed_port
from script_loader import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "wait_for_workers.py"
SUBMITTER = SCRIPT.with_name("ray_submit.py")


wfw = load_script("jobs/wait_for_workers.py", "wait_for_workers")


def node(gpus: float, state: str = "ALIVE") -> dict[str, object]:
    return {"state": state, "resources_total": {"CPU": 200.0, "GPU": gpus}}


def test_counts_alive_nodes_with_enough_gpus():
    nodes = [node(0), node(8), node(8, state="DEAD"), node(4), node(8), {"state": "ALIVE", "resources_total": {}}]
    assert wfw.gpu_workers(nodes, 8) == 2
    assert wfw.gpu_workers(nodes, 4) == 3
    assert wfw.gpu_workers([], 1) == 0


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_until_the_workers_arrive_and_reports_changes():
    time = FakeTime()
    arrivals = iter([[node(0)], [node(0)], [node(0), node(8)], [node(0), node(8), node(8)]])
    said: list[str] = []
    ready = wfw.wait(lambda: next(arrivals), 2, 8, 600, 10, said.append, time.clock, time.sleep)
    assert ready is True
    assert time.now == 30  # three waits of 10 s
    assert said == [
        "0 of 2 Ray GPU workers (8 GPUs each) are up",
        "1 of 2 Ray GPU workers (8 GPUs each) are up",
        "2 of 2 Ray GPU workers (8 GPUs each) are up",
    ]


def test_gives_up_at_the_deadline():
    time = FakeTime()
    said: list[str] = []
    assert wfw.wait(lambda: [node(8)], 2, 8, 45, 10, said.append, time.clock, time.sleep) is False
    assert time.now == 45
    assert said == ["1 of 2 Ray GPU workers (8 GPUs each) are up"]  # said once, not on every poll


def test_an_unanswering_head_is_waited_for():
    time = FakeTime()
    answers: list[object] = [ConnectionError("refused"), ConnectionError("refused"), [node(8)]]

    def list_nodes() -> list[dict[str, object]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    said: list[str] = []
    assert wfw.wait(list_nodes, 1, 8, 600, 5, said.append, time.clock, time.sleep) is True
    assert said[0].startswith("the Ray head does not answer yet (ConnectionError")
    assert len(said) == 2


def run_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.timeout(300)
def test_against_a_real_head(ray_address: str):
    ready = run_script("--address", ray_address, "--nodes", "1", "--gpus-per-node", str(HEAD_GPUS))
    assert ready.returncode == wfw.EXIT_READY, ready.stdout + ready.stderr
    assert f"1 of 1 Ray GPU workers ({HEAD_GPUS} GPUs each) are up" in ready.stdout

    short = ("--timeout-s", "2", "--poll-s", "0.5")
    too_big = run_script("--address", ray_address, "--nodes", "1", "--gpus-per-node", "8", *short)
    assert too_big.returncode == wfw.EXIT_NOT_READY
    assert "0 of 1 Ray GPU workers (8 GPUs each) are up" in too_big.stdout
    too_many = run_script("--address", ray_address, "--nodes", "2", "--gpus-per-node", str(HEAD_GPUS), *short)
    assert too_many.returncode == wfw.EXIT_NOT_READY
    assert "the Job will try again" in too_many.stdout


@pytest.mark.timeout(120)
def test_unreachable_head_and_usage_errors():
    gone = run_script("--address", f"http://127.0.0.1:{closed_port()}", "--nodes", "1", "--gpus-per-node", "8",
                      "--timeout-s", "1", "--poll-s", "0.5")  # fmt: skip
    assert gone.returncode == wfw.EXIT_NOT_READY
    assert "does not answer yet" in gone.stdout
    assert run_script("--nodes", "1").returncode == wfw.EXIT_USAGE
    assert run_script("--address", "http://x:8265", "--nodes", "0", "--gpus-per-node", "8").returncode == wfw.EXIT_USAGE


# --- Asking the autoscaler for the workers (GPU group scaled to zero) -------------------------------------------


def test_asks_for_missing_workers_once_then_withdraws_when_ready():
    time = FakeTime()
    arrivals = iter([[node(0)], [node(0)], [node(0), node(8), node(8)]])
    requests: list[list[dict[str, int]]] = []
    said: list[str] = []
    ready = wfw.wait(lambda: next(arrivals), 2, 8, 600, 10, said.append, time.clock, time.sleep, requests.append)
    assert ready is True
    assert requests == [[{"GPU": 8}, {"GPU": 8}], []]  # asked once, withdrawn at the end
    assert "asked the Ray autoscaler for 2 workers of 8 GPUs (a placement group)" in said
    assert said[-1].startswith("withdrew this run's autoscaler request")


def test_no_request_when_the_workers_are_already_there():
    time = FakeTime()
    requests: list[list[dict[str, int]]] = []
    assert wfw.wait(lambda: [node(8), node(8)], 2, 8, 600, 10, [].append, time.clock, time.sleep, requests.append)
    assert requests == []


def test_request_withdrawn_on_timeout_and_retried_after_a_failure():
    time = FakeTime()
    calls: list[list[dict[str, int]]] = []

    def request(bundles: list[dict[str, int]]) -> None:
        calls.append(bundles)
        if len(calls) == 1:
            raise ConnectionError("client server not up")

    said: list[str] = []
    assert wfw.wait(lambda: [node(0)], 1, 8, 30, 10, said.append, time.clock, time.sleep, request) is False
    assert calls == [[{"GPU": 8}], [{"GPU": 8}], []]  # failed, asked again, withdrawn at the deadline
    assert any(s.startswith("could not ask the autoscaler yet (ConnectionError") for s in said)


def test_a_sigterm_during_the_request_still_withdraws_it():
    """The request may reach the cluster before the call returns; a SIGTERM then (SystemExit from the handler) must
    not leave it standing."""
    time = FakeTime()
    calls: list[list[dict[str, int]]] = []

    def request(bundles: list[dict[str, int]]) -> None:
        calls.append(bundles)
        if bundles:
            raise SystemExit(wfw.EXIT_SIGTERM)  # the handler fires while the call waits for its task

    with pytest.raises(SystemExit) as left:
        wfw.wait(lambda: [node(0)], 2, 8, 600, 10, [].append, time.clock, time.sleep, request)
    assert left.value.code == wfw.EXIT_SIGTERM
    assert calls == [[{"GPU": 8}, {"GPU": 8}], []]  # sent, then withdrawn on the way out


def test_a_failed_withdrawal_is_tried_again():
    time = FakeTime()
    calls: list[list[dict[str, int]]] = []

    def request(bundles: list[dict[str, int]]) -> None:
        calls.append(bundles)
        if bundles == [] and calls.count([]) < wfw.WITHDRAW_ATTEMPTS:
            raise ConnectionError("ray client connection timeout")

    said: list[str] = []
    assert wfw.wait(lambda: [node(0)], 1, 8, 10, 10, said.append, time.clock, time.sleep, request) is False
    assert calls == [[{"GPU": 8}]] + [[]] * wfw.WITHDRAW_ATTEMPTS  # the last withdrawal got through
    assert said[-1].startswith("withdrew this run's autoscaler request")
    assert f"attempt {wfw.WITHDRAW_ATTEMPTS - 1} of {wfw.WITHDRAW_ATTEMPTS} (ConnectionError" in said[-2]


def test_no_request_while_the_head_does_not_answer():
    time = FakeTime()
    requests: list[list[dict[str, int]]] = []

    def down() -> list[dict[str, object]]:
        raise ConnectionError("refused")

    assert wfw.wait(down, 1, 8, 20, 10, [].append, time.clock, time.sleep, requests.append) is False
    assert requests == []


def test_the_childs_reason_is_what_a_failed_request_says(monkeypatch: pytest.MonkeyPatch):
    """Each request runs in a child (this script's placement-group mode); its reason, not Ray's later log lines, is
    what the wait reports."""
    bad = run_script(wfw.HOLD_GROUP_FLAG, "ray://127.0.0.1:1", "not json")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1].startswith(wfw.CHILD_FAILED + "JSONDecodeError: ")

    stderr = f"{wfw.CHILD_FAILED}ConnectionError: ray client connection timeout\nERROR dataclient.py:330 -- late log\n"
    ran: list[list[str]] = []

    class Child:
        def __init__(self, command: list[str], **_: object) -> None:
            ran.append(command)
            self.stdin, self.stdout = io.StringIO(), io.StringIO("")  # it ends without saying it holds a group

        def wait(self, _timeout: float | None = None) -> int:
            return 1

        def kill(self) -> None:
            pass

        def communicate(self) -> tuple[str, str]:
            return "", stderr

    monkeypatch.setattr(wfw.subprocess, "Popen", Child)
    with pytest.raises(wfw.RequestFailedError, match=r"^ConnectionError: ray client connection timeout$"):
        wfw.ray_client_request("ray://head:10001")([{"GPU": 8}])
    assert ran[0][-3:] == [wfw.HOLD_GROUP_FLAG, "ray://head:10001", '[{"GPU": 8}]']


def standing_request(ray_address: str) -> object:
    """The GPU bundles of the pending placement groups on the head (what the autoscaler scales up for), from Ray's
    State API: the wait's request while it stands."""
    from ray.util.state import list_placement_groups

    groups = list_placement_groups(address=ray_address, filters=[("state", "=", "PENDING")], detail=True)
    return [
        dict(b.get("unit_resources") or {})
        for g in groups
        for b in (g.bundles or [])
        if "GPU" in (b.get("unit_resources") or {})
    ]


TWO_WORKERS = [{"GPU": 8}, {"GPU": 8}]
REQUEST_RUNS = 4  # runs of the timeout path at most, each until its request got through


@contextlib.contextmanager
def asking_for_two_workers(
    ray_address: str, ray_client_address: str, ray_gcs_address: str
) -> Iterator[tuple[subprocess.Popen[str], object]]:
    """wait_for_workers asking the test head's autoscaler for two 8-GPU workers (which never come; it would wait
    600 s): yields the process and the standing request, once that is the request or after 120 s; kills the process
    if still running."""
    args = ["--address", ray_address, "--nodes", "2", "--gpus-per-node", "8", "--request-address", ray_client_address]
    waiting = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args, "--timeout-s", "600", "--poll-s", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen: object = None
        deadline = _time.monotonic() + 120
        while _time.monotonic() < deadline and seen != TWO_WORKERS:
            seen = standing_request(ray_address)
            _time.sleep(0.5)
        yield waiting, seen
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


@pytest.mark.timeout(420)
def test_request_reaches_a_real_head_and_is_withdrawn(ray_address: str, ray_client_address: str, ray_gcs_address: str):
    # The request is made before the deadline is looked at, so with a deadline of 1 s the timeout path follows the
    # first request, however long its Ray Client connection takes. A first connection can fail on a loaded machine
    # (the wait then says "could not ask the autoscaler yet" and its deadline ends it without a request): such a run
    # proves nothing here and is run again, at most REQUEST_RUNS times. What the request holds while it stands is
    # checked by the SIGTERM test below on the same head; here the process's own words and the head's final state.
    args = ["--address", ray_address, "--nodes", "2", "--gpus-per-node", "8", "--request-address", ray_client_address]
    outs = []
    for _ in range(REQUEST_RUNS):
        timed_out = run_script(*args, "--timeout-s", "1", "--poll-s", "1", timeout=330)
        outs.append(timed_out.stdout + timed_out.stderr)
        if "asked the Ray autoscaler" in outs[-1] or "could not ask the autoscaler yet" not in outs[-1]:
            break
    out = outs[-1]
    assert timed_out.returncode == wfw.EXIT_NOT_READY, out  # nobody brings GPUs here: the timeout path
    assert "asked the Ray autoscaler for 2 workers of 8 GPUs" in out, "\n---\n".join(outs)
    assert "withdrew this run's autoscaler request" in out, out
    assert standing_request(ray_address) == []

    # Enough workers already (the head offers HEAD_GPUS): no request is made.
    ready = run_script("--address", ray_address, "--nodes", "1", "--gpus-per-node", str(HEAD_GPUS),
                       "--request-address", ray_client_address)  # fmt: skip
    assert ready.returncode == wfw.EXIT_READY, ready.stdout + ready.stderr
    assert "asked the Ray autoscaler" not in ready.stdout


@pytest.mark.timeout(300)
def test_sigterm_withdraws_the_request_on_a_real_head(ray_address: str, ray_client_address: str, ray_gcs_address: str):
    """The pipeline's shell passes SIGTERM on to the wait (pod deleted or evicted): the standing request must not
    outlive it, or the autoscaler keeps GPU nodes up for nobody."""
    with asking_for_two_workers(ray_address, ray_client_address, ray_gcs_address) as (waiting, seen):
        assert seen == TWO_WORKERS, "the request never reached the head"
        waiting.terminate()
        out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == wfw.EXIT_SIGTERM, out
    assert "withdrew this run's autoscaler request" in out, out
    assert standing_request(ray_address) == []


def test_a_train_attempts_wait_runs_as_a_ray_job(ray_address: str, ray_client_address: str, tmp_path: Path):
    """Each train attempt starts with the pipeline's wait, inside the Ray job (on the head, with the job driver's
    environment), submitted through ray_submit.py: here with the head's GPUs present it succeeds at once."""
    infra = SimpleNamespace(
        ray_address=ray_address,
        gpus_per_node=HEAD_GPUS,
        ray_autoscaling=True,
        ray_client_address=ray_client_address,
        mount_path=str(tmp_path),
    )
    job = SimpleNamespace(wait_for_workers_minutes=1, run_name="train-wait")
    words = wait_for_workers(str(SCRIPT), 1, cast(Any, job), cast(Any, infra))
    assert "--with-admitted-runs" in words  # no place RUNNING on this head: only this run's node is waited for
    assert words[0] == "python" and f"--request-address={ray_client_address}" in words
    submission = f"train-wait-{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [sys.executable, str(SUBMITTER), f"--address={ray_address}", f"--submission-id={submission}", "--",
         sys.executable, *words[1:]],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"1 of 1 Ray GPU workers ({HEAD_GPUS} GPUs each) are up" in result.stdout
