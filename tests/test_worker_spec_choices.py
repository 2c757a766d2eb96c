"""What the tutorial's GPU worker spec had and ours leaves out (docs/design.md#left-out), held against the Ray pods
the real ray-cluster chart renders from our values (tools/ray_pods.py, as `make plan` writes them) for every
provisioning mode, and against the GPU node pool the infra program registers: no toleration that would place a
worker on a node being shut down, no toleration of a taint our pools do not have, and no volume that no container
mounts (the tutorial's `ray-tmp`)."""

from __future__ import annotations

from typing import Any

import pytest
from config_rules import validated
from upstream import reference

from infra.settings import InfraSettings
from tools import plan_run, ray_pods
from workloads.ray_values import RAY_TMP_DIR, WORKER_GROUP, build_ray_values
from workloads.stack import RELEASE_NAME

BASE = {"gcp:project": "p", "gcp:region": "europe-west1", "zone": "europe-west1-b", "gpuType": "nvidia-h200-141gb"}
MODES = {
    "spot": {**BASE, "gpuProvisioning": "spot", "gpuNodes": 2},
    "flexStart": {**BASE, "gpuProvisioning": "flexStart", "gpuNodes": 2},
    "reservation": {**BASE, "reservation": "r", "gpuNodes": 2},
}
# The taints the tutorial's workers tolerated, as they are set: Google's node termination handler marks a node
# about to go away; Cluster Toolkit's gke-node-pool module marks its pools.
IMPENDING_TERMINATION = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
USER_WORKLOAD = {"key": "user-workload", "value": "true", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}  # GKE's, on every GPU node


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule (v1 helper ToleratesTaint): empty key with Exists matches every key; Exists ignores the
    value; an empty effect matches every effect."""
    key, operator = toleration.get("key", ""), toleration.get("operator", "Equal")
    if key and key != taint["key"]:
        return False
    if not key and operator != "Exists":
        return False
    if operator == "Equal" and toleration.get("value", "") != taint.get("value", ""):
        return False
    return toleration.get("effect", "") in ("", taint["effect"])


def test_the_toleration_rule_is_not_vacuous():
    assert tolerates(
        {"key": "cloud.google.com/impending-node-termination", "operator": "Exists"}, IMPENDING_TERMINATION
    )
    assert tolerates({"operator": "Exists"}, USER_WORKLOAD)
    assert tolerates({"key": "user-workload", "operator": "Equal", "value": "true"}, USER_WORKLOAD)
    assert not tolerates({"key": "user-workload", "operator": "Equal", "value": "false"}, USER_WORKLOAD)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, USER_WORKLOAD)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, GPU_TAINT)


@pytest.fixture(scope="module", params=list(MODES))
def pods(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The pods KubeRay creates from the RayCluster the real chart renders for this provisioning mode."""
    reference("kuberay-v1.5.1")
    from test_ray_values import make_refs

    values = build_ray_values(validated(InfraSettings, MODES[request.param]), make_refs())
    return ray_pods.ray_pods(ray_pods.render_raycluster(values, RELEASE_NAME, "nemo-rl"))


def _workers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workers = [p for p in pods if p["metadata"]["labels"]["ray.io/group"] == WORKER_GROUP]
    assert workers, [p["metadata"]["name"] for p in pods]
    return workers


def test_workers_tolerate_the_gpu_taint_and_nothing_the_tutorial_added(pods: list[dict[str, Any]]):
    for worker in _workers(pods):
        tolerations = worker["spec"].get("tolerations", [])
        assert any(tolerates(t, GPU_TAINT) for t in tolerations)
        # Never scheduled onto a node that is being shut down.
        assert not any(tolerates(t, IMPENDING_TERMINATION) for t in tolerations), tolerations
        assert not any(tolerates(t, USER_WORKLOAD) for t in tolerations), tolerations


def test_every_volume_of_every_ray_pod_is_mounted(pods: list[dict[str, Any]]):
    """An unmounted volume does nothing (the tutorial's ray-tmp); /tmp/ray stays on the node's disk."""
    for pod in pods:
        spec = pod["spec"]
        containers = [*spec["containers"], *spec.get("initContainers", [])]
        mounted = {m["name"] for c in containers for m in c.get("volumeMounts", [])}
        projected_token = {v["name"] for v in spec["volumes"] if "projected" in v}  # the autoscaler's, mounted there
        assert {v["name"] for v in spec["volumes"]} <= mounted | projected_token, pod["metadata"]["name"]
        ray_container = spec["containers"][0]  # KubeRay's Ray container comes first
        assert ray_container["name"] in ("ray-head", "ray-worker")
        (tmp,) = [m["name"] for m in ray_container["volumeMounts"] if m["mountPath"] == RAY_TMP_DIR]
        (volume,) = [v for v in spec["volumes"] if v["name"] == tmp]
        assert volume.get("emptyDir", {}).get("medium", "") != "Memory"


def test_the_gpu_pool_sets_no_taint_of_its_own():
    """So a toleration of Cluster Toolkit's user-workload taint would match nothing here."""
    result = plan_run.run_plan("dev")
    (pool,) = [
        r
        for r in result.infra.resources
        if r.type == "gcp:container/nodePool:NodePool" and "guestAccelerators" in r.inputs.get("nodeConfig", {})
    ]
    assert "taints" not in pool.inputs["nodeConfig"], pool.inputs["nodeConfig"]["taints"]
    # The field name is right: the CPU pool's config is read the same way.
    assert "machineType" in pool.inputs["nodeConfig"]
