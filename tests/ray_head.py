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

from workloads.ray_values import JOB_START_TIMEOUT_ENV, JOB_START_TIMEOUT_S, NODE_RESOURCES_ENV, PLACE_RESOURCE

RAY_BIN = Path(sys.executable).parent / "ray"
HEAD_GPUS = 2
# A resource each test head offers one unit of, which only the Jobs API contract tests queue on: the places
# (PLACE_RESOURCE) and GPUs are other tests' to take.
CONTRACT_RESOURCE = "jobs_api_contract"
# Ray's workers and drivers bind ports from 10002-19999 unless told otherwise; `make unit` runs several pytest
# workers, each with heads of its own besides the shared one, and two raylets handing out the same port at once make a
# driver fail to bind.
WORKER_PORTS = (10002, 19999)
# Ray Client's proxier gives each client connection a server of its own on a port from this range, in every head
# (ray/util/client/server/proxier.py MIN_/MAX_SPECIFIC_SERVER_PORT).
RAY_CLIENT_SERVER_PORTS = (23000, 24000)
# The test heads' own ports (GCS, dashboard, agents, ...) and closed_port() come from the longest run of ports from here
# up that nothing else draws: not the kernel's ephemeral range, which every outgoing connection and every bind to port 0
# takes its local port from (a port chosen there can be taken before Ray binds it), nor Ray's ranges above.
HEAD_PORTS_FROM = 20000
# Linux's default, for a system that does not say (/proc/sys/net/ipv4/ip_local_port_range).
DEFAULT_EPHEMERAL_PORTS = (32768, 60999)
# A head's own ports, each an attribute of RayHead, in the order they are taken.
HEAD_PORT_FIELDS = (
    "gcs",
    "dashboard",
    "client_server",
    "agent_listen",
    "agent_grpc",
    "metrics",
    "node_manager",
    "object_manager",
    "runtime_env_agent",
)
# The niceness of a test head's processes (lower runs first; see RayHead._command): while `ray start` runs, the raylet
# and dashboard must come up within Ray's fixed windows, so nearly all of two busy cores go to them (a clean-clone CI
# run at -5 missed the dashboard's 20 s window three times in a row, with mypy and checkov running beside the tests);
# once up, the head and the jobs it starts drop to HEAD_NICENESS, so that they do not starve the tests' own processes
# (submitters renewing a lock every second, say).
HEAD_START_NICENESS = -15
HEAD_NICENESS = -5
# The variables of Ray 2.49.2's and 2.55.1's timers an idle head runs (ray/dashboard/consts.py,
# ray/dashboard/modules/reporter/reporter_consts.py; RAY_enable_metrics_collection is RayConfig's), see _environment.
IDLE_HEAD_TIMERS = {
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
    "METRICS_RECORD_INTERVAL_S": "60",
    "RAY_DASHBOARD_STATS_UPDATING_INTERVAL": "60",
    "GCS_CHECK_ALIVE_INTERVAL_SECONDS": "60",
    "RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S": "60",
    "RAY_enable_metrics_collection": "0",
}
# How many times stop() kills what it finds of a head before it says what is left.
STOP_ROUNDS = 3
# A first start that finds a port taken, or misses Ray's start-up window, is started again on fresh ports this often.
START_ATTEMPTS = 4
# What `ray start` says when a process it waits for missed Ray's fixed window: the raylet registering with the GCS
# (30 s, ray/_private/node.py) or the dashboard publishing its address (200 polls 0.1 s apart,
# ray/_private/services.py start_api_server).
STARTED_TOO_LATE = ("timed out during startup", "Failed to start the dashboard")
# What Ray's processes say when a port they were given is in use (services.py's dashboard check, the agents' HTTP
# server, EADDRINUSE from Python or gRPC).
PORT_TAKEN = ("already occupied", "Failed to bind", "Address already in use", "address already in use")


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range, as `low high`."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_PORTS
    return low, high


# The spans a pytest started by a test (tests/test_interrupted_run.py) takes its ports from, as JSON {"head": [LOW,
# HIGH], "worker": [LOW, HIGH]}: the NESTED share of the run that started it, which nothing else of that run draws.
NESTED_PORTS_ENV = "NEMORL_TESTS_NESTED_PORTS"
NESTED = "nested"


def with_dashboard() -> bool:
    """Whether this run's heads start a dashboard (and with it the Jobs API): not in a nested run, whose one test
    (tests/interrupted_heads.py) needs only their processes; the dashboard's subprocess modules are what missed Ray's
    start-up window four times in a row there, beside a full `make test` (clean-clone CI)."""
    return NESTED_PORTS_ENV not in os.environ


def head_ports(ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """The longest run of ports from HEAD_PORTS_FROM to 65535 outside the ephemeral range and Ray's own ranges (in a
    nested run: the head span its parent run gave it)."""
    nested = os.environ.get(NESTED_PORTS_ENV)
    if nested and ephemeral is None:
        low, high = json.loads(nested)["head"]
        return low, high
    ephemeral = ephemeral or ephemeral_ports()
    taken = sorted([ephemeral, RAY_CLIENT_SERVER_PORTS, WORKER_PORTS])
    best, start = (0, -1), HEAD_PORTS_FROM
    for low, high in [*taken, (65536, 65536)]:
        if low - 1 - start > best[1] - best[0]:
            best = (start, low - 1)
        start = max(start, high + 1)
    if best[1] - best[0] < 1000:
        raise RuntimeError(
            f"no room for the test Ray heads' ports: the ephemeral range {ephemeral[0]}-{ephemeral[1]} leaves under "
            f"1000 ports from {HEAD_PORTS_FROM} to 65535 outside it and Ray's ranges; narrow "
            "net.ipv4.ip_local_port_range"
        )
    return best


def _worker_ports() -> tuple[int, int]:
    nested = os.environ.get(NESTED_PORTS_ENV)
    if nested:
        low, high = json.loads(nested)["worker"]
        return low, high
    return WORKER_PORTS


def _share(span: tuple[int, int], worker_id: str | None, count: int | None) -> tuple[int, int]:
    """This pytest-xdist worker's share of `span` (PYTEST_XDIST_WORKER `gwN`; `count` workers, by default
    PYTEST_XDIST_WORKER_COUNT), or, for worker_id None in a run with workers, the share of the head the controller
    starts for them all, or, for NESTED, the share of a pytest a test starts: no two shares overlap. Without xdist,
    the whole span but the nested share."""
    low, high = span
    if count is None:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    shares = count + 2 if count >= 2 else 2
    size = (high - low + 1) // shares
    if worker_id == NESTED:
        index = shares - 1
    elif count < 2:
        return low, low + (shares - 1) * size - 1
    else:
        index = count if worker_id is None else int(worker_id.removeprefix("gw")) % count
    return low + index * size, low + (index + 1) * size - 1


def worker_port_range(worker_id: str | None, count: int | None = None) -> tuple[int, int]:
    """The share of WORKER_PORTS that this process's heads give their Ray workers."""
    return _share(_worker_ports(), worker_id, count)


def head_port_range(worker_id: str | None, count: int | None = None) -> tuple[int, int]:
    """The share of head_ports() that this process's heads and closed_port() take their ports from."""
    return _share(head_ports(), worker_id, count)


def _api_answers(address: str, auth_token: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"{address}/api/version", headers=headers), timeout=5
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def port_is_free(port: int) -> bool:
    """Nothing is bound to 127.0.0.1:`port` (or to every address on it), not even a closing connection in TIME_WAIT."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortPool:
    """Hands out ports of this process's share of head_ports(), in turn, each checked free when handed out; none twice
    until the whole share has been handed out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._span: tuple[int, int] | None = None
        self._next = 0

    def configure(self, worker_id: str | None, count: int | None = None) -> None:
        """The share of this process: the xdist controller takes its own (worker_id None) before starting a head."""
        with self._lock:
            self._span = head_port_range(worker_id, count)
            self._next = self._span[0]

    def take(self, count: int) -> list[int]:
        if self._span is None:
            self.configure(os.environ.get("PYTEST_XDIST_WORKER"))
        assert self._span is not None
        low, high = self._span
        chosen: list[int] = []
        with self._lock:
            for _ in range(high - low + 1):
                port, self._next = self._next, self._next + 1 if self._next < high else low
                if port_is_free(port):
                    chosen.append(port)
                    if len(chosen) == count:
                        return chosen
        raise RuntimeError(f"fewer than {count} free ports left in {low}-{high} (this test process's share)")


PORTS = PortPool()


def closed_port() -> int:
    """A port nothing listens on, nor will: outside the ephemeral range, and never handed out twice."""
    return PORTS.take(1)[0]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stat_fields(stat_path: Path) -> list[str]:
    """The fields of a /proc/<pid>/stat (or .../task/<tid>/stat) after the command name, which may hold spaces and
    parentheses: [0] is field 3 of proc(5) (the state), [1] the parent pid, [16] the niceness."""
    return stat_path.read_text().rsplit(")", 1)[1].split()


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(stat_fields(Path(f"/proc/{entry}/stat"))[1])
        except OSError:
            continue
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
        state = stat_fields(Path(f"/proc/{pid}/stat"))[0]
    except OSError:
        return False
    return state != "Z"


def _renice(pids: set[int], niceness: int) -> None:
    """Every thread of these processes to `niceness` (Linux keeps a niceness per thread; a process started later takes
    that of the thread that starts it). Where lowering is not allowed, or a thread is gone, it is left as it is."""
    for pid in pids:
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in threads:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, niceness)


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


@contextlib.contextmanager
def place_held(address: str, run: str, credentials: dict[str, str] | None = None) -> Iterator[str]:
    """The run's place in Ray's queue, held as the launcher's pipeline holds it (jobs/admission.py hold, one GPU node),
    for tests that submit a step's command by itself: its --place-of waits for this. Released at the end as the
    pipeline releases it when it ends (SIGUSR1)."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(credentials or {}, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory() as folder:
        ready = Path(folder) / "admitted"
        log = Path(folder) / "admission.log"
        with log.open("w") as out:
            holder = subprocess.Popen(
                [sys.executable, str(root / "jobs" / "admission.py"), "hold", f"--address={address}", f"--run={run}",
                 "--nodes=1", f"--capacity={HEAD_GPUS}", f"--ready-file={ready}", "--poll-s=0.5"],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        try:
            wait_for(lambda: ready.exists() or holder.poll() is not None, 180, f"the place of {run}")
            assert ready.exists(), log.read_text()
            yield run
        finally:
            holder.send_signal(signal.SIGUSR1)
            try:
                holder.wait(timeout=60)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()


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
    head = json.loads(ready.read_text())
    assert not head["problem"], f"the shared Ray head did not start: {head['problem']}"
    _CLIENT_ADDRESS[head["address"]] = head["client"]
    _GCS_ADDRESS[head["address"]] = head["gcs"]
    return str(head["address"])


class SharedHead:
    """The head the xdist controller starts for all its workers: the start runs in a thread, and a file says when it
    is done: the head's addresses (known only then: a start may move to fresh ports), or why it did not start."""

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
        head = self.head
        partial = self.ready.with_suffix(".tmp")
        partial.write_text(
            json.dumps(
                {
                    "problem": problem,
                    "address": head.address,
                    "client": f"ray://127.0.0.1:{head.client_server}",
                    "gcs": head.gcs_address,
                }
            )
        )
        partial.rename(self.ready)

    def environ(self) -> str:
        return json.dumps({"ready": str(self.ready)})

    def close(self) -> None:
        self.thread.join(timeout=SHARED_HEAD_START_S)
        self.head.close()


_SHARED: list[SharedHead] = []
# Every head this process started and has not closed: what an interrupted run stops on its way out.
_LIVE_HEADS: set[RayHead] = set()
# How long the controller waits for its workers to stop their heads after passing a SIGTERM on.
WORKERS_STOP_S = 60


def _stop_heads_and_die(signum: int, _frame: object) -> None:
    """SIGTERM or SIGHUP (`timeout`, a CI runner, a closed terminal): pytest would die without teardown, and Ray's
    processes (started detached by `ray start`) would run on as orphans. Pass the signal on to this process's
    children (on the xdist controller: its workers, which do the same), stop this process's own heads, wait for the
    children, then die of the signal as before. Ctrl-C needs none of this: pytest tears down on KeyboardInterrupt."""
    children = _proc_children().get(os.getpid(), [])
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    for head in list(_LIVE_HEADS):
        with contextlib.suppress(Exception):
            head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)
    deadline = time.monotonic() + WORKERS_STOP_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.1)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def pytest_configure(config: pytest.Config) -> None:
    """In every pytest process: stop its heads when it is terminated. On the controller of an xdist run: start the
    workers' shared head (they inherit the environment), on ports of the controller's own share."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _stop_heads_and_die)
    workers = getattr(config.option, "numprocesses", None)  # an int by now (xdist resolves "auto" before this)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 1 or config.option.collectonly:
        return
    PORTS.configure(None, workers)
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
    """A head on loopback ports and a temp dir of its own. Once up it keeps its ports, so that it can be stopped and
    started again at the same address: what a head pod restarted without GCS fault tolerance looks like to its clients
    (same Service address, new session, empty job table)."""

    # Its ports (HEAD_PORT_FIELDS), from PORTS.
    gcs: int
    dashboard: int
    client_server: int
    agent_listen: int
    agent_grpc: int
    metrics: int
    node_manager: int
    object_manager: int
    runtime_env_agent: int

    def __init__(
        self, ray_bin: Path, auth_token: str | None = None, worker_ports: tuple[int, int] | None = None
    ) -> None:
        self.ray_bin = ray_bin
        self.auth_token = auth_token
        self.worker_ports = worker_ports or worker_port_range(os.environ.get("PYTEST_XDIST_WORKER"))
        self.temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
        self.has_started = False
        self._take_ports()

    def _take_ports(self) -> None:
        for field, port in zip(HEAD_PORT_FIELDS, PORTS.take(len(HEAD_PORT_FIELDS)), strict=True):
            setattr(self, field, port)
        self.gcs_address = f"127.0.0.1:{self.gcs}"
        self.address = f"http://127.0.0.1:{self.dashboard}"

    def ports(self) -> list[int]:
        return [getattr(self, field) for field in HEAD_PORT_FIELDS]

    def _command(self) -> list[str]:
        min_worker_port, max_worker_port = self.worker_ports
        return [
            # The start at a higher priority than the test processes, where allowed (GNU nice runs the command anyway,
            # with a warning, where it is not): Ray gives its raylet and dashboard fixed windows to come up, which
            # `make test`'s busy two cores can make them miss. start() lowers it to HEAD_NICENESS once up.
            "nice",
            f"-n{HEAD_START_NICENESS}",
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
            f"--include-dashboard={str(with_dashboard()).lower()}",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # Ray swaps 127.0.0.1 for the host's outward IP (and then listens on all interfaces) unless told that this is
        # a single-machine cluster; with this switch off every Ray server listens on 127.0.0.1 only.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # The raylet starts one idle worker per CPU for the first driver (a latency optimisation); the tests' jobs never
        # use them (each job's supervisor gets a worker of its own runtime env), so they would only cost CPU.
        env["RAY_prestart_worker_first_driver"] = "0"
        # What an idle head does on a timer, which no test reads: the agent's node stats (reporter) and its check that
        # the raylet lives (every 0.4 s), the metrics, the dashboard's stats refresh and its GCS check (the tests stop
        # every process of a head by pid). Once a minute instead: an idle 2.49.2 head measured 3.6 CPU-seconds a
        # minute with Ray's defaults, 2.7 with these.
        env.update(IDLE_HEAD_TIMERS)
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        if self.auth_token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.auth_token)
        # As the infra stack's head: the places of run admission (jobs/submitter/admission.py), one per GPU worker
        # the cluster may have (HEAD_GPUS here), and Ray's job start timeout for the queued ones.
        # And one unit of a resource only the Jobs API contract tests ask for (tests/jobs/test_jobs_api_contract.py).
        env[NODE_RESOURCES_ENV] = json.dumps({PLACE_RESOURCE: HEAD_GPUS, CONTRACT_RESOURCE: 1})
        env[JOB_START_TIMEOUT_ENV] = str(JOB_START_TIMEOUT_S)
        return env

    def _say(self, message: str) -> None:
        print(f"tests/ray_head.py: head {self.temp_dir}: {message}", file=sys.stderr, flush=True)

    def ensure_ports_free(self) -> None:
        """Before a first start: any port taken since it was chosen is replaced, with all the others."""
        taken = [port for port in self.ports() if not port_is_free(port)]
        if taken:
            self._take_ports()
            self._say(f"port(s) {taken} taken since they were chosen; starting on fresh ports {self.ports()}")

    def _start_failure(self, started: subprocess.CompletedProcess[str]) -> str | None:
        """Why `ray start` failed, where starting again may help: a port taken between the check and Ray's bind (by
        what Ray said, or by a port still held once our processes are gone), or Ray's start-up window missed on loaded
        cores. None for any other failure."""
        output = started.stdout + started.stderr
        if any(words in output for words in PORT_TAKEN):
            return "a port was taken"
        if any(late in output for late in STARTED_TOO_LATE):
            return "a process missed Ray's start-up window"
        if not all(port_is_free(port) for port in self.ports()):
            return "a port is still in use"
        return None

    def start(self) -> None:
        """Start the head and wait for its Jobs API. A first start (nobody knows the address yet) that fails for a
        reason in _start_failure is cleared away and started again on fresh ports, up to START_ATTEMPTS in all,
        each saying so on stderr; a restart keeps its ports and tries again, as often, only after a missed window
        (two restarts in a row once missed it in a full run on two busy cores)."""
        first = not self.has_started
        attempts = START_ATTEMPTS
        _LIVE_HEADS.add(self)  # from the first process on: an interrupted start is stopped too
        env = self._environment()
        for attempt in range(1, attempts + 1):
            if first:
                self.ensure_ports_free()
            started = subprocess.run(self._command(), env=env, capture_output=True, text=True, timeout=180, check=False)
            if started.returncode == 0:
                break
            # A failed start may leave the head half up: clear it away before anything else.
            _kill_all(_ray_processes(self.temp_dir, self.gcs_address))
            reason = self._start_failure(started)
            retry = reason is not None and attempt < attempts and (first or "window" in reason)
            assert retry, (
                f"ray start failed ({reason or 'not for a port or a window'}):\n{started.stdout}\n{started.stderr}"
            )
            if first:
                self._take_ports()
            self._say(
                f"ray start failed ({reason}); starting again (attempt {attempt + 1} of {attempts}) "
                f"on ports {self.ports()}"
            )
        if with_dashboard():
            wait_for(lambda: _api_answers(self.address, self.auth_token), 90, "the Ray Jobs API")
        _renice(_ray_processes(self.temp_dir, self.gcs_address), HEAD_NICENESS)
        self.has_started = True
        _CLIENT_ADDRESS[self.address] = f"ray://127.0.0.1:{self.client_server}"
        _GCS_ADDRESS[self.address] = self.gcs_address
        assert not _wide_listeners(_ray_processes(self.temp_dir, self.gcs_address)), "Ray must listen on 127.0.0.1 only"

    def stop(self) -> None:
        """Kill every process of this head (by process id, never `ray stop`, which would stop every head), again for
        any that one started while the others were being killed (a failed start may still be starting some)."""
        left: set[int] = set()
        for _ in range(STOP_ROUNDS):
            _kill_all(_ray_processes(self.temp_dir, self.gcs_address))
            left = {p for p in _ray_processes(self.temp_dir, self.gcs_address) if _alive(p)}
            if not left:
                return
        assert not left, f"Ray processes left running: {sorted(left)}"

    def close(self) -> None:
        try:
            self.stop()
        finally:
            _LIVE_HEADS.discard(self)
            shutil.rmtree(self.temp_dir, ignore_errors=True)
