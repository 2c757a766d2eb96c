"""The worker wait at many nodes, without a Ray head: Ray's State API lists 100 entries unless told otherwise, so
the wait asks for up to the API server's own maximum, and would see 128 workers where the default saw 100."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray.util.state
import ray.util.state.common
from script_loader import load_script

wfw = load_script("jobs/wait_for_workers.py", "wait_for_workers")


def test_the_node_listing_is_not_cut_at_rays_default_limit(monkeypatch: pytest.MonkeyPatch):
    alive = [SimpleNamespace(state="ALIVE", resources_total={"GPU": 8.0}) for _ in range(128)]
    asked: dict[str, Any] = {}

    def list_nodes(**kwargs: Any) -> list[SimpleNamespace]:
        asked.update(kwargs)
        return alive[: kwargs.get("limit", ray.util.state.common.DEFAULT_LIMIT)]

    monkeypatch.setattr(ray.util.state, "list_nodes", list_nodes)
    nodes = wfw.alive_nodes("http://head:8265")
    assert wfw.gpu_workers(nodes, 8) == 128
    assert asked["limit"] == wfw.LIST_NODES_LIMIT == ray.util.state.common.RAY_MAX_LIMIT_FROM_API_SERVER
    assert ray.util.state.common.DEFAULT_LIMIT == 100  # what the listing was cut at before
