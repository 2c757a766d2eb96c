"""Google's own rules for what this stack creates, as data and pure functions, each with where it comes from.

Settings validate against them before anything is registered; the components build from them. Sources:
- CT: Cluster Toolkit (github.com/GoogleCloudPlatform/cluster-toolkit), module `modules/compute/gke-node-pool`
  (its preconditions) and the blueprints `examples/gke-a3-ultragpu`, `examples/gke-a4`, read at commit 1047080
  (2026-06-25);
- GKE docs: cloud.google.com/kubernetes-engine/docs (pages named next to each rule);
- GKE release notes: cloud.google.com/kubernetes-engine/docs/release-notes (and the per-channel pages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The default control-plane minor. GKE release notes (Regular channel, 2026-09-17): 1.35.8-gke.1036000 became the
# default version for cluster creation; 1.33 and 1.34 left standard support in 2026 (GKE release schedule, as
# mirrored by endoflife.date: 1.34 standard support until 2026-08-30, 1.35 until 2027-02-28). No release note later
# than September 2026 was found here, so 1.35, the newest minor known to be creatable and supported in every
# channel, is the conservative choice; Cluster Toolkit's A3 Ultra and A4 blueprints pin the same `1.35.` prefix.
DEFAULT_GKE_VERSION = "1.35"

GKE_VERSION_RE = re.compile(r"^1\.([0-9]+)(?:\.([0-9]+)-gke\.([0-9]+))?$")


def parse_gke_version(version: str) -> tuple[int, ...] | None:
    """(minor, patch, gke build) of '1.32.2-gke.1475000'; (minor,) of a bare minor such as '1.35'; None if neither."""
    match = GKE_VERSION_RE.match(version)
    if not match:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


@dataclass(frozen=True)
class VersionFloor:
    version: str  # the lowest GKE version that works: a full version, or a bare minor for the whole minor
    needed_by: str  # what needs it, as the error message names it
    source: str


# Managed Lustre CSI driver (always enabled here). GKE docs, "About the Managed Lustre CSI driver": cluster and node
# version 1.33.2-gke.1111000 or later. (The older "Connect to an existing Managed Lustre instance" page allowed
# 1.31.5-gke.1299000+, 1.32.1-gke.1673000+ and any 1.32.2+; the newer, stricter floor wins. It also makes the
# 1.31-only rules moot: A3 Ultra on 1.31 needing driver LATEST, and Lustre's 1.31.5 patch floor.)
LUSTRE_CSI_FLOOR = VersionFloor(
    "1.33.2-gke.1111000", "the Managed Lustre CSI driver", "GKE docs: concepts/managed-lustre"
)
# Flex-start VMs for GPU node pools. GKE docs, "Run a large-scale workload with flex-start" (dws-flex-start-training).
FLEX_START_FLOOR = VersionFloor(
    "1.32.2-gke.1652000", "flex-start GPU nodes", "GKE docs: how-to/dws-flex-start-training"
)

# GKE's managed DCGM metrics (GPU utilisation, memory, NVLink; cluster monitoring component DCGM, always declared
# here). GKE docs, "Collect and view DCGM metrics" (how-to/dcgm-metrics): on by default for new clusters from
# 1.32.1-gke.1357000, and it needs GKE-installed GPU drivers (the GPU pool's gpu_driver_installation_config). Older
# versions could opt in, but that floor is the one documented here, so it is the one required.
DCGM_FLOOR = VersionFloor("1.32.1-gke.1357000", "GKE's managed DCGM metrics", "GKE docs: how-to/dcgm-metrics")

# The cluster's monitoring components (MonitoringComponentConfig.enableComponents: the list replaces GKE's default,
# and an empty one turns monitoring off): the system metrics GKE always wants, the kube-state package (storage, HPA,
# pods, DaemonSets, Deployments, StatefulSets), cAdvisor and kubelet (GKE's defaults for new clusters, GKE docs
# "Configure collection of kube state metrics", "cAdvisor/Kubelet metrics"), and DCGM for the GPUs.
MONITORING_COMPONENTS = (
    "SYSTEM_COMPONENTS", "STORAGE", "HPA", "POD", "DAEMONSET", "DEPLOYMENT", "STATEFULSET", "CADVISOR", "KUBELET",
    "DCGM",
)  # fmt: skip


# Secondary boot disks (imageCacheDisk: the NeMo RL image preloaded on a disk image, mode CONTAINER_IMAGE_CACHE, with
# image streaming on). GKE docs, "Use secondary boot disks to preload data or container images"
# (how-to/data-container-image-preloading): Standard clusters from 1.28.3-gke.1067000 (Autopilot from
# 1.30.1-gke.1329000); pulumi-gcp 10.2.0's NodePool docs name the same floor and require gcfs_config enabled.
IMAGE_CACHE_DISK_FLOOR = VersionFloor(
    "1.28.3-gke.1067000",
    "imageCacheDisk (a secondary boot disk as container image cache)",
    "GKE docs: how-to/data-container-image-preloading",
)
# The secondary boot disk mode that serves preloaded container images (GKE API SecondaryBootDisk.mode enum).
IMAGE_CACHE_DISK_MODE = "CONTAINER_IMAGE_CACHE"


def version_floors(
    gpu_floor: VersionFloor, provisioning: str, private_nodes: bool = False, image_cache_disk: bool = False
) -> list[VersionFloor]:
    """Every floor that applies to a stack: the GPU's own (RDMA), Lustre's and DCGM's, and flex-start's, private
    nodes' and the image cache disk's when used."""
    floors = [gpu_floor, LUSTRE_CSI_FLOOR, DCGM_FLOOR]
    if provisioning == "flexStart":
        floors.append(FLEX_START_FLOOR)
    if private_nodes:
        floors.append(PRIVATE_NODES_PSC_FLOOR)
    if image_cache_disk:
        floors.append(IMAGE_CACHE_DISK_FLOOR)
    return floors


def below_floor(version: str, floor: VersionFloor) -> bool:
    """True if `version` may be older than the floor. A bare minor is judged by its minor alone: GKE creates it at
    that minor's current default patch, which is newer than any floor of the same minor listed here."""
    wanted, minimum = parse_gke_version(version), parse_gke_version(floor.version)
    assert wanted is not None and minimum is not None
    return wanted[: len(minimum)] < minimum[: len(wanted)]


# ---------------------------------------------------------------------------------------------------------------
# Flex-start node pools

# GKE docs (dws-flex-start-training): a flex-start VM runs at most 7 days; max_run_duration can only shorten that.
FLEX_START_MAX_RUN_HOURS = 7 * 24


def flex_start_violations(
    *, flex_start: bool, spot: bool, auto_repair: bool, reservation_type: str, min_nodes: int
) -> list[str]:
    """The preconditions GKE puts on a flex-start pool; empty when the pool meets them all (or is not flex-start).

    CT gke-node-pool/main.tf preconditions: "enable_flex_start needs node auto_repair set to false", flex-start
    requires consume_reservation_type NO_RESERVATION, flex-start and spot cannot both be set; GKE docs
    (dws-flex-start-training) and xpk (`--no-enable-autorepair`, `--reservation-affinity=none`) create the pool
    with autoscaling from 0 nodes."""
    if not flex_start:
        return []
    problems = []
    if auto_repair:
        problems.append("auto-repair must be off (CT: 'enable_flex_start needs node auto_repair set to false')")
    if spot:
        problems.append("flex-start and spot cannot both be set (CT gke-node-pool precondition)")
    if reservation_type != "NO_RESERVATION":
        problems.append(f"reservation affinity must be NO_RESERVATION, not {reservation_type} (CT precondition)")
    if min_nodes != 0:
        problems.append(f"the pool must autoscale from 0 nodes, not {min_nodes} (GKE docs, xpk)")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# Maintenance policy

# Scopes a maintenance exclusion may have with end-time behaviour UNTIL_END_OF_SUPPORT (CT gke-cluster variables.tf
# validation; pulumi-gcp ClusterMaintenancePolicyMaintenanceExclusionExclusionOptions). NO_UPGRADES is left out: it
# needs an end time of at most 30 days, so it cannot guard a cluster for its life.
MAINTENANCE_EXCLUSION_SCOPES = ("NO_MINOR_OR_NODE_UPGRADES", "NO_MINOR_UPGRADES")
# Both blueprints (gke-a3-ultragpu.yaml, gke-a4.yaml) exclude NO_MINOR_OR_NODE_UPGRADES until the end of support, as
# the maintenanceExclusion default does (infra/settings.py): GKE then never drains a GPU node for an upgrade during a
# training run; control-plane patches still apply.
# The exclusion's start: a fixed past date, as the blueprints use (2025-12-01 there), so the plan stays the same
# from one run to the next; the exclusion is in force from creation.
MAINTENANCE_EXCLUSION_START = "2026-01-01T00:00:00Z"
# CT gke-cluster's default daily window (variables.tf `maintenance_start_time`), HH:MM in UTC; GKE makes it 4 hours.
DEFAULT_MAINTENANCE_WINDOW_START = "09:00"

# ---------------------------------------------------------------------------------------------------------------
# Networks

# MTU of the second gVNIC network. The CT gke-a3-ultragpu and gke-a4 blueprints build both gVNIC networks with the
# `modules/network/vpc` module, whose default MTU is 8896 (variables.tf), and xpk uses 8896 for A3 Ultra and A4;
# 8244 is the A3 Mega (GPUDirect-TCPXO) value.
GVNIC_MTU = 8896

# ---------------------------------------------------------------------------------------------------------------
# Control plane access, private nodes, shielded nodes, secrets encryption

# The DNS-based control-plane endpoint is how Pulumi and kubectl reach the API: every request passes Google's IAM
# (container.clusters.connect) before the Kubernetes API server sees it, from any network that reaches Google APIs.
# Google Cloud blog "A new flexible DNS-based approach for accessing the GKE control plane" (2024-11-11): "available
# today on every cluster, regardless of version or cluster configuration", so it adds no version floor. GKE docs
# (concepts/network-isolation) name DNS-only access as the best practice; CIS GKE Benchmark v2.0.0, 5.6.4: prefer
# DNS-based access, and disable the IP-based endpoint or restrict it to trusted networks.

# Most CIDR blocks master authorized networks take: container v1 API (discovery document, revision 20261027),
# MasterAuthorizedNetworksConfig.cidrBlocks: "up to 50 external networks". (GKE docs allow 100 on some newer
# clusters; 50 holds on every cluster.)
MAX_AUTHORIZED_NETWORKS = 50
# Private nodes without a control-plane CIDR (masterIpv4CidrBlock): clusters created at 1.29 or later connect nodes
# to the control plane through Private Service Connect, so private nodes need no /28 and no VPC peering. GKE docs:
# how-to/latest/network-isolation ("create your cluster in version 1.29 and later"); Cluster Toolkit's gke-cluster
# still passes a /28 (172.16.0.32/28) for older, peering-based clusters. A bare minor: the whole of 1.29 qualifies.
PRIVATE_NODES_PSC_FLOOR = VersionFloor(
    "1.29",
    "private nodes over Private Service Connect (no control-plane CIDR)",
    "GKE docs: how-to/latest/network-isolation",
)
# Secure boot and integrity monitoring on every pool. CT gke-node-pool (variables.tf `enable_secure_boot`, default
# true: "Keep enabled unless custom kernel modules need to be loaded"; main.tf sets enable_integrity_monitoring =
# true) and gke-cluster's system pool do so; the gke-a3-ultragpu and gke-a4 blueprints keep that default on their
# GPU pools, whose drivers GKE installs (gpu_driver_version DEFAULT, as here): those are signed, so secure boot does
# not stop them loading. A driver installed by a DaemonSet instead would need secure boot off.

# Application-layer secrets encryption (container v1 DatabaseEncryption.keyName, e.g.
# projects/my-project/locations/global/keyRings/my-ring/cryptoKeys/my-key). GKE docs (how-to/encrypting-secrets):
# the key must be in the same location as the cluster (its region, for this regional cluster), and GKE's service
# agent service-PROJECT_NUMBER@container-engine-robot.iam.gserviceaccount.com needs
# roles/cloudkms.cryptoKeyEncrypterDecrypter on it. Key ring and key ids: 1-63 letters, digits, '_' or '-' (Cloud KMS
# resource naming); project ids: 6-30 lowercase letters, digits or '-', starting with a letter.
KMS_KEY_RE = re.compile(
    r"^projects/([a-z][a-z0-9-]{4,28}[a-z0-9])/locations/([a-z0-9-]+)/keyRings/([A-Za-z0-9_-]{1,63})"
    r"/cryptoKeys/([A-Za-z0-9_-]{1,63})$"
)
KMS_ENCRYPTER_DECRYPTER_ROLE = "roles/cloudkms.cryptoKeyEncrypterDecrypter"


def gke_service_agent(project_number: str) -> str:
    """The GKE service agent of a project: it encrypts and decrypts Secrets with the cluster's KMS key."""
    return f"service-{project_number}@container-engine-robot.iam.gserviceaccount.com"
