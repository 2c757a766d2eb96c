"""Day 2: what a change of each infra config key does to a deployed stack, and the guard that refuses a change that
would replace something expensive or stateful (or kill a running training) unless the user lists the key in
`allowReplace`.

Pure data and functions: no Pulumi runtime. The program records `deployed_settings` as a stack output; the next
`pulumi up` reads it back through a StackReference to its own stack and calls `refusals` before registering anything.

Where the facts come from (terraform-provider-google v7.45.0 resource schemas, which pulumi-gcp 10.2.0 bridges; "FN"
means the field is ForceNew there, so a change replaces the resource):
- lustre/resource_lustre_instance.go: `instance_id`, `location`, `network`, `filesystem`,
  `per_unit_storage_throughput`, `project` FN; `capacity_gib` updatable (Managed Lustre only grows).
- container/resource_container_cluster.go: `name`, `location`, `network`, `subnetwork` FN.
- container/node_config.go: `guest_accelerator`, `reservation_affinity`, `spot`, `flex_start`, `max_run_duration`,
  `service_account` FN; `machine_type` updatable (GKE recreates the nodes).
- container/resource_container_node_pool.go: `network_config.additional_node_network_configs` FN; `node_locations`
  updatable (nodes move zone).
- compute/resource_compute_subnetwork.go: `ip_cidr_range` FN unless the new range contains the old
  (CustomizeDiff ForceNewIfChange(ip_cidr_range, IsShrinkageIpCidr)); `region` FN; `secondary_ip_range` updatable
  in the schema, but GKE's docs forbid changing a secondary range a cluster uses.
- compute/resource_compute_global_address.go: `address`, `prefix_length` FN.
- compute/resource_compute_network.go: `network_profile` FN (the RoCE profile names the zone).
- pulumi-gcp asks the engine for delete-before-replace when a resource has an explicit name (all of ours do), so a
  replacement first deletes the resource and everything that depends on it.
- Kubernetes: `metadata.namespace` and `metadata.name` are immutable (pulumi-kubernetes replaces the object).
- KubeRay v1.5.1, ray-operator/controllers/ray/raycluster_controller.go, `reconcilePods`: pods are only counted
  against the desired replicas (and deleted when terminated); a pod template is read only by `buildHeadPod` /
  `buildWorkerPod` when a pod is created. A changed template (image, resources, env, annotations) never reaches
  running pods, only pods created later: the program replaces the RayCluster instead (workloads/raycluster.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi

if TYPE_CHECKING:
    from infra.settings import InfraSettings

IN_PLACE = "in place"
ROLLS_NODES = "rolls nodes"
REPLACES = "replaces"
REFUSED = "refused"  # the API cannot do it: refused even when listed in allowReplace

# The stack output that records what the guard compares.
DEPLOYED_SETTINGS_OUTPUT = "deployedSettings"
ALLOW_REPLACE_KEY = "allowReplace"
# Not a config key: the Ray pod template changed for another reason (a new version of this program).
RAY_CLUSTER = "rayCluster"

_TRAINING_DIES = "a running training dies"
_LUSTRE_LOST = "Lustre with every file on it (checkpoints, models, datasets)"
_RAY_REPLACED = (
    "the RayCluster (KubeRay 1.5.1 would give only pods created later the new template, so it is replaced): "
    f"every Ray pod restarts, {_TRAINING_DIES}"
)


@dataclass(frozen=True)
class KeyEffect:
    """What changing one config key of a deployed stack does."""

    key: str
    effect: str  # IN_PLACE, ROLLS_NODES, REPLACES or REFUSED
    what: str  # what is replaced or disrupted, and what that destroys
    source: str  # where the fact comes from
    in_place_if: str = ""  # "superset" (a range that contains the old one) or "increase": then the change is in place
    ray_template: bool = False  # the key feeds the Ray pod template

    @property
    def guarded(self) -> bool:
        return self.effect != IN_PLACE


_SUBNET = "compute_subnetwork ip_cidr_range (FN unless it contains the old range)"

EFFECTS: tuple[KeyEffect, ...] = (
    KeyEffect(
        "gcp:project",
        REPLACES,
        f"every resource of the stack: the cluster, the GPU pool, {_LUSTRE_LOST}, the Ray cluster; {_TRAINING_DIES}",
        "`project` FN on every Google resource",
        ray_template=True,
    ),
    KeyEffect(
        "gcp:region",
        REPLACES,
        f"the cluster and its node pools, every subnet and, as the zone moves with the region, {_LUSTRE_LOST}; "
        f"{_TRAINING_DIES}",
        "container_cluster location FN, compute_subnetwork region FN",
        ray_template=True,
    ),
    KeyEffect(
        "clusterName",
        REPLACES,
        f"every named resource: the cluster, the networks, the service accounts, the Ray cluster and, as its id is "
        f"CLUSTERNAME-lustre, {_LUSTRE_LOST}; {_TRAINING_DIES}",
        "container_cluster name, lustre_instance instance_id, compute_network name FN",
        ray_template=True,
    ),
    KeyEffect(
        "zone",
        REPLACES,
        f"{_LUSTRE_LOST}, the RDMA network and its 8 subnets, the GPU pool; the CPU nodes move zone (the Ray head "
        f"is evicted); {_TRAINING_DIES}",
        "lustre_instance location FN, compute_network network_profile FN, node pool additional_node_network_configs "
        "FN, node_locations updatable",
    ),
    KeyEffect(
        "lustre.filesystem",
        REPLACES,
        _LUSTRE_LOST,
        "lustre_instance filesystem FN",
    ),
    KeyEffect(
        "lustre.perUnitStorageThroughput",
        REPLACES,
        _LUSTRE_LOST,
        "lustre_instance per_unit_storage_throughput FN",
    ),
    KeyEffect(
        "lustre.capacityGib",
        REFUSED,
        "Managed Lustre capacity only grows: a smaller capacityGib is rejected by the API",
        "lustre_instance capacity_gib updatable; Google: capacity can be increased, not decreased",
        in_place_if="increase",
    ),
    KeyEffect(
        "networkRanges.clusterSubnet",
        REPLACES,
        f"the cluster subnet and the GKE cluster on it, with every Kubernetes object; {_TRAINING_DIES}",
        f"{_SUBNET}, container_cluster subnetwork FN",
        in_place_if="superset",
    ),
    KeyEffect(
        "networkRanges.pods",
        REFUSED,
        "GKE does not let a cluster's Pod range change: the update would fail halfway",
        "compute_subnetwork secondary_ip_range (GKE docs: a secondary range in use cannot change)",
    ),
    KeyEffect(
        "networkRanges.services",
        REFUSED,
        "GKE does not let a cluster's Service range change: the update would fail halfway",
        "compute_subnetwork secondary_ip_range (GKE docs: a secondary range in use cannot change)",
    ),
    KeyEffect(
        "networkRanges.gvnicSubnet",
        REPLACES,
        f"the gVNIC subnet and the GPU pool; {_TRAINING_DIES}",
        f"{_SUBNET}, node pool additional_node_network_configs FN",
        in_place_if="superset",
    ),
    KeyEffect(
        "networkRanges.rdmaSubnets",
        REPLACES,
        f"the RDMA subnets and the GPU pool; {_TRAINING_DIES}",
        f"{_SUBNET}, node pool additional_node_network_configs FN",
        in_place_if="superset",
    ),
    KeyEffect(
        "networkRanges.lustrePeering",
        REPLACES,
        "the private services access range that Lustre's address comes from, while the peering uses it: "
        "Lustre clients can lose the file system",
        "compute_global_address address and prefix_length FN",
    ),
    KeyEffect(
        "gpuType",
        REPLACES,
        f"the GPU pool (its nodes are deleted) and {_RAY_REPLACED}",
        "node_config guest_accelerator FN",
        ray_template=True,
    ),
    KeyEffect(
        "gpuProvisioning",
        REPLACES,
        f"the GPU pool: its nodes are deleted, {_TRAINING_DIES}",
        "node_config spot, flex_start, reservation_affinity FN",
    ),
    KeyEffect(
        "reservation",
        REPLACES,
        f"the GPU pool: its nodes are deleted, {_TRAINING_DIES}",
        "node_config reservation_affinity FN",
    ),
    KeyEffect(
        "maxRunHours",
        REPLACES,
        f"the GPU pool: its nodes are deleted, {_TRAINING_DIES}",
        "node_config max_run_duration FN",
    ),
    KeyEffect(
        "imageCacheDisk",
        REPLACES,
        f"the GPU pool: its nodes are deleted, {_TRAINING_DIES}",
        "node_config secondary_boot_disks FN",
    ),
    KeyEffect(
        "cpuMachineType",
        ROLLS_NODES,
        f"recreates the CPU nodes: the Ray head is evicted, {_TRAINING_DIES}",
        "node_config machine_type updatable (GKE recreates the nodes)",
    ),
    KeyEffect(
        "namespace",
        REPLACES,
        f"every namespaced Kubernetes object: the Lustre claim, the tokens, the service account and {_RAY_REPLACED}",
        "Kubernetes metadata.namespace is immutable",
        ray_template=True,
    ),
    KeyEffect(
        "kubernetesServiceAccount",
        REPLACES,
        f"the Ray service account and {_RAY_REPLACED}",
        "Kubernetes metadata.name is immutable; pod template serviceAccountName",
        ray_template=True,
    ),
    KeyEffect("nemoRlImage", REPLACES, _RAY_REPLACED, "KubeRay 1.5.1 reconcilePods", ray_template=True),
    KeyEffect("rayVersion", REPLACES, _RAY_REPLACED, "KubeRay 1.5.1 reconcilePods", ray_template=True),
    KeyEffect("rayHead", REPLACES, _RAY_REPLACED, "KubeRay 1.5.1 reconcilePods", ray_template=True),
    KeyEffect("rayWorker", REPLACES, _RAY_REPLACED, "KubeRay 1.5.1 reconcilePods", ray_template=True),
    KeyEffect("shmSize", REPLACES, _RAY_REPLACED, "KubeRay 1.5.1 reconcilePods", ray_template=True),
    KeyEffect(
        "rayAutoscaling",
        REPLACES,
        f"{_RAY_REPLACED} (the autoscaler is a container KubeRay adds to the head pod when it creates it)",
        "KubeRay 1.5.1 reconcilePods, buildHeadPod",
        ray_template=True,
    ),
    KeyEffect(
        "wandbApiKey",
        REPLACES,
        f"setting or removing it: {_RAY_REPLACED}; a new value of a set key updates the Secret in place (pods "
        "read it when they start)",
        "KubeRay 1.5.1 reconcilePods (the key's env entry is in the pod template)",
        ray_template=True,
    ),
    KeyEffect(
        RAY_CLUSTER,
        REPLACES,
        f"(no config key: this version of the program changes the Ray pod template) {_RAY_REPLACED}",
        "KubeRay 1.5.1 reconcilePods",
    ),
    KeyEffect(
        "privateNodes",
        ROLLS_NODES,
        f"recreates the nodes of both pools with or without external IPs: the Ray head and workers are evicted, "
        f"{_TRAINING_DIES}",
        "container_cluster private_cluster_config.enable_private_nodes; GKE docs: switching an existing node pool "
        "between public and private nodes recreates its nodes (guarded as a roll: whether the provider updates the "
        "cluster in place was not verified here)",
    ),
    # In place: nothing is replaced and no running pod is touched.
    KeyEffect("gpuNodes", IN_PLACE, "the GPU pool's autoscaling limit", "node pool autoscaling updatable"),
    KeyEffect("rayWorkerReplicas", IN_PLACE, "KubeRay scales the worker group", "KubeRay 1.5.1 reconcilePods"),
    KeyEffect(
        "rayIdleTimeoutSeconds",
        IN_PLACE,
        "the autoscaler reads it from the RayCluster",
        "Ray's KubeRay autoscaler reads autoscalerOptions from the RayCluster on every update",
    ),
    KeyEffect(
        "gkeVersion",
        IN_PLACE,
        "upgrades the control plane; nodes follow under the maintenance exclusion",
        "container_cluster min_master_version updatable",
    ),
    KeyEffect("releaseChannel", IN_PLACE, "the cluster's channel", "container_cluster release_channel updatable"),
    KeyEffect("cpuPoolMinNodes", IN_PLACE, "the CPU pool's autoscaling", "node pool autoscaling updatable"),
    KeyEffect("cpuPoolMaxNodes", IN_PLACE, "the CPU pool's autoscaling", "node pool autoscaling updatable"),
    KeyEffect(
        "protectData",
        IN_PLACE,
        "Pulumi's protect and Lustre's deletion_policy",
        "resource options; lustre_instance deletion_policy",
    ),
    KeyEffect("deletionProtection", IN_PLACE, "GKE deletion protection", "container_cluster deletion_protection"),
    KeyEffect(
        "maintenanceWindowStart",
        IN_PLACE,
        "the cluster's maintenance policy",
        "container_cluster maintenance_policy updatable",
    ),
    KeyEffect(
        "maintenanceExclusion",
        IN_PLACE,
        "the cluster's maintenance policy",
        "container_cluster maintenance_policy updatable",
    ),
    KeyEffect(
        "exportBucket",
        IN_PLACE,
        "the Ray service account's bucket grant (a created bucket is kept while protectData)",
        "storage bucket IAM member",
    ),
    KeyEffect(
        "authorizedNetworks",
        IN_PLACE,
        "who may reach the control plane's IP endpoint",
        "container_cluster master_authorized_networks_config, control_plane_endpoints_config updatable",
    ),
    KeyEffect(
        "databaseEncryptionKey",
        IN_PLACE,
        "GKE re-encrypts the Secrets in etcd with the new key",
        "container_cluster database_encryption updatable",
    ),
    KeyEffect(
        "tensorboard",
        IN_PLACE,
        "creates or deletes the TensorBoard Deployment, its Service and NetworkPolicy (event files stay on Lustre)",
        "Kubernetes objects of their own; the Ray pods are not touched",
    ),
    KeyEffect("gpuNodeHourlyPrice", IN_PLACE, "the cost estimate only (a stack output)", "infra/cost.py"),
    KeyEffect(
        "hfToken",
        IN_PLACE,
        "the Secret's value (pods read it when they start)",
        "Kubernetes Secret stringData updatable",
    ),
    KeyEffect(ALLOW_REPLACE_KEY, IN_PLACE, "nothing: it only lets the guard through", "this program"),
)

EFFECTS_BY_KEY = {effect.key: effect for effect in EFFECTS}
# What allowReplace may name.
REPLACEABLE_KEYS = tuple(effect.key for effect in EFFECTS if effect.effect in (REPLACES, ROLLS_NODES))


def deployed_settings(settings: InfraSettings, ray_pod_template: str, has_wandb_key: bool) -> dict[str, Any]:
    """The values the guard compares on the next `pulumi up`: plain, JSON-safe, nothing secret (the W&B key only as
    set or not). `ray_pod_template` is the digest of the Ray pod templates (workloads.ray_values)."""
    ranges = settings.ranges
    return {
        "gcp:project": settings.project,
        "gcp:region": settings.region,
        "clusterName": settings.cluster_name,
        "zone": settings.zone,
        "lustre.filesystem": settings.lustre.filesystem,
        "lustre.perUnitStorageThroughput": settings.lustre.throughput_mbps_per_tib,
        "lustre.capacityGib": settings.lustre.capacity_gib,
        "networkRanges.clusterSubnet": ranges.cluster_subnet,
        "networkRanges.pods": ranges.pods,
        "networkRanges.services": ranges.services,
        "networkRanges.gvnicSubnet": ranges.gvnic_subnet,
        "networkRanges.rdmaSubnets": list(ranges.rdma_subnets),
        "networkRanges.lustrePeering": ranges.lustre_peering,
        "gpuType": settings.preset.gpu_type,
        "gpuProvisioning": settings.gpu_provisioning,
        "reservation": settings.reservation or "",
        "maxRunHours": settings.max_run_hours or 0,
        "imageCacheDisk": settings.image_cache_disk,
        "cpuMachineType": settings.cpu_machine_type,
        "privateNodes": settings.private_nodes,
        "namespace": settings.namespace,
        "kubernetesServiceAccount": settings.kubernetes_service_account,
        "nemoRlImage": settings.nemo_rl_image,
        "rayVersion": settings.ray_version,
        "rayHead": {"cpu": settings.ray_head.cpu, "memory": settings.ray_head.memory},
        "rayWorker": {"cpu": settings.ray_worker.cpu, "memory": settings.ray_worker.memory},
        "shmSize": settings.shm_size,
        "rayAutoscaling": settings.gpu_autoscaling,
        "wandbApiKey": "set" if has_wandb_key else "not set",
        RAY_CLUSTER: ray_pod_template,
    }


def _contains(old: Any, new: Any) -> bool:
    """Every old range inside the new one at the same position (a subnet grows in place)."""
    olds, news = (old, new) if isinstance(old, list) else ([old], [new])
    if not isinstance(news, list) or len(olds) != len(news):
        return False
    try:
        return all(
            ipaddress.ip_network(str(o)).subnet_of(ipaddress.ip_network(str(n)))  # type: ignore[arg-type]
            for o, n in zip(olds, news, strict=True)
        )
    except (TypeError, ValueError):
        return False


def _plain(value: Any) -> Any:
    """Numbers come back from stack outputs as floats: 18000.0 is 18000."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _in_place(effect: KeyEffect, old: Any, new: Any) -> bool:
    if effect.in_place_if == "superset":
        return _contains(old, new)
    if effect.in_place_if == "increase":
        try:
            return int(new) > int(old)
        except (TypeError, ValueError):
            return False
    return False


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(value[k])}" for k in sorted(value)) + "}"
    return repr(value)


def _put_back(key: str, old: Any) -> str:
    if isinstance(old, (list, dict)):
        return f"put the old value back ({_show(old)})"
    flag = "--path " if "." in key else ""
    return f"put the old value back: pulumi config set {flag}{key} {old}"


def refusals(previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]) -> list[str]:
    """One line per change the guard refuses, comparing the last deployment's record with this one's. No record (a
    first deployment) or a key the record lacks (an older version of the program) compares nothing."""
    if not previous:
        return []
    lines: list[str] = []
    next_index = len(allowed)
    ray_template_keys_changed = False
    for effect in EFFECTS:
        if not effect.guarded or effect.key == RAY_CLUSTER:
            continue
        if effect.key not in previous or effect.key not in current:
            continue
        old, new = _plain(previous[effect.key]), _plain(current[effect.key])
        if old == new or _in_place(effect, old, new):
            continue
        ray_template_keys_changed |= effect.ray_template
        change = f"{effect.key}: {_show(old)} -> {_show(new)}"
        if effect.effect == REFUSED:
            lines.append(f"{change} is refused: {effect.what}; {_put_back(effect.key, old)}")
        elif effect.key not in allowed:
            lines.append(_replacement_line(change, effect, old, next_index))
    template = EFFECTS_BY_KEY[RAY_CLUSTER]
    old_template, new_template = previous.get(RAY_CLUSTER), current.get(RAY_CLUSTER)
    if (
        old_template is not None
        and old_template != new_template
        and not ray_template_keys_changed
        and RAY_CLUSTER not in allowed
    ):
        lines.append(
            f"{RAY_CLUSTER}: the Ray pod template changed without a config change; {template.effect} {template.what}; "
            f"to go ahead: pulumi config set --path '{ALLOW_REPLACE_KEY}[{next_index}]' {RAY_CLUSTER}"
        )
    return lines


def _replacement_line(change: str, effect: KeyEffect, old: Any, index: int) -> str:
    verb = "" if effect.effect == ROLLS_NODES else "replaces "
    return (
        f"{change} {verb}{effect.what}; to go ahead: pulumi config set --path '{ALLOW_REPLACE_KEY}[{index}]' "
        f"{effect.key}, or {_put_back(effect.key, old)}"
    )


def unused_allowances(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]
) -> list[str]:
    """Keys listed in allowReplace that do not change now: left there, they would let a later change through."""
    if not previous:
        return []
    return [key for key in allowed if previous.get(key) == current.get(key)]


class ReplacementRefused(pulumi.RunError):
    """Changes that would replace or disrupt what the stack runs. Pulumi prints the message alone."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__(
            "this `pulumi up` would replace or disrupt what the stack runs; nothing was changed:\n  "
            + "\n  ".join(lines)
        )


def check(previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]) -> list[str]:
    """Raise ReplacementRefused for any refused change; otherwise return the allowReplace keys left unused."""
    lines = refusals(previous, current, allowed)
    if lines:
        raise ReplacementRefused(lines)
    return unused_allowances(previous, current, allowed)
