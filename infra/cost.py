"""What a stack costs, from the dated price table (infra/prices.py). Pure functions: no Pulumi, no network.

Counted: the GPU and CPU nodes (a reservation bills every reserved VM, run or not), their boot disks, GKE's cluster
management fee, Managed Lustre, and, when the stack has one, the Cloud NAT gateway; the export bucket is priced per
GB-month stored (its contents are not known in advance). Not counted: network egress, Cloud NAT's per-GiB
processing, Hyperdisk IOPS and throughput above the free baseline, Cloud Logging.

How the GPU nodes are priced depends on how they are bought. Spot and flex-start: the table's row for that mode. A
reservation: a range, since the stack does not know how the reservation was bought: from the on-demand list rate
less the largest published reservation discount (committed use or calendar mode, "up to 53%") to the on-demand list
rate, the upper bound; the plan names that assumption. A user's gpuNodeHourlyPrice is their exact figure: it
replaces the table's rate and the range, and the plan says the figure is theirs.

A figure that is derived or borrowed from another region is used and named in `notes`. An item with no figure at
all (a region or machine the table does not know) is named in `unpriced`, `complete` is false, and every total it
belongs to is unknown (None), never a partial sum; that never raises. What keeps billing after a destroy follows
protectData: nothing when it is off, the kept Lustre instance (unknown when it has no price) when it is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.prices import (
    DISK_GIB_MONTH,
    FLEX_START,
    GKE_CLUSTER_HOURLY,
    HOURS_PER_MONTH,
    LUSTRE_GIB_MONTH,
    MACHINE_HOURLY,
    NAT_IP_HOURLY,
    NAT_MAX_HOURLY,
    NAT_PER_VM_HOURLY,
    NEAREST_PUBLISHED_REGIONS,
    ON_DEMAND,
    PRICE_MODE_OF_PROVISIONING,
    PRICES_READ_ON,
    PURCHASE_COMMITTED,
    PURCHASE_DWS,
    PURCHASE_ON_DEMAND,
    PURCHASE_SPOT,
    PURCHASES,
    RESERVATION_BILLING_SOURCE,
    RESERVATION_DISCOUNT_SOURCE,
    RESERVATION_MAX_DISCOUNT,
    RESERVATION_PRICE_MODE,
    SOURCES,
    SPOT,
    STORAGE_GB_MONTH,
    Price,
)

TABLE = "table"
USER_RATE = "gpuNodeHourlyPrice"

# How the GPU node rate was reached (estimatedCost.gpuNodePriceBasis).
BASIS_USER = "yours"  # gpuNodeHourlyPrice
BASIS_RESERVATION = "reservationRange"  # committed-use / calendar-mode low end to on-demand list
BASIS_MODE = "provisioningMode"  # the table's spot or flex-start row


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


def _cents(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@dataclass(frozen=True)
class Purchase:
    """One way of buying the GPU VM, priced from the table: a figure or a range, with its source and derivation."""

    key: str  # one of infra.prices.PURCHASES
    low: float | None  # None: the table has no figure
    high: float | None
    source: str  # words naming the source(s), with reliability and date
    derived: str = ""

    def as_output(self) -> dict[str, Any]:
        return {
            "how": self.key,
            "usdLow": _cents(self.low),
            "usdHigh": _cents(self.high),
            "source": self.source,
            "derived": self.derived,
        }


@dataclass
class CostEstimate:
    gpu_node_hourly: float | None  # the upper end: the figure a reservation holder pays at most
    gpu_node_hourly_low: float | None  # the lower end (a reservation's largest published discount); else the same
    gpu_node_price_from: str  # TABLE or USER_RATE
    gpu_node_price_basis: str  # BASIS_USER, BASIS_RESERVATION or BASIS_MODE
    gpu_node_assumption: str  # the words the plan prints for how the GPU node rate was reached
    cpu_node_hourly: float | None
    gke_cluster_hourly: float
    gpu_boot_disk_monthly: float | None
    cpu_boot_disk_monthly: float | None
    lustre_monthly: float | None
    lustre_capacity_gib: int
    lustre_tier: int
    protect_data: bool
    per_hour_while_gpus_run: float | None  # None: an item it includes has no price
    per_hour_while_gpus_run_low: float | None
    per_hour_idle: float | None
    per_hour_idle_low: float | None
    per_month_after_destroy: float | None  # None: the protected Lustre instance keeps billing, at no known price
    export_bucket_gb_month: float | None  # None: no bucket created, or no price
    purchases: list[Purchase] = field(default_factory=list)  # the GPU VM by how it is bought, from the table
    notes: list[str] = field(default_factory=list)  # derived, borrowed or user figures; how a reservation bills
    unpriced: list[str] = field(default_factory=list)  # items with no figure: the totals they belong to are unknown

    @property
    def complete(self) -> bool:
        return not self.unpriced

    def as_output(self) -> dict[str, Any]:
        """The `estimatedCost` stack output: dollars rounded to cents, unknowns as None."""
        return {
            "currency": "USD",
            "pricesReadOn": PRICES_READ_ON,
            "gpuNodePerHour": _cents(self.gpu_node_hourly),
            "gpuNodePerHourLow": _cents(self.gpu_node_hourly_low),
            "gpuNodePriceFrom": self.gpu_node_price_from,
            "gpuNodePriceBasis": self.gpu_node_price_basis,
            "gpuNodeAssumption": self.gpu_node_assumption,
            "gpuNodeByPurchase": [purchase.as_output() for purchase in self.purchases],
            "cpuNodePerHour": _cents(self.cpu_node_hourly),
            "gkeClusterPerHour": _cents(self.gke_cluster_hourly),
            "gpuNodeBootDiskPerMonth": _cents(self.gpu_boot_disk_monthly),
            "cpuNodeBootDiskPerMonth": _cents(self.cpu_boot_disk_monthly),
            "perHourWhileGpusRun": _cents(self.per_hour_while_gpus_run),
            "perHourWhileGpusRunLow": _cents(self.per_hour_while_gpus_run_low),
            "perHourIdle": _cents(self.per_hour_idle),
            "perHourIdleLow": _cents(self.per_hour_idle_low),
            "lustrePerMonth": _cents(self.lustre_monthly),
            "lustreCapacityGib": self.lustre_capacity_gib,
            "lustreThroughputMbpsPerTib": self.lustre_tier,
            "protectData": self.protect_data,
            "perMonthAfterDestroy": _cents(self.per_month_after_destroy),
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


def _source_words(key: str) -> str:
    source = SOURCES[key]
    return f"{source.title}, {source.reliability}, read {source.read_on}"


class _Reader:
    """Reads figures for one region, collecting what the plan must say about them."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.notes: list[str] = []
        self.unpriced: list[str] = []

    def price(self, what: str, table: Mapping[str, Price]) -> float | None:
        price, borrowed_from = _by_region(table, self.region)
        if price is None:
            self.unpriced.append(f"{what} in {self.region} (the table read on {PRICES_READ_ON} has no figure)")
            return None
        if borrowed_from:
            self.notes.append(f"borrowed: {what} has no {self.region} figure; {borrowed_from}'s is used")
        if price.derived:
            self.notes.append(f"derived: {what} ${price.usd:,.2f}: {price.derived}")
        return price.usd

    def machine(self, machine_type: str, mode: str) -> float | None:
        return self.price(f"{machine_type} ({mode})", _mode_table(machine_type, mode))


def _mode_table(machine_type: str, mode: str) -> dict[str, Price]:
    regions = MACHINE_HOURLY.get(machine_type, {})
    return {region: modes[mode] for region, modes in regions.items() if mode in modes}


def purchases(machine_type: str, region: str) -> list[Purchase]:
    """The GPU VM by each way it is sold, from the table (a borrowed region's figures, said so in `source`)."""

    def row(mode: str) -> Price | None:
        return _by_region(_mode_table(machine_type, mode), region)[0]

    def as_listed(key: str, price: Price | None, missing: str) -> Purchase:
        if price is None:
            return Purchase(key, None, None, missing)
        return Purchase(key, price.usd, price.usd, _source_words(price.source), price.derived)

    listed = row(ON_DEMAND)
    discount = _source_words(RESERVATION_DISCOUNT_SOURCE)
    if listed is None:
        committed = Purchase(PURCHASE_COMMITTED, None, None, f"no list rate to discount ({discount})")
    else:
        low = listed.usd * (1 - RESERVATION_MAX_DISCOUNT)
        committed = Purchase(
            PURCHASE_COMMITTED, low, listed.usd, f"up to {RESERVATION_MAX_DISCOUNT:.0%} off the list rate ({discount})"
        )
    return [
        as_listed(PURCHASE_ON_DEMAND, listed, "no figure in the table"),
        committed,
        as_listed(PURCHASE_DWS, row(FLEX_START), "no Dynamic Workload Scheduler figure in the table"),
        as_listed(PURCHASE_SPOT, row(SPOT), "no figure in the table"),
    ]


def _disk_monthly(reader: _Reader, disk_type: str, gib: int) -> float | None:
    rate = reader.price(f"{disk_type} boot disk", DISK_GIB_MONTH.get(disk_type, {}))
    return None if rate is None else rate * gib


def _nat_hourly(vms: int) -> float:
    return min(vms * NAT_PER_VM_HOURLY.usd, NAT_MAX_HOURLY.usd) + NAT_IP_HOURLY.usd


def _gpu_rate(inputs: CostInputs, reader: _Reader) -> tuple[float | None, float | None, str, str, str]:
    """(low, high, price_from, basis, assumption) for one GPU node-hour."""
    reservation = inputs.gpu_provisioning == "reservation"
    mode = RESERVATION_PRICE_MODE if reservation else PRICE_MODE_OF_PROVISIONING.get(inputs.gpu_provisioning, "")
    mode = mode or inputs.gpu_provisioning
    if reservation:
        reader.notes.append(
            f"a reservation bills all {inputs.gpu_nodes} reserved VM(s) for the whole reservation period, run or "
            "not, at the on-demand rate less the discount it was bought with "
            f"({SOURCES[RESERVATION_BILLING_SOURCE].title}); committed-use and calendar-mode reservations of A3 "
            f"Ultra and A4 are discounted up to {RESERVATION_MAX_DISCOUNT:.0%} "
            f"({SOURCES[RESERVATION_DISCOUNT_SOURCE].title}), with no dollar figure published: set "
            "gpuNodeHourlyPrice to your reservation's rate"
        )
    if inputs.gpu_node_hourly_price is not None:
        rate = inputs.gpu_node_hourly_price
        table_rate = _Reader(inputs.region).machine(inputs.gpu_machine_type, mode)
        replaced = f"the table's ${table_rate:,.2f}" if table_rate is not None else "the table, which has none"
        reader.notes.append(
            f"GPU node rate ${rate:,.2f}/h is your figure (gpuNodeHourlyPrice); it replaces {replaced} "
            f"for {inputs.gpu_machine_type} ({mode}) in {inputs.region}"
        )
        return rate, rate, USER_RATE, BASIS_USER, "your gpuNodeHourlyPrice, used as given"
    high = reader.machine(inputs.gpu_machine_type, mode)
    if not reservation:
        return high, high, TABLE, BASIS_MODE, f"the table's {inputs.gpu_provisioning} rate"
    low = None if high is None else high * (1 - RESERVATION_MAX_DISCOUNT)
    assumption = (
        f"reservation: on-demand list less up to {RESERVATION_MAX_DISCOUNT:.0%} for a committed-use or calendar-mode "
        "reservation, to the on-demand list rate, the upper bound"
    )
    return low, high, TABLE, BASIS_RESERVATION, assumption


def estimate(inputs: CostInputs) -> CostEstimate:
    reader = _Reader(inputs.region)
    reservation = inputs.gpu_provisioning == "reservation"
    gpu_low, gpu, price_from, basis, assumption = _gpu_rate(inputs, reader)
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

    # A total is known only when every item in it has a price: never a partial sum that reads as a total.
    known = None not in (gpu, cpu, gpu_disk, cpu_disk, lustre)

    def total(gpu_rate: float | None, billed_gpus: int, running_gpus: int) -> float | None:
        if not known or gpu_rate is None:
            return None
        assert cpu is not None and cpu_disk is not None and gpu_disk is not None and lustre is not None
        always = GKE_CLUSTER_HOURLY.usd + inputs.cpu_nodes * (cpu + cpu_disk / HOURS_PER_MONTH)
        always += lustre / HOURS_PER_MONTH
        nat = _nat_hourly(inputs.cpu_nodes + running_gpus) if inputs.cloud_nat else 0.0
        return always + billed_gpus * gpu_rate + running_gpus * gpu_disk / HOURS_PER_MONTH + nat

    bought = purchases(inputs.gpu_machine_type, inputs.region)
    for purchase in bought:
        if purchase.derived and not any(purchase.derived in note for note in reader.notes):
            reader.notes.append(
                f"derived: {inputs.gpu_machine_type} ({PURCHASES[purchase.key]}) {dollars(purchase.high)}: "
                f"{purchase.derived}"
            )

    return CostEstimate(
        gpu_node_hourly=gpu,
        gpu_node_hourly_low=gpu_low,
        gpu_node_price_from=price_from,
        gpu_node_price_basis=basis,
        gpu_node_assumption=assumption,
        cpu_node_hourly=cpu,
        gke_cluster_hourly=GKE_CLUSTER_HOURLY.usd,
        gpu_boot_disk_monthly=gpu_disk,
        cpu_boot_disk_monthly=cpu_disk,
        lustre_monthly=lustre,
        lustre_capacity_gib=inputs.lustre_capacity_gib,
        lustre_tier=inputs.lustre_tier,
        protect_data=inputs.protect_data,
        per_hour_while_gpus_run=total(gpu, billed_busy, running_busy),
        per_hour_while_gpus_run_low=total(gpu_low, billed_busy, running_busy),
        per_hour_idle=total(gpu, billed_idle, running_idle),
        per_hour_idle_low=total(gpu_low, billed_idle, running_idle),
        # With protectData, `pulumi destroy --exclude-protected` keeps the Lustre instance, which bills on; without
        # it nothing is kept, whatever the table knows. An unknown Lustre price is unknown, never "nothing".
        per_month_after_destroy=lustre if inputs.protect_data else 0.0,
        export_bucket_gb_month=bucket,
        purchases=bought,
        notes=reader.notes,
        unpriced=reader.unpriced,
    )


def dollars(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def dollar_range(low: float | None, high: float | None) -> str:
    """ "$A to $B", or one figure when both ends are the same, or "unknown"."""
    if low is None or high is None or round(low, 2) == round(high, 2):
        return dollars(high)
    return f"{dollars(low)} to {dollars(high)}"


def after_destroy_line(output: Mapping[str, Any]) -> str:
    """What keeps billing after `pulumi destroy --exclude-protected` (README's tear-down quotes it). It follows
    protectData: nothing is kept without it; with it the Lustre instance bills on, at its price or at an unknown one."""
    kept = output["perMonthAfterDestroy"]
    protected = output.get("protectData", kept != 0)
    lustre = f"{output['lustreCapacityGib']:,} GiB at {output['lustreThroughputMbpsPerTib']} MB/s/TiB"
    if not protected:
        what = f"{dollars(kept)} (nothing: protectData is off)"
    elif kept is None:
        what = f"unknown (the Lustre instance protectData keeps, {lustre}, has no price in the table)"
    else:
        what = f"{dollars(kept)} (the Lustre instance protectData keeps, {lustre})"
    line = f"per month after destroy:     {what}"
    if output.get("exportBucketPerGbMonth") is not None:
        line += f", plus ${output['exportBucketPerGbMonth']:.3f} per GB-month in the export bucket"
    return line


def _total(output: Mapping[str, Any], key: str) -> str:
    if output[key] is None:
        return 'unknown: the prices listed under "missing price" are not in the table'
    return dollar_range(output.get(f"{key}Low", output[key]), output[key])


def summary_lines(output: Mapping[str, Any]) -> list[str]:
    """The estimate as `make plan` prints it and docs/cost.md quotes it. A total with an item that has no price is
    unknown, and the missing prices are named; a reservation's figures are ranges with the assumption named."""
    if output["gpuNodePriceFrom"] == USER_RATE:
        rate_from = "your gpuNodeHourlyPrice"
    else:
        rate_from = output.get("gpuNodeAssumption") or "the table's rate"
    gpu = dollar_range(output.get("gpuNodePerHourLow", output["gpuNodePerHour"]), output["gpuNodePerHour"])
    lines = [
        f"per hour while the GPUs run: {_total(output, 'perHourWhileGpusRun')}",
        f"per hour idle (no run):      {_total(output, 'perHourIdle')}",
        f"one GPU node per hour:       {gpu} ({rate_from})",
        f"one CPU node per hour:       {dollars(output['cpuNodePerHour'])}",
        f"GKE cluster fee per hour:    {dollars(output['gkeClusterPerHour'])}",
        f"boot disk per node-month:    GPU {dollars(output['gpuNodeBootDiskPerMonth'])}, "
        f"CPU {dollars(output['cpuNodeBootDiskPerMonth'])}",
        f"Lustre per month:            {dollars(output['lustrePerMonth'])}",
        after_destroy_line(output),
    ]
    purchases = output.get("gpuNodeByPurchase") or []
    if purchases:
        lines.append(
            "one GPU node per hour by how it is bought (the table's figures; your own rate: gpuNodeHourlyPrice):"
        )
        width = max(len(PURCHASES[p["how"]]) for p in purchases) + 2
        for purchase in purchases:
            label = f"{PURCHASES[purchase['how']]}:"
            figure = dollar_range(purchase["usdLow"], purchase["usdHigh"])
            derived = ", derived (note below)" if purchase.get("derived") else ""
            lines.append(f"  {label:<{width}}{figure} ({purchase['source']}{derived})")
    lines += [f"note: {note}" for note in output["notes"]]
    lines += [f"missing price: {item}" for item in output["unpriced"]]
    lines.append(f"prices read on {output['pricesReadOn']} (infra/prices.py)")
    return lines
