"""Outbound internet for private nodes: a Cloud Router and Cloud NAT on the cluster VPC, and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.network import Networks
from infra.services import ProjectServices
from infra.settings import SiteSettings

# Private nodes have no external IP, yet pull the NeMo RL image from nvcr.io and models and datasets from Hugging
# Face. Google APIs need no NAT (the cluster subnet has Private Google Access). The gVNIC and RDMA VPCs carry only
# node-to-node traffic between GPU nodes, so they get no router and no NAT.
NAT_SOURCE_RANGES = ["ALL_IP_RANGES"]  # the subnet's primary (node) range and its secondary (pod, service) ranges


@dataclass(frozen=True)
class ClusterEgressArgs:
    settings: SiteSettings
    networks: Networks
    services: ProjectServices


class ClusterEgress(pulumi.ComponentResource):
    """Cloud Router and Cloud NAT (automatically allocated addresses) for the cluster subnet only."""

    router: gcp.compute.Router
    nat: gcp.compute.RouterNat

    def __init__(self, name: str, args: ClusterEgressArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:ClusterEgress", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=args.services.needed_by("compute"))
        networks = args.networks

        self.router = gcp.compute.Router(
            f"{name}-router",
            name=f"{args.settings.cluster_name}-router",
            project=args.settings.project,
            region=args.settings.region,
            network=networks.cluster_network.id,
            opts=child,
        )
        self.nat = gcp.compute.RouterNat(
            f"{name}-nat",
            name=f"{args.settings.cluster_name}-nat",
            project=args.settings.project,
            region=args.settings.region,
            router=self.router.name,
            nat_ip_allocate_option="AUTO_ONLY",
            # Named subnets only, so a subnet added to the VPC later gets no internet access by accident.
            source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
            subnetworks=[
                gcp.compute.RouterNatSubnetworkArgs(
                    name=networks.cluster_subnet.id, source_ip_ranges_to_nats=NAT_SOURCE_RANGES
                )
            ],
            # Failed translations (e.g. ports run out during a large image pull) show in Cloud Logging.
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=child,
        )
        self.register_outputs({"router": self.router.name, "nat": self.nat.name})
