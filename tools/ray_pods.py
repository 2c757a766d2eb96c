"""The Ray pods that will run: the RayCluster the real ray-cluster chart renders from our values (Helm's Go SDK, in
process: helm-python-sdk), turned into the Pods KubeRay creates from it. `make plan` writes them for checkov
(build/<stack>/ray-pods/), and the tests hold the NetworkPolicy selectors and the Pod Security level to them.

What KubeRay adds to each pod template, modelled from ray-operator/controllers/ray/common/pod.go at v1.5.1 (the
version GKE's RayOperator add-on runs, and the chart's): the pod labels (labelPod: a template cannot override
ray.io/cluster, ray.io/node-type or ray.io/group), the RayCluster's namespace, its controller reference to the
RayCluster (raycluster_controller.go buildHeadPod/buildWorkerPod: controller-runtime's SetControllerReference, with
controller and blockOwnerDeletion true; the uid is the live RayCluster's, a stand-in here), the
overwrite-container-cmd annotation, and the containers it injects: the autoscaler beside the head
(BuildAutoscalerContainer, then autoscalerOptions merged in) and the wait-gcs-ready init container of each worker,
which copies the worker's Ray container image, env, volume mounts and securityContext. Only what bears on security
and selection is modelled: not the generated `ray start` environment, nor the exec probes KubeRay adds to the Ray
container.

The chart is read from ../shared/reference (next to the repository), as the tests do; without it, or without
helm-python-sdk (a test dependency), there is nothing to render and `chart_problem` says why.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT.parent / "shared" / "reference" / "kuberay-v1.5.1" / "helm-chart" / "ray-cluster"

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
HEAD_GROUP = "headgroup"
OVERWRITE_CONTAINER_CMD = "ray.io/overwrite-container-cmd"
RAY_LOGS_VOLUME = "ray-logs"  # KubeRay's name for the shared /tmp/ray volume (ours has the same name)
RAY_LOGS_PATH = "/tmp/ray"
KUBERAY_SHELL = ["/bin/bash", "-c", "--"]  # utils.GetContainerCommand
RAYCLUSTER_API_VERSION = "ray.io/v1"
RAYCLUSTER_UID_STAND_IN = "00000000-0000-0000-0000-000000000000"  # the RayCluster's uid, known once it exists


def chart_problem(chart_dir: Path = CHART_DIR) -> str | None:
    """Why the chart cannot be rendered here, or None when it can."""
    try:
        import helm_python  # noqa: F401
    except ImportError:
        return "it needs helm-python-sdk, which `make test` installs (requirements-dev.txt)"
    if not (chart_dir / "Chart.yaml").is_file():
        return f"it needs the ray-cluster chart at {chart_dir} (the upstream reference next to the repository)"
    return None


def render_raycluster(
    values: dict[str, Any], release_name: str, namespace: str, chart_dir: Path = CHART_DIR
) -> dict[str, Any]:
    """The one RayCluster the chart renders from `values`."""
    import helm_python

    chart = helm_python.Chart.load(str(chart_dir))
    rendered = chart.render(copy.deepcopy(values), name=release_name, namespace=namespace)
    objects = [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]
    clusters = [obj for obj in objects if obj.get("kind") == "RayCluster"]
    if len(clusters) != 1:
        raise ValueError(f"the chart rendered {[obj.get('kind') for obj in objects]}, not one RayCluster")
    cluster = clusters[0]
    cluster.setdefault("metadata", {})["namespace"] = namespace
    return cluster


def kuberay_labels(template_labels: dict[str, str], cluster: str, node_type: str, group: str) -> dict[str, str]:
    """labelPod: KubeRay's labels, then the template's, except the three KubeRay keeps."""
    labels = {
        "ray.io/is-ray-node": "yes",
        CLUSTER_LABEL: cluster,
        NODE_TYPE_LABEL: node_type,
        GROUP_LABEL: group,
        "ray.io/identifier": f"{cluster}-{node_type}"[:63],
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    for key, value in template_labels.items():
        if key not in (CLUSTER_LABEL, NODE_TYPE_LABEL, GROUP_LABEL):
            labels[key] = value
    return labels


def controller_reference(cluster: str) -> dict[str, Any]:
    """What SetControllerReference writes on a pod the RayCluster `cluster` owns."""
    return {
        "apiVersion": RAYCLUSTER_API_VERSION,
        "kind": "RayCluster",
        "name": cluster,
        "uid": RAYCLUSTER_UID_STAND_IN,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _autoscaler(ray_container: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "autoscaler",
        "image": options.get("image", ray_container["image"]),
        "imagePullPolicy": options.get("imagePullPolicy", "IfNotPresent"),
        "env": [
            {
                "name": "RAY_CLUSTER_NAME",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{CLUSTER_LABEL}']"}},
            },
            {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "RAY_HEAD_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "KUBERAY_CRD_VER", "value": "v1"},
            *options.get("env", []),
        ],
        "command": KUBERAY_SHELL,
        "args": [
            "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)"
        ],
        "resources": options.get(
            "resources",
            {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "500m", "memory": "512Mi"}},
        ),
        "volumeMounts": [*options.get("volumeMounts", []), {"name": RAY_LOGS_VOLUME, "mountPath": RAY_LOGS_PATH}],
    }
    if "securityContext" in options:
        container["securityContext"] = options["securityContext"]
    return container


def _wait_gcs_ready(ray_container: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "wait-gcs-ready",
        "image": ray_container["image"],
        "command": KUBERAY_SHELL,
        "args": ["until ray health-check --address $(FQ_RAY_IP):$(RAY_PORT); do sleep 5; done"],  # abridged
        "env": copy.deepcopy(ray_container.get("env", [])),
        "volumeMounts": copy.deepcopy(ray_container.get("volumeMounts", [])),
        "resources": {"limits": {"cpu": "200m", "memory": "256Mi"}, "requests": {"cpu": "200m", "memory": "256Mi"}},
    }
    for key in ("imagePullPolicy", "securityContext"):
        if key in ray_container:
            container[key] = copy.deepcopy(ray_container[key])
    return container


def _pod(cluster: dict[str, Any], template: dict[str, Any], name: str, node_type: str, group: str) -> dict[str, Any]:
    meta = cluster["metadata"]
    spec = copy.deepcopy(template["spec"])
    annotations = dict(template.get("metadata", {}).get("annotations") or {})
    if str((meta.get("annotations") or {}).get(OVERWRITE_CONTAINER_CMD, "")).lower() == "true":
        annotations[OVERWRITE_CONTAINER_CMD] = "true"
    pod_meta: dict[str, Any] = {
        "name": name,
        "namespace": meta["namespace"],
        "labels": kuberay_labels(template.get("metadata", {}).get("labels") or {}, meta["name"], node_type, group),
        "ownerReferences": [controller_reference(meta["name"])],
    }
    if annotations:
        pod_meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def ray_pods(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """One Pod per group of the RayCluster: the head, then each worker group, as KubeRay would create them."""
    spec = cluster["spec"]
    name = cluster["metadata"]["name"]
    head = _pod(cluster, spec["headGroupSpec"]["template"], f"{name}-head", "head", HEAD_GROUP)
    if spec.get("enableInTreeAutoscaling"):
        head_spec = head["spec"]
        head_spec["serviceAccountName"] = head_spec.get("serviceAccountName") or name
        head_spec["containers"].append(_autoscaler(head_spec["containers"][0], spec.get("autoscalerOptions") or {}))
    pods = [head]
    for group in spec.get("workerGroupSpecs") or []:
        pod = _pod(cluster, group["template"], f"{name}-{group['groupName']}-worker", "worker", group["groupName"])
        pod["spec"].setdefault("initContainers", []).append(_wait_gcs_ready(pod["spec"]["containers"][0]))
        pods.append(pod)
    return pods
