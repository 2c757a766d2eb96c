"""The NeMo RL image, pulled onto every node as soon as the node exists: a DaemonSet that only holds the image.

Without it a GPU node pulls the image (tens of GB) only when its Ray worker pod lands there, and that pod exists only
once the Ray cluster is installed, after Managed Lustre: the pull then sits on the longest path to the first GRPO
step. The DaemonSet needs nothing but the cluster, so each node starts pulling the moment it joins (and the CPU node
for the Ray head and the submitter too); the kubelet keeps an image in use by a running container, so the Ray pods
find it in place. A DaemonSet pod never makes the cluster autoscaler add a node, so nothing here starts or bills a
GPU node on its own.

The container runs the exact image reference the Ray pods run (digest included when the settings pin one), as a
non-root user, with nothing to do but sleep: no network, no token, no writable filesystem, a few millicores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.settings import IMAGE_HOLDER
from workloads.ray_values import GPU_RESOURCE, PART_OF

# Beside GKE's own node-level DaemonSets (and the gIB installer): not in the Ray namespace, so it depends on nothing
# but the cluster and needs no namespace of its own.
PREPULL_NAMESPACE = "kube-system"
# Any unprivileged user: the holder reads nothing and writes nothing (`nobody` on the image's Ubuntu base).
NOBODY = 65534
HOLD_COMMAND = ["sleep", "infinity"]
COMPONENT = "image-prepull"
SKIP_AWAIT = "pulumi.com/skipAwait"


@dataclass(frozen=True)
class ImagePrepullArgs:
    name: str
    image: str  # the Ray pods' image, exactly as the settings give it


def prepull_daemonset(name: str, image: str) -> dict[str, Any]:
    """The DaemonSet as a plain manifest (pure: tested and rendered without Pulumi)."""
    labels = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/component": COMPONENT,
    }
    resources = {"cpu": IMAGE_HOLDER.cpu, "memory": IMAGE_HOLDER.memory}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": PREPULL_NAMESPACE,
            "labels": labels,
            # `pulumi up` waits for the object, not for every node's pull (which takes minutes and may outlast the
            # provider's rollout timeout on a fresh node).
            "annotations": {SKIP_AWAIT: "true"},
        },
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            # A new image reference rolls every node at once: each starts pulling the new image right away.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    # sleep ignores SIGTERM as PID 1: no reason to wait the default 30 s on a deletion.
                    "terminationGracePeriodSeconds": 1,
                    # GPU nodes carry the nvidia.com/gpu taint; CPU nodes have none. Every node gets a holder.
                    "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": NOBODY,
                        "runAsGroup": NOBODY,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "hold",
                            "image": image,
                            # Always: the kubelet resolves the reference and reuses the layers it has; the holder
                            # never keeps a stale image under a re-pushed tag.
                            "imagePullPolicy": "Always",
                            "command": HOLD_COMMAND,
                            "resources": {"requests": dict(resources), "limits": dict(resources)},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True,
                                "runAsUser": NOBODY,
                                "runAsGroup": NOBODY,
                                "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            # The holder is alive as long as its sleep is; a probe that runs a no-op says so.
                            "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 300},
                            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 300},
                        }
                    ],
                },
            },
        },
    }


def holder_network_policy(name: str) -> dict[str, Any]:
    """The holder talks to nothing and nothing talks to it: no ingress, no egress (the kubelet pulls the image on
    the node's own network, which no NetworkPolicy touches)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-no-traffic", "namespace": PREPULL_NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "policyTypes": ["Ingress", "Egress"],
        },
    }


class ImagePrepull(pulumi.ComponentResource):
    """Created right after the cluster (through its provider), with no dependency on Lustre or the Ray cluster."""

    daemonset: k8s.apps.v1.DaemonSet
    network_policy: k8s.networking.v1.NetworkPolicy

    def __init__(self, name: str, args: ImagePrepullArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:ImagePrepull", name, None, opts)
        manifest = prepull_daemonset(args.name, args.image)
        self.daemonset = k8s.apps.v1.DaemonSet(
            name,
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self),
        )
        policy = holder_network_policy(args.name)
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-no-traffic",
            metadata=policy["metadata"],
            spec=policy["spec"],
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"daemonset": self.daemonset.metadata.name, "image": args.image})
