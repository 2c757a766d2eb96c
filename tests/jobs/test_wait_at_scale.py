"""The worker wait at many nodes, without a Ray head: Ray's State API lists 100 entries unless told otherwise, so
the wait asks for up to the API server's own maximum, and would see 128 workers where the default saw 100.

Run in a child interpreter: importing ray.util.state in a test worker left that worker's later in-process
`ray.init` unable to reach a GCS (the pre-flight tests' drivers timed out on the worker that ran this first)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

CHECK = """
import json, sys
from types import SimpleNamespace
import ray.util.state, ray.util.state.common
sys.path[:0] = sys.argv[1:]  # tests/, and jobs/ for the submitter package that ships beside the script
from script_loader import load_script
wfw = load_script("jobs/wait_for_workers.py", "wait_for_workers")
alive = [SimpleNamespace(state="ALIVE", resources_total={"GPU": 8.0}) for _ in range(128)]
asked = {}
def list_nodes(**kwargs):
    asked.update(kwargs)
    return alive[: kwargs.get("limit", ray.util.state.common.DEFAULT_LIMIT)]
ray.util.state.list_nodes = list_nodes
nodes = wfw.alive_nodes("http://head:8265")
print(json.dumps({
    "workers": wfw.gpu_workers(nodes, 8),
    "asked": asked["limit"],
    "ours": wfw.LIST_NODES_LIMIT,
    "api_max": ray.util.state.common.RAY_MAX_LIMIT_FROM_API_SERVER,
    "default": ray.util.state.common.DEFAULT_LIMIT,
}))
"""


def test_the_node_listing_is_not_cut_at_rays_default_limit():
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(ROOT / "tests"), str(ROOT / "jobs")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["workers"] == 128
    assert seen["asked"] == seen["ours"] == seen["api_max"]
    assert seen["default"] == 100  # what the listing was cut at before
