"""What a stack costs, from the dated price table (infra/prices.py). Pure functions: no Pulumi, no network.

Counted: the GPU and CPU nodes (a reservation bills every reserved VM at the on-demand rate, run or not), their
boot disks, GKE's cluster management fee, Managed Lustre, and, when the stack has one, the Cloud NAT gateway; the
export bucket is priced per GB-month stored (its contents are not known in advance). Not counted: network egress,
Cloud NAT's per-GiB processing, Hyperdisk IOPS and throughput above the free baseline, Cloud Logging.

A figure that is derived or borrowed from another region is used and named in `notes`; a user's gpuNodeHourlyPrice
replaces the table's GPU node rate and is named too. An item with no figure at all (a region or machine the table
does not know) is left out of the totals and named in `unpriced`, and `complete` is false; that never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.prices import (
    DISK_GIB_MONTH,
    GKE_CLUSTER_HOURLY,
    HOURS_PER_MONTH,
    LUSTRE_GIB_MONTH,
    MACHINE_HOURLY,
    NAT_IP_HOURLY,
    NAT_MAX_HOURLY,
    NAT_PER_VM_HOURLY,
    NEAREST_PUBLISHED_REGIONS,
    PRICE_MODE_OF_PROVISIONING,
    PRICES_READ_ON,
    RESERVATION_BILLING_SOURCE,
    RESERVATION_PRICE_MODE,
    SOURCES,
    STORAGE_GB_MONTH,
    Price,
)

TABLE = "table"
USER_RATE = "gpuNodeHourlyPrice"


@dataclass(frozen=True)
class CostInputs:
    region: str
    gpu_machine_type: str
    gpu_provisioning: str  # reservation, spot or flexStart
    gpu_nodes: int  # the pool's maximum (a reservation bills for these whether used or not)
    ray_worker_replicas: int  # GPU nodes the Ray cluster holds while it runs
    gpu_autoscaling: bool  # idle GPU workers are released (KubeRay in-tree autoscaler)
    cpu_machine_type: str
    cpu_nodes: int  # CPU-pool nodes that always run (its minimum)
    lustre_capacity_gib: int
    lustre_tier: int
    protect_data: bool
    gpu_boot_disk_type: str = "hyperdisk-balanced"
    gpu_boot_disk_gib: int = 500
    cpu_boot_disk_type: str = "pd-balanced"
    cpu_boot_disk_gib: int = 500
    export_bucket: bool = False  # the stack creates one (it outlives a destroy, like Lustre)
    gpu_node_hourly_price: float | None = None  # the user's rate (gpuNodeHourlyPrice), replaces the table's
    cloud_nat: bool = False  # the nodes reach the internet through a Cloud NAT gateway with one external address


@dataclass
class CostEstimate:
    gpu_node_hourly: float | None
    gpu_node_price_from: str  # TABLE or USER_RATE
    cpu_node_hourly: float | None
    gke_cluster_hourly: float
    gpu_boot_disk_monthly: float | None
    cpu_boot_disk_monthly: float | None
    lustre_monthly: float | None
    lustre_capacity_gib: int
    lustre_tier: int
    per_hour_while_gpus_run: float
    per_hour_idle: float
    per_month_after_destroy: float | None  # None: the protected Lustre instance keeps billing, at no known price
    export_bucket_gb_month: float | None  # None: no bucket created, or no price
    notes: list[str] = field(default_factory=list)  # derived, borrowed or user figures; how a reservation bills
    unpriced: list[str] = field(default_factory=list)  # items with no figure, left out of the totals

    @property
    def complete(self) -> bool:
        return not self.unpriced

    def as_output(self) -> dict[str, Any]:
        """The `estimatedCost` stack output: dollars rounded to cents, unknowns as None."""

        def cents(value: float | None) -> float | None:
            return None if value is None else round(value, 2)

        return {
            "currency": "USD",
            "pricesReadOn": PRICES_READ_ON,
            "gpuNodePerHour": cents(self.gpu_node_hourly),
            "gpuNodePriceFrom": self.gpu_node_price_from,
            "cpuNodePerHour": cents(self.cpu_node_hourly),
            "gkeClusterPerHour": cents(self.gke_cluster_hourly),
            "gpuNodeBootDiskPerMonth": cents(self.gpu_boot_disk_monthly),
            "cpuNodeBootDiskPerMonth": cents(self.cpu_boot_disk_monthly),
            "perHourWhileGpusRun": cents(self.per_hour_while_gpus_run),
            "perHourIdle": cents(self.per_hour_idle),
            "lustrePerMonth": cents(self.lustre_monthly),
            "lustreCapacityGib": self.lustre_capacity_gib,
            "lustreThroughputMbpsPerTib": self.lustre_tier,
            "perMonthAfterDestroy": cents(self.per_month_after_destroy),
            "exportBucketPerGbMonth": self.export_bucket_gb_month,
            "complete": self.complete,
            "notes": list(self.notes),
            "unpriced": list(self.unpriced),
            "sources": sorted(f"{s.title} ({s.reliability}, read {s.read_on}): {s.where}" for s in SOURCES.values()),
        }


def _by_region(table: Mapping[str, Price], region: str) -> tuple[Price | None, str | None]:
    """(the region's price, None), or (the nearest published region's price, that region), or (None, None)."""
    if region in table:
        return table[region], None
    for nearer in NEAREST_PUBLISHED_REGIONS.get(region, ()):
        if nearer in table:
            return table[nearer], nearer
    return None, None


class _Reader:
    """Reads figures for one region, collecting what the plan must say about them."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.notes: list[str] = []
        self.unpriced: list[str] = []

    def price(self, what: str, table: Mapping[str, Price]) -> float | None:
        price, borrowed_from = _by_region(table, self.region)
        if price is None:
            self.unpriced.append(f"no price for {what} in {self.region} in the table read on {PRICES_READ_ON}")
            return None
        if borrowed_from:
            self.notes.append(f"borrowed: {what} has no {self.region} figure; {borrowed_from}'s is used")
        if price.derived:
            self.notes.append(f"derived: {what} ${price.usd:,.2f}: {price.derived}")
        return price.usd

    def machine(self, machine_type: str, mode: str) -> float | None:
        regions = MACHINE_HOURLY.get(machine_type, {})
        by_region = {region: modes[mode] for region, modes in regions.items() if mode in modes}
        return self.price(f"{machine_type} ({mode})", by_region)


def _disk_monthly(reader: _Reader, disk_type: str, gib: int) -> float | None:
    rate = reader.price(f"{disk_type} boot disk", DISK_GIB_MONTH.get(disk_type, {}))
    return None if rate is None else rate * gib


def _nat_hourly(vms: int) -> float:
    return min(vms * NAT_PER_VM_HOURLY.usd, NAT_MAX_HOURLY.usd) + NAT_IP_HOURLY.usd


def estimate(inputs: CostInputs) -> CostEstimate:
    reader = _Reader(inputs.region)
    mode = PRICE_MODE_OF_PROVISIONING.get(inputs.gpu_provisioning, inputs.gpu_provisioning)
    reservation = inputs.gpu_provisioning == "reservation"
    if reservation:
        mode = RESERVATION_PRICE_MODE
        reader.notes.append(
            f"a reservation bills all {inputs.gpu_nodes} reserved VM(s) at the on-demand rate, run or not "
            f"({SOURCES[RESERVATION_BILLING_SOURCE].title})"
        )
    if inputs.gpu_node_hourly_price is not None:
        gpu: float | None = inputs.gpu_node_hourly_price
        price_from = USER_RATE
        table_rate = _Reader(inputs.region).machine(inputs.gpu_machine_type, mode)
        replaced = f"the table's ${table_rate:,.2f}" if table_rate is not None else "the table, which has none"
        reader.notes.append(
            f"GPU node rate ${gpu:,.2f}/h is your figure (gpuNodeHourlyPrice); it replaces {replaced} "
            f"for {inputs.gpu_machine_type} ({mode}) in {inputs.region}"
        )
    else:
        gpu = reader.machine(inputs.gpu_machine_type, mode)
        price_from = TABLE
    cpu = reader.machine(inputs.cpu_machine_type, RESERVATION_PRICE_MODE)
    gpu_disk = _disk_monthly(reader, inputs.gpu_boot_disk_type, inputs.gpu_boot_disk_gib)
    cpu_disk = _disk_monthly(reader, inputs.cpu_boot_disk_type, inputs.cpu_boot_disk_gib)
    lustre_rate = reader.price(
        f"Managed Lustre at {inputs.lustre_tier} MB/s/TiB",
        {
            region: tiers[inputs.lustre_tier]
            for region, tiers in LUSTRE_GIB_MONTH.items()
            if inputs.lustre_tier in tiers
        },
    )
    lustre = None if lustre_rate is None else lustre_rate * inputs.lustre_capacity_gib
    bucket = reader.price("Cloud Storage Standard", STORAGE_GB_MONTH) if inputs.export_bucket else None

    # Nodes that exist with no run: the Ray cluster holds its workers unless the autoscaler releases them.
    running_idle = 0 if inputs.gpu_autoscaling else inputs.ray_worker_replicas
    running_busy = max(inputs.ray_worker_replicas, running_idle)
    billed_idle = inputs.gpu_nodes if reservation else running_idle
    billed_busy = inputs.gpu_nodes if reservation else running_busy

    def hourly(monthly: float | None) -> float:
        return (monthly or 0.0) / HOURS_PER_MONTH

    # What bills whatever the GPUs do: the cluster fee, the CPU pool's minimum and its disks, Lustre.
    always = GKE_CLUSTER_HOURLY.usd + inputs.cpu_nodes * ((cpu or 0.0) + hourly(cpu_disk)) + hourly(lustre)

    def total(billed_gpus: int, running_gpus: int) -> float:
        nat = _nat_hourly(inputs.cpu_nodes + running_gpus) if inputs.cloud_nat else 0.0
        return always + billed_gpus * (gpu or 0.0) + running_gpus * hourly(gpu_disk) + nat

    return CostEstimate(
        gpu_node_hourly=gpu,
        gpu_node_price_from=price_from,
        cpu_node_hourly=cpu,
        gke_cluster_hourly=GKE_CLUSTER_HOURLY.usd,
        gpu_boot_disk_monthly=gpu_disk,
        cpu_boot_disk_monthly=cpu_disk,
        lustre_monthly=lustre,
        lustre_capacity_gib=inputs.lustre_capacity_gib,
        lustre_tier=inputs.lustre_tier,
        per_hour_while_gpus_run=total(billed_busy, running_busy),
        per_hour_idle=total(billed_idle, running_idle),
        # With protectData, `pulumi destroy --exclude-protected` keeps the Lustre instance, which bills on.
        per_month_after_destroy=lustre if inputs.protect_data else 0.0,
        export_bucket_gb_month=bucket,
        notes=reader.notes,
        unpriced=reader.unpriced,
    )


def dollars(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def after_destroy_line(output: Mapping[str, Any]) -> str:
    """What keeps billing after `pulumi destroy --exclude-protected` (README's tear-down quotes it)."""
    kept = output["perMonthAfterDestroy"]
    lustre = f"{output['lustreCapacityGib']:,} GiB at {output['lustreThroughputMbpsPerTib']} MB/s/TiB"
    what = f"the Lustre instance protectData keeps, {lustre}" if kept else "nothing: protectData is off"
    line = f"per month after destroy:     {dollars(kept)} ({what})"
    if output.get("exportBucketPerGbMonth") is not None:
        line += f", plus ${output['exportBucketPerGbMonth']:.3f} per GB-month in the export bucket"
    return line


def summary_lines(output: Mapping[str, Any]) -> list[str]:
    """The estimate as `make plan` prints it and docs/cost.md quotes it. A total that leaves out an item without a
    price reads "at least"."""
    floor = "" if output["complete"] else "at least "
    rate_from = "your gpuNodeHourlyPrice" if output["gpuNodePriceFrom"] == USER_RATE else "the table's rate"
    lines = [
        f"per hour while the GPUs run: {floor}{dollars(output['perHourWhileGpusRun'])}",
        f"per hour idle (no run):      {floor}{dollars(output['perHourIdle'])}",
        f"one GPU node per hour:       {dollars(output['gpuNodePerHour'])} ({rate_from})",
        f"one CPU node per hour:       {dollars(output['cpuNodePerHour'])}",
        f"GKE cluster fee per hour:    {dollars(output['gkeClusterPerHour'])}",
        f"boot disk per node-month:    GPU {dollars(output['gpuNodeBootDiskPerMonth'])}, "
        f"CPU {dollars(output['cpuNodeBootDiskPerMonth'])}",
        f"Lustre per month:            {dollars(output['lustrePerMonth'])}",
        after_destroy_line(output),
    ]
    lines += [f"note: {note}" for note in output["notes"]]
    lines += [f"not counted: {item}" for item in output["unpriced"]]
    lines.append(f"prices read on {output['pricesReadOn']} (infra/prices.py)")
    return lines
