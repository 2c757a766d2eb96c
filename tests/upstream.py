"""Upstream sources the tests hold the project against (../shared/reference/, next to the repository), and NeMo RL's
own config loader run on them (tools/nemorl_config.py in .venv-nemorl).

A user's clone has no ../shared/reference: the tests that need it skip, with a one-line reason saying how to get
the sources. Under CI (CI=true) a missing reference or loader fails instead: CI must not skip them.
"""

from __future__ import annotations

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


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must run these tests, not skip them)")
    pytest.skip(reason)


def reference(name: str) -> Path:
    """../shared/reference/<name>, or skip (fail under CI) when it is not there."""
    path = REFERENCE / name
    if not (path / "SOURCE").is_file():
        _missing(f"no upstream reference {name} at {path}: {HOW_TO_GET}")
    return path


def nemo_rl_python() -> Path:
    """The Python of .venv-nemorl, or skip (fail under CI) when it was not created."""
    if not NEMORL_PYTHON.is_file():
        _missing(f"no {NEMORL_PYTHON.parent.parent.name}: create it with `make .venv-nemorl/.installed`")
    return NEMORL_PYTHON


class NemoRlRefusedError(Exception):
    """NeMo RL's loader refused the recipe or an override; the message is the loader's one line."""


def resolve_with_nemo_rl(nemo_rl_dir: Path, entry_args: list[str], entrypoint: str = "grpo") -> dict[str, Any]:
    """The config NeMo RL's GRPO entrypoint (or, with entrypoint="run_eval", examples/run_eval.py) would run with,
    given the words it gets after its script name (`--config=...` and the overrides), resolved by the loader of the
    NeMo RL tree `nemo_rl_dir`."""
    result = subprocess.run(
        [
            str(nemo_rl_python()),
            str(NEMORL_CONFIG),
            "--nemo-rl",
            str(nemo_rl_dir),
            "--entrypoint",
            entrypoint,
            "--",
            *entry_args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode == 1:
        raise NemoRlRefusedError(result.stderr.strip())
    assert result.returncode == 0, result.stderr
    resolved: dict[str, Any] = json.loads(result.stdout)
    return resolved
