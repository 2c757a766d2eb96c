"""The KubeRay `ray-cluster` Helm chart we render the RayCluster with, and the value keys it reads.

Only the chart is installed: GKE's RayOperator add-on is the operator (never kuberay-operator).
The chart has no values.schema.json, so Helm silently ignores a key it does not read. CHART_VALUE_KEYS
lists what the pinned version's templates read, and `unknown_value_keys` checks a values tree against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHART_NAME = "ray-cluster"
CHART_REPO = "https://ray-project.github.io/kuberay-helm/"
# 1.5.1 is published in the Helm repository above (kuberay-helm PR #77) and used publicly with
# `--version 1.5.1`. Its templates are identical to v1.5.2's (only Chart.yaml and README differ).
CHART_VERSION = "1.5.1"

# Stands for the map key of an entry under additionalWorkerGroups (the chart uses it as groupName).
GROUP = "<name>"

# Read from github.com/ray-project/kuberay, tag v1.5.1, helm-chart/ray-cluster/templates/
# raycluster-cluster.yaml and _helpers.tpl. `serviceAccount.*` appears only in a helper the
# templates never include, so it is left out: setting it would change nothing.
_TOP_LEVEL = (
    "nameOverride",
    "fullnameOverride",
    "annotations",  # metadata.annotations of the RayCluster object
    "image.repository",
    "image.tag",
    "image.pullPolicy",
    "imagePullSecrets",
    "common.containerEnv",
    "service.type",
    "gcsFaultTolerance.enabled",
    "gcsFaultTolerance.redisAddress",
    "gcsFaultTolerance.externalStorageNamespace",
    "gcsFaultTolerance.redisPassword",
    "gcsFaultTolerance.redisUsername",
)
# Read the same way for the head, the default worker and every additional worker group.
_EVERY_GROUP = (
    "image.repository",
    "image.tag",
    "image.pullPolicy",
    "rayStartParams",
    "initArgs",  # deprecated alias of rayStartParams
    "labels",
    "annotations",  # pod template annotations
    "initContainers",
    "command",
    "args",
    "containerEnv",
    "envFrom",
    "volumeMounts",
    "ports",
    "resources",
    "lifecycle",
    "securityContext",
    "sidecarContainers",
    "volumes",
    "dnsConfig",
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "priority",
    "topologySpreadConstraints",
    "restartPolicy",
    "serviceAccountName",
    "podSecurityContext",
)
_HEAD_ONLY = ("rayVersion", "enableInTreeAutoscaling", "autoscalerOptions", "headService")
_WORKER_ONLY = ("disabled", "replicas", "minReplicas", "maxReplicas", "numOfHosts")

CHART_VALUE_KEYS: frozenset[str] = frozenset(
    [*_TOP_LEVEL]
    + [f"head.{key}" for key in (*_EVERY_GROUP, *_HEAD_ONLY)]
    + [f"worker.{key}" for key in (*_EVERY_GROUP, *_WORKER_ONLY, "groupName")]
    + [f"additionalWorkerGroups.{GROUP}.{key}" for key in (*_EVERY_GROUP, *_WORKER_ONLY)]
)

_KEY_PATHS: frozenset[tuple[str, ...]] = frozenset(tuple(key.split(".")) for key in CHART_VALUE_KEYS)
_PREFIXES: frozenset[tuple[str, ...]] = frozenset(path[:n] for path in _KEY_PATHS for n in range(1, len(path)))


def _normalise(path: tuple[str, ...]) -> tuple[str, ...]:
    if len(path) >= 2 and path[0] == "additionalWorkerGroups":
        return (path[0], GROUP, *path[2:])
    return path


def unknown_value_keys(values: Mapping[str, Any]) -> list[str]:
    """Dotted paths in `values` that the pinned chart does not read (Helm would drop them silently).

    A key the chart reads as a whole (resources, nodeSelector, ...) is a leaf: what is under it is not
    checked here. A list is always a leaf. Anything else must lead to a key the chart reads.
    """
    unknown: list[str] = []

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            here = (*path, str(key))
            shape = _normalise(here)
            if shape in _KEY_PATHS:
                continue
            if shape in _PREFIXES and isinstance(value, Mapping):
                walk(value, here)
            else:
                unknown.append(".".join(here))

    walk(values, ())
    return unknown
