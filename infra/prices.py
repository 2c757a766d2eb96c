"""The dated price table the cost estimate reads (infra/cost.py). Data only: the one place that knows prices.

Every figure below was read on PRICES_READ_ON from the source named beside it, in US dollars, list prices before
any discount, tax or committed-use contract. A figure that could not be found is recorded as None with the reason,
and the estimate then says "no price for ..." instead of guessing. Refresh the table by reading the sources again
and changing the date; nothing else in the project hard-codes a price.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.presets import GPU_PRESETS

PRICES_READ_ON = "2026-12-01"

# How GPU capacity is paid for, per infra gpuProvisioning mode. A reservation is billed at the on-demand rate for
# every reserved VM, whether a node runs on it or not (Compute Engine's reservation billing).
ON_DEMAND = "onDemand"
SPOT = "spot"
FLEX_START = "flexStart"
PRICE_MODE_OF_PROVISIONING = {"reservation": ON_DEMAND, "spot": SPOT, "flexStart": FLEX_START}


@dataclass(frozen=True)
class Source:
    title: str
    where: str  # address and, for a repository, the commit read
    what: str  # what the figures are and how they were taken


SOURCES: dict[str, Source] = {
    "gpu-list-prices": Source(
        title="Hugging Face dataset tanod/cloud-gpu-list-prices, snapshot 2026-10-13",
        where="https://huggingface.co/datasets/tanod/cloud-gpu-list-prices",
        what=(
            "per-GPU share of the whole a3-ultragpu-8g machine (GPUs, vCPUs and memory), on-demand and spot, "
            "taken by the dataset from the Google Cloud Billing Catalog API; the machine price here is that share "
            "times the machine's 8 GPUs"
        ),
    ),
    "skypilot-catalog": Source(
        title="SkyPilot catalog, catalogs/v8/gcp/vms.csv",
        where="https://github.com/skypilot-org/skypilot-catalog (commit 006059e0f18acb1341e22a27751e9f80df6ba92f)",
        what="whole-VM hourly Price and SpotPrice per region, built by SkyPilot from the Cloud Billing Catalog API",
    ),
    "skypilot-catalog-a4": Source(
        title="SkyPilot catalog, catalogs/v8/gcp/vms.csv, a4-highgpu-8g and B200 rows",
        where="https://github.com/skypilot-org/skypilot-catalog (commit 006059e0f18acb1341e22a27751e9f80df6ba92f)",
        what=(
            "whole-VM hourly price taken as SkyPilot prices a GCP VM: its machine row plus its accelerator row. "
            "For a4-highgpu-8g in us-central1 (zone us-central1-b) the machine row's Price and SpotPrice are 0.0 "
            "and the 8 x B200 accelerator row's are 90.216 and 32.6064, so the VM is 90.216 on-demand and "
            "32.6064 spot. The catalog has no a4-highgpu-8g zone in europe-west1"
        ),
    ),
    "not-found": Source(
        title="no figure found",
        where=(
            "searched on 2026-12-01: SkyPilot's catalog (catalogs/v8/gcp/vms.csv at commit 006059e0: no flex-start "
            "column, no A4 zone in europe-west1, no storage), Cyclenerd/google-cloud-pricing-cost-calculator "
            "(its build list at commit dac31281 has no A3 Ultra, A4 or Managed Lustre), the Hugging Face dataset "
            "tanod/cloud-gpu-list-prices (on-demand and spot only), Google Cloud's docs and pricing pages (flex-start "
            "VMs and GKE flex-start say only 'discounted', 'up to 53%' off vCPUs and GPUs: a ceiling, not a price; "
            "the Managed Lustre docs give tiers and capacity limits, no price)"
        ),
        what="no published figure for this item could be read; the estimate leaves it out and says so",
    ),
}


@dataclass(frozen=True)
class Price:
    usd: float | None  # None: no figure found (see `source`)
    source: str  # key of SOURCES

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown price source {self.source!r}")
        if self.usd is not None and self.usd < 0:
            raise ValueError(f"negative price {self.usd}")


_NOT_FOUND = Price(None, "not-found")
# The per-GPU share of a3-ultragpu-8g (gpu-list-prices) times the machine's GPUs.
_H200_GPUS = GPU_PRESETS["nvidia-h200-141gb"].gpus_per_node

# Machine type -> region -> price mode -> US dollars per hour for one VM.
MACHINE_HOURLY: dict[str, dict[str, dict[str, Price]]] = {
    "a3-ultragpu-8g": {
        "europe-west1": {
            ON_DEMAND: Price(11.4934 * _H200_GPUS, "gpu-list-prices"),
            SPOT: Price(6.8944 * _H200_GPUS, "gpu-list-prices"),
            FLEX_START: _NOT_FOUND,
        },
        "us-central1": {
            ON_DEMAND: Price(10.4365 * _H200_GPUS, "gpu-list-prices"),
            SPOT: Price(6.2607 * _H200_GPUS, "gpu-list-prices"),
            FLEX_START: _NOT_FOUND,
        },
    },
    # SkyPilot's catalog has A4 (B200) in us-central1 but not in europe-west1; no source has a flex-start price.
    "a4-highgpu-8g": {
        "europe-west1": {ON_DEMAND: _NOT_FOUND, SPOT: _NOT_FOUND, FLEX_START: _NOT_FOUND},
        "us-central1": {
            ON_DEMAND: Price(0.0 + 90.216, "skypilot-catalog-a4"),
            SPOT: Price(0.0 + 32.6064, "skypilot-catalog-a4"),
            FLEX_START: _NOT_FOUND,
        },
    },
    # The CPU pool is always on-demand (it holds the Ray head).
    "n2-highmem-80": {
        "europe-west1": {ON_DEMAND: Price(5.76488, "skypilot-catalog"), SPOT: Price(0.82528, "skypilot-catalog")},
        "us-central1": {ON_DEMAND: Price(5.24056, "skypilot-catalog"), SPOT: Price(1.71296, "skypilot-catalog")},
    },
}

# Managed Lustre, US dollars per GiB-month, per throughput tier (MB/s per TiB). No per-tier list price for the
# four fixed tiers could be found in the sources searched (see SOURCES["not-found"]); the estimate says so rather
# than guess.
LUSTRE_GIB_MONTH: dict[int, Price] = {tier: _NOT_FOUND for tier in (125, 250, 500, 1000)}

HOURS_PER_MONTH = 730  # Google Cloud's billing convention for monthly figures
