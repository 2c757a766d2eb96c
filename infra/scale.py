"""What the settings must hold for N GPU nodes: address ranges, the Ray head, compact placement. Pure functions,
no Pulumi: infra/settings.py calls them before any resource is registered, so a stack sized past what its
ranges or its head can carry is refused with the key to change.

Sources for the figures below:
- GCP reserves four addresses in every subnet's primary range (network, gateway, second-to-last, broadcast); none
  in secondary ranges (VPC docs: subnets, "Unusable addresses in IPv4 subnet ranges").
- A GKE Standard node takes a pod CIDR block from the cluster's pod range sized for twice its maximum pods,
  rounded up to a power of two: /24 at the default 110 pods per node (GKE docs: how-to/flexible-pod-cidr, "the
  node's pod CIDR block"). The cluster sets no max-pods, so every node takes a /24.
- The services range must be /27 or larger; GKE's own default is /20 (GKE docs: how-to/alias-ips, "Secondary range
  for Services"; the sizing table of concepts/alias-ips).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from infra.sizing import GIB, cpu_cores, memory_bytes

SUBNET_RESERVED_ADDRESSES = 4
DEFAULT_MAX_PODS_PER_NODE = 110
SERVICES_MIN_PREFIX = 27
# A surge node during a CPU pool upgrade (GKE's default max-surge of 1; the GPU pool upgrades with max_surge 0).
CPU_POOL_SURGE_NODES = 1


def pod_block_prefix(max_pods_per_node: int = DEFAULT_MAX_PODS_PER_NODE) -> int:
    """The prefix of the pod CIDR block GKE gives each node: room for twice its pods, a power of two."""
    addresses = 2 ** math.ceil(math.log2(2 * max_pods_per_node))
    return 32 - int(math.log2(addresses))


@dataclass(frozen=True)
class RangeProblem:
    """A range too small for the nodes it must address: the config key, its value, and what would do."""

    key: str
    value: str
    allowed: str


def range_problems(
    cluster_subnet: str,
    pods: str,
    services: str,
    gvnic_subnet: str,
    rdma_subnets: tuple[str, ...],
    gpu_nodes: int,
    cpu_max_nodes: int,
) -> list[RangeProblem]:
    """Every range that cannot address the nodes the stack may run: each node (GPU and CPU, and a CPU surge node)
    has a primary address in the cluster subnet and a /24 from the pod range; each GPU node one address in the
    gVNIC subnet and one in each RDMA subnet (one subnet per GPU NIC)."""
    problems: list[RangeProblem] = []
    all_nodes = gpu_nodes + cpu_max_nodes + CPU_POOL_SURGE_NODES
    who_all = f"{gpu_nodes} GPU + {cpu_max_nodes} CPU (cpuPoolMaxNodes) + {CPU_POOL_SURGE_NODES} upgrade surge node"

    def primary(key: str, cidr: str, nodes: int, who: str) -> None:
        network = ipaddress.ip_network(cidr)
        usable = network.num_addresses - SUBNET_RESERVED_ADDRESSES
        if usable < nodes:
            prefix = 32 - math.ceil(math.log2(nodes + SUBNET_RESERVED_ADDRESSES))
            problems.append(
                RangeProblem(
                    key,
                    cidr,
                    f"a /{prefix} or larger: {usable} usable addresses (GCP keeps {SUBNET_RESERVED_ADDRESSES}) for "
                    f"{nodes} nodes ({who})",
                )
            )

    primary("networkRanges.clusterSubnet", cluster_subnet, all_nodes, who_all)
    block = pod_block_prefix()
    pod_range = ipaddress.ip_network(pods)
    pod_blocks = 2 ** (block - pod_range.prefixlen) if pod_range.prefixlen <= block else 0
    if pod_blocks < all_nodes:
        needed = block - math.ceil(math.log2(all_nodes))
        problems.append(
            RangeProblem(
                "networkRanges.pods",
                pods,
                f"a /{needed} or larger: each node takes a /{block} of it ({DEFAULT_MAX_PODS_PER_NODE} pods per "
                f"node, GKE's default), and {pods} holds {pod_blocks} for {all_nodes} nodes ({who_all})",
            )
        )
    if ipaddress.ip_network(services).prefixlen > SERVICES_MIN_PREFIX:
        problems.append(
            RangeProblem("networkRanges.services", services, f"a /{SERVICES_MIN_PREFIX} or larger (GKE's minimum)")
        )
    primary("networkRanges.gvnicSubnet", gvnic_subnet, gpu_nodes, f"{gpu_nodes} GPU nodes (gpuNodes), one each")
    for n, cidr in enumerate(rdma_subnets):
        primary(
            f"networkRanges.rdmaSubnets[{n}]", cidr, gpu_nodes, f"{gpu_nodes} GPU nodes (gpuNodes), one RDMA NIC each"
        )
    return problems


# The Ray head at scale. Ray's guidance for large clusters (Ray docs: cluster/vms/user-guides/large-cluster-best-
# practices, "Configuring the head node"): the head's GCS, dashboard and autoscaler load grows with the nodes and
# the tasks and actors they run; it names a machine of at least 8 vCPUs and 32 GB for large clusters. NeMo RL adds
# its driver on the head (`ray job submit` runs the entrypoint there): the driver of a 32-node run holds the
# collective's metadata and every worker group's handles, and the head keeps the object store for the batches
# sent to the workers. We ask for the Ray floor plus one core and 8 GiB per GPU worker, so a head sized for two
# nodes (the smallest CPU machine here) is refused at sizes that load it well past that. A rule of ours, stated
# so: no published figure sizes the head per worker.
HEAD_BASE_CPU = 8.0
HEAD_BASE_MEMORY_BYTES = 32 * 10**9
HEAD_CPU_PER_WORKER = 1.0
HEAD_MEMORY_PER_WORKER_BYTES = 8 * GIB


def head_minimum(workers: int) -> tuple[float, int]:
    """(cores, bytes) the Ray head should have for `workers` GPU workers."""
    cores = HEAD_BASE_CPU + HEAD_CPU_PER_WORKER * workers
    return cores, HEAD_BASE_MEMORY_BYTES + HEAD_MEMORY_PER_WORKER_BYTES * workers


def head_problems(cpu: str, memory: str, workers: int) -> list[RangeProblem]:
    cores, size = head_minimum(workers)
    problems = []
    why = (
        f"for {workers} GPU workers (rayWorkerReplicas): Ray's large-cluster floor of {HEAD_BASE_CPU:g} cores and "
        f"{HEAD_BASE_MEMORY_BYTES // 10**9} GB, plus {HEAD_CPU_PER_WORKER:g} core and "
        f"{HEAD_MEMORY_PER_WORKER_BYTES // GIB}Gi per worker (docs/design.md, Beyond two nodes); a larger "
        "cpuMachineType gives it room"
    )
    if cpu_cores(cpu) < cores:
        problems.append(RangeProblem("rayHead.cpu", cpu, f"at least {cores:g} cores {why}"))
    if memory_bytes(memory) < size:
        problems.append(RangeProblem("rayHead.memory", memory, f"at least {math.ceil(size / GIB)}Gi {why}"))
    return problems


# Compact placement (GKE docs: how-to/compact-placement; AI Hypercomputer docs: placement-policy-and-workload-policy):
# - nodes of a compact placement are in one zone (the GPU pool is single-zone: node_locations=[zone]);
# - a compact placement group holds at most 1,500 nodes (the page's current figure, given in its Autopilot section;
#   older versions of the page said 150: a spot or flex-start pool past 150 nodes may still be refused by GKE);
# - VMs obtained through a reservation are already densely colocated by it (its blocks and sub-blocks, AI Hypercomputer
#   doc), so a reservation-bound pool is given no policy of ours: only spot and flex-start pools get one (whether GKE
#   would accept one on a reservation-bound pool is not verified here);
# - A3 Ultra (a3-ultragpu-8g) and A4 (a4-highgpu-8g) are among the GPU machines compact placement policies apply
#   to (AI Hypercomputer placement-policy doc lists A4X, A4, A3 Ultra, A3 Mega, A3 High).
COMPACT_PLACEMENT_MAX_NODES = 1_500
COMPACT_PLACEMENT_MACHINES = ("a3-ultragpu-8g", "a4-highgpu-8g")
COMPACT_PLACEMENT_PROVISIONING = ("spot", "flexStart")


def compact_placement(provisioning: str, machine_type: str, max_nodes: int) -> bool:
    """Whether the GPU pool gets a COMPACT placement policy: spot and flex-start pools of a machine type GKE
    places compactly, no larger than one placement group."""
    return (
        provisioning in COMPACT_PLACEMENT_PROVISIONING
        and machine_type in COMPACT_PLACEMENT_MACHINES
        and max_nodes <= COMPACT_PLACEMENT_MAX_NODES
    )


def compact_placement_problem(provisioning: str, machine_type: str, max_nodes: int) -> RangeProblem | None:
    """A spot or flex-start pool larger than one compact placement group: refused rather than placed loosely."""
    placed = provisioning in COMPACT_PLACEMENT_PROVISIONING and machine_type in COMPACT_PLACEMENT_MACHINES
    if placed and max_nodes > COMPACT_PLACEMENT_MAX_NODES:
        return RangeProblem(
            "gpuNodes",
            str(max_nodes),
            f"at most {COMPACT_PLACEMENT_MAX_NODES} with gpuProvisioning {provisioning}: one compact placement "
            "group's limit (GKE docs: how-to/compact-placement)",
        )
    return None
