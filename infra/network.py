"""The three VPCs a GPU node needs: the cluster VPC, a second gVNIC VPC and the RoCE VPC for GPU RDMA."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.gke_rules import GVNIC_MTU
from infra.services import ProjectServices
from infra.settings import NetworkSettings

POD_RANGE_NAME = "pods"
SERVICE_RANGE_NAME = "services"
RDMA_MTU = 8896
# Jumbo frames elsewhere too: the second gVNIC network as Google's A3 Ultra/A4 setups have it (see gke_rules), and
# Managed Lustre is fastest over a VPC with 8896 (the most GCP allows).
CLUSTER_MTU = 8896


@dataclass(frozen=True)
class NetworksArgs:
    settings: NetworkSettings  # its zone: the RoCE network profile is zonal, it pins the RDMA VPC to the GPU zone
    services: ProjectServices


def roce_network_profile(project: str, zone: str) -> str:
    return f"projects/{project}/global/networkProfiles/{zone}-vpc-roce"


class Networks(pulumi.ComponentResource):
    """Cluster VPC (VPC-native), gVNIC VPC with an internal-only firewall, RDMA VPC with 8 subnets."""

    cluster_network: gcp.compute.Network
    cluster_subnet: gcp.compute.Subnetwork
    gvnic_network: gcp.compute.Network
    gvnic_subnet: gcp.compute.Subnetwork
    rdma_network: gcp.compute.Network
    rdma_subnets: list[gcp.compute.Subnetwork]

    def __init__(self, name: str, args: NetworksArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:Networks", name, None, opts)
        # Every child calls the Compute API.
        child = pulumi.ResourceOptions(parent=self, depends_on=args.services.needed_by("compute"))
        prefix, ranges = args.settings.cluster_name, args.settings.ranges

        self.cluster_network = gcp.compute.Network(
            f"{name}-cluster",
            name=f"{prefix}-net",
            project=args.settings.project,
            auto_create_subnetworks=False,
            mtu=CLUSTER_MTU,
            opts=child,
        )
        self.cluster_subnet = gcp.compute.Subnetwork(
            f"{name}-cluster",
            name=f"{prefix}-subnet",
            project=args.settings.project,
            region=args.settings.region,
            network=self.cluster_network.id,
            ip_cidr_range=ranges.cluster_subnet,
            private_ip_google_access=True,
            secondary_ip_ranges=[
                gcp.compute.SubnetworkSecondaryIpRangeArgs(range_name=POD_RANGE_NAME, ip_cidr_range=ranges.pods),
                gcp.compute.SubnetworkSecondaryIpRangeArgs(
                    range_name=SERVICE_RANGE_NAME, ip_cidr_range=ranges.services
                ),
            ],
            opts=child,
        )

        self.gvnic_network = gcp.compute.Network(
            f"{name}-gvnic",
            name=f"{prefix}-gvnic-net",
            project=args.settings.project,
            auto_create_subnetworks=False,
            mtu=GVNIC_MTU,
            opts=child,
        )
        self.gvnic_subnet = gcp.compute.Subnetwork(
            f"{name}-gvnic",
            name=f"{prefix}-gvnic-sub",
            project=args.settings.project,
            region=args.settings.region,
            network=self.gvnic_network.id,
            ip_cidr_range=ranges.gvnic_subnet,
            opts=child,
        )
        # Node-to-node traffic on the second NIC only; the source is our own subnet, never the internet.
        self.gvnic_firewall = gcp.compute.Firewall(
            f"{name}-gvnic-internal",
            name=f"{prefix}-gvnic-internal",
            project=args.settings.project,
            network=self.gvnic_network.id,
            direction="INGRESS",
            source_ranges=[ranges.gvnic_subnet],
            allows=[
                gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["0-65535"]),
                gcp.compute.FirewallAllowArgs(protocol="udp", ports=["0-65535"]),
                gcp.compute.FirewallAllowArgs(protocol="icmp"),
            ],
            opts=child,
        )

        self.rdma_network = gcp.compute.Network(
            f"{name}-rdma",
            name=f"{prefix}-rdma-net",
            project=args.settings.project,
            auto_create_subnetworks=False,
            network_profile=roce_network_profile(args.settings.project, args.settings.zone),
            mtu=RDMA_MTU,
            opts=child,
        )
        # One subnet per GPU NIC. Each depends only on the network (through its id), so all 8 build at once.
        self.rdma_subnets = [
            gcp.compute.Subnetwork(
                f"{name}-rdma-{n}",
                name=f"{prefix}-rdma-sub-{n}",
                project=args.settings.project,
                region=args.settings.region,
                network=self.rdma_network.id,
                ip_cidr_range=cidr,
                opts=child,
            )
            for n, cidr in enumerate(ranges.rdma_subnets)
        ]

        self.register_outputs(
            {
                "clusterNetwork": self.cluster_network.name,
                "clusterSubnet": self.cluster_subnet.name,
                "gvnicNetwork": self.gvnic_network.name,
                "gvnicSubnet": self.gvnic_subnet.name,
                "rdmaNetwork": self.rdma_network.name,
                "rdmaSubnets": [subnet.name for subnet in self.rdma_subnets],
            }
        )
