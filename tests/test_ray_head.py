"""The test Ray heads' ports. The pytest-xdist workers (`make unit` runs five) and the head their controller starts
for them all hand out Ray worker ports from ranges that never overlap, so two raylets cannot give the same port to two
drivers at once. The heads' own ports (and closed_port()) come from outside the kernel's ephemeral range, which every
outgoing connection draws its local port from, in shares that never overlap either; and a head whose port is taken
before Ray binds it starts again on fresh ports by itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray_head
from ray_head import (
    HEAD_NICENESS,
    HEAD_START_NICENESS,
    NESTED,
    NESTED_PORTS_ENV,
    RAY_BIN,
    RAY_CLIENT_SERVER_PORTS,
    SHARED_HEAD_ENV,
    START_ATTEMPTS,
    WORKER_PORTS,
    PortPool,
    RayHead,
    ephemeral_ports,
    head_port_range,
    head_ports,
    port_is_free,
    worker_port_range,
)


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


@pytest.mark.parametrize("count", [2, 3, 4, 5])
@pytest.mark.parametrize("ranges_of", [worker_port_range, head_port_range], ids=["worker ports", "head ports"])
def test_xdist_workers_get_disjoint_port_ranges(monkeypatch: pytest.MonkeyPatch, count: int, ranges_of):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    whole = WORKER_PORTS if ranges_of is worker_port_range else head_ports()
    # The workers' own heads and the head the controller starts for them all (worker id None).
    # And the share of a pytest that a test starts (tests/test_interrupted_run.py).
    ranges = [ranges_of(f"gw{index}") for index in range(count)] + [ranges_of(None, count), ranges_of(NESTED)]
    for low, high in ranges:
        assert whole[0] <= low < high <= whole[1]
        assert high - low >= 1000  # room for every worker, driver and head a test process starts
    ports = [port for low, high in ranges for port in range(low, high + 1)]
    assert len(ports) == len(set(ports))


def test_without_xdist_a_head_has_the_whole_range_but_a_nested_runs_share(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    for ranges_of, whole in ((worker_port_range, WORKER_PORTS), (head_port_range, head_ports())):
        own, nested = ranges_of(None), ranges_of(NESTED)
        assert own[0] == whole[0] and own[1] + 1 == nested[0] and nested[1] <= whole[1]
        assert nested[1] - nested[0] >= 1000


def test_a_nested_run_takes_its_ports_from_the_share_it_was_given(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(NESTED_PORTS_ENV, json.dumps({"head": [30000, 30899], "worker": [18000, 18899]}))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    ranges = [head_port_range(f"gw{index}") for index in range(2)] + [head_port_range(None, 2)]
    assert ranges == [(30000, 30224), (30225, 30449), (30450, 30674)]
    assert worker_port_range("gw1") == (18225, 18449)


def test_only_a_nested_run_starts_its_heads_without_a_dashboard(monkeypatch: pytest.MonkeyPatch):
    head = RayHead(RAY_BIN)
    try:
        assert "--include-dashboard=true" in head._command()
        monkeypatch.setenv(NESTED_PORTS_ENV, json.dumps({"head": [30000, 30899], "worker": [18000, 18899]}))
        assert "--include-dashboard=false" in head._command()
    finally:
        head.close()


@pytest.mark.parametrize(
    ("ephemeral", "expected"),
    [
        ((32768, 60999), (24001, 32767)),  # Linux's default: between Ray Client's servers and the ephemeral range
        ((49152, 65535), (24001, 49151)),  # IANA's dynamic ports, the default of some systems
        ((15000, 40000), (40001, 65535)),
    ],
)
def test_head_ports_are_the_longest_run_nothing_else_draws(ephemeral: tuple[int, int], expected: tuple[int, int]):
    ports = head_ports(ephemeral)
    assert ports == expected
    for taken in (ephemeral, WORKER_PORTS, RAY_CLIENT_SERVER_PORTS):
        assert not _overlaps(ports, taken)


def test_no_room_for_head_ports_is_said_with_the_setting_to_change():
    with pytest.raises(RuntimeError, match=r"ephemeral range 1024-65535 .* net.ipv4.ip_local_port_range"):
        head_ports((1024, 65535))


def test_this_machines_ephemeral_range_holds_no_port_a_test_chooses():
    ephemeral = ephemeral_ports()
    assert not _overlaps(head_ports(), ephemeral)
    assert not _overlaps(WORKER_PORTS, ephemeral)  # Ray's raylets hand these out to workers and drivers, later


def test_ephemeral_range_is_read_from_the_kernel_setting(tmp_path: Path):
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    assert ephemeral_ports(setting) == (40000, 50000)
    assert ephemeral_ports(tmp_path / "absent") == ray_head.DEFAULT_EPHEMERAL_PORTS


def test_the_pool_skips_a_port_in_use_and_hands_out_none_twice(
    monkeypatch: pytest.MonkeyPatch, listeners: list[socket.socket]
):
    # The last six ports of this process's share: no other test process hands them out.
    high = head_port_range(os.environ.get("PYTEST_XDIST_WORKER"))[1]
    low = high - 5
    monkeypatch.setattr(ray_head, "head_port_range", lambda worker_id, count=None: (low, high))
    pool = PortPool()
    pool.configure(None)
    listeners.append(_listener(low + 1))
    first = pool.take(2)
    assert first == [low, low + 2]
    assert pool.take(3) == [low + 3, low + 4, low + 5]
    with pytest.raises(RuntimeError, match=rf"fewer than 6 free ports left in {low}-{high}"):
        pool.take(6)  # one of the six is in use


def test_closed_port_is_outside_the_ephemeral_range_and_closed():
    port = ray_head.closed_port()
    assert head_ports()[0] <= port <= head_ports()[1]
    assert port_is_free(port)
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_ports_taken_after_they_were_chosen_are_replaced_before_the_start(
    listeners: list[socket.socket], capfd: pytest.CaptureFixture[str]
):
    head = RayHead(RAY_BIN)
    try:
        chosen = head.ports()
        listeners.append(_listener(head.dashboard))
        head.ensure_ports_free()
        assert not set(head.ports()) & set(chosen)
        assert head.address == f"http://127.0.0.1:{head.dashboard}"
        assert all(port_is_free(port) for port in head.ports())
        assert f"port(s) [{chosen[1]}] taken since they were chosen; starting on fresh ports" in capfd.readouterr().err
    finally:
        head.close()


# A stand-in for the `ray` command: `ray start` fails as Ray's dashboard check does (services.py) while the file
# FAIL_STARTS in the head's temp dir holds a count above zero, and otherwise leaves a Jobs API stand-in answering on
# --dashboard-port, its command line naming the temp dir (so RayHead.stop finds and kills it).
FAKE_RAY = """\
import http.server, os, subprocess, sys
if sys.argv[1] == "serve":
    class Version(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Version).serve_forever()
options = dict(arg[2:].split("=", 1) for arg in sys.argv[2:] if "=" in arg)
port, temp_dir = options["dashboard-port"], options["temp-dir"]
open(os.path.join(temp_dir, "START_NICENESS"), "w").write(str(os.nice(0)))
counter = os.path.join(temp_dir, "FAIL_STARTS")
left = int(open(counter).read()) if os.path.exists(counter) else 0
if left:
    open(counter, "w").write(str(left - 1))
    sys.exit(f"ValueError: Failed to bind to 127.0.0.1:{port} because it's already occupied.")
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
subprocess.Popen([sys.executable, __file__, "serve", port, temp_dir], start_new_session=True, **quiet)
"""


@pytest.fixture
def fake_ray(tmp_path: Path) -> Path:
    script = tmp_path / "ray"
    script.write_text(f"#!{sys.executable}\n{FAKE_RAY}")
    script.chmod(0o755)
    return script


def _thread_niceness(pid: int) -> set[int]:
    return {int(ray_head.stat_fields(task / "stat")[16]) for task in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a process's priority needs root (CAP_SYS_NICE)")
def test_the_head_starts_at_a_high_priority_and_runs_on_at_a_lower_one(fake_ray: Path):
    """`ray start` at HEAD_START_NICENESS (Ray's start-up windows on busy cores); once up, every thread of the head at
    HEAD_NICENESS, so its jobs leave the tests' own processes their share."""
    head = RayHead(fake_ray)
    try:
        head.start()
        assert int((Path(head.temp_dir) / "START_NICENESS").read_text()) == HEAD_START_NICENESS
        pids = ray_head._ray_processes(head.temp_dir, head.gcs_address)
        assert pids and all(_thread_niceness(pid) == {HEAD_NICENESS} for pid in pids)
    finally:
        head.close()


def test_a_first_start_that_meets_a_taken_port_starts_again_on_fresh_ports(
    fake_ray: Path, capfd: pytest.CaptureFixture[str]
):
    head = RayHead(fake_ray)
    try:
        (Path(head.temp_dir) / "FAIL_STARTS").write_text("1")
        first = head.ports()
        head.start()
        assert not set(head.ports()) & set(first)
        assert ray_head._api_answers(head.address)
        err = capfd.readouterr().err
        retried = f"ray start failed (a port was taken); starting again (attempt 2 of {START_ATTEMPTS}) on ports"
        assert retried in err, err
    finally:
        head.close()
    assert not ray_head._api_answers(head.address)  # close() found the stand-in by its temp dir


def test_a_first_start_gives_up_after_start_attempts_and_a_restart_keeps_its_address(
    fake_ray: Path, capfd: pytest.CaptureFixture[str]
):
    head = RayHead(fake_ray)
    try:
        (Path(head.temp_dir) / "FAIL_STARTS").write_text(str(START_ATTEMPTS))
        with pytest.raises(AssertionError, match="ray start failed \\(a port was taken\\)"):
            head.start()
        assert f"attempt {START_ATTEMPTS} of {START_ATTEMPTS}" in capfd.readouterr().err
        head.start()  # the count is spent: up
        head.stop()
        address = head.address
        (Path(head.temp_dir) / "FAIL_STARTS").write_text("1")
        # Its clients know the address: a restart does not move, it fails.
        with pytest.raises(AssertionError, match="ray start failed \\(a port was taken\\)"):
            head.start()
        assert head.address == address
    finally:
        head.close()


@pytest.mark.timeout(120)
def test_rays_own_words_for_a_taken_port_are_recognised(listeners: list[socket.socket]):
    """Real Ray, with its dashboard port taken: `ray start` fails, and the failure reads as a port taken (a start
    on fresh ports follows in RayHead.start)."""
    head = RayHead(RAY_BIN)
    listeners.append(_listener(head.dashboard))
    try:
        started = subprocess.run(
            head._command(), env=head._environment(), capture_output=True, text=True, timeout=110, check=False
        )
        assert started.returncode != 0
        assert head._start_failure(started) == "a port was taken", started.stdout + started.stderr
    finally:
        head.close()


def test_xdist_workers_share_the_head_their_controller_started(request: pytest.FixtureRequest):
    """A head start costs about 9 CPU-seconds of a CPU-bound run: under xdist no worker starts its own session head."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("only under pytest-xdist (make unit)")
    ready = Path(json.loads(os.environ[SHARED_HEAD_ENV])["ready"])
    assert request.getfixturevalue("ray_address") == json.loads(ready.read_text())["address"]
