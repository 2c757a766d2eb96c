"""The Lustre instance as a Kubernetes volume: a statically bound PersistentVolume and its claim."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

LUSTRE_CSI_DRIVER = "lustre.csi.storage.gke.io"


@dataclass(frozen=True)
class LustreVolumeArgs:
    pv_name: str
    pvc_name: str
    namespace: pulumi.Input[str]
    project: str
    zone: str
    instance_id: pulumi.Input[str]
    ip: pulumi.Input[str]
    filesystem: pulumi.Input[str]
    capacity_gib: pulumi.Input[str]


def volume_handle(project: str, zone: str, instance_id: str) -> str:
    return f"{project}/{zone}/{instance_id}"


class LustreVolume(pulumi.ComponentResource):
    """Retain policy: deleting the volume objects never touches the data on Lustre."""

    pv: k8s.core.v1.PersistentVolume
    pvc: k8s.core.v1.PersistentVolumeClaim

    def __init__(self, name: str, args: LustreVolumeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:LustreVolume", name, None, opts)
        capacity = pulumi.Output.from_input(args.capacity_gib).apply(lambda gib: f"{gib}Gi")
        # Empty storage class: bind to this volume only, never dynamically provision another one.
        self.pv = k8s.core.v1.PersistentVolume(
            f"{name}-pv",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.pv_name),
            spec=k8s.core.v1.PersistentVolumeSpecArgs(
                storage_class_name="",
                capacity={"storage": capacity},
                access_modes=["ReadWriteMany"],
                persistent_volume_reclaim_policy="Retain",
                volume_mode="Filesystem",
                claim_ref=k8s.core.v1.ObjectReferenceArgs(namespace=args.namespace, name=args.pvc_name),
                csi=k8s.core.v1.CSIPersistentVolumeSourceArgs(
                    driver=LUSTRE_CSI_DRIVER,
                    volume_handle=pulumi.Output.from_input(args.instance_id).apply(
                        lambda instance_id: volume_handle(args.project, args.zone, instance_id)
                    ),
                    volume_attributes={"ip": args.ip, "filesystem": args.filesystem},
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.pvc = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-pvc",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.pvc_name, namespace=args.namespace),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                storage_class_name="",
                volume_name=self.pv.metadata.name,
                access_modes=["ReadWriteMany"],
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": capacity}),
            ),
            # Binding can take a moment after the volume appears; the Ray pods wait for the claim anyway. A claim on
            # a static volume cannot be resized: when the instance grows, the volume follows and the claim stays.
            opts=pulumi.ResourceOptions(
                parent=self,
                custom_timeouts=pulumi.CustomTimeouts(create="10m"),
                ignore_changes=["spec.resources"],
            ),
        )
        self.register_outputs({"pv": self.pv.metadata.name, "pvc": self.pvc.metadata.name})
