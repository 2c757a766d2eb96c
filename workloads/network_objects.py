"""GKE multi-network objects: one GKENetworkParamSet and one Network per extra NIC of the GPU nodes."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from workloads.nics import ExtraNic

API_VERSION = "networking.gke.io/v1"


@dataclass(frozen=True)
class NetworkMappingArgs:
    nics: list[ExtraNic]
    gvnic_network: pulumi.Input[str]
    gvnic_subnet: pulumi.Input[str]
    rdma_network: pulumi.Input[str]
    rdma_subnets: list[pulumi.Input[str]]  # index = NIC's rdma_index


class NetworkMapping(pulumi.ComponentResource):
    """Maps each node NIC to a pod-visible network name (gvnic-1, rdma-0..7)."""

    resources: list[k8s.apiextensions.CustomResource]

    def __init__(self, name: str, args: NetworkMappingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:NetworkMapping", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.resources = []
        for nic in args.nics:
            if nic.rdma_index is None:
                vpc, subnet = args.gvnic_network, args.gvnic_subnet
            else:
                vpc, subnet = args.rdma_network, args.rdma_subnets[nic.rdma_index]
            param_set = k8s.apiextensions.CustomResource(
                f"{name}-{nic.network}-params",
                api_version=API_VERSION,
                kind="GKENetworkParamSet",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=nic.network),
                spec={"vpc": vpc, "vpcSubnet": subnet, "deviceMode": nic.device_mode},
                opts=child,
            )
            network = k8s.apiextensions.CustomResource(
                f"{name}-{nic.network}",
                api_version=API_VERSION,
                kind="Network",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=nic.network),
                spec={
                    "type": "Device",
                    "parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": nic.network},
                },
                # The Network names its parameter set by a plain string: say the order explicitly.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[param_set]),
            )
            self.resources += [param_set, network]
        self.register_outputs({"networks": [nic.network for nic in args.nics]})
