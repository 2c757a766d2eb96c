"""What a stack costs, from the dated price table (infra/prices.py). Pure functions: no Pulumi, no network.

An item without a price is left out of the totals and named in `notes` ("no price for ..."), and `complete` is
false; an unknown region, machine type or tier never raises. Not counted at all: the GKE cluster fee, boot disks,
network egress, Cloud Logging, and the export bucket's storage (exportBucket; like Lustre, it outlives a destroy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.prices import (
    HOURS_PER_MONTH,
    LUSTRE_GIB_MONTH,
    MACHINE_HOURLY,
    ON_DEMAND,
    PRICE_MODE_OF_PROVISIONING,
    PRICES_READ_ON,
    SOURCES,
)


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


@dataclass
class CostEstimate:
    gpu_node_hourly: float | None
    cpu_node_hourly: float | None
    lustre_monthly: float | None
    per_hour_while_gpus_run: float
    per_hour_idle: float
    per_month_after_destroy: float | None  # None: the protected Lustre instance keeps billing, at no known price
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.notes

    def as_output(self) -> dict[str, Any]:
        """The `estimatedCost` stack output: dollars rounded to cents, unknowns as None."""

        def cents(value: float | None) -> float | None:
            return None if value is None else round(value, 2)

        return {
            "currency": "USD",
            "pricesReadOn": PRICES_READ_ON,
            "gpuNodePerHour": cents(self.gpu_node_hourly),
            "cpuNodePerHour": cents(self.cpu_node_hourly),
            "perHourWhileGpusRun": cents(self.per_hour_while_gpus_run),
            "perHourIdle": cents(self.per_hour_idle),
            "lustrePerMonth": cents(self.lustre_monthly),
            "perMonthAfterDestroy": cents(self.per_month_after_destroy),
            "complete": self.complete,
            "notes": list(self.notes),
            "sources": sorted({f"{s.title}: {s.where}" for key, s in SOURCES.items() if key != "not-found"}),
        }


def machine_hourly(machine_type: str, region: str, mode: str) -> tuple[float | None, str | None]:
    """(dollars per hour, None) or (None, why there is no price)."""
    price = MACHINE_HOURLY.get(machine_type, {}).get(region, {}).get(mode)
    if price is None or price.usd is None:
        return None, f"no price for {machine_type} ({mode}) in {region} in the table read on {PRICES_READ_ON}"
    return price.usd, None


def lustre_monthly(capacity_gib: int, tier: int) -> tuple[float | None, str | None]:
    price = LUSTRE_GIB_MONTH.get(tier)
    if price is None or price.usd is None:
        return None, f"no price for Managed Lustre at {tier} MB/s/TiB in the table read on {PRICES_READ_ON}"
    return capacity_gib * price.usd, None


def estimate(inputs: CostInputs) -> CostEstimate:
    notes: list[str] = []

    def known(value_and_note: tuple[float | None, str | None]) -> float | None:
        value, note = value_and_note
        if note:
            notes.append(note)
        return value

    mode = PRICE_MODE_OF_PROVISIONING.get(inputs.gpu_provisioning, inputs.gpu_provisioning)
    gpu = known(machine_hourly(inputs.gpu_machine_type, inputs.region, mode))
    cpu = known(machine_hourly(inputs.cpu_machine_type, inputs.region, ON_DEMAND))
    lustre = known(lustre_monthly(inputs.lustre_capacity_gib, inputs.lustre_tier))

    lustre_hourly = (lustre or 0.0) / HOURS_PER_MONTH
    always = inputs.cpu_nodes * (cpu or 0.0) + lustre_hourly
    if inputs.gpu_provisioning == "reservation":
        idle_gpu_nodes = inputs.gpu_nodes  # the reservation bills whether nodes run or not
    elif inputs.gpu_autoscaling:
        idle_gpu_nodes = 0  # the autoscaler gives idle GPU nodes back
    else:
        idle_gpu_nodes = inputs.ray_worker_replicas  # held for as long as the Ray cluster exists
    running_gpu_nodes = max(inputs.ray_worker_replicas, idle_gpu_nodes)
    return CostEstimate(
        gpu_node_hourly=gpu,
        cpu_node_hourly=cpu,
        lustre_monthly=lustre,
        per_hour_while_gpus_run=always + running_gpu_nodes * (gpu or 0.0),
        per_hour_idle=always + idle_gpu_nodes * (gpu or 0.0),
        # With protectData, `pulumi destroy --exclude-protected` keeps the Lustre instance, which bills on.
        per_month_after_destroy=lustre if inputs.protect_data else 0.0,
        notes=notes,
    )


def dollars(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def summary_lines(output: dict[str, Any]) -> list[str]:
    """The estimate as `make plan` prints it and the README quotes it. A total that leaves out an item without a
    price reads "at least"."""
    floor = "" if output["complete"] else "at least "
    lines = [
        f"per hour while the GPUs run: {floor}{dollars(output['perHourWhileGpusRun'])}",
        f"per hour idle (no run):      {floor}{dollars(output['perHourIdle'])}",
        f"one GPU node per hour:       {dollars(output['gpuNodePerHour'])}",
        f"Lustre per month:            {dollars(output['lustrePerMonth'])}",
        f"per month after destroy:     {dollars(output['perMonthAfterDestroy'])} (what protectData keeps: Lustre)",
    ]
    lines += [f"note: {note}" for note in output["notes"]]
    lines.append(f"prices read on {output['pricesReadOn']} (infra/prices.py); totals leave out unknown items")
    return lines
