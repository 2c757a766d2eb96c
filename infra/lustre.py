"""Managed Lustre on the cluster VPC, reached through private services access."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.services import ProjectServices
from infra.settings import StorageSettings

LUSTRE_PREVENT_DELETION = "PREVENT"


@dataclass(frozen=True)
class LustreArgs:
    settings: StorageSettings
    network_id: pulumi.Input[str]  # the cluster VPC, as projects/{p}/global/networks/{n}
    services: ProjectServices


def lustre_ip(mount_point: str) -> str:
    """The server address in a Lustre mount point such as '10.32.0.2@tcp:/lustrefs'."""
    return mount_point.split("@", 1)[0]


class ManagedLustre(pulumi.ComponentResource):
    """Depends on the VPC and its peering only, never on the cluster: it takes far longer than GKE, so
    both are created side by side."""

    instance: gcp.lustre.Instance

    def __init__(self, name: str, args: LustreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:ManagedLustre", name, None, opts)
        services = args.services
        child = pulumi.ResourceOptions(parent=self, depends_on=services.needed_by("compute"))
        peering = ipaddress.ip_network(args.settings.ranges.lustre_peering)

        self.peering_range = gcp.compute.GlobalAddress(
            f"{name}-range",
            name=f"{args.settings.lustre_instance_id}-range",
            project=args.settings.project,
            purpose="VPC_PEERING",
            address_type="INTERNAL",
            address=str(peering.network_address),
            prefix_length=peering.prefixlen,
            network=args.network_id,
            opts=child,
        )
        # REMOVE_PEERING: plain DELETE fails while the producer still holds the range, and ABANDON leaves a
        # peering behind that then blocks deleting the VPC. Removing the peering lets destroy run to the end.
        self.peering = gcp.servicenetworking.Connection(
            f"{name}-peering",
            network=args.network_id,
            service="servicenetworking.googleapis.com",
            reserved_peering_ranges=[self.peering_range.name],
            deletion_policy="REMOVE_PEERING",
            opts=pulumi.ResourceOptions(parent=self, depends_on=services.needed_by("servicenetworking")),
        )
        # Lustre servers open connections to their clients too (lock callbacks, recovery): admit the peering
        # range on the Lustre ports, 988 and the legacy 6988 the GKE driver uses. Nothing else, nowhere else.
        self.firewall = gcp.compute.Firewall(
            f"{name}-ingress",
            name=f"{args.settings.lustre_instance_id}-ingress",
            project=args.settings.project,
            network=args.network_id,
            direction="INGRESS",
            # From the address resource, not the config: the firewall follows the range actually reserved.
            source_ranges=[
                pulumi.Output.concat(
                    self.peering_range.address, "/", self.peering_range.prefix_length.apply(lambda n: str(n))
                )
            ],
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["988", "6988"])],
            opts=child,
        )
        self.instance = gcp.lustre.Instance(
            name,
            instance_id=args.settings.lustre_instance_id,
            project=args.settings.project,
            location=args.settings.zone,
            network=args.network_id,
            capacity_gib=str(args.settings.lustre.capacity_gib),
            per_unit_storage_throughput=str(args.settings.lustre.throughput_mbps_per_tib),
            filesystem=args.settings.lustre.filesystem,
            gke_support_enabled=True,
            # A second lock beside Pulumi's protect: the provider refuses to delete the instance (destroy or
            # replacement) while its state says PREVENT. Lifted by setting protectData false and running `pulumi up`.
            deletion_policy=LUSTRE_PREVENT_DELETION if args.settings.protect_data else None,
            # The instance can only be created once the peering exists; nothing carries that as data. A replacement
            # (allowed, protectData off) deletes the old instance first: the new one has the same instance_id, which
            # the API would refuse while the old one exists, and pulumi-terraform-bridge asks for delete-first only
            # for a resource whose `name` is set (this one is named by instance_id).
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.peering, *services.needed_by("lustre")],
                protect=args.settings.protect_data,
                delete_before_replace=True,
            ),
        )
        self.ip = self.instance.mount_point.apply(lustre_ip)

        self.register_outputs(
            {
                "instanceId": self.instance.instance_id,
                "ip": self.ip,
                "filesystem": self.instance.filesystem,
                "mountPoint": self.instance.mount_point,
                "capacityGib": self.instance.capacity_gib,
            }
        )
