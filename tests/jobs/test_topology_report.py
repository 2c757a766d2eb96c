"""The NCCL pre-flight's topology report (issue 34): the GPU workers learn their node's name through the downward
API, the pre-flight records it per rank, and the submitter looks each node up (`get` nodes, nothing more) and says
which reservation blocks and sub-blocks the run landed on. Pure: the API is a function here."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conftest import ROOT
from script_loader import load_script

topo = load_script("jobs/scripts/topology_report.py", "topology_report")
na = load_script("jobs/preflight/nccl_allreduce.py", "preflight_nccl_allreduce_topology")

BLOCK, SUB = topo.BLOCK_LABEL, topo.SUBBLOCK_LABEL


def report(nodes: int, gpus: int = 8) -> dict[str, Any]:
    return {"ranks": [{"rank": n * gpus + g, "node_name": f"gke-gpu-{n}"} for n in range(nodes) for g in range(gpus)]}


def labelled(block_of: Mapping[str, tuple[str, str] | None]) -> Any:
    def get(name: str) -> dict[str, Any]:
        where = block_of[name]
        return {"metadata": {"labels": {BLOCK: where[0], SUB: where[1]} if where else {}}}

    return get


def test_one_line_per_block_and_sub_block():
    nodes = {f"gke-gpu-{n}": ("blk-a", "sb-1" if n < 24 else "sb-2") for n in range(32)}
    lines = topo.report_lines(report(32), labelled(nodes))
    assert lines == [
        "topology: 32 GPU nodes of the run",
        "topology: 1 block (blk-a: 32)",
        "topology: 2 sub-blocks (blk-a/sb-1: 24, blk-a/sb-2: 8)",
    ]


def test_nodes_across_blocks_and_without_labels_are_said():
    nodes = {"gke-gpu-0": ("blk-a", "sb-1"), "gke-gpu-1": ("blk-b", "sb-7"), "gke-gpu-2": None}
    lines = topo.report_lines(report(3), labelled(nodes))
    assert "topology: 2 blocks (blk-a: 1, blk-b: 1)" in lines
    assert any("span blocks" in line for line in lines)
    assert lines[-1].startswith("topology: 1 node(s) (no topology labels)")


def test_unknown_is_said_not_guessed():
    def refused(name: str) -> Any:
        raise FileNotFoundError("token")  # stopOnDelete false: no token

    assert topo.report_lines(report(2), refused)[0].startswith("topology unknown: could not read node gke-gpu-0")
    assert topo.report_lines({"ranks": [{"rank": 0}]}, refused)[0].startswith("topology unknown: the pre-flight")


def test_the_script_exits_0_without_a_report(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "scripts" / "topology_report.py"), f"--report={tmp_path}/none.json"],
        capture_output=True,
        text=True,
        cwd=ROOT / "jobs",
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("topology unknown: no pre-flight report"), done


def test_the_preflight_records_the_node_name_and_the_report_file_feeds_the_script(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("NODE_NAME", "gke-gpu-7")
    monkeypatch.setattr(na, "run_collective", lambda *args: {"times_s": [], "errors": []})
    actor = na.NcclActor({"global_rank": 3, "bundle_index": 0})
    result = actor.run(1, "127.0.0.1", 1, {"backend": "gloo"})
    assert result["node_name"] == "gke-gpu-7"
    path = tmp_path / "preflight-nccl.json"
    path.write_text(json.dumps({"ranks": [result]}))
    assert topo.node_names(json.loads(path.read_text())) == ["gke-gpu-7"]


def test_the_pipeline_runs_the_report_after_the_nccl_preflight():
    from conftest import shared_infra_run
    from launcher.infra_outputs import build_infra_outputs
    from launcher.paths import nccl_report_file
    from launcher.script import pipeline_script, topology_command
    from launcher.steps import pipeline_steps
    from test_checkpoints import settings

    infra = build_infra_outputs(shared_infra_run("h200").outputs)
    job = settings(infra, numNodes=2, generationNodes=1)
    steps = pipeline_steps(job, infra)
    nccl = next(s for s in steps if s.name == "preflight-nccl")
    assert f"--json-out={nccl_report_file(job, infra)}" in nccl.entrypoint
    script = pipeline_script(job, infra, steps).splitlines()
    report_line = f"{shlex.join(topology_command(job, infra))} || true"
    assert report_line in script
    # Right after the NCCL step's submission block, before the next step starts.
    at = script.index(report_line)
    assert "preflight-nccl" in "\n".join(script[at - 6 : at]) and "=== step 2/" in script[at + 1]


def test_the_submitter_may_get_nodes_and_nothing_more_cluster_wide():
    from conftest import shared_infra_run

    from tools.offline import load_stack_config, run_program

    jobs = ROOT / "jobs"
    infra = shared_infra_run("h200")
    project, config = load_stack_config(jobs, "h200")
    reference = config[f"{project}:infraStack"]
    run = run_program(
        jobs,
        config,
        stack="h200",
        stack_outputs={reference: infra.outputs},
        stack_secret_outputs={reference: infra.secret_outputs},
    )
    role = run.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole").inputs
    binding = run.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding").inputs
    account = run.one("kubernetes:core/v1:ServiceAccount").inputs["metadata"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert role["metadata"]["name"] == f"{infra.outputs['namespace']}-gemma3-27b-gsm8k-node-reader"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"],
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    # Without stopOnDelete the submitter has no token, and no role at all.
    config[f"{project}:stopOnDelete"] = False
    bare = run_program(
        jobs,
        config,
        stack="h200",
        stack_outputs={reference: infra.outputs},
        stack_secret_outputs={reference: infra.secret_outputs},
    )
    assert not bare.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")


def test_the_gpu_workers_know_their_node_name():
    from config_rules import validated
    from test_ray_values import make_refs

    from infra.settings import InfraSettings
    from workloads import ray_values

    settings = validated(
        InfraSettings,
        {
            "gcp:project": "p",
            "gcp:region": "europe-west1",
            "zone": "europe-west1-b",
            "gpuType": "nvidia-h200-141gb",
            "reservation": "r",
        },
    )
    values = ray_values.build_ray_values(settings, make_refs())
    env = values["additionalWorkerGroups"][ray_values.WORKER_GROUP]["containerEnv"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in env
    assert na.NODE_NAME_ENV == "NODE_NAME"
