"""NeMo RL v0.7.0's Ray (2.55.1, from .venv-ray2551) for the tests: its interpreter and one head, shared by
test_ray_2_55_1.py and test_ray_token_auth.py (tests/conftest.py hands the two modules to one worker).

The head requires a token, as every 2.55.1 cluster of the stack does (Ray has token authentication from 2.52, and
workloads/ray_auth.py always turns it on there): the submitter pod's clients send it, and so do these tests' clients
(WITH_TOKEN), except where a test shows what a client without it, or with a wrong one, is told.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_head import ray_head
from upstream import unavailable

from infra.nemo_rl_releases import NEMO_RL_RELEASES

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-ray2551"
RAY_VERSION = NEMO_RL_RELEASES["v0.7.0"].ray_version

TOKEN = f"tok{uuid.uuid4().hex}{uuid.uuid4().hex[:13]}"  # 48 letters and digits, like the stack's
WITH_TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}


@pytest.fixture(scope="session")
def v070_python() -> Path:
    """.venv-ray2551's Python, holding the Ray of the v0.7.0 row; skip (fail under CI) when it was not created."""
    python = VENV / "bin" / "python"
    if not python.is_file():
        unavailable(f"no {VENV.name}: create it with `make {VENV.name}/.installed`")
    found = subprocess.run(
        [str(python), "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == RAY_VERSION, "requirements-ray2551.txt must pin the Ray of the v0.7.0 row"
    return python


@pytest.fixture(scope="session")
def v070_address(v070_python: Path) -> Iterator[str]:
    """The Jobs API of the 2.55.1 head (token authentication on, TOKEN)."""
    with ray_head(v070_python.parent / "ray", auth_token=TOKEN) as address:
        yield address
