"""Upstream sources the tests hold the project against (../shared/reference/, next to the repository), and NeMo RL's
own config loader run on them (tools/nemorl_config.py in .venv-nemorl).

A user's clone has no ../shared/reference: the tests that need it skip, with a one-line reason saying how to get
the sources. Under CI (CI=true) a missing reference or loader fails instead: CI must not skip them.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "reference"
NEMORL_PYTHON = ROOT / ".venv-nemorl" / "bin" / "python"
NEMORL_CONFIG = ROOT / "tools" / "nemorl_config.py"
HOW_TO_GET = (
    "put the upstream files (NVIDIA-NeMo/RL at the tag, with SOURCE and LICENSE) in ../shared/reference/ next to "
    "the repository"
)


def unavailable(reason: str) -> None:
    """Skip the test for this reason, or fail it under CI (CI=true), where nothing it needs may be missing."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must run these tests, not skip them)")
    pytest.skip(reason)


def reference(name: str) -> Path:
    """../shared/reference/<name>, or skip (fail under CI) when it is not there."""
    path = REFERENCE / name
    if not (path / "SOURCE").is_file():
        unavailable(f"no upstream reference {name} at {path}: {HOW_TO_GET}")
    return path


def nemo_rl_python() -> Path:
    """The Python of .venv-nemorl, or skip (fail under CI) when it was not created."""
    if not NEMORL_PYTHON.is_file():
        unavailable(f"no {NEMORL_PYTHON.parent.parent.name}: create it with `make .venv-nemorl/.installed`")
    return NEMORL_PYTHON


class NemoRlRefusedError(Exception):
    """NeMo RL's loader refused the recipe or an override; the message is the loader's one line."""


class _LoaderServer:
    """tools/nemorl_config.py --serve in .venv-nemorl, one per test process, started at its first call: each call is
    still a process of its own (a child of the server), without starting Python and importing hydra each time."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def call(self, words: list[str]) -> subprocess.CompletedProcess[str]:
        python = nemo_rl_python()
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [str(python), str(NEMORL_CONFIG), "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            atexit.register(self.process.kill)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(words) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"tools/nemorl_config.py --serve ended (status {self.process.wait()}) while answering {words}"
        answer = json.loads(line)
        return subprocess.CompletedProcess(words, answer["code"], answer["stdout"], answer["stderr"])


_LOADER = _LoaderServer()


def resolve_with_nemo_rl(nemo_rl_dir: Path, entry_args: list[str], entrypoint: str = "grpo") -> dict[str, Any]:
    """The config NeMo RL's GRPO entrypoint (or, with entrypoint="run_eval", examples/run_eval.py) would run with,
    given the words it gets after its script name (`--config=...` and the overrides), resolved by the loader of the
    NeMo RL tree `nemo_rl_dir`."""
    result = _LOADER.call(["--nemo-rl", str(nemo_rl_dir), "--entrypoint", entrypoint, "--", *entry_args])
    if result.returncode == 1:
        raise NemoRlRefusedError(result.stderr.strip())
    assert result.returncode == 0, result.stderr
    resolved: dict[str, Any] = json.loads(result.stdout)
    return resolved
