"""`python tools/plan.py ...` in a copy of the repository, at the cost of a fork: a server process in that copy runs
one plan (which imports the providers' modules and the programs, about 4 CPU-seconds a process), then forks a child
for each plan asked of it. Each child is a process of its own that runs the copy's `tools/plan.py` main() with the
arguments given, its output in files, its exit status the plan's: what a test of the command sees of a fresh
`python tools/plan.py`, without the start-up each time (test_user_stack runs about thirty plans)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs in the copy (cwd): `python -c` puts the cwd first on sys.path, so `tools` is the copy's.
_SERVER = r"""
import contextlib, json, os, sys, traceback
from tools import plan
with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
    plan.main(["--stack", "dev", "--out", sys.argv[1], "--quiet"])
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        code = 1
        try:
            code = plan.main(request["argv"])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(child, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
"""


class PlanForks:
    def __init__(self, copy: Path, env: dict[str, str]) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="plan-forks-"))
        self.server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(self.scratch / "warm")],
            cwd=copy, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.count = 0

    def plan(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """`python tools/plan.py *argv` in the copy, as a forked child of the server."""
        assert self.server.stdin and self.server.stdout
        self.count += 1
        out, err = self.scratch / f"{self.count}.out", self.scratch / f"{self.count}.err"
        self.server.stdin.write(json.dumps({"argv": argv, "stdout": str(out), "stderr": str(err)}) + "\n")
        self.server.stdin.flush()
        reply = self.server.stdout.readline()
        assert reply, f"the plan server ended (exit {self.server.wait()})"
        return subprocess.CompletedProcess(
            ["tools/plan.py", *argv], json.loads(reply), out.read_text(), err.read_text()
        )

    def close(self) -> None:
        """End the server, and remove the plans' output files and the warm-up plan's folder."""
        if self.server.stdin:
            self.server.stdin.close()
        try:
            self.server.wait(timeout=60)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
