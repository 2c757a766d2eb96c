"""An interrupted `make test` leaves no Ray head behind: SIGTERM (`timeout`, a CI runner) of the pytest controller,
or Ctrl-C (SIGINT to the whole foreground process group), stops both the head the xdist controller shares and the
heads its workers started (tests/ray_head.py _stop_heads_and_die; pytest's own teardown for Ctrl-C)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from interrupted_heads import READY_ENV
from ray_head import NESTED, NESTED_PORTS_ENV, _alive, _ray_processes, head_port_range, wait_for, worker_port_range

TESTS = Path(__file__).resolve().parent


@pytest.mark.timeout(420)
@pytest.mark.parametrize("interrupt", ["sigterm", "ctrl-c"])
def test_an_interrupted_run_stops_every_head_it_started(tmp_path: Path, interrupt: str) -> None:
    ready = tmp_path / "heads.json"
    # The run's output goes to a file, not a pipe nobody reads until the end (a full pipe would block the run).
    log = tmp_path / "run.log"
    output = log.open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NEMORL_TESTS_SHARED"))}
    env[READY_ENV] = str(ready)
    # Ports of this run's nested share: no head of this run, nor the other interruption of this module, takes them.
    env[NESTED_PORTS_ENV] = json.dumps({"head": head_port_range(NESTED), "worker": worker_port_range(NESTED)})
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--timeout=0",
         str(TESTS / "interrupted_heads.py")],
        cwd=TESTS.parent, env=env, stdout=output, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as `make test` in a terminal has
        preexec_fn=_as_in_a_terminal,
    )  # fmt: skip
    try:
        wait_for(lambda: ready.exists() or run.poll() is not None, 300, "both heads of the interrupted run")
        assert ready.exists(), log.read_text()
        heads = json.loads(ready.read_text())
        pids = set().union(*(_ray_processes(head["temp_dir"], head["gcs"]) for head in heads))
        assert len(heads) == 2 and pids
        if interrupt == "sigterm":
            run.send_signal(signal.SIGTERM)
        else:
            os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{interrupt}: the run did not end within 120 s\n{_hung_run(run.pid, log)}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)
        left = sorted(pid for pid in pids if _alive(pid))
        assert not left, f"{interrupt} left Ray processes running: {left}\n{log.read_text()}"
        assert all(not Path(head["temp_dir"]).exists() for head in heads)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        output.close()


PR_SET_PDEATHSIG = 1  # prctl(2)


def _as_in_a_terminal() -> None:
    """In the nested run before it starts: Ctrl-C's default action, as in a terminal (a `make test` started in the
    background by a non-interactive shell ignores SIGINT, and its children inherit that: the nested run then slept
    through its Ctrl-C), and SIGTERM when this test's process dies (a SIGTERM of the outer run ends this worker
    without the `finally` below, which would leave the nested run and its heads behind)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _hung_run(session: int, log: Path) -> str:
    """What a run that did not end was doing: its output, its processes, and the Python stack of each."""
    processes = subprocess.run(
        ["ps", "-o", "pid,stat,etime,args", "--forest", "-s", str(session)], capture_output=True, text=True
    ).stdout
    stacks = []
    py_spy = Path(sys.executable).parent / "py-spy"  # ray[default] installs it
    for line in processes.splitlines()[1:]:
        if "python" in line and py_spy.exists():
            pid = line.split()[0]
            dump = subprocess.run([str(py_spy), "dump", "--pid", pid],
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            stacks.append(f"--- {pid}\n{dump.stdout}{dump.stderr}")
    return f"{log.read_text()}\n{processes}\n" + "\n".join(stacks)
