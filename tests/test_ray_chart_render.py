"""The real ray-cluster chart (1.5.1, ../shared/reference) rendered with our values by Helm's own Go SDK, in
process (helm-python-sdk), and the RayCluster it yields checked against KubeRay's CRD schema, strictly (a field
the schema does not know is an error, as with `kubectl apply --validate=strict`). Autoscaling per provisioning
mode is checked on what the chart actually renders, not on our values."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from config_rules import validated
from upstream import reference

from infra.settings import InfraSettings
from workloads.ray_values import WORKER_GROUP, build_ray_values
from workloads.stack import RELEASE_NAME

KUBERAY = "kuberay-v1.5.1"
CHART_PATH = Path("helm-chart", "ray-cluster")
CRD_PATH = Path("ray-operator", "config", "crd", "bases", "ray.io_rayclusters.yaml")

BASE = {"gcp:project": "p", "gcp:region": "europe-west1", "zone": "europe-west1-b", "gpuType": "nvidia-h200-141gb"}
CASES = {
    "flexStart": {**BASE, "gpuProvisioning": "flexStart", "gpuNodes": 2},
    "spot": {**BASE, "gpuProvisioning": "spot", "gpuNodes": 3, "rayIdleTimeoutSeconds": 900},
    "reservation": {**BASE, "reservation": "r", "gpuNodes": 2},
    "reservation-autoscaled": {**BASE, "reservation": "r", "gpuNodes": 2, "rayAutoscaling": True},
    "flexStart-fixed": {**BASE, "gpuProvisioning": "flexStart", "gpuNodes": 1, "rayAutoscaling": False},
}


def refs() -> Any:
    from test_ray_values import make_refs

    return make_refs()


@pytest.fixture(scope="module")
def chart() -> Any:
    # Skips in a user's clone without ../shared/reference, and fails under CI (tests/upstream.py).
    return helm_python.Chart.load(str(reference(KUBERAY) / CHART_PATH))


@pytest.fixture(scope="module")
def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((reference(KUBERAY) / CRD_PATH).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def render_raycluster(chart: Any, values: dict[str, Any]) -> dict[str, Any]:
    rendered = chart.render(copy.deepcopy(values), name=RELEASE_NAME, namespace="default")
    objects = [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]
    clusters = [obj for obj in objects if obj.get("kind") == "RayCluster"]
    assert len(clusters) == 1, [obj.get("kind") for obj in objects]
    return clusters[0]


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of `obj` that `schema` has no place for (OpenAPI v3 as Kubernetes reads it)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            here = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                found += unknown_fields(value, properties[key], here)
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, here)
            elif properties is not None or extra is False:
                found.append(here)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for n, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], f"{path}[{n}]")
    return found


def check_against_crd(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    jsonschema.validate(obj, schema)
    assert not unknown_fields(obj, schema), unknown_fields(obj, schema)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_raycluster_matches_the_crd_and_the_mode(chart: Any, crd_schema: dict[str, Any], case: str):
    settings = validated(InfraSettings, CASES[case])
    cluster = render_raycluster(chart, build_ray_values(settings, refs()))
    check_against_crd(cluster, crd_schema)

    spec = cluster["spec"]
    (group,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == WORKER_GROUP]
    replicas = settings.ray_worker_replicas
    head_containers = spec["headGroupSpec"]["template"]["spec"]["containers"]
    if settings.gpu_autoscaling:
        assert spec["enableInTreeAutoscaling"] is True
        assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == settings.idle_timeout_seconds
        assert "image" not in spec["autoscalerOptions"]  # KubeRay then uses the head's pinned image
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, replicas)
    else:
        assert not spec.get("enableInTreeAutoscaling")
        assert "autoscalerOptions" not in spec
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (replicas, replicas, replicas)
    # KubeRay adds the autoscaler container itself; the chart's head pod has only ours.
    assert [c["name"] for c in head_containers] == ["ray-head", "fluent-bit"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_offline_chart_model_renders_what_the_chart_renders(chart: Any, case: str):
    """test_ray_values builds pods from our values with its own model of the chart's templates (render_pod), so it
    runs without ../shared/reference; here that model is held to the real chart: the same pod spec and labels, and
    the template's annotations plus the one KubeRay copies from the RayCluster."""
    from test_ray_values import render_pod

    values = build_ray_values(validated(InfraSettings, CASES[case]), refs())
    cluster = render_raycluster(chart, values)
    spec = cluster["spec"]
    (group,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == WORKER_GROUP]
    copied = {k: v for k, v in cluster["metadata"].get("annotations", {}).items() if k.startswith("ray.io/")}
    for template, group_name in ((spec["headGroupSpec"]["template"], None), (group["template"], WORKER_GROUP)):
        modelled = render_pod(values, group_name)
        assert modelled["spec"] == template["spec"]
        assert modelled["metadata"]["labels"] == template["metadata"]["labels"]
        assert modelled["metadata"].get("annotations", {}) == {**template["metadata"].get("annotations", {}), **copied}


def test_defaults_per_mode():
    assert validated(InfraSettings, CASES["flexStart"]).gpu_autoscaling is True
    assert validated(InfraSettings, CASES["spot"]).gpu_autoscaling is True
    assert validated(InfraSettings, CASES["reservation"]).gpu_autoscaling is False
    assert validated(InfraSettings, CASES["spot"]).idle_timeout_seconds == 900
    assert validated(InfraSettings, CASES["flexStart"]).idle_timeout_seconds == 600


def test_the_crd_check_catches_a_bad_raycluster(chart: Any, crd_schema: dict[str, Any]):
    cluster = render_raycluster(chart, build_ray_values(validated(InfraSettings, CASES["flexStart"]), refs()))
    wrong_type = copy.deepcopy(cluster)
    wrong_type["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = "ten minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong_type, crd_schema)
    misspelt = copy.deepcopy(cluster)
    misspelt["spec"]["autoscalerOptions"]["idleTimeoutSecs"] = 600
    assert unknown_fields(misspelt, crd_schema) == ["spec.autoscalerOptions.idleTimeoutSecs"]


def test_chart_dir_is_the_pinned_version():
    from workloads.ray_chart import CHART_VERSION

    kuberay = reference(KUBERAY)
    assert yaml.safe_load((kuberay / CHART_PATH / "Chart.yaml").read_text())["version"] == CHART_VERSION
    assert (kuberay / CRD_PATH).is_file()


def test_the_chart_passes_the_workers_topology_affinity(chart: Any, crd_schema: dict[str, Any]):
    """The ray-cluster chart renders a worker group's `affinity` into its pod template (templates/
    raycluster-cluster.yaml, additionalWorkerGroups): the preferred pod affinity to one reservation sub-block, then
    one block, reaches the RayCluster KubeRay reads, and the CRD accepts it."""
    from workloads.ray_values import TOPOLOGY_BLOCK_LABEL, TOPOLOGY_SUBBLOCK_LABEL, topology_affinity

    values = build_ray_values(validated(InfraSettings, {**BASE, "reservation": "r", "gpuNodes": 32}), refs())
    cluster = render_raycluster(chart, values)
    check_against_crd(cluster, crd_schema)
    (group,) = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == WORKER_GROUP]
    affinity = group["template"]["spec"]["affinity"]
    assert affinity == topology_affinity(values["fullnameOverride"])
    terms = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["podAffinityTerm"]["topologyKey"] for t in terms]
    assert keys == [TOPOLOGY_SUBBLOCK_LABEL, TOPOLOGY_BLOCK_LABEL]
    assert group["maxReplicas"] == 32
    # The head keeps its own node affinity and no pod affinity.
    assert "podAffinity" not in cluster["spec"]["headGroupSpec"]["template"]["spec"]["affinity"]
