"""Repeat the two admission races many times on a real local Ray head (not part of `make test`).

    .venv/bin/python tools/admission_bench.py [--trials 100]

Each trial, on a head that offers 2 places (`gpu_node`, as the infra stack's head offers one per GPU worker):
- two runs: two holders (jobs/admission.py hold) of different runs, each needing both nodes, started at the same
  moment; one of them paused (SIGSTOP) for a second right after it asked. Counted: trials where Ray ran more than 2
  units of places at any look, and trials where neither was admitted.
- two submitters: two holders of the same run and two ray_submit.py of the same step started at the same moment.
  Counted: trials where the run had more than one place, and trials where the step ran more than once.
Prints one line per case and exits 1 if any count is not zero.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "jobs"), str(ROOT)]

from ray_head import RAY_BIN, RayHead, wait_for  # noqa: E402
from submitter.admission import list_places  # noqa: E402
from submitter.ray_api import jobs_api  # noqa: E402

ADMISSION = ROOT / "jobs" / "admission.py"
SUBMITTER = ROOT / "jobs" / "ray_submit.py"


def _holder(address: str, run: str, nodes: int, folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    ready = folder / f"{run}-{uuid.uuid4().hex[:4]}.ready"
    args = [sys.executable, str(ADMISSION), "hold", f"--address={address}", f"--run={run}", f"--nodes={nodes}",
            "--capacity=2", f"--ready-file={ready}", "--poll-s=0.3"]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), ready


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGUSR1)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def two_runs(address: str, folder: Path) -> tuple[bool, bool]:
    """(more than the capacity admitted at some look, nobody admitted)."""
    runs = [f"race-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    started = [_holder(address, run, 2, folder) for run in runs]
    started[1][0].send_signal(signal.SIGSTOP)
    over, deadline = False, time.monotonic() + 1.0
    while time.monotonic() < deadline:
        over |= sum(p.nodes for p in list_places(address) if p.run in runs and p.status == "RUNNING") > 2
    started[1][0].send_signal(signal.SIGCONT)
    try:
        wait_for(lambda: any(ready.exists() for _, ready in started), 60, "one admission")
        none = False
    except AssertionError:
        none = True
    for _ in range(5):
        over |= sum(p.nodes for p in list_places(address) if p.run in runs and p.status == "RUNNING") > 2
        time.sleep(0.2)
    _end([proc for proc, _ in started])
    return over, none


def two_submitters(address: str, folder: Path) -> tuple[bool, bool]:
    """(the run had more than one place, the step ran more than once)."""
    run = f"twice-{uuid.uuid4().hex[:6]}"
    holders = [_holder(address, run, 1, folder) for _ in range(2)]
    sid, marker = f"{run}-step", folder / f"{run}.ran"
    step = [sys.executable, str(SUBMITTER), f"--address={address}", f"--submission-id={sid}",
            f"--record={folder / run / 'step.json'}", "--", "sh", "-c", f"echo ran >> {marker}"]  # fmt: skip
    steps = [subprocess.Popen(step, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    for proc in steps:
        proc.wait(timeout=180)
    wait_for(lambda: all(ready.exists() for _, ready in holders), 60, "both holders admitted")
    places = [p for p in list_places(address) if p.run == run]
    _end([proc for proc, _ in holders])
    jobs = [j for j in jobs_api(address, "GET", "/api/jobs/", 10) or [] if str(j.get("submission_id")).startswith(sid)]
    ran = marker.read_text().count("ran") if marker.exists() else 0
    return len(places) != 1, ran != 1 or len(jobs) != 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    head = RayHead(RAY_BIN)
    head.start()
    counts = {"over capacity": 0, "none admitted": 0, "two places": 0, "step twice": 0}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.trials):
                over, none = two_runs(head.address, Path(tmp))
                counts["over capacity"] += over
                counts["none admitted"] += none
                places, twice = two_submitters(head.address, Path(tmp))
                counts["two places"] += places
                counts["step twice"] += twice
    finally:
        head.close()
    print(f"two runs, {args.trials} trials: {counts['over capacity']} over, {counts['none admitted']} none")
    print(f"two submitters, {args.trials} trials: {counts['two places']} 2 places, {counts['step twice']} twice")
    return 1 if any(counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
