"""The GPU node pool: 8-GPU A3 Ultra or A4 nodes with a gVNIC and 8 RDMA NICs, provisioned as configured."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.cluster import AUTOSCALED_FIELDS, CLOUD_PLATFORM_SCOPE, SHIELDED_NODE, GkeCluster
from infra.gke_rules import IMAGE_CACHE_DISK_MODE, flex_start_violations
from infra.network import Networks
from infra.scale import compact_placement
from infra.settings import GpuPoolSettings

GPU_POOL_NAME = "gpu-pool"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


@dataclass(frozen=True)
class GpuNodePoolArgs:
    settings: GpuPoolSettings
    cluster: GkeCluster
    networks: Networks
    protect: bool = False  # Pulumi's protect on the pool (protectCompute, infra.day2.compute_locks)


def nodes_at_creation(settings: GpuPoolSettings) -> int:
    """GPU nodes the pool starts with. A reservation bills its nodes whether they run or not, so without the Ray
    autoscaler the pool is created with the nodes the Ray cluster holds anyway: they boot (and pull the image, see
    workloads/image_prepull.py) while Managed Lustre is still being created, instead of after the Ray cluster asks
    for them. They are also the pool's minimum, or the cluster autoscaler would remove them again before the Ray
    pods arrive (DaemonSet pods do not keep a node). Spot, flex-start and autoscaled Ray start from zero."""
    fixed = settings.gpu_provisioning == "reservation" and not settings.gpu_autoscaling
    return settings.ray_worker_replicas if fixed else 0


def image_cache_config(disk_image: str) -> dict[str, object]:
    """Node-config fields for a secondary boot disk that serves the NeMo RL image from a disk image (GKE's container
    image cache), with image streaming (gcfs) on, which GKE requires for it; empty without a disk image."""
    if not disk_image:
        return {}
    return {
        "secondary_boot_disks": [
            gcp.container.NodePoolNodeConfigSecondaryBootDiskArgs(disk_image=disk_image, mode=IMAGE_CACHE_DISK_MODE)
        ],
        "gcfs_config": gcp.container.NodePoolNodeConfigGcfsConfigArgs(enabled=True),
    }


def provisioning_config(provisioning: str, reservation: str | None) -> dict[str, object]:
    """Node-config fields for each way of getting GPUs. Pure, so each mode is tested on its own."""
    if provisioning == "reservation":
        return {
            "reservation_affinity": gcp.container.NodePoolNodeConfigReservationAffinityArgs(
                consume_reservation_type="SPECIFIC_RESERVATION", key=RESERVATION_KEY, values=[reservation or ""]
            )
        }
    no_reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(consume_reservation_type="NO_RESERVATION")
    if provisioning == "spot":
        return {"spot": True, "reservation_affinity": no_reservation}
    if provisioning == "flexStart":
        return {"flex_start": True, "reservation_affinity": no_reservation}
    raise ValueError(f"unknown GPU provisioning mode {provisioning!r}")


def placement_policy(
    provisioning: str, machine_type: str, max_nodes: int
) -> gcp.container.NodePoolPlacementPolicyArgs | None:
    """Node-pool fields for compact placement: spot and flex-start pools of A3 Ultra / A4 ask GKE to place their
    nodes close together (infra/scale.py names the limits and their sources). A reservation's nodes are placed by
    the reservation itself, in its blocks and sub-blocks, and its pool takes no policy; the Ray workers then prefer
    one sub-block, then one block, by pod affinity (workloads/ray_values.py)."""
    if not compact_placement(provisioning, machine_type, max_nodes):
        return None
    return gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT")


def pool_management(provisioning: str) -> gcp.container.NodePoolManagementArgs:
    """Auto-upgrade stays on (release channels require it; the cluster's maintenance exclusion holds node upgrades
    back). Auto-repair is on, except for flex-start, which GKE refuses with it (see gke_rules)."""
    return gcp.container.NodePoolManagementArgs(auto_repair=provisioning != "flexStart", auto_upgrade=True)


def check_flex_start(
    config: dict[str, object], management: gcp.container.NodePoolManagementArgs, min_nodes: int
) -> None:
    """Google's flex-start preconditions, checked on exactly what is about to be registered. Settings cannot ask
    for a pool that breaks them; this guards the code above, as Cluster Toolkit's preconditions guard its module."""
    affinity = config.get("reservation_affinity")
    problems = flex_start_violations(
        flex_start=bool(config.get("flex_start")),
        spot=bool(config.get("spot")),
        auto_repair=bool(management.auto_repair),
        reservation_type=str(getattr(affinity, "consume_reservation_type", "")),
        min_nodes=min_nodes,
    )
    if problems:
        raise ValueError(f"flex-start pool breaks GKE's preconditions: {'; '.join(problems)}")


class GpuNodePool(pulumi.ComponentResource):
    """Autoscaled: from zero (nodes exist only while Ray workers need them), or, for a reservation without the Ray
    autoscaler, created with the Ray cluster's nodes (nodes_at_creation)."""

    pool: gcp.container.NodePool

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:GpuNodePool", name, None, opts)
        preset, networks = args.settings.preset, args.networks

        # NIC order matters: eth1 is the gVNIC, eth2..eth9 the RDMA NICs in GPU order (pods name them so).
        additional_networks = [
            gcp.container.NodePoolNetworkConfigAdditionalNodeNetworkConfigArgs(
                network=networks.gvnic_network.name, subnetwork=networks.gvnic_subnet.name
            )
        ] + [
            gcp.container.NodePoolNetworkConfigAdditionalNodeNetworkConfigArgs(
                network=networks.rdma_network.name, subnetwork=subnet.name
            )
            for subnet in networks.rdma_subnets
        ]

        min_nodes = nodes_at_creation(args.settings)
        provisioning = provisioning_config(args.settings.gpu_provisioning, args.settings.reservation)
        if args.settings.max_run_hours:
            provisioning["max_run_duration"] = f"{args.settings.max_run_hours * 3600}s"
        management = pool_management(args.settings.gpu_provisioning)
        check_flex_start(provisioning, management, min_nodes)

        self.pool = gcp.container.NodePool(
            name,
            name=GPU_POOL_NAME,
            project=args.settings.project,
            cluster=args.cluster.cluster.id,
            location=args.settings.region,
            node_locations=[args.settings.zone],
            initial_node_count=min_nodes,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                total_min_node_count=min_nodes,
                total_max_node_count=args.settings.gpu_nodes,
                # ANY takes whatever capacity exists (and is what flex-start requires).
                location_policy="ANY",
            ),
            management=management,
            # Reserved capacity has no room for a surge node: upgrade one node at a time in place.
            upgrade_settings=gcp.container.NodePoolUpgradeSettingsArgs(max_surge=0, max_unavailable=1),
            network_config=gcp.container.NodePoolNetworkConfigArgs(additional_node_network_configs=additional_networks),
            placement_policy=placement_policy(
                args.settings.gpu_provisioning, preset.machine_type, args.settings.gpu_nodes
            ),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=preset.machine_type,
                guest_accelerators=[
                    gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
                        type=preset.gpu_type,
                        count=preset.gpus_per_node,
                        gpu_driver_installation_config=gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs(
                            gpu_driver_version="DEFAULT"
                        ),
                    )
                ],
                gvnic=gcp.container.NodePoolNodeConfigGvnicArgs(enabled=True),
                disk_type=preset.boot_disk_type,
                disk_size_gb=500,
                service_account=args.cluster.node_service_account.email,
                oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                # Secure boot holds with GKE's own (signed) GPU drivers, as in Cluster Toolkit's A3 Ultra/A4 pools.
                shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(**SHIELDED_NODE),
                **image_cache_config(args.settings.image_cache_disk),  # type: ignore[arg-type]
                **provisioning,  # type: ignore[arg-type]
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=args.cluster.node_roles,
                ignore_changes=AUTOSCALED_FIELDS,
                delete_before_replace=True,
                # The engine refuses to delete or replace it while protected: a running training's nodes.
                protect=args.protect,
            ),
        )
        self.register_outputs({"name": self.pool.name, "machineType": preset.machine_type})
