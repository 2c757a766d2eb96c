"""The infra project's settings: read once from Pulumi config, validated before any resource exists."""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from infra import day2, gke_rules, scale, zones
from infra.nemo_rl_releases import DEFAULT_IMAGE, NEMO_RL_RELEASES, NemoRlRelease, release_for
from infra.presets import CPU_MACHINES, GPU_PRESETS, CpuMachine, GpuPreset
from infra.sizing import allocatable_cpu, allocatable_memory_bytes, cpu_cores, memory_bytes

GPU_PROVISIONING_MODES = ("reservation", "spot", "flexStart")
# Lustre throughput tiers (MB/s per TiB) -> (minimum, step, step-change point, step above it, maximum) GiB.
LUSTRE_TIERS: dict[int, tuple[int, int, int, int, int]] = {
    1000: (9_000, 9_000, 1_530_000, 72_000, 10_008_000),
    500: (18_000, 18_000, 3_060_000, 144_000, 20_016_000),
    250: (36_000, 36_000, 6_120_000, 288_000, 40_032_000),
    125: (72_000, 72_000, 12_240_000, 72_000, 12_240_000),
}
_CLUSTER_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$")
_FILESYSTEM_RE = re.compile(r"^[A-Za-z0-9]{1,8}$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
_MAINTENANCE_WINDOW_RE = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
_RFC1918 = tuple(ipaddress.IPv4Network(cidr) for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_IMAGE_RE = re.compile(r"^[a-z0-9.\-/:]+:[A-Za-z0-9_.\-]+$")  # repository:tag (the digest is split off first)
# An image digest as registries give it: the tag still names the NeMo RL release, the digest pins its bytes.
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_RAY_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
# A Cloud Storage bucket name without dots (dotted names need domain verification).
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$")
EXPORT_BUCKET_CREATE = "create"

DEFAULT_RDMA_RANGES = tuple(f"192.168.{n}.0/24" for n in range(1, 9))


class ConfigError(pulumi.RunError):
    """A config value that cannot work. Pulumi prints the message alone, without a traceback."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        shown = "is not set" if value is None else f"= {value!r} is not allowed"
        super().__init__(f"config '{key}' {shown}: {allowed}")


class UnknownKeyError(ConfigError):
    """A config key the program does not read: it would be ignored without a word."""

    def __init__(self, key: str, hint: str) -> None:
        self.key, self.value, self.allowed = key, None, hint
        pulumi.RunError.__init__(self, f"config '{key}' is not a key this program reads: {hint}")


@dataclass(frozen=True)
class LustreSettings:
    capacity_gib: int
    throughput_mbps_per_tib: int
    filesystem: str


@dataclass(frozen=True)
class NetworkRanges:
    cluster_subnet: str
    pods: str
    services: str
    gvnic_subnet: str
    rdma_subnets: tuple[str, ...]
    lustre_peering: str


@dataclass(frozen=True)
class PodResources:
    cpu: str
    memory: str


@dataclass(frozen=True)
class InfraSettings:
    project: str
    region: str
    zone: str
    preset: GpuPreset
    gpu_provisioning: str
    reservation: str | None
    gpu_nodes: int
    ray_worker_replicas: int
    cluster_name: str
    gke_version: str
    release_channel: str
    cpu_machine_type: str
    cpu_pool_min_nodes: int
    cpu_pool_max_nodes: int
    lustre: LustreSettings
    protect_data: bool
    deletion_protection: bool
    ranges: NetworkRanges
    namespace: str
    kubernetes_service_account: str
    nemo_rl_image: str
    nemo_rl_release: NemoRlRelease | None  # the row of the image's tag; None for a tag we do not know
    ray_version: str
    ray_head: PodResources
    ray_worker: PodResources
    shm_size: str
    maintenance_window_start: str
    maintenance_exclusion: str | None
    max_run_hours: int | None
    # KubeRay's in-tree autoscaler: GPU workers from 0 up to rayWorkerReplicas and back to 0 after the idle timeout.
    gpu_autoscaling: bool
    idle_timeout_seconds: int
    export_bucket: str  # "" (no export), "create", or an existing bucket's name
    # Security of the cluster itself (issue 17): nodes without public IPs (Cloud NAT for egress), the control plane
    # reached through its IAM-gated DNS endpoint, its IP endpoint off unless authorized networks are given.
    private_nodes: bool = True
    authorized_networks: tuple[str, ...] = ()
    database_encryption_key: str | None = None  # a Cloud KMS key for application-layer Secrets encryption
    # Keys whose change the user accepts to replace what it replaces (infra/day2.py); empty by default.
    allow_replace: tuple[str, ...] = ()
    # Pulumi's protect on the cluster and the GPU pool (lifted per change by allowReplace: infra.stack).
    protect_compute: bool = True
    # Keys of day2.DERIVED_FROM the user left unset, whose value the program derived (rayAutoscaling, rayVersion,
    # rayWorkerReplicas).
    derived_keys: tuple[str, ...] = ()
    # The user's own rate for one GPU node-hour (committed use, negotiated); None: the price table's.
    gpu_node_hourly_price: float | None = None
    tensorboard: bool = True  # a TensorBoard on the CPU pool over /data, read-only
    # A disk image holding the NeMo RL image (projects/P/global/images/NAME), given to GPU nodes as a secondary boot
    # disk in CONTAINER_IMAGE_CACHE mode; "" for none.
    image_cache_disk: str = ""
    # What infra/zone_table.json cannot say about the zone (a region it has not read): warned, not refused.
    zone_notes: tuple[str, ...] = ()

    @property
    def export_bucket_name(self) -> str:
        """The bucket trained models are copied to, or "" when there is none."""
        if self.export_bucket == EXPORT_BUCKET_CREATE:
            return f"{self.project}-{self.cluster_name}-models"
        return self.export_bucket

    @property
    def gke_minor(self) -> str:
        """Kubernetes minor version the cluster targets, e.g. '1.33'."""
        return ".".join(self.gke_version.split(".")[:2])

    @property
    def lustre_instance_id(self) -> str:
        return f"{self.cluster_name}-lustre"


def _require(values: Mapping[str, Any], key: str, what: str) -> Any:
    value = values.get(key)
    if value is None or value == "":
        raise ConfigError(key, value, f"required: {what} (pulumi config set {key} ...)")
    return value


def _as_int(key: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        number = int(str(value))
    except (TypeError, ValueError):
        raise ConfigError(key, value, "a whole number") from None
    return number


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(key, value, "true or false")


def _network(key: str, value: Any) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        raise ConfigError(key, value, "an IPv4 CIDR range with no host bits, such as 10.0.0.0/20") from None
    if not isinstance(network, ipaddress.IPv4Network) or not any(network.subnet_of(block) for block in _RFC1918):
        raise ConfigError(key, value, "a private IPv4 range inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16")
    return network


def _refuse_unknown_fields(key: str, raw: Mapping[str, Any], known: tuple[str, ...]) -> None:
    """A field of an object key (as `pulumi config set --path KEY.FIELD` writes it) that nothing reads."""
    for field in sorted(set(raw) - set(known)):
        raise UnknownKeyError(f"{key}.{field}", f"{_closest(field, known)} ({key} has {', '.join(known)})")


def validate_lustre_capacity(key: str, capacity: int, tier: int) -> None:
    """Managed Lustre sells capacity in tier-specific steps; anything else is rejected by the API."""
    minimum, step, step_change, step_above, maximum = LUSTRE_TIERS[tier]
    if capacity < minimum or capacity > maximum:
        raise ConfigError(key, capacity, f"{minimum}..{maximum} GiB at {tier} MB/s/TiB")
    valid = capacity % (step if capacity <= step_change else step_above) == 0
    if not valid:
        rule = f"a multiple of {step} GiB"
        if step_above != step:
            rule += f" up to {step_change}, a multiple of {step_above} above it,"
        raise ConfigError(key, capacity, f"{rule} at {tier} MB/s/TiB")


def _lustre(raw: Any) -> LustreSettings:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("lustre", raw, "an object with capacityGib, perUnitStorageThroughput, filesystem")
    _refuse_unknown_fields("lustre", raw, ("capacityGib", "perUnitStorageThroughput", "filesystem"))
    tier = _as_int("lustre.perUnitStorageThroughput", raw.get("perUnitStorageThroughput", 500))
    if tier not in LUSTRE_TIERS:
        raise ConfigError("lustre.perUnitStorageThroughput", tier, f"one of {sorted(LUSTRE_TIERS)} MB/s per TiB")
    capacity = _as_int("lustre.capacityGib", raw.get("capacityGib", 18_000))
    validate_lustre_capacity("lustre.capacityGib", capacity, tier)
    filesystem = str(raw.get("filesystem", "lustrefs"))
    if not _FILESYSTEM_RE.match(filesystem):
        raise ConfigError("lustre.filesystem", filesystem, "1 to 8 letters or digits")
    return LustreSettings(capacity_gib=capacity, throughput_mbps_per_tib=tier, filesystem=filesystem)


_RANGE_KEYS = {
    "clusterSubnet": "10.0.0.0/20",
    "pods": "10.16.0.0/14",
    "services": "10.20.0.0/20",
    "gvnicSubnet": "192.168.0.0/24",
    "lustrePeering": "10.32.0.0/20",
}


def _ranges(raw: Any) -> NetworkRanges:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("networkRanges", raw, f"an object with keys {sorted([*_RANGE_KEYS, 'rdmaSubnets'])}")
    _refuse_unknown_fields("networkRanges", raw, (*_RANGE_KEYS, "rdmaSubnets"))
    named = {name: str(raw.get(name, default)) for name, default in _RANGE_KEYS.items()}
    rdma = raw.get("rdmaSubnets", list(DEFAULT_RDMA_RANGES))
    if not isinstance(rdma, list) or len(rdma) != 8:
        raise ConfigError("networkRanges.rdmaSubnets", rdma, "a list of exactly 8 CIDR ranges, one per GPU NIC")
    parsed: list[tuple[str, ipaddress.IPv4Network]] = [
        (f"networkRanges.{name}", _network(f"networkRanges.{name}", cidr)) for name, cidr in named.items()
    ]
    parsed += [
        (f"networkRanges.rdmaSubnets[{n}]", _network(f"networkRanges.rdmaSubnets[{n}]", cidr))
        for n, cidr in enumerate(rdma)
    ]
    prefix_of_peering = parsed[4][1].prefixlen
    if prefix_of_peering != 20:
        raise ConfigError("networkRanges.lustrePeering", named["lustrePeering"], "a /20 range (Managed Lustre)")
    for i, (key_a, net_a) in enumerate(parsed):
        for key_b, net_b in parsed[i + 1 :]:
            if net_a.overlaps(net_b):
                raise ConfigError(key_b, str(net_b), f"a range that does not overlap {key_a} ({net_a})")
    return NetworkRanges(
        cluster_subnet=named["clusterSubnet"],
        pods=named["pods"],
        services=named["services"],
        gvnic_subnet=named["gvnicSubnet"],
        rdma_subnets=tuple(str(cidr) for cidr in rdma),
        lustre_peering=named["lustrePeering"],
    )


def _pod_resources(key: str, raw: Any, default: PodResources) -> PodResources:
    if raw is None:
        return default
    if not isinstance(raw, Mapping):
        raise ConfigError(key, raw, "an object with keys cpu and memory, e.g. {cpu: 64, memory: 500G}")
    _refuse_unknown_fields(key, raw, ("cpu", "memory"))
    cpu, memory = str(raw.get("cpu", default.cpu)), str(raw.get("memory", default.memory))
    try:
        if cpu_cores(cpu) <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{key}.cpu", cpu, "a positive Kubernetes CPU quantity such as 64 or 500m") from None
    try:
        if memory_bytes(memory) <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"{key}.memory", memory, "a positive Kubernetes memory quantity such as 500G or 2400Gi"
        ) from None
    return PodResources(cpu=cpu, memory=memory)


# The fluent-bit sidecar beside every Ray container: it must fit on the node too.
LOG_SIDECAR = PodResources(cpu="200m", memory="256Mi")
# The autoscaler container KubeRay adds to the head pod when in-tree autoscaling is on (KubeRay's own default size,
# set explicitly so the sizing check and the pod agree).
AUTOSCALER = PodResources(cpu="500m", memory="512Mi")
# The pre-pull DaemonSet's container (workloads/image_prepull.py): it only holds the NeMo RL image on every node.
IMAGE_HOLDER = PodResources(cpu="10m", memory="16Mi")
# Idle GPU workers are released after this long by default; GPU nodes take minutes to come back, so not KubeRay's
# 60 s (which stays the shortest allowed).
DEFAULT_IDLE_TIMEOUT_SECONDS = 600
IDLE_TIMEOUT_RANGE = (60, 86_400)


def check_fits(
    key: str,
    resources: PodResources,
    machine_type: str,
    vcpus: int,
    memory_gb: int,
    extra: tuple[PodResources, ...] = (),
) -> None:
    """Raise unless the Ray container plus its log sidecar (and any `extra` containers) fit what the node leaves
    to pods."""
    beside = (LOG_SIDECAR, *extra)
    cpu_free = allocatable_cpu(vcpus) - sum(cpu_cores(c.cpu) for c in beside)
    memory_free = allocatable_memory_bytes(memory_gb * 10**9) - sum(memory_bytes(c.memory) for c in beside)
    if cpu_cores(resources.cpu) > cpu_free:
        raise ConfigError(f"{key}.cpu", resources.cpu, f"at most {cpu_free:.1f} cores on {machine_type} ({vcpus} vCPU)")
    if memory_bytes(resources.memory) > memory_free:
        raise ConfigError(
            f"{key}.memory",
            resources.memory,
            f"at most {memory_free / 2**30:.0f}Gi on {machine_type} ({memory_gb} GB)",
        )


def check_scale(
    ranges: NetworkRanges,
    gpu_nodes: int,
    cpu_max_nodes: int,
    workers: int,
    ray_head: PodResources,
    provisioning: str,
    machine_type: str,
) -> None:
    """What N GPU nodes need (infra/scale.py): address ranges that hold every node, a Ray head sized for the
    workers, a compact placement group that holds the pool. The first problem is raised."""
    problems = scale.range_problems(
        ranges.cluster_subnet,
        ranges.pods,
        ranges.services,
        ranges.gvnic_subnet,
        ranges.rdma_subnets,
        gpu_nodes,
        cpu_max_nodes,
    )
    problems += scale.head_problems(ray_head.cpu, ray_head.memory, workers)
    compact = scale.compact_placement_problem(provisioning, machine_type, gpu_nodes)
    problems += [compact] if compact else []
    for problem in problems:
        raise ConfigError(problem.key, problem.value, problem.allowed)


def _shm_size(value: Any, ray_worker: PodResources) -> str:
    size = str(value)
    try:
        shm = memory_bytes(size)
    except ValueError:
        raise ConfigError("shmSize", size, "a Kubernetes memory quantity such as 240Gi") from None
    # Memory-backed emptyDir counts against the container's memory limit.
    if shm <= 0 or shm >= memory_bytes(ray_worker.memory):
        raise ConfigError("shmSize", size, f"more than 0 and less than the worker memory ({ray_worker.memory})")
    return size


def _gke_version(
    value: Any, preset: GpuPreset, provisioning: str, private_nodes: bool, image_cache_disk: bool = False
) -> str:
    """A bare minor (GKE picks that minor's current patch) or a full version, at or above every floor that applies
    (gke_rules: the GPU's RDMA floor, the Lustre CSI driver's, flex-start's)."""
    version = str(value)
    if gke_rules.parse_gke_version(version) is None:
        example = gke_rules.DEFAULT_GKE_VERSION
        raise ConfigError(
            "gkeVersion", version, f"a GKE minor such as {example}, or a full version such as {example}.8-gke.1036000"
        )
    rdma = gke_rules.VersionFloor(
        preset.min_gke_version, f"GPUDirect RDMA on {preset.gpu_type}", "GKE docs: gpu-bandwidth-gpudirect-rdma"
    )
    floors = gke_rules.version_floors(rdma, provisioning, private_nodes, image_cache_disk)
    for floor in sorted(floors, key=lambda f: gke_rules.parse_gke_version(f.version) or (), reverse=True):
        if gke_rules.below_floor(version, floor):
            raise ConfigError(
                "gkeVersion", version, f"at or above {floor.version}, the oldest GKE for {floor.needed_by}"
            )
    return version


def _maintenance(values: Mapping[str, Any]) -> tuple[str, str | None]:
    window = str(values.get("maintenanceWindowStart", gke_rules.DEFAULT_MAINTENANCE_WINDOW_START))
    if not _MAINTENANCE_WINDOW_RE.match(window):
        raise ConfigError(
            "maintenanceWindowStart", window, "a time of day HH:MM in UTC, e.g. 09:00 (GKE's 4-hour window)"
        )
    exclusion = str(values.get("maintenanceExclusion", gke_rules.DEFAULT_MAINTENANCE_EXCLUSION))
    allowed = (*gke_rules.MAINTENANCE_EXCLUSION_SCOPES, "none")
    if exclusion not in allowed:
        raise ConfigError(
            "maintenanceExclusion", exclusion, f"one of {list(allowed)}; 'none' lets GKE upgrade GPU nodes mid-run"
        )
    return window, None if exclusion == "none" else exclusion


def _max_run_hours(values: Mapping[str, Any], provisioning: str) -> int | None:
    hours = _as_int("maxRunHours", values.get("maxRunHours", 0))
    if hours == 0:
        return None
    limit = gke_rules.FLEX_START_MAX_RUN_HOURS
    if provisioning != "flexStart" or not 1 <= hours <= limit:
        raise ConfigError("maxRunHours", hours, f"0 (not set), or 1..{limit} with gpuProvisioning flexStart")
    return hours


def build_settings(values: Mapping[str, Any]) -> InfraSettings:
    """Validate raw config values (camelCase keys, as in Pulumi.yaml) into settings. Pure: no Pulumi runtime."""
    project = str(_require(values, "gcp:project", "the GCP project id"))
    region = str(_require(values, "gcp:region", "the region of the control plane and subnets, e.g. us-central1"))
    zone = str(_require(values, "zone", f"the zone of the GPU nodes and Lustre, inside gcp:region, e.g. {region}-b"))
    zone_match = _ZONE_RE.match(zone)
    if not zone_match or zone_match.group(1) != region:
        raise ConfigError("zone", zone, f"a zone inside gcp:region {region!r}, such as {region}-b")

    gpu_type = str(_require(values, "gpuType", f"one of {sorted(GPU_PRESETS)}"))
    if gpu_type not in GPU_PRESETS:
        raise ConfigError("gpuType", gpu_type, f"one of {sorted(GPU_PRESETS)}")
    preset = GPU_PRESETS[gpu_type]
    zone_verdict = zones.check_zone(zone, preset.machine_type)
    if zone_verdict.refusal:
        raise ConfigError("zone", zone, zone_verdict.refusal)

    provisioning = str(values.get("gpuProvisioning", "reservation"))
    if provisioning not in GPU_PROVISIONING_MODES:
        raise ConfigError("gpuProvisioning", provisioning, f"one of {list(GPU_PROVISIONING_MODES)}")
    reservation = values.get("reservation") or None
    if provisioning == "reservation" and not reservation:
        raise ConfigError(
            "reservation",
            reservation,
            "the name of your GPU reservation, required when gpuProvisioning is 'reservation' "
            "(pulumi config set reservation NAME), or set gpuProvisioning to spot or flexStart",
        )
    if reservation and provisioning != "reservation":
        raise ConfigError("reservation", reservation, f"unset when gpuProvisioning is {provisioning!r}")

    gpu_nodes = _as_int("gpuNodes", values.get("gpuNodes", 2))
    if gpu_nodes < 1:
        raise ConfigError("gpuNodes", gpu_nodes, "1 or more")
    # 0 (the declared default) means one worker per GPU node.
    replicas = _as_int("rayWorkerReplicas", values.get("rayWorkerReplicas", 0)) or gpu_nodes
    if replicas < 1 or replicas > gpu_nodes:
        raise ConfigError("rayWorkerReplicas", replicas, f"1..gpuNodes ({gpu_nodes}): one Ray worker per GPU node")

    cluster_name = str(values.get("clusterName", "nemo-rl"))
    if not _CLUSTER_NAME_RE.match(cluster_name):
        raise ConfigError(
            "clusterName",
            cluster_name,
            "2-24 characters: a lowercase letter, then lowercase letters, digits or hyphens, ending in a letter or "
            "digit (GKE's rule; 2 to 24 so the service accounts named after it fit GCP's 6-30 character ids)",
        )

    cpu_machine_type = str(values.get("cpuMachineType", "n2-highmem-80"))
    if cpu_machine_type not in CPU_MACHINES:
        raise ConfigError("cpuMachineType", cpu_machine_type, f"one of {sorted(CPU_MACHINES)}")
    cpu_machine: CpuMachine = CPU_MACHINES[cpu_machine_type]
    cpu_min = _as_int("cpuPoolMinNodes", values.get("cpuPoolMinNodes", 1))
    cpu_max = _as_int("cpuPoolMaxNodes", values.get("cpuPoolMaxNodes", 5))
    if cpu_min < 1:
        raise ConfigError("cpuPoolMinNodes", cpu_min, "1 or more: the Ray head and system pods live there")
    if cpu_max < cpu_min:
        raise ConfigError("cpuPoolMaxNodes", cpu_max, f"at least cpuPoolMinNodes ({cpu_min})")

    release_channel = str(values.get("releaseChannel", "REGULAR"))
    if release_channel not in ("RAPID", "REGULAR", "STABLE", "EXTENDED"):
        raise ConfigError("releaseChannel", release_channel, "RAPID, REGULAR, STABLE or EXTENDED")

    # The Ray namespace, created by the stack with Pod Security labels (workloads/pod_security.py).
    namespace = str(values.get("namespace", "nemo-rl"))
    if not _DNS_LABEL_RE.match(namespace):
        raise ConfigError("namespace", namespace, "a Kubernetes namespace name (DNS label: a-z, 0-9, '-', 1-63)")
    ksa = str(values.get("kubernetesServiceAccount", "generic-ksa"))
    if not _DNS_LABEL_RE.match(ksa):
        raise ConfigError("kubernetesServiceAccount", ksa, "a DNS label: a-z, 0-9, '-', 1-63 characters")
    if ksa == f"{cluster_name}-ray-worker":  # workloads.stack.worker_service_account: the workers' own account
        raise ConfigError("kubernetesServiceAccount", ksa, f"any name but {ksa}, the GPU workers' own account")

    image = _image(values.get("nemoRlImage", DEFAULT_IMAGE))
    release = release_for(image)
    ray_version = values.get("rayVersion") or (release.ray_version if release else None)
    if release and str(ray_version) != release.ray_version:
        # Most likely a rayVersion left over from another image: the tag alone decides for a known release.
        raise ConfigError(
            "rayVersion",
            ray_version,
            f"empty or {release.ray_version}, the Ray inside NeMo RL {release.tag} ({image})",
        )
    if not ray_version:
        raise ConfigError(
            "rayVersion",
            ray_version,
            f"the Ray version inside {image}, whose tag is none of the known NeMo RL releases "
            f"({', '.join(NEMO_RL_RELEASES)}): set rayVersion, or use one of those tags",
        )
    if not _RAY_VERSION_RE.match(str(ray_version)):
        raise ConfigError("rayVersion", ray_version, "a Ray release such as 2.49.2")

    maintenance_window_start, maintenance_exclusion = _maintenance(values)
    private_nodes = _as_bool("privateNodes", values.get("privateNodes", True))
    image_cache_disk = _image_cache_disk(values.get("imageCacheDisk", ""), project)
    # On by default where idle GPUs cost money that can be saved (spot, flex-start); a reservation bills anyway.
    # Empty (the declared default) means: by provisioning mode.
    autoscaling_raw = values.get("rayAutoscaling")
    gpu_autoscaling = (
        _as_bool("rayAutoscaling", autoscaling_raw)
        if autoscaling_raw not in (None, "")
        else provisioning != "reservation"
    )
    idle_timeout = _as_int("rayIdleTimeoutSeconds", values.get("rayIdleTimeoutSeconds", DEFAULT_IDLE_TIMEOUT_SECONDS))
    shortest, longest = IDLE_TIMEOUT_RANGE
    if not shortest <= idle_timeout <= longest:
        raise ConfigError("rayIdleTimeoutSeconds", idle_timeout, f"{shortest}..{longest} seconds")

    ray_head = _pod_resources("rayHead", values.get("rayHead"), PodResources(cpu="64", memory="500G"))
    head_extra = (IMAGE_HOLDER, AUTOSCALER) if gpu_autoscaling else (IMAGE_HOLDER,)
    check_fits("rayHead", ray_head, cpu_machine_type, cpu_machine.vcpus, cpu_machine.memory_gb, head_extra)
    ray_worker = _pod_resources("rayWorker", values.get("rayWorker"), PodResources(cpu="206", memory="2400Gi"))
    check_fits("rayWorker", ray_worker, preset.machine_type, preset.vcpus, preset.memory_gb, (IMAGE_HOLDER,))
    ranges = _ranges(values.get("networkRanges"))
    check_scale(ranges, gpu_nodes, cpu_max, replicas, ray_head, provisioning, preset.machine_type)

    return InfraSettings(
        project=project,
        region=region,
        zone=zone,
        preset=preset,
        gpu_provisioning=provisioning,
        reservation=str(reservation) if reservation else None,
        gpu_nodes=gpu_nodes,
        ray_worker_replicas=replicas,
        cluster_name=cluster_name,
        gke_version=_gke_version(
            values.get("gkeVersion", gke_rules.DEFAULT_GKE_VERSION),
            preset,
            provisioning,
            private_nodes,
            bool(image_cache_disk),
        ),
        release_channel=release_channel,
        cpu_machine_type=cpu_machine_type,
        cpu_pool_min_nodes=cpu_min,
        cpu_pool_max_nodes=cpu_max,
        lustre=_lustre(values.get("lustre")),
        protect_data=_as_bool("protectData", values.get("protectData", True)),
        protect_compute=_as_bool("protectCompute", values.get("protectCompute", True)),
        deletion_protection=_as_bool("deletionProtection", values.get("deletionProtection", False)),
        ranges=ranges,
        namespace=namespace,
        kubernetes_service_account=ksa,
        nemo_rl_image=image,
        nemo_rl_release=release,
        ray_version=str(ray_version),
        ray_head=ray_head,
        ray_worker=ray_worker,
        shm_size=_shm_size(values.get("shmSize", "240Gi"), ray_worker),
        maintenance_window_start=maintenance_window_start,
        maintenance_exclusion=maintenance_exclusion,
        max_run_hours=_max_run_hours(values, provisioning),
        gpu_autoscaling=gpu_autoscaling,
        idle_timeout_seconds=idle_timeout,
        export_bucket=_export_bucket(values.get("exportBucket", "")),
        private_nodes=private_nodes,
        authorized_networks=_authorized_networks(values.get("authorizedNetworks")),
        database_encryption_key=_database_encryption_key(values.get("databaseEncryptionKey", ""), region),
        allow_replace=_allow_replace(values.get(day2.ALLOW_REPLACE_KEY)),
        derived_keys=tuple(
            key
            for key in day2.DERIVED_FROM
            # rayWorkerReplicas is declared with the default 0: one worker per GPU node.
            if str(values.get(key, "")) in ("", "0" if key == "rayWorkerReplicas" else "")
        ),
        gpu_node_hourly_price=_gpu_node_hourly_price(values.get("gpuNodeHourlyPrice", "")),
        tensorboard=_as_bool("tensorboard", values.get("tensorboard", True)),
        image_cache_disk=image_cache_disk,
        zone_notes=zone_verdict.notes,
    )


def _image(value: Any) -> str:
    """`repository:tag` or `repository:tag@sha256:<64 hex>`: the tag names the NeMo RL release, a digest pins the
    exact image (what the registry serves for the tag may change; the digest cannot)."""
    image = str(value)
    named, at, digest = image.partition("@")
    if at and not _DIGEST_RE.match(digest):
        raise ConfigError(
            "nemoRlImage",
            image,
            f"a digest of the form sha256: and 64 lowercase hex digits after '@', e.g. {DEFAULT_IMAGE}@sha256:"
            f"{'0' * 64} (as `docker buildx imagetools inspect` or the registry prints it)",
        )
    if not _IMAGE_RE.match(named) or named.endswith(":latest"):
        raise ConfigError(
            "nemoRlImage",
            image,
            f"an image reference with a pinned tag, e.g. {DEFAULT_IMAGE}, optionally pinned further by digest "
            f"({DEFAULT_IMAGE}@sha256:<64 hex digits>)",
        )
    return image


def _authorized_networks(raw: Any) -> tuple[str, ...]:
    """CIDR ranges allowed to reach the control plane's IP endpoint; none (the default) turns that endpoint off
    and leaves only the IAM-gated DNS endpoint. Set as a list in the stack file, or as JSON / comma-separated text."""
    key = "authorizedNetworks"
    if raw is None or raw == "":
        return ()
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith(("[", "{")):
            try:
                raw = json.loads(text)
            except ValueError:
                raise ConfigError(key, raw, 'a list of CIDR ranges, e.g. ["203.0.113.0/24"]') from None
        else:
            raw = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(raw, list):
        raise ConfigError(key, raw, 'a list of CIDR ranges, e.g. ["203.0.113.0/24"]')
    limit = gke_rules.MAX_AUTHORIZED_NETWORKS
    if len(raw) > limit:
        raise ConfigError(key, raw, f"at most {limit} CIDR ranges (GKE's limit)")
    seen: dict[ipaddress.IPv4Network, int] = {}
    for n, cidr in enumerate(raw):
        item = f"{key}[{n}]"
        try:
            network = ipaddress.ip_network(str(cidr), strict=True)
        except ValueError:
            raise ConfigError(item, cidr, "an IPv4 CIDR range with no host bits, such as 203.0.113.0/24") from None
        if not isinstance(network, ipaddress.IPv4Network):
            raise ConfigError(item, cidr, "an IPv4 CIDR range (GKE's authorized networks are IPv4)")
        if network.prefixlen < 8:
            raise ConfigError(
                item, cidr, "a range of /8 or narrower: a wider one opens the control plane to much of the internet"
            )
        if network in seen:
            raise ConfigError(item, cidr, f"a range not already listed (it repeats {key}[{seen[network]}])")
        seen[network] = n
    return tuple(str(cidr) for cidr in raw)


def _database_encryption_key(value: Any, region: str) -> str | None:
    key_name = str(value or "")
    if not key_name:
        return None
    match = gke_rules.KMS_KEY_RE.match(key_name)
    if not match:
        raise ConfigError(
            "databaseEncryptionKey",
            key_name,
            "'' (GKE's default encryption), or a Cloud KMS key's resource name: "
            f"projects/PROJECT/locations/{region}/keyRings/RING/cryptoKeys/KEY",
        )
    if match.group(2) != region:
        raise ConfigError(
            "databaseEncryptionKey",
            key_name,
            f"a key in the cluster's region: locations/{region} (GKE requires the key in the cluster's location), "
            f"not locations/{match.group(2)}",
        )
    return key_name


def _allow_replace(raw: Any) -> tuple[str, ...]:
    """The keys a user lets replace what they replace: `pulumi config set --path 'allowReplace[0]' zone`."""
    key = day2.ALLOW_REPLACE_KEY
    if raw is None or raw == "":
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise ConfigError(key, raw, f"a list of key names, set with: pulumi config set --path '{key}[0]' zone")
    known = day2.REPLACEABLE_KEYS
    for item in raw:
        if item not in known:
            effect = day2.EFFECTS_BY_KEY.get(item)
            why = f"{item} is refused even when listed ({effect.what}); " if effect and effect.guarded else ""
            raise ConfigError(f"{key}[{raw.index(item)}]", item, f"{why}one of {', '.join(known)}")
    return tuple(dict.fromkeys(raw))


def _gpu_node_hourly_price(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        price = float(str(value))
    except (TypeError, ValueError):
        price = math.nan
    if not math.isfinite(price) or price <= 0:
        raise ConfigError(
            "gpuNodeHourlyPrice",
            value,
            "a positive number of US dollars per GPU node-hour, such as 61.50 (your committed-use or negotiated "
            "rate), or empty for the price table's rate",
        )
    return price


# A Compute Engine image: its name (in the stack's project) or its full resource path.
_IMAGE_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DISK_IMAGE_RE = re.compile(rf"^(?:projects/([a-z][-a-z0-9]{{4,28}}[a-z0-9])/global/images/)?({_IMAGE_NAME})$")


def _image_cache_disk(value: Any, project: str) -> str:
    """'' (none), or the fully-qualified disk image GKE asks for (SecondaryBootDisk.diskImage): a bare image name
    is taken from the stack's own project."""
    text = str(value or "")
    if not text:
        return ""
    match = _DISK_IMAGE_RE.match(text)
    if not match:
        raise ConfigError(
            "imageCacheDisk",
            text,
            "'' (none), a disk image name in the stack's project, or projects/PROJECT/global/images/NAME: a disk image "
            "built with gke-disk-image-builder that holds nemoRlImage (docs/design.md, Faster start-up)",
        )
    return f"projects/{match.group(1) or project}/global/images/{match.group(2)}"


def _export_bucket(value: Any) -> str:
    bucket = str(value or "")
    if bucket and bucket != EXPORT_BUCKET_CREATE and (not _BUCKET_RE.match(bucket) or bucket.startswith("goog")):
        raise ConfigError(
            "exportBucket",
            bucket,
            f"'' (no export), '{EXPORT_BUCKET_CREATE}' (a new bucket PROJECT-CLUSTER-models), or an existing bucket's "
            "name: 3-63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit",
        )
    return bucket


# Non-secret project keys read with Config.get/get_object; secrets are read separately.
_PLAIN_KEYS = (
    "zone", "gpuType", "gpuProvisioning", "reservation", "gpuNodes", "rayWorkerReplicas", "clusterName",
    "gkeVersion", "releaseChannel", "cpuMachineType", "cpuPoolMinNodes", "cpuPoolMaxNodes", "protectData",
    "protectCompute", "deletionProtection", "namespace", "kubernetesServiceAccount", "nemoRlImage", "rayVersion",
    "shmSize",
    "maintenanceWindowStart", "maintenanceExclusion", "maxRunHours",
    "rayAutoscaling", "rayIdleTimeoutSeconds",
    "exportBucket",
    "privateNodes", "authorizedNetworks", "databaseEncryptionKey",
    "gpuNodeHourlyPrice", "tensorboard", "imageCacheDisk",
)  # fmt: skip
_OBJECT_KEYS = ("lustre", "networkRanges", "rayHead", "rayWorker", day2.ALLOW_REPLACE_KEY)


_SECRET_KEYS = ("hfToken", "wandbApiKey")
# Providers' own namespaces: their keys are theirs to check.
_PROVIDER_NAMESPACES = ("gcp", "kubernetes", "pulumi")


def check_keys(project: str, keys: Iterable[str]) -> None:
    """Refuse config the program would silently ignore: an unknown key in the project's namespace (a misspelt
    `gpuNode`, or `lustre.capacityGib` set without --path), or a key in a namespace that is a near miss of the
    project's (`nemo-rl:zone`). Names the key and the closest known one."""
    known = (*_PLAIN_KEYS, *_OBJECT_KEYS, *_SECRET_KEYS)
    for full_key in sorted(keys):
        namespace, _, key = full_key.rpartition(":")
        if namespace == project and key not in known:
            head = key.split(".")[0]
            if "." in key and head in _OBJECT_KEYS:
                hint = f"a nested key: pulumi config set --path {key} VALUE"
            else:
                hint = _closest(key, known)
            raise UnknownKeyError(full_key, hint)
        if namespace not in (project, *_PROVIDER_NAMESPACES) and difflib.get_close_matches(namespace, [project]):
            raise UnknownKeyError(full_key, f"its namespace is not {project!r}; did you mean '{project}:{key}'?")


# Names a user may reach for that are not this project's keys, by their letters alone (case, '_' and '-' dropped):
# the provider's own keys set without their namespace, and the variables of the GKE NeMo RL tutorial this project
# replaces (its `export NAME=...` lines). Each maps to what to set instead.
KEY_ALIASES: dict[str, str] = {
    "region": "'gcp:region' (the provider's key: pulumi config set gcp:region REGION)",
    "controlplaneregion": "'gcp:region' (the provider's key: pulumi config set gcp:region REGION)",
    "project": "'gcp:project' (the provider's key: pulumi config set gcp:project PROJECT_ID)",
    "projectid": "'gcp:project' (the provider's key: pulumi config set gcp:project PROJECT_ID)",
    "nodezone": "'zone'",
    "gpuzone": "'zone'",
    "machinetype": "'gpuType': the GPU nodes' machine type follows it (nvidia-h200-141gb: a3-ultragpu-8g, "
    "nvidia-b200: a4-highgpu-8g); the CPU pool's is 'cpuMachineType'",
    "gpumachinetype": "'gpuType': the GPU nodes' machine type follows it (nvidia-h200-141gb: a3-ultragpu-8g, "
    "nvidia-b200: a4-highgpu-8g)",
    "ksaname": "'kubernetesServiceAccount'",
    "lustrename": "'clusterName': the Lustre instance is named CLUSTER-lustre (its file system name is "
    "lustre.filesystem: pulumi config set --path lustre.filesystem NAME)",
    "replicacount": "'rayWorkerReplicas'",
    "hftoken": "'hfToken', stored encrypted: pulumi config set --secret hfToken hf_...",
    "wandbapikey": "'wandbApiKey', stored encrypted: pulumi config set --secret wandbApiKey KEY",
    "network": "nothing: the networks are named after clusterName; their ranges are networkRanges",
    "gvnicnetworkprefix": "nothing: the gVNIC network is named after clusterName; its range is "
    "networkRanges.gvnicSubnet",
    "rdmanetworkprefix": "nothing: the RDMA network is named after clusterName; its ranges are "
    "networkRanges.rdmaSubnets",
}


def alias_hint(key: str, aliases: Mapping[str, str]) -> str | None:
    """What to set instead of `key` when it is a known stand-in (KEY_ALIASES), else None."""
    target = aliases.get(re.sub(r"[^a-z0-9]", "", key.lower()))
    return f"did you mean {target}?" if target else None


def _closest(key: str, known: Iterable[str]) -> str:
    alias = alias_hint(key, KEY_ALIASES)
    if alias:
        return alias
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else "see the configuration tables in docs/configuration.md"


def runtime_config_keys() -> set[str]:
    """Every config key the engine handed the program (`pulumi up` passes them in PULUMI_CONFIG; mocks and
    tools/offline.py set them in the runtime's map)."""
    return set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.config.get_config_env())


@dataclass(frozen=True)
class Secrets:
    hf_token: pulumi.Output[str]
    wandb_api_key: pulumi.Output[str] | None


def load() -> tuple[InfraSettings, Secrets]:
    """Read the stack's config once. Raises ConfigError before any resource is registered."""
    config = pulumi.Config()
    check_keys(pulumi.get_project(), runtime_config_keys())
    gcp = pulumi.Config("gcp")
    values: dict[str, Any] = {"gcp:project": gcp.get("project"), "gcp:region": gcp.get("region")}
    for key in _PLAIN_KEYS:
        value = config.get(key)
        if value is not None:
            values[key] = value
    for key in _OBJECT_KEYS:
        text = config.get(key)
        if text is not None:
            try:
                values[key] = json.loads(text)
            except ValueError:
                values[key] = text  # not JSON (set without --path): the key's own check names it

    hf_token = config.get_secret("hfToken")
    if hf_token is None:
        raise ConfigError(
            "hfToken",
            None,
            "required: your Hugging Face token, stored encrypted: pulumi config set --secret hfToken hf_...",
        )
    settings = build_settings(values)
    for note in settings.zone_notes:
        pulumi.log.warn(note)
    return settings, Secrets(hf_token=hf_token, wandb_api_key=config.get_secret("wandbApiKey"))
