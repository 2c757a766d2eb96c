"""GKE's gIB NCCL installer: a DaemonSet that puts the RDMA NCCL plugin on each GPU node (/home/kubernetes/bin/gib).

Written here as typed objects, so that what is deployed is in the plan (build/<stack>/manifests), reviewed in diffs
and scanned by checkov, instead of a manifest fetched at deploy time. The facts (images, the install steps, host
paths, node affinity, tolerations, privileges) are those of gpudirect-rdma/nccl-rdma-installer.yaml in
GoogleCloudPlatform/container-engine-accelerators at commit INSTALLER_COMMIT (2026-05-06, installer nccl-plugin-gib
v1.1.1); tests/test_nccl_installer.py holds them. To move to a newer installer: read that file at the new commit,
update the facts below and INSTALLER_COMMIT, and review the plan's diff.

The DaemonSet keeps upstream's privileges: its install script (inside Google's image, /scripts/container_entry.sh)
writes the plugin and its libraries onto the host, and Google publishes it as privileged with the host's network and
PID namespaces. It runs in kube-system (where GKE's own node agents run), not in the Ray namespace, and only as an
init container: the pod then idles in a pause container. Ours, beyond upstream, and changing nothing the install
does: no Kubernetes token (it never calls the API), the runtime's seccomp filter as the pod default (the privileged
installer is unconfined anyway), and the idle pause container locked down and sized.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

# Provenance: the commit whose manifest these facts were read from.
INSTALLER_COMMIT = "2da1c92ff7bd772a2c833710bb6c21dcfe6dfaae"
INSTALLER_SOURCE = (
    "https://github.com/GoogleCloudPlatform/container-engine-accelerators/blob/"
    f"{INSTALLER_COMMIT}/gpudirect-rdma/nccl-rdma-installer.yaml"
)

NAME = "nccl-rdma-installer"
NAMESPACE = "kube-system"
INSTALLER_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"
PAUSE_IMAGE = "gke.gcr.io/pause:3.8@sha256:880e63f94b145e46f1b1082bb71b85e21f16b99b180b9996407d61240ceb9830"
# The GPUs whose nodes get the plugin (A3 Ultra and A4).
GPU_TYPES = ("nvidia-h200-141gb", "nvidia-b200")
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"

# Host directories and where the installer sees them.
HOST_NVIDIA_LIB = "/home/kubernetes/bin/nvidia/lib64"
HOST_GIB = "/home/kubernetes/bin/gib"
MOUNT_PREFIX = "/usr/local"
IMAGE_GIB_DIR = "/var/lib/gib"  # what the image installs from


def install_script() -> str:
    """The installer's steps: the image's own install, then its libraries next to the driver's and the whole plugin
    (lib64, scripts, tuner configs) into the gIB host directory."""
    return (
        "\n".join(
            [
                "set -ex",
                "/scripts/container_entry.sh install",
                f"cp -r {IMAGE_GIB_DIR}/lib64/. {MOUNT_PREFIX}{HOST_NVIDIA_LIB}",
                f"cp -r {IMAGE_GIB_DIR}/. {MOUNT_PREFIX}{HOST_GIB}",
                'echo "installation finishes"',
            ]
        )
        + "\n"
    )


def daemonset_labels() -> dict[str, str]:
    return {"k8s-app": NAME}


# The pause container: it only sleeps (the image runs as its own unprivileged user).
PAUSE_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
PAUSE_RESOURCES = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}}


def pod_spec() -> dict[str, Any]:
    """The pod template's spec, as plain data (tested against the Kubernetes schema and upstream's facts)."""
    return {
        "priorityClassName": "system-node-critical",
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": ACCELERATOR_LABEL, "operator": "In", "values": list(GPU_TYPES)}]}
                    ]
                }
            }
        },
        # Every taint: the GPU nodes carry nvidia.com/gpu and may carry others (spot, flex-start).
        "tolerations": [{"operator": "Exists"}],
        "hostNetwork": True,
        "hostPID": True,
        "volumes": [
            {"name": "library-dir-host", "hostPath": {"path": HOST_NVIDIA_LIB, "type": "DirectoryOrCreate"}},
            {"name": "gib", "hostPath": {"path": HOST_GIB}},
        ],
        "initContainers": [
            {
                "name": NAME,
                "image": INSTALLER_IMAGE,
                "command": ["/bin/sh", "-c"],
                "args": [install_script()],
                "resources": {"requests": {"cpu": "150m"}},
                "securityContext": {"privileged": True},
                "volumeMounts": [
                    {"name": "library-dir-host", "mountPath": f"{MOUNT_PREFIX}{HOST_NVIDIA_LIB}"},
                    {"name": "gib", "mountPath": f"{MOUNT_PREFIX}{HOST_GIB}"},
                ],
            }
        ],
        "containers": [
            {
                "name": "pause",
                "image": PAUSE_IMAGE,
                "securityContext": PAUSE_SECURITY_CONTEXT,
                "resources": PAUSE_RESOURCES,
            }
        ],
    }


class NcclInstaller(pulumi.ComponentResource):
    daemonset: k8s.apps.v1.DaemonSet

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:NcclInstaller", name, None, opts)
        labels = daemonset_labels()
        self.daemonset = k8s.apps.v1.DaemonSet(
            name,
            # `pulumi up` waits for the object, not for every GPU node's install: a worker restarts until the plugin
            # is on its node (workloads/ray_values.py), and a node that cannot run it must not hang the update.
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=NAME, namespace=NAMESPACE, labels=labels, annotations={"pulumi.com/skipAwait": "true"}
            ),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="RollingUpdate"),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels={**labels, "name": NAME}),
                    spec=pod_spec(),  # type: ignore[arg-type]  # plain data in the API's shape
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"name": self.daemonset.metadata.name, "source": INSTALLER_SOURCE})
