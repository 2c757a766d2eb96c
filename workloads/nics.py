"""The pod-side names of the GPU nodes' extra NICs. One list: network objects and pod annotations use it."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ExtraNic:
    network: str  # name of the GKE Network and GKENetworkParamSet objects
    interface: str  # interface name inside the pod
    device_mode: str  # NetDevice for gVNIC, RDMA for the ConnectX NICs
    rdma_index: int | None  # which RDMA subnet, None for the gVNIC


def extra_nics(rdma_count: int = 8) -> list[ExtraNic]:
    """eth1 is the second gVNIC; eth2..eth(1+rdma_count) are the RDMA NICs, in GPU order."""
    nics = [ExtraNic(network="gvnic-1", interface="eth1", device_mode="NetDevice", rdma_index=None)]
    nics += [
        ExtraNic(network=f"rdma-{n}", interface=f"eth{n + 2}", device_mode="RDMA", rdma_index=n)
        for n in range(rdma_count)
    ]
    return nics


DEFAULT_INTERFACE = "eth0"


def interfaces_annotation(nics: list[ExtraNic]) -> str:
    """Value of the pod annotation networking.gke.io/interfaces: eth0 on the default network, then each NIC."""
    entries = [{"interfaceName": DEFAULT_INTERFACE, "network": "default"}]
    entries += [{"interfaceName": nic.interface, "network": nic.network} for nic in nics]
    return json.dumps(entries)


def pod_network_annotations(nics: list[ExtraNic]) -> dict[str, str]:
    return {
        "networking.gke.io/default-interface": DEFAULT_INTERFACE,
        "networking.gke.io/interfaces": interfaces_annotation(nics),
    }
