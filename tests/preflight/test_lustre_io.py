"""jobs/preflight/lustre_io.py: threshold arithmetic, read plan, mount lookup, verdict, and real runs on a temp dir
(in-process, as a script, and through a local Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "preflight" / "lustre_io.py"


lio = load_script("jobs/preflight/lustre_io.py", "preflight_lustre_io")
MIB, GIB = 1 << 20, 1 << 30


# ------------------------------------------------------------------------------------------------- threshold


@pytest.mark.parametrize(
    ("capacity", "tier", "gbps"),
    [(18000, 1000, 17.578125), (9000, 1000, 8.7890625), (72000, 125, 8.7890625), (36000, 250, 8.7890625)],
)
def test_expected_instance_throughput_is_tib_times_tier(capacity: int, tier: int, gbps: float) -> None:
    assert lio.expected_instance_gbps(capacity, tier) == pytest.approx(gbps)


def test_threshold_is_limited_by_the_nodes_when_they_cannot_saturate_the_instance() -> None:
    thr = lio.io_threshold(1_530_000, 1000, nodes=2, node_limit_gbps=5.0, min_fraction=0.5)
    assert thr.instance_gbps == pytest.approx(1494.140625)
    assert thr.nodes_gbps == pytest.approx(10.0)
    assert thr.limited_by == "nodes"
    assert thr.threshold_gbps == pytest.approx(5.0)


def test_threshold_is_limited_by_the_instance_when_many_nodes_share_it() -> None:
    thr = lio.io_threshold(18000, 1000, nodes=16, node_limit_gbps=5.0, min_fraction=0.5)
    assert thr.limited_by == "instance"
    assert thr.threshold_gbps == pytest.approx(0.5 * 17.578125)


def test_threshold_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        lio.io_threshold(18000, 1000, nodes=0, node_limit_gbps=5.0, min_fraction=0.5)
    with pytest.raises(ValueError):
        lio.io_threshold(18000, 1000, nodes=2, node_limit_gbps=5.0, min_fraction=1.5)
    with pytest.raises(ValueError):
        lio.expected_instance_gbps(0, 1000)


def test_defaults_are_what_the_docs_say() -> None:
    args = lio.parse_args(["--capacity-gib", "18000", "--tier-mbps-per-tib", "1000"])
    assert args.min_fraction == 0.5 and args.node_limit_gbps == 5.0
    assert args.path == "/data/preflight" and args.read_mode == "auto"


def test_stream_sizes_split_evenly_in_whole_mib() -> None:
    assert lio.stream_sizes(16 * GIB, 16) == [GIB] * 16
    assert lio.stream_sizes(int(0.01 * GIB), 4) == [2 * MIB] * 4  # 2.56 MiB rounded down
    assert lio.stream_sizes(MIB // 2, 3) == [MIB] * 3  # never below one aligned unit


def test_read_plan_makes_every_node_read_another_nodes_files() -> None:
    assert lio.resolve_read_mode("auto", 3) == "cross-node"
    assert lio.resolve_read_mode("auto", 1) == "direct"
    assert lio.read_sources(3, "cross-node") == [1, 2, 0]
    assert all(src != node for node, src in enumerate(lio.read_sources(5, "cross-node")))
    assert lio.read_sources(3, "direct") == [0, 1, 2]
    with pytest.raises(ValueError):
        lio.resolve_read_mode("cross-node", 1)


def test_aggregate_is_all_bytes_over_the_whole_span() -> None:
    phases = [{"bytes": 10 * 10**9, "start": 100.0, "end": 102.0}, {"bytes": 10 * 10**9, "start": 100.5, "end": 104.0}]
    assert lio.aggregate_gbps(phases) == pytest.approx(5.0)  # 20 GB over 4 s, not 5 + 2.86


MOUNTS = """\
overlay / overlay rw,relatime 0 0
proc /proc proc rw 0 0
10.90.0.2@tcp:/lfs /data lustre rw,flock,lazystatfs 0 0
/dev/sda1 /data\\040scratch ext4 rw 0 0
"""


def test_mount_of_finds_the_longest_matching_mount_point() -> None:
    assert lio.mount_of("/data/preflight/run-1", MOUNTS) == ("/data", "lustre", "10.90.0.2@tcp:/lfs")
    assert lio.mount_of("/data", MOUNTS)[1] == "lustre"
    assert lio.mount_of("/datax/file", MOUNTS)[:2] == ("/", "overlay")
    assert lio.mount_of("/data scratch/x", MOUNTS)[:2] == ("/data scratch", "ext4")


def test_select_nodes_takes_alive_gpu_nodes_in_a_stable_order() -> None:
    nodes = [
        {"NodeID": "c", "Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"GPU": 8.0}},
        {"NodeID": "h", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0}},
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"GPU": 8.0}},
        {"NodeID": "d", "Alive": False, "NodeManagerAddress": "10.0.0.4", "Resources": {"GPU": 8.0}},
    ]
    assert [n["NodeID"] for n in lio.select_nodes(nodes, None, False)] == ["a", "c"]
    assert [n["NodeID"] for n in lio.select_nodes(nodes, 1, False)] == ["a"]
    assert [n["NodeID"] for n in lio.select_nodes(nodes, None, True)] == ["h", "a", "c"]
    with pytest.raises(lio.PreflightError, match="only 2"):
        lio.select_nodes(nodes, 3, False)


def test_verdict_pass_and_fail_messages() -> None:
    thr = lio.io_threshold(18000, 1000, nodes=2, node_limit_gbps=5.0, min_fraction=0.5)
    ok = lio.io_verdict(6.0, 7.0, thr, 2)
    assert ok.ok and ok.message.startswith("PASS") and "5.00 GB/s" in ok.message
    bad = lio.io_verdict(6.0, 1.2, thr, 2)
    assert not bad.ok
    assert "read 1.20 GB/s" in bad.message and "write" not in bad.message.splitlines()[0]
    assert "--capacity-gib" in bad.message and "lustre" in bad.message


# ------------------------------------------------------------------------------------------------- local runs


def _args(path: Path, *extra: str) -> list[str]:
    return [
        "--local",
        "--path",
        str(path),
        "--gib-per-node",
        "0.01",
        "--streams",
        "3",
        "--block-mib",
        "1",
        "--capacity-gib",
        "18000",
        "--tier-mbps-per-tib",
        "1000",
        *extra,
    ]


def _left_behind(path: Path) -> list[str]:
    return [str(p) for p in path.rglob("*")] if path.exists() else []


def test_local_run_reports_numbers_and_removes_its_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "preflight"
    out = tmp_path / "out.json"
    status = lio.main(_args(base, "--node-limit-gbps", "1e-6", "--json-out", str(out)))
    text = capsys.readouterr().out
    assert status == 0, text
    assert "PASS" in text and "write GB/s" in text and "files removed: yes" in text
    result = json.loads(out.read_text())
    assert result["write_total_gbps"] > 0 and result["read_total_gbps"] > 0
    assert result["writes"][0]["bytes"] == 3 * 3 * MIB  # 0.01 GiB over 3 streams: 3 MiB each
    assert result["reads"][0]["bytes"] == 3 * 3 * MIB and result["reads"][0]["verified"]
    assert result["reads"][0]["mode"] in ("direct", "buffered")
    assert result["removed"] and _left_behind(base) == []


def test_local_run_fails_under_the_threshold_and_still_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "preflight"
    status = lio.main(_args(base, "--node-limit-gbps", "1e9", "--min-fraction", "1"))
    text = capsys.readouterr().out
    assert status == 1
    assert "FAIL: Lustre write" in text and "17.58 GB/s" in text  # the instance's 17.58 GB/s is the limit
    assert _left_behind(base) == []


def test_files_are_removed_when_a_phase_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "preflight"
    seen: list[list[str]] = []

    def broken_read(run_dir: str, *args: Any) -> None:
        seen.append(sorted(os.listdir(lio.node_dir_of(run_dir, 0))))
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(lio, "read_node", broken_read)
    assert lio.main(_args(base, "--node-limit-gbps", "1e-6")) == 2
    assert seen == [["stream-000.bin", "stream-001.bin", "stream-002.bin"]]  # the files existed when it broke
    err = capsys.readouterr().err
    assert "Input/output error" in err
    assert _left_behind(base) == []
    assert ": removed" in err and "NOT removed" not in err  # says so, since no report follows


def test_corrupted_data_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = lio.write_node

    def corrupting_write(run_dir: str, node_index: int, sizes: list[int], block: int) -> dict[str, Any]:
        result = original(run_dir, node_index, sizes, block)
        with open(lio.stream_path(lio.node_dir_of(run_dir, node_index), 1), "r+b") as fh:
            first = fh.read(1)
            fh.seek(0)
            fh.write(bytes([first[0] ^ 0xFF]))
        return result

    monkeypatch.setattr(lio, "write_node", corrupting_write)
    status = lio.main(_args(tmp_path / "p", "--node-limit-gbps", "1e-6"))
    text = capsys.readouterr().out
    assert status == 1
    assert "data read back differs" in text and "streams [1]" in text


def test_wrong_file_system_type_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = lio.main(_args(tmp_path / "p", "--node-limit-gbps", "1e-6", "--expect-fstype", "lustre"))
    text = capsys.readouterr().out
    assert status == 1
    assert "is not on a lustre file system" in text


@pytest.mark.timeout(120)
def test_script_entrypoint_exit_codes(tmp_path: Path) -> None:
    base = tmp_path / "p"
    ok = subprocess.run(
        [sys.executable, str(SCRIPT), *_args(base, "--node-limit-gbps", "1e-6")],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "# total: write" in ok.stdout
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), "--local", "--path", str(base)], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 2 and "--capacity-gib" in missing.stderr
    assert _left_behind(base) == []


# ------------------------------------------------------------------------------------------------- Ray path


def _ray_args(path: Path) -> list[str]:
    """The Ray path on the session head: its node actors reserve no CPU, so they never wait behind the NCCL test's
    placement group (which holds the head's 2 CPUs for a few seconds) on another worker."""
    return [a for a in _args(path, "--node-limit-gbps", "1e-6", "--cpus-per-actor", "0") if a != "--local"]


@pytest.mark.timeout(360)
def test_ray_node_actor_path(ray_gcs_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(lio)
    ray.init(address=ray_gcs_address, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        args = _ray_args(tmp_path / "p")
        status = lio.main([*args, "--all-nodes", "--expect-fstype", ""])
        text = capsys.readouterr().out
        assert status == 0, text
        assert "1 node(s)" in text and "node 0" in text and "PASS" in text and "files removed: yes" in text
        assert _left_behind(tmp_path / "p") == []
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(lio)


# ------------------------------------------------------------------------------------- Ray path, stuck phase


class _FakeRayError(Exception):
    pass


class _FakeGetTimeoutError(_FakeRayError):
    pass


class _FakeActorDiedError(_FakeRayError):
    pass


class _FakeTaskError(_FakeRayError):
    pass


class _FakeAffinity:
    def __init__(self, node_id: str, soft: bool) -> None:
        self.node_id, self.soft = node_id, soft


class _FakeActor:
    """An actor handle with Ray's default concurrency of one: calls run one after another on one thread."""

    def __init__(self, ray: _FakeRay, index: int, instance: Any) -> None:
        self.ray, self.index, self.instance = ray, index, instance
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.dead = False

    def __getattr__(self, method: str) -> Any:
        handle = self

        class _Method:
            def remote(self, *args: Any) -> Future[Any]:
                return handle.call(method, args)

        return _Method()

    def call(self, method: str, args: tuple[Any, ...]) -> Future[Any]:
        self.ray.log.append(("call", method, self.index))
        if self.dead:
            failed: Future[Any] = Future()
            failed.set_exception(_FakeActorDiedError(f"actor {self.index} was killed"))
            return failed

        def run() -> Any:
            if self.dead:
                raise _FakeActorDiedError(f"actor {self.index} was killed")
            return getattr(self.instance, method)(*args)

        return self.pool.submit(run)

    def kill(self) -> None:
        self.dead = True  # a call already running carries on (its thread cannot be stopped); queued ones fail
        self.pool.shutdown(wait=False, cancel_futures=True)


class _FakeRay:
    """The part of the Ray API that run_ray uses, in-process: enough to show what the driver waits on."""

    def __init__(self, nodes: int) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.actors: list[_FakeActor] = []
        self.exceptions = SimpleNamespace(
            RayError=_FakeRayError, GetTimeoutError=_FakeGetTimeoutError, RayActorError=_FakeActorDiedError
        )
        self.util = SimpleNamespace(
            get_node_ip_address=lambda: "10.0.0.1",
            scheduling_strategies=SimpleNamespace(NodeAffinitySchedulingStrategy=_FakeAffinity),
        )
        self._nodes = [
            {"NodeID": f"node-{i}", "Alive": True, "NodeManagerAddress": f"10.0.0.{i + 1}", "Resources": {"GPU": 8.0}}
            for i in range(nodes)
        ]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "ray", self)
        monkeypatch.setitem(sys.modules, "ray.exceptions", self.exceptions)
        monkeypatch.setitem(sys.modules, "ray.util", self.util)
        monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", self.util.scheduling_strategies)

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def remote(self, target: Any) -> Any:
        fake = self
        if isinstance(target, type):

            class _ActorClass:
                def options(self, **_: Any) -> _ActorClass:
                    return self

                def remote(self) -> _FakeActor:
                    actor = _FakeActor(fake, len(fake.actors), target())
                    fake.actors.append(actor)
                    return actor

            return _ActorClass()

        class _Task:
            def __init__(self, node_id: str = "") -> None:
                self.node_id = node_id

            def options(self, *, scheduling_strategy: _FakeAffinity, **_: Any) -> _Task:
                return _Task(scheduling_strategy.node_id)

            def remote(self, *args: Any) -> Future[Any]:
                fake.log.append(("task", target.__name__, self.node_id))
                return ThreadPoolExecutor(max_workers=1).submit(target, *args)  # a new worker, no queue

        return _Task()

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        many = isinstance(refs, list)
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for ref in refs if many else [refs]:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(ref.result(timeout=left))
            except FutureTimeout as exc:
                raise _FakeGetTimeoutError("timed out") from exc
            except CancelledError as exc:
                raise _FakeActorDiedError("the actor was killed") from exc
            except _FakeRayError:
                raise
            except Exception as exc:
                raise _FakeTaskError(repr(exc)) from exc
        return out if many else out[0]

    def wait(
        self, refs: list[Future[Any]], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Future[Any]], list[Future[Any]]]:
        assert num_returns == 1
        done, _ = futures_wait(refs, timeout=timeout, return_when=FIRST_COMPLETED)
        return [r for r in refs if r in done], [r for r in refs if r not in done]

    def kill(self, actor: _FakeActor) -> None:
        self.log.append(("kill", actor.index))
        actor.kill()

    def cancel(self, ref: Future[Any], force: bool = False) -> None:
        ref.cancel()


def test_cleanup_after_a_stuck_phase_kills_the_actors_instead_of_queueing_behind_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every node's write hangs (as on a Lustre outage): the phase times out, and the files are still removed, at
    once, by fresh tasks; nothing is sent to the hung actors, which would only run it after the hung write."""
    fake = _FakeRay(nodes=2)
    fake.install(monkeypatch)
    hung = threading.Event()
    stuck: list[int] = []

    def hanging_write(run_dir: str, node_index: int, sizes: list[int], block: int) -> dict[str, Any]:
        node_dir = lio.node_dir_of(run_dir, node_index)
        os.makedirs(node_dir, exist_ok=True)
        Path(lio.stream_path(node_dir, 0)).write_bytes(b"partly written")
        stuck.append(node_index)
        hung.wait(60)
        raise OSError(5, "Input/output error")  # what the write would end with; the test releases it at the end

    monkeypatch.setattr(lio, "write_node", hanging_write)
    monkeypatch.setattr(lio, "CLEANUP_TIMEOUT_S", 30.0)
    base = tmp_path / "p"
    args = [a for a in _args(base, "--node-limit-gbps", "1e-6") if a != "--local"]
    try:
        began = time.monotonic()
        status = lio.main([*args, "--timeout-s", "0.5", "--expect-fstype", ""])
        took = time.monotonic() - began
        left = _left_behind(base)
        still_hung = not hung.is_set() and sorted(stuck) == [0, 1]
    finally:
        hung.set()
    err = capsys.readouterr().err
    assert status == 2
    assert "a phase did not finish within 0.5 s" in err
    assert still_hung  # the writes were still hanging when main returned ...
    assert left == [], left  # ... and their files were gone all the same
    assert "files under" in err and ": removed" in err
    assert took < 10  # the phase's 0.5 s and a quick removal, not a wait on the hung actors
    calls = [entry for entry in fake.log if entry[0] == "call"]
    assert {entry[1] for entry in calls} == {"info", "write"}  # no cleanup call went to an actor
    kills = [i for i, entry in enumerate(fake.log) if entry[0] == "kill"]
    tasks = [i for i, entry in enumerate(fake.log) if entry[0] == "task"]
    assert {fake.log[i][1] for i in kills} >= {0, 1} and tasks
    assert max(kills[:2]) < min(tasks)  # both actors were killed before the removal started
    assert {fake.log[i][1:] for i in tasks} <= {("remove_run_dir", "node-0"), ("remove_run_dir", "node-1")}


def test_removal_reports_files_left_when_no_task_manages_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay(nodes=2)
    fake.install(monkeypatch)
    release = threading.Event()

    def hanging_remove(run_dir: str) -> bool:
        release.wait(60)
        return True

    def failing_remove(run_dir: str) -> bool:
        raise OSError(5, "Input/output error")

    try:
        began = time.monotonic()
        hung = lio.remove_with_fresh_tasks(fake, fake.remote(hanging_remove), ["node-0", "node-1"], "/x", 0.3)
        took = time.monotonic() - began
    finally:
        release.set()
    assert hung is False and took < 5  # bounded by the timeout, reported as not removed
    assert lio.remove_with_fresh_tasks(fake, fake.remote(failing_remove), ["node-0"], "/x", 5.0) is False
    assert lio.remove_with_fresh_tasks(fake, fake.remote(lambda run_dir: False), ["node-0"], "/x", 5.0) is False


def test_a_slow_actor_start_is_not_counted_against_the_phase_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker process that takes longer to start than --timeout-s (a busy node) is waited for up to
    ACTOR_START_TIMEOUT_S; an actor that never reports is named as such, not as a hung I/O phase."""
    fake = _FakeRay(nodes=1)
    fake.install(monkeypatch)
    node_info = lio.node_info
    # A start slower than the phase timeout but within the actor start timeout; each phase (0.01 GiB per node
    # written, then read) has 5 s, room enough on loaded cores.
    start_s = [6.0]

    def slow_node_info(path: str) -> dict[str, Any]:
        time.sleep(start_s[0])
        return node_info(path)

    monkeypatch.setattr(lio, "node_info", slow_node_info)
    monkeypatch.setattr(lio, "ACTOR_START_TIMEOUT_S", 12.0)
    args = [a for a in _args(tmp_path / "p", "--node-limit-gbps", "1e-6") if a != "--local"]
    assert lio.main([*args, "--timeout-s", "5", "--expect-fstype", ""]) == 0, capsys.readouterr()
    assert _left_behind(tmp_path / "p") == []
    start_s[0] = 15.0
    assert lio.main([*args, "--timeout-s", "5", "--expect-fstype", ""]) == 2
    err = capsys.readouterr().err
    assert "the node actors did not start within 12.0 s" in err and "phase" not in err, err


@pytest.mark.timeout(360)
def test_ray_path_removes_the_files_of_a_hung_phase_without_waiting_on_its_actor(
    ray_gcs_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray
    import ray.cloudpickle

    def hanging_write(run_dir: str, node_index: int, sizes: list[int], block: int) -> None:
        node_dir = os.path.join(run_dir, f"node-{node_index:03d}")  # no reference to lio: it runs in a Ray worker
        os.makedirs(node_dir, exist_ok=True)
        with open(os.path.join(node_dir, "stream-000.bin"), "wb") as fh:
            fh.write(b"partly written")
        time.sleep(600)

    monkeypatch.setattr(lio, "write_node", hanging_write)
    ray.cloudpickle.register_pickle_by_value(lio)
    ray.init(address=ray_gcs_address, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        args = _ray_args(tmp_path / "p")
        began = time.monotonic()
        # The actor's start is not counted (ACTOR_START_TIMEOUT_S): the 15 s run from the write's call, which the
        # actor, up by then, begins at once.
        status = lio.main([*args, "--all-nodes", "--expect-fstype", "", "--timeout-s", "15"])
        took = time.monotonic() - began
        err = capsys.readouterr().err
        assert status == 2 and "a phase did not finish within 15.0 s" in err, err
        assert ": removed" in err and _left_behind(tmp_path / "p") == [], err
        assert took < 75  # the 15 s phase and the removal; the actor's write would sleep for 600 s
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(lio)
