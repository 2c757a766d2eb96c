"""A real Ray head for the tests, on 127.0.0.1 only, started once per run and stopped by process id.

Loaded as a pytest plugin (tests/conftest.py), so every test module shares the one head: the job submitter's tests,
the worker-wait tests and the preflight checks' Ray paths. Under pytest-xdist (`make unit`) the controller starts it,
in the background while the workers start, and all workers share it (a head start costs about 9 CPU-seconds, and
`make unit` is CPU-bound on two cores); without xdist the session starts its own. The head declares 2 logical GPUs
(Ray counts them; no device is touched), so tests can ask "are there GPU workers" of a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

RAY_BIN = Path(sys.executable).parent / "ray"
HEAD_GPUS = 2
# Ray's workers and drivers bind ports from 10002-19999 unless told otherwise; `make unit` runs several pytest
# workers, each with heads of its own besides the shared one, and two raylets handing out the same port at once make a
# driver fail to bind.
WORKER_PORTS = (10002, 19999)
# What `ray start` says when a process it waits for missed Ray's fixed window: the raylet registering with the GCS
# (30 s, ray/_private/node.py) or the dashboard publishing its address (200 polls 0.1 s apart,
# ray/_private/services.py start_api_server).
STARTED_TOO_LATE = ("timed out during startup", "Failed to start the dashboard")


def worker_port_range(worker_id: str | None, count: int | None = None) -> tuple[int, int]:
    """This pytest-xdist worker's share of WORKER_PORTS (PYTEST_XDIST_WORKER `gwN`; `count` workers, by default
    PYTEST_XDIST_WORKER_COUNT), or, for worker_id None in a run with workers, the share of the head the controller
    starts for them all: no two shares overlap. Without xdist, the whole range."""
    low, high = WORKER_PORTS
    if count is None:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count < 2:
        return low, high
    index = count if worker_id is None else int(worker_id.removeprefix("gw")) % count
    size = (high - low + 1) // (count + 1)
    return low + index * size, low + (index + 1) * size - 1


def _api_answers(address: str, auth_token: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"{address}/api/version", headers=headers), timeout=5
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all held open until all are chosen, so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def closed_port() -> int:
    return free_ports(1)[0]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _pids_mentioning(text: str) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.add(int(entry))
    return found


def _ray_processes(temp_dir: str, gcs_address: str) -> set[int]:
    """Every process of our Ray head: those whose command line names our temp dir or our GCS address (the Ray
    Client server names only the latter, and outlives `ray start` as an orphan), and all their descendants
    (workers rename themselves to ray::..., so they are only found through their parents)."""
    roots = _pids_mentioning(temp_dir) | _pids_mentioning(f"--address={gcs_address}")
    children = _proc_children()
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        stack.extend(children.get(pid, []))
    return seen


def _wide_listeners(pids: set[int]) -> list[str]:
    """Listening TCP sockets of these processes that are not on a loopback address, as 'pid hexaddr:port'."""
    inode_owner: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inode_owner[link[8:-1]] = pid
    loopback = ("0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F")
    wide = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inode_owner and local.split(":")[0] not in loopback:
                wide.append(f"{inode_owner[inode]} {local}")
    return wide


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _kill_all(pids: set[int]) -> None:
    """SIGKILL, not SIGTERM: Ray's GCS server and raylet outlive a SIGTERM by more than 3 s, and nothing of a test
    head is worth a graceful stop (its temp dir is removed after). Waits until every process is gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


_CLIENT_ADDRESS: dict[str, str] = {}
_GCS_ADDRESS: dict[str, str] = {}

# The head the xdist controller started for its workers: its addresses and the file that says it is up (or why not).
SHARED_HEAD_ENV = "NEMORL_TESTS_SHARED_RAY_HEAD"
SHARED_HEAD_START_S = 300


@pytest.fixture(scope="session")
def ray_client_address(ray_address: str) -> str:
    """Ray Client address (ray://127.0.0.1:PORT) of the same head."""
    return _CLIENT_ADDRESS[ray_address]


@pytest.fixture(scope="session")
def ray_gcs_address(ray_address: str) -> str:
    """GCS address (127.0.0.1:PORT) of the same head, for reading what the cluster itself stores."""
    return _GCS_ADDRESS[ray_address]


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    shared = os.environ.get(SHARED_HEAD_ENV)
    if shared:
        yield _wait_for_shared_head(json.loads(shared))
        return
    with ray_head(RAY_BIN) as address:
        yield address


def _wait_for_shared_head(shared: dict[str, str]) -> str:
    ready = Path(shared["ready"])
    wait_for(ready.exists, SHARED_HEAD_START_S, "the shared Ray head (started by the xdist controller)")
    problem = ready.read_text()
    assert not problem, f"the shared Ray head did not start: {problem}"
    _CLIENT_ADDRESS[shared["address"]] = shared["client"]
    _GCS_ADDRESS[shared["address"]] = shared["gcs"]
    return shared["address"]


class SharedHead:
    """The head the xdist controller starts for all its workers: addresses are known at once (ports are chosen up
    front), the start runs in a thread, and a file says when it is done: empty when the head is up, else why not."""

    def __init__(self, workers: int) -> None:
        self.head = RayHead(RAY_BIN, worker_ports=worker_port_range(None, workers))
        self.ready = Path(self.head.temp_dir) / "shared-head-ready"
        self.thread = threading.Thread(target=self._start, name="shared-ray-head", daemon=True)

    def _start(self) -> None:
        try:
            self.head.start()
            problem = ""
        except BaseException as exc:  # the workers' fixtures fail with this text
            problem = f"{type(exc).__name__}: {exc}"
        partial = self.ready.with_suffix(".tmp")
        partial.write_text(problem)
        partial.rename(self.ready)

    def environ(self) -> str:
        head = self.head
        return json.dumps(
            {
                "address": head.address,
                "client": f"ray://127.0.0.1:{head.client_server}",
                "gcs": head.gcs_address,
                "ready": str(self.ready),
            }
        )

    def close(self) -> None:
        self.thread.join(timeout=SHARED_HEAD_START_S)
        self.head.close()


_SHARED: list[SharedHead] = []


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of an xdist run: start the workers' shared head (they inherit the environment)."""
    workers = getattr(config.option, "numprocesses", None)  # an int by now (xdist resolves "auto" before this)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 1 or config.option.collectonly:
        return
    shared = SharedHead(workers)
    os.environ[SHARED_HEAD_ENV] = shared.environ()
    _SHARED.append(shared)
    shared.thread.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _SHARED:
        _SHARED.pop().close()
    os.environ.pop(SHARED_HEAD_ENV, None)


@contextlib.contextmanager
def ray_head(ray_bin: Path, auth_token: str | None = None) -> Iterator[str]:
    """A head started with `ray_bin` (its virtualenv's Ray version) on loopback; yields the Jobs API address and
    stops every process of it on exit. With `auth_token` (Ray >= 2.52) the head requires that token of every client
    (RAY_AUTH_MODE=token), as the stack's Ray cluster does."""
    head = RayHead(ray_bin, auth_token)
    try:
        head.start()
        yield head.address
    finally:
        head.close()


class RayHead:
    """A head on fixed loopback ports and temp dir, so that it can be stopped and started again at the same address:
    what a head pod restarted without GCS fault tolerance looks like to its clients (same Service address, new
    session, empty job table)."""

    def __init__(
        self, ray_bin: Path, auth_token: str | None = None, worker_ports: tuple[int, int] | None = None
    ) -> None:
        self.ray_bin = ray_bin
        self.auth_token = auth_token
        self.worker_ports = worker_ports or worker_port_range(os.environ.get("PYTEST_XDIST_WORKER"))
        self.temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
        (
            self.gcs,
            self.dashboard,
            self.client_server,
            self.agent_listen,
            self.agent_grpc,
            self.metrics,
            self.node_manager,
            self.object_manager,
            self.runtime_env_agent,
        ) = free_ports(9)
        self.gcs_address = f"127.0.0.1:{self.gcs}"
        self.address = f"http://127.0.0.1:{self.dashboard}"

    def start(self) -> None:
        min_worker_port, max_worker_port = self.worker_ports
        cmd = [
            str(self.ray_bin),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={self.gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard}",
            f"--ray-client-server-port={self.client_server}",
            f"--dashboard-agent-listen-port={self.agent_listen}",
            f"--dashboard-agent-grpc-port={self.agent_grpc}",
            f"--metrics-export-port={self.metrics}",
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--min-worker-port={min_worker_port}",
            f"--max-worker-port={max_worker_port}",
            "--num-cpus=2",
            f"--num-gpus={HEAD_GPUS}",
            "--include-dashboard=true",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # Ray swaps 127.0.0.1 for the host's outward IP (and then listens on all interfaces) unless told that this is
        # a single-machine cluster; with this switch off every Ray server listens on 127.0.0.1 only.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # The raylet starts one idle worker per CPU for the first driver (a latency optimisation); the tests' jobs never
        # use them (each job's supervisor gets a worker of its own runtime env), so they would only cost CPU.
        env["RAY_prestart_worker_first_driver"] = "0"
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        if self.auth_token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.auth_token)
        started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, check=False)
        if started.returncode != 0 and any(late in started.stdout + started.stderr for late in STARTED_TOO_LATE):
            # On two loaded cores (several heads starting at once) a fixed window can pass. The head is then half up:
            # clear it away and start once more.
            _kill_all(_ray_processes(self.temp_dir, self.gcs_address))
            started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, check=False)
        assert started.returncode == 0, f"ray start failed:\n{started.stdout}\n{started.stderr}"
        wait_for(lambda: _api_answers(self.address, self.auth_token), 90, "the Ray Jobs API")
        _CLIENT_ADDRESS[self.address] = f"ray://127.0.0.1:{self.client_server}"
        _GCS_ADDRESS[self.address] = self.gcs_address
        assert not _wide_listeners(_ray_processes(self.temp_dir, self.gcs_address)), "Ray must listen on 127.0.0.1 only"

    def stop(self) -> None:
        """Kill every process of this head (by process id, never `ray stop`, which would stop every head)."""
        _kill_all(_ray_processes(self.temp_dir, self.gcs_address))
        left = {p for p in _ray_processes(self.temp_dir, self.gcs_address) if _alive(p)}
        assert not left, f"Ray processes left running: {sorted(left)}"

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
