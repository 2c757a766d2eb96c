"""Day 2 as data: what a change of each infra config key does to a deployed stack (the guard, infra/day2.py, reads
this table).

Where the facts come from. pulumi-gcp 10.2.0 (requirements.txt) bridges terraform-provider-google-beta 8.x (v9.x
bridged 7.x); "FN" means the field is ForceNew in that resource's schema, so a change replaces the resource. Paths
are under google-beta/services/ of hashicorp/terraform-provider-google-beta:
- lustre/resource_lustre_instance.go: `instance_id`, `location`, `network`, `filesystem`,
  `per_unit_storage_throughput`, `project` FN; `capacity_gib` updatable (Managed Lustre only grows).
- container/resource_container_cluster.go: `name`, `location`, `network`, `subnetwork` FN; `private_cluster_config`
  Optional+Computed, not FN: an update sends only `DesiredDefaultEnablePrivateNodes`, the default for node pools
  created later; a pool's own nodes follow its `network_config.enable_private_nodes`, which ours leave unset.
- container/node_config.go: `guest_accelerator`, `reservation_affinity`, `spot`, `flex_start`, `max_run_duration`,
  `service_account` FN; `machine_type` updatable (GKE recreates the nodes).
- container/resource_container_node_pool.go: `network_config.additional_node_network_configs` FN; `node_locations`
  updatable (nodes move zone).
- compute/resource_compute_subnetwork.go: `ip_cidr_range` FN unless the new range contains the old
  (CustomizeDiff ForceNewIfChange(ip_cidr_range, IsShrinkageIpCidr)); `region` FN; `secondary_ip_range` updatable
  in the schema, but GKE's docs forbid changing a secondary range a cluster uses.
- compute/resource_compute_global_address.go: `address`, `prefix_length` FN.
- compute/resource_compute_network.go: `network_profile` FN (the RoCE profile names the zone).
- pulumi-terraform-bridge asks the engine for delete-before-replace when a resource's `name` is set explicitly, so
  such a replacement first deletes the resource and everything that depends on it. google_lustre_instance names
  itself by `instance_id`, not `name`: the bridge would create the new instance first (same id: refused by the API),
  so the program sets `delete_before_replace` on it (infra/lustre.py).
- pulumi-kubernetes 4.34.2 (requirements.txt), provider/pkg/provider/diff.go `forceNewProperties`:
  `metadata.namespace` and `metadata.name` force a replacement; a Secret's `type`, `data` and `stringData` too,
  unless the provider sets `enableSecretMutable` (ours does: infra/cluster.py) and the Secret is not immutable. A
  PersistentVolume's `spec.csi` and a claim's `spec.volumeName` force a replacement; pulumi-kubernetes deletes a
  named object before creating its replacement, and a claim's deletion waits (kubernetes.io/pvc-protection) for
  every pod that mounts it.
- pulumi/pulumi (engine), pkg/resource/deploy/step.go `DeleteStep.Apply`: a resource protected in the state is never
  deleted (`up`, `preview` and `destroy` stop there); step_generator.go: one protected in both the state and the
  program is never replaced (unprotecting and replacing in one update is allowed). `replacement_trigger` needs engine
  3.208.0 (the dependency fix: 3.226.0), and an old trigger of null (a stack deployed before the option) replaces
  nothing.
- The rows' "From" column names those resources short: container_cluster, node_config, node pool,
  compute_subnetwork, compute_network, compute_global_address, lustre_instance are the files above; "engine step.go"
  is pulumi/pulumi's; "pulumi-kubernetes diff.go" the pinned pulumi-kubernetes's.
- KubeRay v1.5.1, ray-operator/controllers/ray/raycluster_controller.go, `reconcilePods`: pods are only counted
  against the desired replicas (and deleted when terminated); a pod template is read only by `buildHeadPod` /
  `buildWorkerPod` when a pod is created. A changed template (image, resources, env, annotations) never reaches
  running pods, only pods created later: the program replaces the RayCluster instead (workloads/raycluster.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.keys import ALLOW_REPLACE_KEY

IN_PLACE = "in place"
ROLLS_NODES = "rolls nodes"
REPLACES = "replaces"
REFUSED = "refused"  # the API cannot do it: refused even when listed in allowReplace
DELETES_WORKERS = "deletes workers"  # KubeRay deletes running Ray workers: a running training dies
NEEDS_ALLOWANCE = (REPLACES, ROLLS_NODES, DELETES_WORKERS)

# The stack output that records what the guard compares.
DEPLOYED_SETTINGS_OUTPUT = "deployedSettings"
# Not a config key: the Ray pod template changed for another reason (a new version of this program).
RAY_CLUSTER = "rayCluster"

_TRAINING_DIES = "a running training dies"
_LUSTRE_LOST = (
    "Lustre with every file on it (checkpoints, models, datasets), deleted before the new one is created (same "
    "instance id), its PersistentVolume and claim and, as every Ray pod mounts the claim, the RayCluster"
)
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
        f"{_LUSTRE_LOST}; the RDMA network and its 8 subnets, the GPU pool; the CPU nodes move zone; {_TRAINING_DIES}",
        "lustre_instance location FN, compute_network network_profile FN, node pool additional_node_network_configs "
        "FN, node_locations updatable",
        ray_template=True,
    ),
    KeyEffect(
        "lustre.filesystem",
        REPLACES,
        _LUSTRE_LOST,
        "lustre/resource_lustre_instance.go filesystem FN; pulumi-kubernetes PV spec.csi FN",
        ray_template=True,
    ),
    KeyEffect(
        "lustre.perUnitStorageThroughput",
        REPLACES,
        _LUSTRE_LOST,
        "lustre/resource_lustre_instance.go per_unit_storage_throughput FN; pulumi-kubernetes PV spec.csi FN",
        ray_template=True,
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
        "container/node_config.go spot, flex_start, reservation_affinity FN (with rayAutoscaling unset, "
        "rayAutoscaling follows: on for spot and flexStart, off for a reservation)",
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
        "KubeRay 1.5.1 reconcilePods (the key's env entry is in the pod template); pulumi-kubernetes 4.34.2 diff.go: "
        "Secret data updatable with enableSecretMutable",
        ray_template=True,
    ),
    KeyEffect(
        RAY_CLUSTER,
        REPLACES,
        f"(no config key: this version of the program changes the Ray pod template or the KubeRay chart version) "
        f"{_RAY_REPLACED}",
        "KubeRay 1.5.1 reconcilePods",
    ),
    KeyEffect(
        "privateNodes",
        REFUSED,
        "no node would change: pulumi-gcp updates only the cluster's default for node pools created later, while "
        "the program would delete Cloud NAT (true -> false: the private nodes lose nvcr.io and Hugging Face) or add "
        "it for nodes that have external IPs (false -> true); it takes a new cluster: pulumi destroy, then pulumi up "
        "with the new value (docs/operations.md, Tear down in detail, for keeping Lustre's data)",
        "container/resource_container_cluster.go private_cluster_config not FN, update sets "
        "DesiredDefaultEnablePrivateNodes only; node pools' network_config.enable_private_nodes unset",
    ),
    # In place: nothing is replaced and no running pod is touched.
    KeyEffect(
        "gpuNodes",
        DELETES_WORKERS,
        "the GPU pool's autoscaling limit, in place; with rayWorkerReplicas unset it follows gpuNodes, and a smaller "
        f"value with rayAutoscaling off makes KubeRay delete running GPU workers: {_TRAINING_DIES} (with "
        "rayAutoscaling on: in place)",
        "node pool autoscaling updatable; KubeRay 1.5.1 raycluster_controller.go reconcilePods",
        in_place_if="increase",
    ),
    KeyEffect(
        "rayWorkerReplicas",
        DELETES_WORKERS,
        f"with rayAutoscaling off, KubeRay deletes running GPU workers (pods chosen at random) down to the new count: "
        f"{_TRAINING_DIES}; with rayAutoscaling on it deletes only the pods the autoscaler names: in place; the "
        "head's admission capacity (gpu_node units, its RAY_OVERRIDE_RESOURCES env) reaches a running head only when "
        "it next starts, so a run asking for more nodes than before queues until then",
        "KubeRay 1.5.1 ray-operator/controllers/ray/raycluster_controller.go reconcilePods (diff < 0: random "
        "deletion unless enableInTreeAutoscaling; a changed head template is not applied to the running head pod)",
        in_place_if="increase",
    ),
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
    KeyEffect(
        "protectCompute",
        IN_PLACE,
        "Pulumi's protect on the cluster and the GPU pool: a key in allowReplace lifts it for a change that replaces "
        "them itself; a change that replaces a network or subnet under them is refused while the last deployment "
        "had it on (the engine checks the state's flag of each dependent it deletes first)",
        "pulumi v3.259 pkg/resource/deploy/step_generator.go generateStepsFromDiff (protected in state and program: "
        "never replaced; delete-before-replace: a dependent protected in the state stops the update)",
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
        "the Ray service account's bucket grant; from create to anything else the bucket is deleted (only when "
        "empty: force_destroy is off), refused while the last deployment protected it, but to the created bucket's "
        "own name (kept once out of the state); while it is create, a new clusterName or gcp:project is refused",
        "storage/resource_storage_bucket.go force_destroy; engine step.go DeleteStep refuses a protected resource",
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
        "the Secret's value, updated in place: no moment without it (pods read it when they start)",
        "pulumi-kubernetes 4.34.2 provider/pkg/provider/diff.go forceNewProperties: Secret data updatable with "
        "enableSecretMutable, which the provider sets (infra/cluster.py)",
    ),
    KeyEffect(ALLOW_REPLACE_KEY, IN_PLACE, "nothing: it only lets the guard through", "this program"),
)

EFFECTS_BY_KEY = {effect.key: effect for effect in EFFECTS}

# What replaces the cluster, and the GPU pool (the cluster's keys replace the pool with it). With protectCompute the
# engine refuses to delete either; listing one of these keys in allowReplace lifts that lock for the change, in the
# same `pulumi up`: the engine allows unprotecting and replacing a resource in one update when the resource's own
# diff replaces it (step_generator.go generateStepsFromDiff, `new.Protect && old.Protect`).
REPLACES_CLUSTER = ("gcp:project", "gcp:region", "clusterName", "networkRanges.clusterSubnet")
REPLACES_GPU_POOL = (
    *REPLACES_CLUSTER,
    "zone",
    "networkRanges.gvnicSubnet",
    "networkRanges.rdmaSubnets",
    "gpuType",
    "gpuProvisioning",
    "reservation",
    "maxRunHours",
    "imageCacheDisk",
)
# What replaces, delete-first (explicit names), a network or subnet the cluster or the GPU pool uses: the engine
# deletes those as dependents first, and refuses a dependent protected in the STATE (pulumi v3.259
# step_generator.go generateStepsFromDiff, the loop over calculateDependentReplacements: "unable to replace resource
# ... as part of replacing ..."), whatever this run registers. So while the last deployment had protectCompute on,
# allowReplace alone would fail halfway: the lock must be lifted by an `up` of its own first.
REPLACES_NETWORKS = (
    "gcp:project",
    "gcp:region",
    "clusterName",
    "zone",
    "networkRanges.clusterSubnet",
    "networkRanges.gvnicSubnet",
    "networkRanges.rdmaSubnets",
)
# What replaces the Lustre instance. While the last deployment protected it (protectData), its state holds Pulumi's
# protect and the provider's deletion_policy PREVENT: a replacement fails at the delete, so the guard refuses it.
REPLACES_LUSTRE = (
    "gcp:project",
    "gcp:region",
    "clusterName",
    "zone",
    "lustre.filesystem",
    "lustre.perUnitStorageThroughput",
)
# What renames a created export bucket (<project>-<clusterName>-models): pulumi-gcp replaces a named bucket
# delete-first, and a bucket that holds objects cannot be deleted (force_destroy off): the `up` would fail halfway.
RENAMES_BUCKET = ("gcp:project", "clusterName")
BUCKET_URN = (
    '"urn:pulumi:$(pulumi stack --show-name)::nemo-rl-gke::"\'nemo-rl-gke:infra:ExportBucket$gcp:storage/bucket:Bucket'
    "::model-export'"
)
LOCKS = {
    "protectData": "it replaces Lustre, which the last deployment protected (protectData: Pulumi's protect and the "
    "provider's deletion_policy PREVENT are in the state)",
    "protectCompute": "it replaces, delete-first, a network or subnet under the cluster and the GPU pool, which the "
    "engine then deletes first as dependents, and the last deployment protected them (protectCompute: the engine "
    "checks the flag in the state, not this run's)",
}

PROTECTED_BUCKET = KeyEffect(
    "exportBucket",
    REFUSED,
    "the bucket the stack created would be deleted, and the last deployment protected it (protectData), so the "
    "engine would stop this and every later `pulumi up` and `preview` there; to let it go: keep exportBucket "
    "create, pulumi config set protectData false, pulumi up (that lifts the protection of Lustre too), then change "
    "exportBucket (the bucket is deleted only when empty); to keep the bucket out of the stack instead: "
    f"pulumi state delete --force --target-dependents {BUCKET_URN}, then set exportBucket to the bucket's name",
    "engine step.go DeleteStep refuses a resource protected in the state; storage bucket force_destroy off",
)
# What allowReplace may name.
REPLACEABLE_KEYS = tuple(effect.key for effect in EFFECTS if effect.effect in NEEDS_ALLOWANCE)
