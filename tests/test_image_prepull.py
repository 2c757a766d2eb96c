"""The start-up cuts on the cluster side: the image pre-pull DaemonSet (the Ray pods' exact image, on every node,
created right after the cluster and independent of Lustre) and the compile caches on Lustre."""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import kubernetes_validate
import pytest
from conftest import RunInfra
from test_ray_chart_render import CHART_PATH, KUBERAY, render_raycluster
from upstream import reference

from tools import timeline
from workloads.image_prepull import HOLD_COMMAND, PREPULL_NAMESPACE, holder_network_policy, prepull_daemonset
from workloads.ray_values import COMPILE_CACHE_ENV, LUSTRE_MOUNT_PATH

DAEMONSET = "kubernetes:apps/v1:DaemonSet"
RELEASE = "kubernetes:helm.sh/v3:Release"


def containers_of(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


@pytest.fixture(scope="module")
def chart() -> Any:
    return helm_python.Chart.load(str(reference(KUBERAY) / CHART_PATH))


def test_prepull_holds_exactly_the_image_the_ray_pods_run(stack_run, chart: Any):
    """Read from what the real chart renders: every Ray container but the log sidecar runs the DaemonSet's image."""
    _, run = stack_run
    holder = run.one(DAEMONSET).inputs
    [container] = holder["spec"]["template"]["spec"]["containers"]
    assert container["image"] == run.outputs["nemoRlImage"]
    cluster = render_raycluster(chart, copy.deepcopy(run.one(RELEASE).inputs["values"]))
    pods = [cluster["spec"]["headGroupSpec"]["template"]["spec"]]
    pods += [group["template"]["spec"] for group in cluster["spec"]["workerGroupSpecs"]]
    ray_images = {c["image"] for pod in pods for c in containers_of(pod) if c["name"] != "fluent-bit"}
    assert ray_images == {container["image"]}


def test_prepull_is_created_right_after_the_cluster_and_waits_for_nothing_else(stack_run):
    _, run = stack_run
    holder = run.one(DAEMONSET)
    model = timeline.build([run.resources])
    label = timeline.label_of(holder)
    waits = model.ancestors(label)
    assert "Cluster/gke" in waits
    for other in ("Instance/lustre", "NodePool/gpu", "Release/ray", "PersistentVolumeClaim/lustre-volume-pvc"):
        assert other not in waits, other
    assert model.steps[label].start < model.steps["Instance/lustre"].end - 15  # pulls long before Lustre is up
    # Through the cluster's provider, in its own namespace (no wait for a Ray namespace).
    assert holder.inputs["metadata"]["namespace"] == PREPULL_NAMESPACE
    assert holder.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"


def test_prepull_runs_on_gpu_and_cpu_nodes_doing_nothing_with_minimal_rights(stack_run):
    _, run = stack_run
    spec = run.one(DAEMONSET).inputs["spec"]["template"]["spec"]
    # GPU nodes carry the nvidia.com/gpu taint; nothing restricts the holder to a pool.
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert "nodeSelector" not in spec and "affinity" not in spec
    [container] = spec["containers"]
    assert container["command"] == HOLD_COMMAND
    assert container["resources"]["limits"] == container["resources"]["requests"]
    assert container["resources"]["limits"]["cpu"].endswith("m")
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] > 10000
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert "volumes" not in spec and "env" not in container
    # No traffic in or out for the holder pods.
    policy = run.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "image-prepull-no-traffic").inputs
    assert policy["spec"]["podSelector"]["matchLabels"] == run.one(DAEMONSET).inputs["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]


def test_prepull_objects_validate_strictly(run_infra: RunInfra):
    run = run_infra("h200")
    minor = run.outputs["kubernetesMinorVersion"]
    image = run.outputs["nemoRlImage"]
    for obj in (prepull_daemonset("x-image-prepull", image), holder_network_policy("x-image-prepull")):
        kubernetes_validate.validate(obj, minor, strict=True)
    broken = prepull_daemonset("x-image-prepull", image)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, minor, strict=True)


@pytest.mark.parametrize(
    "image", ["nvcr.io/nvidia/nemo-rl:v0.7.0", "nvcr.io/nvidia/nemo-rl:v0.5.0@sha256:" + "ab" * 32]
)
def test_prepull_follows_a_changed_or_digest_pinned_image(run_infra: RunInfra, chart: Any, image: str):
    run = run_infra("dev", {"nemoRlImage": image})
    [container] = run.one(DAEMONSET).inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image  # the full reference, digest included
    cluster = render_raycluster(chart, copy.deepcopy(run.one(RELEASE).inputs["values"]))
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == image


def test_compile_caches_are_on_lustre_for_every_ray_pod(stack_run, chart: Any):
    """VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR (the names vLLM's envs.py and torch's cache_dir_utils.py read) point
    under the Lustre mount in every Ray container, as the chart renders them."""
    _, run = stack_run
    assert set(COMPILE_CACHE_ENV) == {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"}
    cluster = render_raycluster(chart, copy.deepcopy(run.one(RELEASE).inputs["values"]))
    pods = [cluster["spec"]["headGroupSpec"]["template"]["spec"]]
    pods += [group["template"]["spec"] for group in cluster["spec"]["workerGroupSpecs"]]
    for pod in pods:
        ray = next(c for c in pod["containers"] if c["name"] != "fluent-bit")
        env = {e["name"]: e.get("value") for e in ray["env"]}
        mounts = {m["mountPath"] for m in ray["volumeMounts"]}
        assert LUSTRE_MOUNT_PATH in mounts
        for name, path in COMPILE_CACHE_ENV.items():
            assert env[name] == path and path.startswith(f"{LUSTRE_MOUNT_PATH}/"), name
    assert len(set(COMPILE_CACHE_ENV.values())) == 2  # two caches, two folders


def test_the_vllm_cache_variable_is_the_one_the_pinned_vllm_reads():
    """NeMo RL pins vLLM; VLLM_CACHE_ROOT is vLLM's own name for its cache root (vllm/envs.py at every release since
    the V1 engine). Checked here against the pin in the reference pyproject: a NeMo RL that stops pinning vLLM
    (or pins a 0.x below 0.8, before torch.compile caching) needs this looked at again."""
    import re

    for tag in ("nemo-rl-v0.5.0", "nemo-rl-v0.7.0"):
        text = (reference(tag) / "pyproject.toml").read_text()
        pins = {
            tuple(int(p) for p in v.split(".")[:2])
            for v in re.findall(r"vllm[ =@][^\n]*?([0-9]+\.[0-9]+\.[0-9]+)", text)
        }
        assert pins, tag
        assert all(pin >= (0, 8) for pin in pins), (tag, pins)
        torch = re.findall(r'"torch==([0-9.]+)"', text)
        assert torch and all(tuple(int(p) for p in t.split(".")[:2]) >= (2, 4) for t in torch), (tag, torch)
