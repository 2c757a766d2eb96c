"""GKE's gIB NCCL installer: a DaemonSet that puts the RDMA NCCL plugin on each GPU node (/home/kubernetes/bin/gib)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

# Pinned to a commit of GoogleCloudPlatform/container-engine-accelerators (2026-05-06, installer nccl-plugin-gib
# v1.1.1), never the moving master branch: an upstream change reaches us only when we bump this.
INSTALLER_COMMIT = "2da1c92ff7bd772a2c833710bb6c21dcfe6dfaae"
INSTALLER_URL = (
    "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/"
    f"{INSTALLER_COMMIT}/gpudirect-rdma/nccl-rdma-installer.yaml"
)


class NcclInstaller(pulumi.ComponentResource):
    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:NcclInstaller", name, None, opts)
        self.manifest = k8s.yaml.v2.ConfigFile(
            f"{name}-manifest", file=INSTALLER_URL, opts=pulumi.ResourceOptions(parent=self)
        )
        self.register_outputs({"url": INSTALLER_URL})
