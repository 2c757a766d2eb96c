"""Wires the infra settings into components. __main__ calls build_infra; tests and the planner do too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from infra import day2
from infra.cluster import ClusterArgs, GkeCluster
from infra.cost import CostInputs, estimate
from infra.export_bucket import ExportBucket, ExportBucketArgs
from infra.gpu_pool import GpuNodePool, GpuNodePoolArgs
from infra.lustre import LustreArgs, ManagedLustre
from infra.nat import ClusterEgress, ClusterEgressArgs
from infra.network import Networks, NetworksArgs
from infra.presets import BOOT_DISK_GIB, CPU_BOOT_DISK_TYPE
from infra.services import ProjectServices, ProjectServicesArgs
from infra.settings import EXPORT_BUCKET_CREATE, InfraSettings


@dataclass
class Infra:
    networks: Networks
    cluster: GkeCluster
    gpu_pool: GpuNodePool
    lustre: ManagedLustre
    services: ProjectServices
    export_bucket: ExportBucket | None = None
    egress: ClusterEgress | None = None  # Cloud NAT, with private nodes


def self_reference_name() -> str:
    """This stack, as a StackReference names it: `<organization>/<project>/<stack>`."""
    return f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"


async def check_against_last_deployment(current: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """Read what the last deployment recorded (the stack's own `deployedSettings` output; none on a first
    deployment) and raise day2.ReplacementRefused for a change that is not allowed. Warns about allowReplace
    entries that change nothing now: left there, they would let a later change through unasked."""
    name = self_reference_name()
    try:
        last = pulumi.StackReference("last-deployment", stack_name=name)
        details = await last.get_output_details(day2.DEPLOYED_SETTINGS_OUTPUT)
    except Exception as error:
        # Logged as well as raised: the engine may report the failed read itself, before this error.
        message = (
            f"the day-2 guard could not read this stack's last deployment through a StackReference to {name}: "
            f"{error}. On a DIY backend (a bucket or directory) in the legacy layout, without .pulumi/meta.yaml, a "
            "name with '/' cannot be read: run `pulumi state upgrade` once, then `pulumi up` again"
        )
        pulumi.log.error(message)
        raise pulumi.RunError(message) from error
    previous = details.value if details.value is not None else details.secret_value
    for key in day2.check(previous, current, allowed):
        pulumi.log.warn(
            f"allowReplace lists {key}, which does not change now: remove it once the change is deployed "
            f"(pulumi config rm --path 'allowReplace[{allowed.index(key)}]')"
        )


def what_the_record_describes(infra: Infra) -> list[pulumi.CustomResource]:
    """The resources whose settings the day-2 record describes: it is written only once each of them exists."""
    networks = infra.networks
    resources: list[pulumi.CustomResource] = [
        networks.cluster_network,
        networks.cluster_subnet,
        networks.gvnic_subnet,
        *networks.rdma_subnets,
        infra.cluster.cluster,
        infra.cluster.cpu_pool,
        infra.gpu_pool.pool,
        infra.lustre.instance,
        infra.lustre.peering_range,
    ]
    if infra.egress:
        resources.append(infra.egress.nat)
    if infra.export_bucket:
        resources.append(infra.export_bucket.bucket)
    return resources


def record_once_built(record: Mapping[str, Any], resources: Sequence[pulumi.CustomResource]) -> pulumi.Output[Any]:
    """The day-2 record as an output that resolves only once every resource it describes was created or updated. An
    `up` that fails on one of them leaves the output unresolved, so the stack keeps the last deployment's record (the
    engine merges a failed update's outputs into the old ones) and the next `up` compares against what exists."""
    return pulumi.Output.all(*[resource.id for resource in resources]).apply(lambda _: dict(record))


def build_infra(settings: InfraSettings) -> Infra:
    # A new project has none of the APIs on: each resource below waits for the ones it calls.
    services = ProjectServices("apis", ProjectServicesArgs(project=settings.project))
    networks = Networks("networks", NetworksArgs(settings, services))
    # Lustre needs only the VPC: it builds while the cluster does.
    lustre = ManagedLustre("lustre", LustreArgs(settings, networks.cluster_network.id, services))
    protect_cluster, protect_gpu_pool = day2.compute_locks(settings.protect_compute, settings.allow_replace)
    cluster = GkeCluster("gke", ClusterArgs(settings, networks, services, protect=protect_cluster))
    # Private nodes reach nvcr.io and Hugging Face through Cloud NAT; nodes with public IPs need none.
    egress = (
        ClusterEgress("egress", ClusterEgressArgs(settings, networks, services)) if settings.private_nodes else None
    )
    gpu_pool = GpuNodePool("gpu", GpuNodePoolArgs(settings, cluster, networks, protect=protect_gpu_pool))
    export_bucket = None
    if settings.export_bucket == EXPORT_BUCKET_CREATE:
        export_bucket = ExportBucket("model-export", ExportBucketArgs(settings, services))
    return Infra(
        networks=networks,
        cluster=cluster,
        gpu_pool=gpu_pool,
        lustre=lustre,
        services=services,
        export_bucket=export_bucket,
        egress=egress,
    )


def cost_inputs(settings: InfraSettings) -> CostInputs:
    return CostInputs(
        region=settings.region,
        gpu_machine_type=settings.preset.machine_type,
        gpu_provisioning=settings.gpu_provisioning,
        gpu_nodes=settings.gpu_nodes,
        ray_worker_replicas=settings.ray_worker_replicas,
        gpu_autoscaling=settings.gpu_autoscaling,
        cpu_machine_type=settings.cpu_machine_type,
        cpu_nodes=settings.cpu_pool_min_nodes,
        lustre_capacity_gib=settings.lustre.capacity_gib,
        lustre_tier=settings.lustre.throughput_mbps_per_tib,
        protect_data=settings.protect_data,
        gpu_boot_disk_type=settings.preset.boot_disk_type,
        gpu_boot_disk_gib=BOOT_DISK_GIB,
        cpu_boot_disk_type=CPU_BOOT_DISK_TYPE,
        cpu_boot_disk_gib=BOOT_DISK_GIB,
        export_bucket=settings.export_bucket == EXPORT_BUCKET_CREATE,
        gpu_node_hourly_price=settings.gpu_node_hourly_price,
        cloud_nat=settings.private_nodes,  # ClusterEgress exists exactly then
    )


def export_infra(settings: InfraSettings, infra: Infra) -> None:
    """Stack outputs the workloads and the job stack read. Names are a contract: change them with care."""
    pulumi.export("project", settings.project)
    pulumi.export("region", settings.region)
    pulumi.export("zone", settings.zone)
    pulumi.export("clusterName", infra.cluster.cluster.name)
    pulumi.export("clusterLocation", infra.cluster.cluster.location)
    # This stack's Kubernetes provider takes the id as cluster_identifier: a cluster replaced under the same name
    # keeps it, and the engine replaces the provider as a dependent of that delete-before-replace. The job stack,
    # which reads these outputs and has no such dependency, takes clusterInstance (id and DNS endpoint, which names
    # the cluster's uid), so its provider, and its Job, follow a replaced cluster.
    pulumi.export("clusterId", infra.cluster.cluster_identifier)
    pulumi.export("clusterInstance", infra.cluster.cluster_instance)
    pulumi.export("kubernetesMinorVersion", settings.gke_minor)
    pulumi.export("kubeconfig", infra.cluster.kubeconfig)
    pulumi.export("clusterNetwork", infra.networks.cluster_network.name)
    pulumi.export("gvnicNetwork", infra.networks.gvnic_network.name)
    pulumi.export("rdmaNetwork", infra.networks.rdma_network.name)
    pulumi.export("rdmaSubnets", [subnet.name for subnet in infra.networks.rdma_subnets])
    pulumi.export("lustreInstanceId", infra.lustre.instance.instance_id)
    pulumi.export("lustreIp", infra.lustre.ip)
    pulumi.export("lustreFilesystem", infra.lustre.instance.filesystem)
    pulumi.export("lustreMountPoint", infra.lustre.instance.mount_point)
    pulumi.export("lustreCapacityGib", settings.lustre.capacity_gib)
    pulumi.export("lustreThroughputMbpsPerTib", settings.lustre.throughput_mbps_per_tib)
    pulumi.export("cpuNodePool", infra.cluster.cpu_pool.name)
    pulumi.export("gpuType", settings.preset.gpu_type)
    pulumi.export("gpuMachineType", settings.preset.machine_type)
    pulumi.export("gpuNodes", settings.gpu_nodes)
    pulumi.export("rayWorkerReplicas", settings.ray_worker_replicas)
    pulumi.export("rayAutoscaling", settings.gpu_autoscaling)
    # Dollars from the dated table in infra/prices.py; `make plan` prints it, the job stack prices a run with it.
    pulumi.export("estimatedCost", estimate(cost_inputs(settings)).as_output())
