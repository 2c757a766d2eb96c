"""The test Ray heads of the pytest-xdist workers (`make unit` runs five) and the head their controller starts for
them all hand out worker ports from ranges that never overlap, so two raylets cannot give the same port to two
drivers at once."""

from __future__ import annotations

import json
import os

import pytest
from ray_head import SHARED_HEAD_ENV, WORKER_PORTS, worker_port_range


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_xdist_workers_get_disjoint_worker_port_ranges(monkeypatch: pytest.MonkeyPatch, count: int):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    # The workers' own heads and the head the controller starts for them all (worker id None).
    ranges = [worker_port_range(f"gw{index}") for index in range(count)] + [worker_port_range(None, count)]
    for low, high in ranges:
        assert WORKER_PORTS[0] <= low < high <= WORKER_PORTS[1]
        assert high - low >= 1000  # room for every worker and driver a test file starts
    ports = [port for low, high in ranges for port in range(low, high + 1)]
    assert len(ports) == len(set(ports))


def test_without_xdist_a_head_has_the_whole_range(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert worker_port_range(None) == WORKER_PORTS


def test_xdist_workers_share_the_head_their_controller_started(request: pytest.FixtureRequest):
    """A head start costs about 9 CPU-seconds of a CPU-bound run: under xdist no worker starts its own session head."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("only under pytest-xdist (make unit)")
    assert request.getfixturevalue("ray_address") == json.loads(os.environ[SHARED_HEAD_ENV])["address"]
