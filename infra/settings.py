"""The infra project's settings: one pydantic model read once from Pulumi config, validated before any resource
exists. Field aliases are the config keys; each field's docstring is its row in docs/configuration.md and its
description in Pulumi.yaml (tools/config_docs.py writes both)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pulumi
from config_rules import (
    Allowed,
    ConfigError,
    Flag,
    Required,
    Secret,
    Settings,
    Shown,
    Text,
    UnknownKeyError,
    WholeNumber,
    read_config,
    validated,
)
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from infra import gke_rules, scale, zones
from infra.day2_effects import EFFECTS_BY_KEY, REPLACEABLE_KEYS
from infra.keys import ALLOW_REPLACE_KEY, DERIVED_FROM, EXPORT_BUCKET_CREATE
from infra.nemo_rl_releases import DEFAULT_IMAGE, NEMO_RL_RELEASES, NemoRlRelease, release_for
from infra.presets import CPU_MACHINES, GPU_PRESETS, CpuMachineType, GpuPreset, GpuType
from infra.sizing import allocatable_cpu, allocatable_memory_bytes, cpu_cores, memory_bytes

__all__ = ["EXPORT_BUCKET_CREATE", "ConfigError", "UnknownKeyError"]

# Lustre throughput tiers (MB/s per TiB) -> (minimum, step, step-change point, step above it, maximum) GiB.
LUSTRE_TIERS: dict[int, tuple[int, int, int, int, int]] = {
    1000: (9_000, 9_000, 1_530_000, 72_000, 10_008_000),
    500: (18_000, 18_000, 3_060_000, 144_000, 20_016_000),
    250: (36_000, 36_000, 6_120_000, 288_000, 40_032_000),
    125: (72_000, 72_000, 12_240_000, 72_000, 12_240_000),
}
_RFC1918 = tuple(ipaddress.IPv4Network(cidr) for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_IMAGE_RE = r"^[a-z0-9.\-/:]+:[A-Za-z0-9_.\-]+$"  # repository:tag (the digest is split off first)
# An image digest as registries give it: the tag still names the NeMo RL release, the digest pins its bytes.
_DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
_DNS_LABEL = r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
_ZONE_RE = r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$"
# A Compute Engine image: its name (in the stack's project) or its full resource path.
_DISK_IMAGE_RE = r"^(?:projects/([a-z][-a-z0-9]{4,28}[a-z0-9])/global/images/)?([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$"


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


def _price_text(value: Any) -> Any:
    # As text, so that a boolean is no price (pydantic's float takes True as 1.0).
    return None if value in ("", None) else str(value)


def _network(cidr: str, example: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        raise PydanticCustomError("cidr", f"an IPv4 CIDR range with no host bits, such as {example}") from None


def _private_range(cidr: str) -> str:
    network = _network(cidr, "10.0.0.0/20")
    if not isinstance(network, ipaddress.IPv4Network) or not any(network.subnet_of(block) for block in _RFC1918):
        raise PydanticCustomError(
            "private_range", "a private IPv4 range inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
        )
    return cidr


def _control_plane_client(cidr: str) -> str:
    network = _network(cidr, "203.0.113.0/24")
    if not isinstance(network, ipaddress.IPv4Network):
        raise PydanticCustomError("ipv4", "an IPv4 CIDR range (GKE's authorized networks are IPv4)")
    if network.prefixlen < 8:
        raise PydanticCustomError(
            "wide", "a range of /8 or narrower: a wider one opens the control plane to much of the internet"
        )
    return cidr


def _positive(parse: Callable[[str], float], what: str) -> AfterValidator:
    """A Kubernetes quantity that `parse` reads as more than 0."""

    def check(quantity: str) -> str:
        with contextlib.suppress(ValueError):
            if parse(quantity) > 0:
                return quantity
        raise PydanticCustomError("quantity", f"a positive Kubernetes {what}")

    return AfterValidator(check)


PrivateRange = Annotated[Text, AfterValidator(_private_range)]
CpuQuantity = Annotated[Text, _positive(cpu_cores, "CPU quantity such as 64 or 500m")]
MemoryQuantity = Annotated[Text, _positive(memory_bytes, "memory quantity such as 500G or 2400Gi")]
# The deployed record (infra/day2.py) has always held "" or 0 for a key left unset.
_RECORDED_EMPTY = PlainSerializer(lambda value: value or "")
_RECORDED_ZERO = PlainSerializer(lambda value: value or 0)
# rayHead and rayWorker given as anything but an object.
_POD_OBJECT = Allowed("an object with keys cpu and memory, e.g. {cpu: 64, memory: 500G}")


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


class LustreSettings(Settings):
    capacity_gib: WholeNumber = Field(18_000, alias="capacityGib")
    """GiB, in the tier's steps: 1000 → 9,000–10,008,000 by 9,000 (by 72,000 above 1,530,000); 500 → 18,000–20,016,000
    by 18,000 (by 144,000 above 3,060,000); 250 → 36,000–40,032,000 by 36,000 (by 288,000 above 6,120,000); 125 →
    72,000–12,240,000 by 72,000."""
    throughput_mbps_per_tib: WholeNumber = Field(500, alias="perUnitStorageThroughput")
    """MB/s per TiB: `125`, `250`, `500` or `1000`."""
    filesystem: Annotated[Text, Field(pattern=r"^[A-Za-z0-9]{1,8}$"), Allowed("1 to 8 letters or digits")] = "lustrefs"
    """1–8 letters or digits."""

    @model_validator(mode="after")
    def _tier_steps(self) -> LustreSettings:
        tier = self.throughput_mbps_per_tib
        if tier not in LUSTRE_TIERS:
            raise ConfigError("lustre.perUnitStorageThroughput", tier, f"one of {sorted(LUSTRE_TIERS)} MB/s per TiB")
        validate_lustre_capacity("lustre.capacityGib", self.capacity_gib, tier)
        return self


class NetworkRanges(Settings):
    cluster_subnet: PrivateRange = Field("10.0.0.0/20", alias="clusterSubnet")
    """Nodes of the cluster VPC."""
    pods: PrivateRange = "10.16.0.0/14"
    """Pod secondary range."""
    services: PrivateRange = "10.20.0.0/20"
    """Service secondary range."""
    gvnic_subnet: PrivateRange = Field("192.168.0.0/24", alias="gvnicSubnet")
    """Second gVNIC; also the only source the gVNIC firewall admits."""
    rdma_subnets: Annotated[tuple[PrivateRange, ...], Shown("`192.168.1.0/24` … `192.168.8.0/24`")] = Field(
        tuple(f"192.168.{n}.0/24" for n in range(1, 9)), alias="rdmaSubnets"
    )
    """Exactly 8 ranges, one per RDMA NIC, in GPU order."""
    lustre_peering: PrivateRange = Field("10.32.0.0/20", alias="lustrePeering")
    """Private services access range for Lustre; must be a /20."""

    @field_validator("rdma_subnets", mode="before")
    @classmethod
    def _one_per_nic(cls, rdma: Any) -> Any:
        if not isinstance(rdma, list | tuple) or len(rdma) != 8:
            raise ConfigError("networkRanges.rdmaSubnets", rdma, "a list of exactly 8 CIDR ranges, one per GPU NIC")
        return rdma

    @model_validator(mode="after")
    def _apart(self) -> NetworkRanges:
        if ipaddress.ip_network(self.lustre_peering).prefixlen != 20:
            raise ConfigError("networkRanges.lustrePeering", self.lustre_peering, "a /20 range (Managed Lustre)")
        ranges = {f"networkRanges.{key}": cidr for key, cidr in self.model_dump(by_alias=True).items()}
        ranges |= {
            f"networkRanges.rdmaSubnets[{n}]": cidr for n, cidr in enumerate(ranges.pop("networkRanges.rdmaSubnets"))
        }
        parsed = [(key, ipaddress.ip_network(cidr)) for key, cidr in ranges.items()]
        for i, (key_a, net_a) in enumerate(parsed):
            for key_b, net_b in parsed[i + 1 :]:
                if net_a.overlaps(net_b):
                    raise ConfigError(key_b, str(net_b), f"a range that does not overlap {key_a} ({net_a})")
        return self


class PodResources(Settings):
    cpu: CpuQuantity
    memory: MemoryQuantity


class RayHead(PodResources):
    cpu: CpuQuantity = "64"
    """The Ray head's CPU (request = limit), a Kubernetes CPU quantity."""
    memory: MemoryQuantity = "500G"
    """The Ray head's memory (request = limit), a Kubernetes memory quantity."""


class RayWorker(PodResources):
    cpu: CpuQuantity = "206"
    """Each GPU worker's CPU (request = limit), a Kubernetes CPU quantity."""
    memory: MemoryQuantity = "2400Gi"
    """Each GPU worker's memory (request = limit), a Kubernetes memory quantity."""


# The fluent-bit sidecar beside every Ray container: it must fit on the node too.
LOG_SIDECAR = PodResources(cpu="200m", memory="256Mi")
# The autoscaler container KubeRay adds to the head pod when in-tree autoscaling is on (KubeRay's own default size,
# set explicitly so the sizing check and the pod agree).
AUTOSCALER = PodResources(cpu="500m", memory="512Mi")
# The pre-pull DaemonSet's container (workloads/image_prepull.py): it only holds the NeMo RL image on every node.
IMAGE_HOLDER = PodResources(cpu="10m", memory="16Mi")


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


class SiteSettings(Settings):
    """Where the stack is and what it is named after: every component reads these."""

    project: Annotated[Text, Field(min_length=1, alias="gcp:project"), Required("the GCP project id")]
    """GCP project id."""
    region: Annotated[
        Text,
        Field(min_length=1, alias="gcp:region"),
        Required("the region of the control plane and subnets, e.g. us-central1"),
    ]
    """Region of the control plane and subnets."""
    zone: Text
    """Zone of the GPU nodes, the CPU pool (so the Ray head), and Lustre; must be inside `gcp:region` and offer the GPU
    machine type and Managed Lustre (see [Zones](#zones)). Use your reservation's zone."""
    cluster_name: Annotated[
        Text,
        Field(alias="clusterName", pattern=r"^[a-z][a-z0-9-]{0,22}[a-z0-9]$"),
        Allowed(
            "2-24 characters: a lowercase letter, then lowercase letters, digits or hyphens, ending in a letter or "
            "digit (GKE's rule; 2 to 24 so the service accounts named after it fit GCP's 6-30 character ids)"
        ),
    ] = "nemo-rl"
    """GKE cluster name and prefix of every other name: 2–24 characters, lowercase letter first, then lowercase letters,
    digits, hyphens, ending in a letter or digit."""
    # Keys of DERIVED_FROM the user left unset, whose value the program derived.
    _derived: frozenset[str] = PrivateAttr(frozenset())

    @model_validator(mode="before")
    @classmethod
    def _zone_is_set(cls, values: Any) -> Any:
        # Before the fields: the rule names the zone of the region given.
        region = values.get("gcp:region") if isinstance(values, dict) else None
        if region and values.get("gcp:project") and not values.get("zone"):
            raise ConfigError(
                "zone",
                values.get("zone"),
                f"required: the zone of the GPU nodes and Lustre, inside gcp:region, e.g. {region}-b "
                "(pulumi config set zone ...)",
            )
        return values

    @model_validator(mode="after")
    def _zone_in_region(self) -> SiteSettings:
        region, zone = self.region, self.zone
        zone_match = re.match(_ZONE_RE, zone)
        if not zone_match or zone_match.group(1) != region:
            raise ConfigError("zone", zone, f"a zone inside gcp:region {region!r}, such as {region}-b")
        return self

    def _derive(self, field: str, value: Any) -> None:
        """Fill in a key of DERIVED_FROM that the user left unset; frozen for everyone else."""
        self._derived |= {type(self).model_fields[field].alias or field}
        object.__setattr__(self, field, value)

    @property
    def derived_keys(self) -> tuple[str, ...]:
        return tuple(key for key in DERIVED_FROM if key in self._derived)


class NetworkSettings(SiteSettings):
    """The three VPCs and their subnets (infra/network.py)."""

    ranges: NetworkRanges = Field(default_factory=lambda: NetworkRanges.model_validate({}), alias="networkRanges")
    """Object."""


class ClusterSettings(SiteSettings):
    """The GKE cluster, its control plane and its CPU node pool (infra/cluster.py)."""

    gke_version: Annotated[
        Text,
        Field(alias="gkeVersion", pattern=gke_rules.GKE_VERSION_RE.pattern),
        Allowed(
            f"a GKE minor such as {gke_rules.DEFAULT_GKE_VERSION}, or a full version such as "
            f"{gke_rules.DEFAULT_GKE_VERSION}.8-gke.1036000"
        ),
    ] = gke_rules.DEFAULT_GKE_VERSION
    """Minimum control-plane version: a minor such as `1.35`, or a full GKE version such as `1.35.8-gke.1036000`; at or
    above every floor Google documents for what the stack uses (`infra/gke_rules.py`): the Managed Lustre CSI driver
    1.33.2-gke.1111000, A4 RDMA 1.32.2-gke.1475000, A3 Ultra 1.31.4-gke.1183000, flex-start 1.32.2-gke.1652000, GKE's
    managed DCGM metrics 1.32.1-gke.1357000. 1.35 is the Regular channel's default for new clusters since September
    2026; 1.33 and 1.34 are past standard support."""
    release_channel: Annotated[
        Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"],
        Field(alias="releaseChannel"),
        Allowed("RAPID, REGULAR, STABLE or EXTENDED"),
    ] = "REGULAR"
    """`RAPID`, `REGULAR`, `STABLE` or `EXTENDED`."""
    maintenance_window_start: Annotated[
        Text,
        Field(alias="maintenanceWindowStart", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$"),
        Allowed("a time of day HH:MM in UTC, e.g. 09:00 (GKE's 4-hour window)"),
    ] = gke_rules.DEFAULT_MAINTENANCE_WINDOW_START
    """Start of GKE's daily 4-hour maintenance window, `HH:MM` UTC."""
    maintenance_exclusion: Annotated[
        Literal["NO_MINOR_OR_NODE_UPGRADES", "NO_MINOR_UPGRADES"] | None,
        BeforeValidator(lambda value: None if value == "none" else value),
        Field(alias="maintenanceExclusion"),
        Allowed(
            f"one of {[*gke_rules.MAINTENANCE_EXCLUSION_SCOPES, 'none']}; 'none' lets GKE upgrade GPU nodes mid-run"
        ),
        _RECORDED_EMPTY,
    ] = "NO_MINOR_OR_NODE_UPGRADES"
    """Maintenance exclusion kept until the end of the minor's support: `NO_MINOR_OR_NODE_UPGRADES` (GKE never drains a
    GPU node for an upgrade mid-run, as Cluster Toolkit's A3 Ultra/A4 blueprints do; upgrade between runs yourself),
    `NO_MINOR_UPGRADES`, or `none`."""
    cpu_machine_type: Annotated[
        CpuMachineType, Field(alias="cpuMachineType"), Allowed(f"one of {sorted(CPU_MACHINES)}")
    ] = "n2-highmem-80"
    """CPU pool machine; one of the types listed in `infra/presets.py` (`CPU_MACHINES`), so the Ray head can be sized
    against it."""
    cpu_pool_min_nodes: Annotated[
        WholeNumber, Field(alias="cpuPoolMinNodes", ge=1), Allowed("1 or more: the Ray head and system pods live there")
    ] = 1
    """At least 1: the Ray head and system pods live there."""
    cpu_pool_max_nodes: WholeNumber = Field(5, alias="cpuPoolMaxNodes")
    """At least `cpuPoolMinNodes`."""
    deletion_protection: Flag = Field(False, alias="deletionProtection")
    """GKE deletion protection (see [Tear down in detail](operations.md#tear-down-in-detail))."""
    private_nodes: Flag = Field(True, alias="privateNodes")
    """Nodes without external IP addresses; they reach the internet (nvcr.io, Hugging Face) through a Cloud Router and
    Cloud NAT on the cluster VPC (`PREFIX-router`, `PREFIX-nat`; Google APIs through Private Google Access). `false`
    gives nodes public IPs and creates no NAT. See [Cluster security](security.md#cluster-security)."""
    authorized_networks: Annotated[
        tuple[Annotated[Text, AfterValidator(_control_plane_client)], ...], Field(alias="authorizedNetworks")
    ] = ()
    """IPv4 CIDR ranges (at most 50, each `/8` or narrower, no host bits, no repeats) allowed to reach the control
    plane's IP endpoint; empty (the default) turns the IP endpoint off, so the IAM-gated DNS endpoint is the only way
    in. Set it in the stack file as a list, or `pulumi config set authorizedNetworks 203.0.113.0/24,198.51.100.7/32`."""
    database_encryption_key: Annotated[
        Text | None, BeforeValidator(_empty_is_none), Field(alias="databaseEncryptionKey"), _RECORDED_EMPTY
    ] = None
    """Empty: GKE's default encryption of etcd. Or a Cloud KMS key,
    `projects/P/locations/REGION/keyRings/R/cryptoKeys/K` in `gcp:region`, that encrypts Kubernetes Secrets at the
    application layer; the stack grants GKE's service agent `roles/cloudkms.cryptoKeyEncrypterDecrypter` on it (see
    [Cluster security](security.md#cluster-security))."""

    @field_validator("authorized_networks", mode="before")
    @classmethod
    def _cidr_list(cls, raw: Any) -> Any:
        """A list in the stack file, or JSON / comma-separated text from `pulumi config set`."""
        key, example = "authorizedNetworks", 'a list of CIDR ranges, e.g. ["203.0.113.0/24"]'
        if raw is None:
            return ()
        if isinstance(raw, str):
            try:
                raw = (
                    json.loads(raw)
                    if raw.strip().startswith(("[", "{"))
                    else [p.strip() for p in raw.split(",") if p.strip()]
                )
            except ValueError:
                raise ConfigError(key, raw, example) from None
        if not isinstance(raw, list | tuple):
            raise ConfigError(key, raw, example)
        if len(raw) > gke_rules.MAX_AUTHORIZED_NETWORKS:
            raise ConfigError(key, raw, f"at most {gke_rules.MAX_AUTHORIZED_NETWORKS} CIDR ranges (GKE's limit)")
        return raw

    @field_validator("authorized_networks")
    @classmethod
    def _no_repeats(cls, cidrs: tuple[str, ...]) -> tuple[str, ...]:
        seen: dict[Any, int] = {}
        for n, cidr in enumerate(cidrs):
            network = ipaddress.ip_network(cidr)
            if network in seen:
                raise ConfigError(
                    f"authorizedNetworks[{n}]",
                    cidr,
                    f"a range not already listed (it repeats authorizedNetworks[{seen[network]}])",
                )
            seen[network] = n
        return cidrs

    @model_validator(mode="after")
    def _cluster(self) -> ClusterSettings:
        if self.cpu_pool_max_nodes < self.cpu_pool_min_nodes:
            raise ConfigError(
                "cpuPoolMaxNodes", self.cpu_pool_max_nodes, f"at least cpuPoolMinNodes ({self.cpu_pool_min_nodes})"
            )
        key_name, region = self.database_encryption_key, self.region
        if not key_name:
            return self
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
        return self

    @property
    def gke_minor(self) -> str:
        """Kubernetes minor version the cluster targets, e.g. '1.33'."""
        return ".".join(self.gke_version.split(".")[:2])


class GpuPoolSettings(SiteSettings):
    """The GPU node pool (infra/gpu_pool.py): its machine, how it is bought, and how many nodes it holds, which
    follows the Ray workers it runs, one per node."""

    gpu_type: Annotated[
        GpuType,
        Field(alias="gpuType"),
        Allowed(f"one of {sorted(GPU_PRESETS)}"),
        Required(f"one of {sorted(GPU_PRESETS)}"),
    ]
    """`nvidia-h200-141gb` (A3 Ultra) or `nvidia-b200` (A4). Everything else about the machine follows from it (see [GPU
    presets](design.md#gpu-presets))."""
    gpu_provisioning: Literal["reservation", "spot", "flexStart"] = Field("reservation", alias="gpuProvisioning")
    """`reservation`, `spot` or `flexStart`. A flex-start pool has auto-repair off, reservation affinity
    `NO_RESERVATION`, no spot and a minimum of 0 nodes, as GKE requires (Cluster Toolkit's preconditions, checked
    before the pool is registered)."""
    reservation: Annotated[Text | None, BeforeValidator(_empty_is_none), _RECORDED_EMPTY] = None
    """Reservation name; required with `reservation`, must be unset with `spot`/`flexStart`."""
    gpu_nodes: WholeNumber = Field(2, alias="gpuNodes", ge=1)
    """Most GPU nodes the pool scales to (8 GPUs each); at least 1. The pool starts at zero, except with `reservation`
    and no `rayAutoscaling`: it is then created with (and keeps at least) the `rayWorkerReplicas` nodes the Ray
    cluster holds, which the reservation bills anyway, so they boot while Lustre is created."""
    ray_worker_replicas: WholeNumber = Field(0, alias="rayWorkerReplicas")
    """Ray GPU workers, one per node, 1..`gpuNodes`; `0` means `gpuNodes`."""
    ray_autoscaling: Annotated[
        Flag | None,
        BeforeValidator(_empty_is_none),
        Field(alias="rayAutoscaling"),
        Shown("`true` for spot and flexStart, `false` for reservation"),
    ] = None
    """KubeRay's in-tree autoscaler: the GPU worker group runs 0..`rayWorkerReplicas` workers and releases idle ones.
    Its container (500m CPU, 512Mi) runs beside the head and must fit `cpuMachineType` with it. Empty (the declared
    default) means by `gpuProvisioning`."""
    max_run_hours: Annotated[
        Annotated[WholeNumber, Field(ge=1, le=gke_rules.FLEX_START_MAX_RUN_HOURS)] | None,
        BeforeValidator(lambda value: None if str(value).strip() == "0" else value),
        Field(alias="maxRunHours", validate_default=True),
        Allowed(f"0 (not set), or 1..{gke_rules.FLEX_START_MAX_RUN_HOURS} with gpuProvisioning flexStart"),
        _RECORDED_ZERO,
    ] = 0
    """Only with `flexStart`: hours after which GKE deletes a GPU node, 1–168; `0` leaves flex-start's own limit of 7
    days."""
    image_cache_disk: Annotated[
        Text,
        Field(alias="imageCacheDisk", pattern=rf"^$|{_DISK_IMAGE_RE}"),
        Allowed(
            "'' (none), a disk image name in the stack's project, or projects/PROJECT/global/images/NAME: a disk image "
            "built with gke-disk-image-builder that holds nemoRlImage (docs/design.md, Faster start-up)"
        ),
    ] = ""
    """Empty: none. A disk image holding `nemoRlImage` (its name in the stack's project, or
    `projects/PROJECT/global/images/NAME`), built with gke-disk-image-builder (see [Faster
    start-up](design.md#faster-start-up)): GPU nodes get it as a secondary boot disk in `CONTAINER_IMAGE_CACHE` mode
    with image streaming (`gcfs_config`) on, so a new node (autoscaled, or after a preemption) starts the image
    without pulling it. Needs GKE 1.28.3-gke.1067000 or later (`infra/gke_rules.py`). Changing it recreates the GPU
    pool's nodes: change it between runs."""
    # What infra/zone_table.json cannot say about the zone (a region it has not read): warned, not refused.
    _zone_notes: tuple[str, ...] = PrivateAttr(())

    @model_validator(mode="after")
    def _pool(self) -> GpuPoolSettings:
        verdict = zones.check_zone(self.zone, self.preset.machine_type)
        if verdict.refusal:
            raise ConfigError("zone", self.zone, verdict.refusal)
        self._zone_notes = verdict.notes
        provisioning, reservation = self.gpu_provisioning, self.reservation
        if provisioning == "reservation" and not reservation:
            raise ConfigError(
                "reservation",
                reservation,
                "the name of your GPU reservation, required when gpuProvisioning is 'reservation' "
                "(pulumi config set reservation NAME), or set gpuProvisioning to spot or flexStart",
            )
        if reservation and provisioning != "reservation":
            raise ConfigError("reservation", reservation, f"unset when gpuProvisioning is {provisioning!r}")
        if not self.ray_worker_replicas:  # 0, the declared default: one worker per GPU node
            self._derive("ray_worker_replicas", self.gpu_nodes)
        replicas = self.ray_worker_replicas
        if replicas < 1 or replicas > self.gpu_nodes:
            raise ConfigError(
                "rayWorkerReplicas", replicas, f"1..gpuNodes ({self.gpu_nodes}): one Ray worker per GPU node"
            )
        if self.ray_autoscaling is None:
            # On where idle GPUs cost money that can be saved (spot, flex-start); a reservation bills anyway.
            self._derive("ray_autoscaling", provisioning != "reservation")
        if self.max_run_hours and provisioning != "flexStart":
            limit = gke_rules.FLEX_START_MAX_RUN_HOURS
            raise ConfigError(
                "maxRunHours", self.max_run_hours, f"0 (not set), or 1..{limit} with gpuProvisioning flexStart"
            )
        if disk := re.match(_DISK_IMAGE_RE, self.image_cache_disk):
            # A bare image name is taken from the stack's own project (SecondaryBootDisk.diskImage is a full path).
            full_path = f"projects/{disk.group(1) or self.project}/global/images/{disk.group(2)}"
            object.__setattr__(self, "image_cache_disk", full_path)
        return self

    @property
    def preset(self) -> GpuPreset:
        return GPU_PRESETS[self.gpu_type]

    @property
    def gpu_autoscaling(self) -> bool:
        """KubeRay's in-tree autoscaler: GPU workers from 0 up to rayWorkerReplicas and back to 0 when idle."""
        return bool(self.ray_autoscaling)

    @property
    def zone_notes(self) -> tuple[str, ...]:
        return self._zone_notes


class RaySettings(GpuPoolSettings):
    """The Ray cluster on the GPU pool (workloads/ray_values.py): its image, its pods, and the namespace and service
    account they run under."""

    namespace: Annotated[
        Text, Field(pattern=_DNS_LABEL), Allowed("a Kubernetes namespace name (DNS label: a-z, 0-9, '-', 1-63)")
    ] = "nemo-rl"
    """Namespace of the Ray cluster, claim, Secrets and service accounts (and of the job stack's Job). Created by the
    stack with Pod Security Admission labels (see [Security](security.md#security)); a built-in one (`default`,
    `kube-system`, `kube-public`) is used as it is, without them."""
    kubernetes_service_account: Annotated[
        Text,
        Field(alias="kubernetesServiceAccount", pattern=_DNS_LABEL),
        Allowed("a DNS label: a-z, 0-9, '-', 1-63 characters"),
    ] = "generic-ksa"
    """Kubernetes service account of the Ray head, bound to the GSA `PREFIX-ray`; its token is mounted only into
    KubeRay's autoscaler container. The GPU workers get their own, `PREFIX-ray-worker` (no Kubernetes token, same
    GSA), which this key may not name."""
    nemo_rl_image: Text = Field(DEFAULT_IMAGE, alias="nemoRlImage")
    """NeMo RL image; must have a pinned tag (`:latest` is refused), and may be pinned by digest too:
    `nvcr.io/nvidia/nemo-rl:v0.5.0@sha256:<64 hex digits>` (the Ray pods and the submitter then run exactly that
    image). Its tag selects the release (see [NeMo RL versions](#nemo-rl-versions)); a mirror keeps working as long
    as it keeps the tag."""
    ray_version: Text = Field("", alias="rayVersion")
    """Ray version inside the image; empty means the release's (`2.49.2` for `v0.5.0`, `2.55.1` for `v0.7.0`), and any
    other value is refused for those tags. Required for an image whose tag is no known release (the job stack then
    refuses to build a pipeline for it)."""
    shm_size: Annotated[
        MemoryQuantity, Field(alias="shmSize"), Allowed("a Kubernetes memory quantity such as 240Gi")
    ] = "240Gi"
    """Memory-backed `/dev/shm` of each GPU worker; more than 0 and less than `rayWorker.memory`."""
    idle_timeout_seconds: Annotated[
        WholeNumber, Field(alias="rayIdleTimeoutSeconds", ge=60, le=86_400), Allowed("60..86400 seconds")
    ] = 600  # GPU nodes take minutes to come back: not KubeRay's 60 s (the shortest allowed)
    """With `rayAutoscaling`: seconds a GPU worker may sit idle before it is released; 60..86400."""
    tensorboard: Flag = True
    """Serve every run's TensorBoard event files from Lustre (read-only) with one TensorBoard on the CPU pool, reached
    through the `tensorboardPortForward` output."""
    ray_head: Annotated[RayHead, _POD_OBJECT, Shown('`{cpu: "64", memory: 500G}`')] = Field(
        default_factory=lambda: RayHead.model_validate({}), alias="rayHead"
    )
    """Object: the head's CPU and memory (requests = limits). Must fit `cpuMachineType` after GKE's reservations, a
    DaemonSet allowance and the log sidecar."""
    ray_worker: Annotated[RayWorker, _POD_OBJECT, Shown('`{cpu: "206", memory: 2400Gi}`')] = Field(
        default_factory=lambda: RayWorker.model_validate({}), alias="rayWorker"
    )
    """Object: each GPU worker's CPU and memory (plus all 8 GPUs). Must fit the GPU machine the same way."""

    @field_validator("nemo_rl_image")
    @classmethod
    def _pinned(cls, image: str) -> str:
        """`repository:tag` or `repository:tag@sha256:<64 hex>`: the tag names the NeMo RL release, a digest pins
        the exact image (what the registry serves for the tag may change; the digest cannot)."""
        named, at, digest = image.partition("@")
        if at and not re.match(_DIGEST_RE, digest):
            raise ConfigError(
                "nemoRlImage",
                image,
                f"a digest of the form sha256: and 64 lowercase hex digits after '@', e.g. {DEFAULT_IMAGE}@sha256:"
                f"{'0' * 64} (as `docker buildx imagetools inspect` or the registry prints it)",
            )
        if not re.match(_IMAGE_RE, named) or named.endswith(":latest"):
            raise ConfigError(
                "nemoRlImage",
                image,
                f"an image reference with a pinned tag, e.g. {DEFAULT_IMAGE}, optionally pinned further by digest "
                f"({DEFAULT_IMAGE}@sha256:<64 hex digits>)",
            )
        return image

    @model_validator(mode="after")
    def _ray(self) -> RaySettings:
        ksa = self.kubernetes_service_account
        if ksa == f"{self.cluster_name}-ray-worker":  # workloads.stack.worker_service_account: the workers' own account
            raise ConfigError("kubernetesServiceAccount", ksa, f"any name but {ksa}, the GPU workers' own account")
        release, image = self.nemo_rl_release, self.nemo_rl_image
        if release and not self.ray_version:
            self._derive("ray_version", release.ray_version)
        ray_version = self.ray_version
        if release and ray_version != release.ray_version:
            # Most likely a rayVersion left over from another image: the tag alone decides for a known release.
            raise ConfigError(
                "rayVersion",
                ray_version,
                f"empty or {release.ray_version}, the Ray inside NeMo RL {release.tag} ({image})",
            )
        if not ray_version:
            raise ConfigError(
                "rayVersion",
                None,
                f"the Ray version inside {image}, whose tag is none of the known NeMo RL releases "
                f"({', '.join(NEMO_RL_RELEASES)}): set rayVersion, or use one of those tags",
            )
        if not re.match(r"^[0-9]+\.[0-9]+\.[0-9]+$", ray_version):
            raise ConfigError("rayVersion", ray_version, "a Ray release such as 2.49.2")
        preset = self.preset
        check_fits("rayWorker", self.ray_worker, preset.machine_type, preset.vcpus, preset.memory_gb, (IMAGE_HOLDER,))
        # Memory-backed emptyDir counts against the container's memory limit.
        if memory_bytes(self.shm_size) >= memory_bytes(self.ray_worker.memory):
            raise ConfigError(
                "shmSize", self.shm_size, f"more than 0 and less than the worker memory ({self.ray_worker.memory})"
            )
        return self

    @property
    def nemo_rl_release(self) -> NemoRlRelease | None:
        """The row of the image's tag; None for a tag we do not know."""
        return release_for(self.nemo_rl_image)


class StorageSettings(NetworkSettings):
    """Managed Lustre (infra/lustre.py), peered into the cluster VPC, and the bucket models are exported to
    (infra/export_bucket.py): what outlives the compute."""

    lustre: LustreSettings = Field(default_factory=lambda: LustreSettings.model_validate({}))
    """Object."""
    protect_data: Flag = Field(True, alias="protectData")
    """Protect the Lustre instance from `pulumi destroy`."""
    export_bucket: Annotated[
        Text,
        # A Cloud Storage bucket name without dots (dotted names need domain verification), not Google's "goog".
        Field(
            alias="exportBucket", pattern=rf"^(?:|{EXPORT_BUCKET_CREATE}|(?!goog)[a-z0-9][a-z0-9_-]{{1,61}}[a-z0-9])$"
        ),
        Allowed(
            f"'' (no export), '{EXPORT_BUCKET_CREATE}' (a new bucket PROJECT-CLUSTER-models), or an existing bucket's "
            "name: 3-63 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit"
        ),
    ] = ""
    """Where trained models are copied (see [Getting the model out](operations.md#getting-the-model-out)): `""` nowhere,
    `create` a new bucket `<project>-<clusterName>-models` (uniform access, protected with `protectData`), or an
    existing bucket's name (3-63 lowercase letters, digits, `-`, `_`; give it uniform bucket-level access)."""

    @property
    def lustre_instance_id(self) -> str:
        return f"{self.cluster_name}-lustre"

    @property
    def export_bucket_name(self) -> str:
        """The bucket trained models are copied to, or "" when there is none."""
        if self.export_bucket == EXPORT_BUCKET_CREATE:
            return f"{self.project}-{self.cluster_name}-models"
        return self.export_bucket


class InfraSettings(StorageSettings, RaySettings, ClusterSettings, NetworkSettings):
    """All the parts at once, as the stack's wiring takes them, and the keys of no single part: the compute's
    protection, your GPU price, what a change may replace.

    Each component takes the part it reads (SiteSettings and the classes above); the rules here tie parts
    together."""

    protect_compute: Flag = Field(True, alias="protectCompute")
    """Pulumi `protect` on the cluster and the GPU pool: the engine stops before deleting or replacing either, also for
    a replacement the [day-2 guard](operations.md#changing-a-deployed-stack) did not foresee (a new program or
    provider version). A key in `allowReplace` that replaces them lifts it for that `pulumi up`; before `pulumi
    destroy`: `pulumi config set protectCompute false && pulumi up`."""
    gpu_node_hourly_price: Annotated[
        Annotated[float, Field(gt=0, allow_inf_nan=False)] | None,
        BeforeValidator(_price_text),
        Field(alias="gpuNodeHourlyPrice"),
        Allowed(
            "a positive number of US dollars per GPU node-hour, such as 61.50 (your committed-use or negotiated "
            "rate), or empty for the price table's rate"
        ),
        _RECORDED_ZERO,
    ] = None
    """Your own rate in US dollars per GPU node-hour (a committed-use or negotiated price), a positive number such as
    `61.50`; empty means the price table's list rate. It replaces the table's rate (for a reservation, the range from
    the largest published discount to the on-demand list rate) for the GPU nodes in `estimatedCost` and the job
    stack's `estimatedRun`, and the plan says the figure is yours."""
    allow_replace: Annotated[
        tuple[Text, ...],
        BeforeValidator(lambda value: () if value == "" else value),
        Field(alias=ALLOW_REPLACE_KEY),
        Allowed(f"a list of key names, set with: pulumi config set --path '{ALLOW_REPLACE_KEY}[0]' zone"),
    ] = ()
    """List of keys whose change you accept to replace what it replaces, e.g. `pulumi config set --path
    'allowReplace[0]' zone`; see [Changing a deployed stack](operations.md#changing-a-deployed-stack). Names outside
    that table's replacing keys are refused."""

    @field_validator("allow_replace")
    @classmethod
    def _replaceable(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        """The keys a user lets replace what they replace: `pulumi config set --path 'allowReplace[0]' zone`."""
        for key in keys:
            if key not in REPLACEABLE_KEYS:
                effect = EFFECTS_BY_KEY.get(key)
                why = f"{key} is refused even when listed ({effect.what}); " if effect and effect.guarded else ""
                raise ConfigError(
                    f"{ALLOW_REPLACE_KEY}[{keys.index(key)}]", key, f"{why}one of {', '.join(REPLACEABLE_KEYS)}"
                )
        return tuple(dict.fromkeys(keys))

    @model_validator(mode="after")
    def _across_parts(self) -> InfraSettings:
        """The rules that need more than one part, each naming the key to change."""
        head_extra = (IMAGE_HOLDER, AUTOSCALER) if self.gpu_autoscaling else (IMAGE_HOLDER,)
        cpu = CPU_MACHINES[self.cpu_machine_type]
        check_fits("rayHead", self.ray_head, self.cpu_machine_type, cpu.vcpus, cpu.memory_gb, head_extra)
        ranges = self.ranges
        # What N GPU nodes need (infra/scale.py): address ranges that hold every node, a Ray head sized for the
        # workers, a compact placement group that holds the pool.
        problems = scale.range_problems(
            ranges.cluster_subnet, ranges.pods, ranges.services, ranges.gvnic_subnet, ranges.rdma_subnets,
            self.gpu_nodes, self.cpu_pool_max_nodes,
        )  # fmt: skip
        problems += scale.head_problems(self.ray_head.cpu, self.ray_head.memory, self.ray_worker_replicas)
        compact = scale.compact_placement_problem(self.gpu_provisioning, self.preset.machine_type, self.gpu_nodes)
        for problem in [*problems, *([compact] if compact else [])]:
            raise ConfigError(problem.key, problem.value, problem.allowed)
        # At or above every floor that applies (gke_rules: the GPU's RDMA floor, the Lustre CSI driver's, ...).
        preset, version = self.preset, self.gke_version
        rdma = gke_rules.VersionFloor(
            preset.min_gke_version, f"GPUDirect RDMA on {preset.gpu_type}", "GKE docs: gpu-bandwidth-gpudirect-rdma"
        )
        floors = gke_rules.version_floors(rdma, self.gpu_provisioning, self.private_nodes, bool(self.image_cache_disk))
        for floor in sorted(floors, key=lambda f: gke_rules.parse_gke_version(f.version) or (), reverse=True):
            if gke_rules.below_floor(version, floor):
                raise ConfigError(
                    "gkeVersion", version, f"at or above {floor.version}, the oldest GKE for {floor.needed_by}"
                )
        return self


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


MODEL = InfraSettings
SECRETS = {
    "hfToken": Secret("Hugging Face token: `pulumi config set --secret hfToken hf_...`.", required=True),
    "wandbApiKey": Secret(
        "W&B API key: `pulumi config set --secret wandbApiKey ...`. Not declared in `Pulumi.yaml` (a declared key "
        "without a default would be mandatory).",
        required=False,
    ),
}


@dataclass(frozen=True)
class Secrets:
    hf_token: pulumi.Output[str]
    wandb_api_key: pulumi.Output[str] | None


def load() -> tuple[InfraSettings, Secrets]:
    """Read the stack's config once. Raises ConfigError before any resource is registered."""
    values = read_config(InfraSettings, KEY_ALIASES, secrets=SECRETS)
    config = pulumi.Config()
    secrets = {key: config.get_secret(key) for key in SECRETS}
    if secrets["hfToken"] is None:
        raise ConfigError(
            "hfToken",
            None,
            "required: your Hugging Face token, stored encrypted: pulumi config set --secret hfToken hf_...",
        )
    settings = validated(InfraSettings, values)
    for note in settings.zone_notes:
        pulumi.log.warn(note)
    return settings, Secrets(hf_token=secrets["hfToken"], wandb_api_key=secrets["wandbApiKey"])
