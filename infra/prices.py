"""The dated price table the cost estimate reads (infra/cost.py). Data only: the one place that knows prices.

Every figure is in US dollars, a list price before discounts, tax or contracts, read on PRICES_READ_ON (or on the
date its source names) from the source named beside it. Each source says how reliable it is: Google's own page,
a billing SKU (Google's billing catalog, here only second-hand), or a third-party catalog built from that billing
catalog. A figure that no source gives directly is marked `derived`: the words say how it was worked out, and the
plan prints them. Where sources disagree, the figure not used is kept beside the one used (`others`) with the
reason for the choice. A region with no figure of its own borrows the nearest region that has one
(NEAREST_PUBLISHED_REGIONS), and the plan says so. A user's negotiated or committed-use rate for the GPU nodes
replaces the table's with the infra key gpuNodeHourlyPrice. Refresh the table by reading the sources again and
changing the date; nothing else in the project hard-codes a price.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_READ_ON = "2026-12-01"

# How GPU capacity is paid for, per infra gpuProvisioning mode.
ON_DEMAND = "onDemand"
SPOT = "spot"
FLEX_START = "flexStart"
PRICE_MODE_OF_PROVISIONING = {"reservation": ON_DEMAND, "spot": SPOT, "flexStart": FLEX_START}

# How much weight a figure carries, best first.
OFFICIAL = "official page"
BILLING_SKU = "billing SKU"
THIRD_PARTY = "third-party catalog"
RELIABILITIES = (OFFICIAL, BILLING_SKU, THIRD_PARTY)


@dataclass(frozen=True)
class Source:
    title: str
    where: str  # address and, for a repository, the commit read
    what: str  # what the figures are and how they were taken
    reliability: str  # one of RELIABILITIES
    read_on: str = PRICES_READ_ON

    def __post_init__(self) -> None:
        if self.reliability not in RELIABILITIES:
            raise ValueError(f"unknown reliability {self.reliability!r}")


SKYPILOT_COMMIT = "006059e0f18acb1341e22a27751e9f80df6ba92f"

SOURCES: dict[str, Source] = {
    "skypilot-catalog": Source(
        title="SkyPilot catalog, catalogs/v8/gcp/vms.csv",
        where=f"https://github.com/skypilot-org/skypilot-catalog (commit {SKYPILOT_COMMIT})",
        what=(
            "hourly Price and SpotPrice per zone, built by SkyPilot from the Cloud Billing Catalog API. A GPU VM is "
            "its machine row (vCPUs and memory) plus its accelerator row (all its GPUs), as SkyPilot prices it. In "
            "some regions the Price column holds a flex-start (DWS) figure instead of on-demand: there it is below "
            "the spot price, or equal across regions where on-demand differs (H100: $4.20076 per GPU, the published "
            "flex-start price of SKU 341A-49A5-0C07, in us-central1, while us-east4 shows $9.79655). Every GPU figure "
            "used here was checked region by region for that"
        ),
        reliability=THIRD_PARTY,
    ),
    "gpu-list-prices": Source(
        title="Hugging Face dataset tanod/cloud-gpu-list-prices (second-hand)",
        where="https://huggingface.co/datasets/tanod/cloud-gpu-list-prices",
        what=(
            "per-GPU share of the whole a3-ultragpu-8g machine (GPUs, vCPUs and memory), on-demand and spot, taken "
            "by the dataset from the Cloud Billing Catalog API: us-central1 $10.4365 on-demand ($83.49 per VM-hour), "
            "europe-west1 $11.4934 ($91.95). Used for A3 Ultra on-demand: it prices the VM's vCPUs and memory with "
            "the machine's own SKUs, where SkyPilot's machine row uses A3 High rates (see `others`)"
        ),
        reliability=THIRD_PARTY,
        read_on="2026-10-13",
    ),
    "billing-catalog-a4": Source(
        title="Cloud Billing catalog scrape of the B200 GPU SKU, us-central1 (second-hand)",
        where="reported in issue 21 and ../shared/FACTS.md (scrape dated 2026-07-07); not re-read in this session",
        what=(
            "$16.11 per B200 GPU-hour, the slice price that covers the whole a4-highgpu-8g VM (GPUs, vCPUs, "
            "memory): $128.88 per VM-hour"
        ),
        reliability=BILLING_SKU,
        read_on="2026-07-07",
    ),
    "lustre-billing-skus": Source(
        title="Managed Lustre capacity SKUs per performance tier, us-central1 (second-hand)",
        where=(
            "Google's BigQuery price export as reported in issue 21 and ../shared/FACTS.md (checked 2026-06-05); "
            "the 125 MB/s/TiB SKU 517C-E77D-C11A at $0.145 confirmed separately there; not re-read in this session"
        ),
        what="dollars per GiB-month of provisioned capacity: 0.145 / 0.21 / 0.34 / 0.60 for 125 / 250 / 500 / 1000",
        reliability=BILLING_SKU,
        read_on="2026-06-05",
    ),
    "gke-pricing": Source(
        title="Google Kubernetes Engine pricing",
        where="https://cloud.google.com/kubernetes-engine/pricing",
        what=(
            "cluster management fee $0.10 per cluster-hour, any mode and topology; the free-tier credit ($74.40 a "
            "month per billing account) applies to zonal and Autopilot clusters only, and this stack's cluster is "
            "regional"
        ),
        reliability=OFFICIAL,
    ),
    "consumption-options": Source(
        title="Cluster Director: choose a consumption option",
        where=(
            "https://docs.cloud.google.com/cluster-director/docs/choose-consumption-option and "
            "https://docs.cloud.google.com/ai-hypercomputer/docs/obtain-capacity"
        ),
        what=(
            "how A4 and A3 Ultra are sold: future reservations for blocks of capacity, discounted up to 53% (a "
            "reservation of a year or longer needs a resource-based commitment attached), and future reservations "
            "in calendar mode (up to 90 days), discounted up to 53% and billed at Dynamic Workload Scheduler prices "
            "for the whole reservation period, used or not; flex-start, discounted up to 53% at Dynamic Workload "
            "Scheduler prices, charged while in use; spot, up to 91% off; on-demand only for N2. No dollar figure "
            "for the discounted rates is given there"
        ),
        reliability=OFFICIAL,
    ),
    "reservation-billing": Source(
        title="Compute Engine reservations: pricing for reservations",
        where="https://cloud.google.com/compute/docs/instances/reservations-overview#reservation-billing",
        what=(
            "reserved resources are charged at the same on-demand rate as running VMs, with any applicable "
            "discounts (committed use), from creation until the reservation is deleted, consumed or not"
        ),
        reliability=OFFICIAL,
    ),
    "disk-pricing": Source(
        title="Compute Engine disk and image pricing, us-central1",
        where="https://cloud.google.com/compute/disks-image-pricing (figures as quoted by third-party cost tools)",
        what=(
            "provisioned capacity per GiB-month: pd-balanced $0.10, hyperdisk-balanced $0.08 (Hyperdisk Balanced "
            "also bills provisioned IOPS above 3,000 and throughput above 140 MiB/s, not counted here)"
        ),
        reliability=THIRD_PARTY,
    ),
    "storage-pricing": Source(
        title="Cloud Storage pricing, Standard storage",
        where="https://cloud.google.com/storage/pricing",
        what="regional Standard storage per GB-month: us-central1 $0.020, europe-west1 $0.020",
        reliability=OFFICIAL,
    ),
    "nat-pricing": Source(
        title="Cloud NAT pricing, Public NAT",
        where="https://cloud.google.com/nat/pricing",
        what=(
            "$0.0014 per VM-hour for each VM using the gateway, capped at $0.044 per hour (32 VMs); $0.005 per hour "
            "per external IP address; $0.045 per GiB processed, in and out"
        ),
        reliability=OFFICIAL,
    ),
}


@dataclass(frozen=True)
class Other:
    """A figure for the same thing from another source, not used, and why."""

    usd: float
    source: str
    why_not: str


@dataclass(frozen=True)
class Price:
    usd: float
    source: str  # key of SOURCES
    derived: str = ""  # how the figure was worked out when no source gives it directly ("": read as is)
    others: tuple[Other, ...] = ()

    def __post_init__(self) -> None:
        for key in (self.source, *(other.source for other in self.others)):
            if key not in SOURCES:
                raise ValueError(f"unknown price source {key!r}")
        if self.usd < 0 or any(other.usd < 0 for other in self.others):
            raise ValueError(f"negative price {self.usd}")


# --- GPU and CPU machines: dollars per VM-hour ------------------------------------------------------------------

# SkyPilot's rows (commit above), dollars per hour: machine row (vCPUs + memory) and the 8-GPU accelerator row.
_A3U_VM = {"us-central1": (12.266, 3.74713), "europe-west1": (13.50609, 3.08825)}  # (Price, SpotPrice)
_H200_X8_US_CENTRAL1 = (74.49392, 37.2472)  # on-demand: 8 x $9.31174
_H200_X8_EUROPE_WEST1_SPOT = 41.0128
# Price column of the H200 x8 row in europe-west1, asia-south1/2, europe-west4, us-east5 and us-south1: below the
# spot price where both are given (europe-west1: 36.60258 < 41.0128), and the same in every one of those regions:
# a flex-start (DWS) figure, as SkyPilot's H100 rows show. Not an on-demand price.
_H200_X8_FLEX = 36.60258
_EUROPE_WEST1_UPLIFT = _A3U_VM["europe-west1"][0] / _A3U_VM["us-central1"][0]  # 1.1011, SkyPilot's own VM rows

_FLEX_VM_PART = (
    "the vCPU and memory part at the on-demand rate: no flex-start figure for it was found, and Google says only "
    "that flex-start discounts vCPUs and GPUs (up to 53%), so this is an upper bound"
)
_B200_FLEX = 64.44  # SkyPilot's B200 x8 Price where it is not 90.216 (us-east4, us-west2/3, asia, europe-north1)

MACHINE_HOURLY: dict[str, dict[str, dict[str, Price]]] = {
    "a3-ultragpu-8g": {
        "us-central1": {
            ON_DEMAND: Price(
                10.4365 * 8,
                "gpu-list-prices",
                others=(
                    Other(
                        _H200_X8_US_CENTRAL1[0] + _A3U_VM["us-central1"][0],
                        "skypilot-catalog",
                        "$86.76 = GPUs $9.31174 x 8 + machine row $12.266, and that machine row prices the VM's 224 "
                        "vCPUs and 2,952 GiB at A3 High rates (../shared/FACTS.md, 2026-12-02, second-hand), not A3 "
                        "Ultra's own; cloudprice.net is reported (issue 21) to agree with $86.76",
                    ),
                ),
            ),
            SPOT: Price(
                _H200_X8_US_CENTRAL1[1] + _A3U_VM["us-central1"][1],
                "skypilot-catalog",
                others=(
                    Other(
                        6.2607 * 8,
                        "gpu-list-prices",
                        "spot prices move up to daily; SkyPilot's is kept for one consistent snapshot with its "
                        "on-demand figure",
                    ),
                ),
            ),
            FLEX_START: Price(
                _H200_X8_FLEX + _A3U_VM["us-central1"][0],
                "skypilot-catalog",
                derived=(
                    "flex-start: SkyPilot's H200 x8 flex-start figure $36.60 (its Price column in the regions where "
                    "that is below spot; none is given for us-central1, where the column holds on-demand) plus "
                    + _FLEX_VM_PART
                ),
            ),
        },
        "europe-west1": {
            ON_DEMAND: Price(
                11.4934 * 8,
                "gpu-list-prices",
                others=(
                    Other(
                        _H200_X8_US_CENTRAL1[0] * _EUROPE_WEST1_UPLIFT + _A3U_VM["europe-west1"][0],
                        "skypilot-catalog",
                        "derived, not read: SkyPilot's europe-west1 H200 row holds a flex-start figure, so this is its "
                        "us-central1 on-demand GPU row ($74.49) times the europe-west1/us-central1 ratio of its own "
                        "machine rows (1.101) plus the europe-west1 machine row ($13.51), at A3 High vCPU/memory "
                        "rates; the dataset's own europe-west1/us-central1 ratio (1.1013) agrees",
                    ),
                ),
            ),
            SPOT: Price(
                _H200_X8_EUROPE_WEST1_SPOT + _A3U_VM["europe-west1"][1],
                "skypilot-catalog",
                others=(Other(6.8944 * 8, "gpu-list-prices", "one consistent snapshot with the other SkyPilot rows"),),
            ),
            FLEX_START: Price(
                _H200_X8_FLEX + _A3U_VM["europe-west1"][0],
                "skypilot-catalog",
                derived=(
                    "flex-start: SkyPilot's europe-west1 H200 x8 Price $36.60, below its spot price $41.01 and so "
                    "taken as the flex-start figure, plus " + _FLEX_VM_PART
                ),
            ),
        },
    },
    # Google offers A4 through reservations, flex-start and spot, not plain on-demand; a reservation bills at the
    # on-demand rate (SOURCES["reservation-billing"]), which is the billing catalog's B200 slice price.
    "a4-highgpu-8g": {
        "us-central1": {
            ON_DEMAND: Price(
                16.11 * 8,
                "billing-catalog-a4",
                others=(
                    Other(
                        90.216,
                        "skypilot-catalog",
                        "exactly 0.70 x $128.88: a 30%-discounted SKU, not the list rate a reservation bills (its "
                        "machine row is 0.0, its B200 x8 row 90.216)",
                    ),
                ),
            ),
            SPOT: Price(0.0 + 32.6064, "skypilot-catalog"),  # machine row 0.0 + B200 x8 row
            FLEX_START: Price(
                _B200_FLEX,
                "skypilot-catalog",
                derived=(
                    "flex-start: SkyPilot's B200 x8 Price in us-east4 (nearest region where it is not 90.216), "
                    "$64.44, exactly 50% of the $128.88 list rate, within Google's flex-start discount"
                ),
            ),
        },
        # SkyPilot lists A4 in europe-west4: the same 90.216 / 32.6064-type rows as us-central1, with its own spot
        # figure. Google lists a4-highgpu-8g in europe-west1 too (Cyclenerd machinetyperegion.csv, 2026-08, as
        # ../shared/FACTS.md reports it), but no source read here prices it there (SkyPilot's catalog at commit
        # 8427bbff988abdd050a9f51addd314ef31cb4e85 has no europe-west1 A4 row): europe-west1 borrows these figures
        # (NEAREST_PUBLISHED_REGIONS) and the plan says so.
        "europe-west4": {
            ON_DEMAND: Price(
                16.11 * 8,
                "billing-catalog-a4",
                derived=(
                    "the us-central1 slice price: SkyPilot's europe-west4 B200 x8 row (90.216) equals its us-central1 "
                    "row, so the same list rate is taken"
                ),
            ),
            SPOT: Price(0.0 + 35.8672, "skypilot-catalog"),
            FLEX_START: Price(
                _B200_FLEX,
                "skypilot-catalog",
                derived="flex-start: SkyPilot's B200 x8 Price in europe-north1, $64.44, 50% of the list rate",
            ),
        },
    },
    # The CPU pool is always on-demand (it holds the Ray head).
    "n2-highmem-80": {
        "europe-west1": {ON_DEMAND: Price(5.76488, "skypilot-catalog"), SPOT: Price(0.82528, "skypilot-catalog")},
        "us-central1": {ON_DEMAND: Price(5.24056, "skypilot-catalog"), SPOT: Price(1.71296, "skypilot-catalog")},
    },
}

# A region with no figure of its own borrows the first of these that has one (the plan names it).
NEAREST_PUBLISHED_REGIONS: dict[str, tuple[str, ...]] = {
    "europe-west1": ("europe-west4", "us-central1"),
    "europe-west4": ("europe-west1", "us-central1"),
    "us-central1": ("us-east4",),
}

# --- Storage and fees ---------------------------------------------------------------------------------------------

# Managed Lustre, dollars per GiB-month of capacity, per throughput tier (MB/s per TiB), by region.
LUSTRE_GIB_MONTH: dict[str, dict[int, Price]] = {
    "us-central1": {
        125: Price(0.145, "lustre-billing-skus"),
        250: Price(0.21, "lustre-billing-skus"),
        500: Price(0.34, "lustre-billing-skus"),
        1000: Price(0.60, "lustre-billing-skus"),
    },
}

# Boot disks, dollars per GiB-month of provisioned capacity, by disk type and region.
DISK_GIB_MONTH: dict[str, dict[str, Price]] = {
    "pd-balanced": {"us-central1": Price(0.10, "disk-pricing")},
    "hyperdisk-balanced": {"us-central1": Price(0.08, "disk-pricing")},
}

# Cloud Storage Standard, regional, dollars per GB-month stored (the export bucket).
STORAGE_GB_MONTH: dict[str, Price] = {
    "us-central1": Price(0.020, "storage-pricing"),
    "europe-west1": Price(0.020, "storage-pricing"),
}

GKE_CLUSTER_HOURLY = Price(0.10, "gke-pricing")  # regional cluster: no free-tier credit

# Cloud NAT (Public NAT), the same in every region.
NAT_PER_VM_HOURLY = Price(0.0014, "nat-pricing")
NAT_MAX_HOURLY = Price(0.044, "nat-pricing")  # the per-VM charge stops growing at 32 VMs
NAT_IP_HOURLY = Price(0.005, "nat-pricing")
NAT_PER_GIB = Price(0.045, "nat-pricing")

# What a reservation is billed at, and on whose word: the on-demand row of the reserved machine, for every
# reserved VM, whether a node runs on it or not, less the discount of how the reservation was bought.
RESERVATION_PRICE_MODE = ON_DEMAND
RESERVATION_BILLING_SOURCE = "reservation-billing"

# How A3 Ultra and A4 reservations are sold (SOURCES["consumption-options"]): a block reservation with a committed-
# use discount, or a calendar-mode reservation at Dynamic Workload Scheduler prices, each "discounted up to 53%".
# A reservation stack does not know which it holds, so its GPU nodes are priced as a range: from the list rate less
# the largest published discount to the on-demand list rate (the upper bound). No dollar figure for either discount
# is published; a holder's own rate goes in gpuNodeHourlyPrice.
RESERVATION_MAX_DISCOUNT = 0.53
RESERVATION_DISCOUNT_SOURCE = "consumption-options"

# The ways a GPU VM is bought, as the plan names them (key, words); each priced from the table's rows above.
PURCHASE_ON_DEMAND = "onDemandList"
PURCHASE_COMMITTED = "committedUseReservation"
PURCHASE_DWS = "calendarModeOrFlexStart"
PURCHASE_SPOT = "spot"
PURCHASES = {
    PURCHASE_ON_DEMAND: "on-demand list (upper bound)",
    PURCHASE_COMMITTED: "committed-use reservation",
    PURCHASE_DWS: "calendar mode / flex-start (DWS)",
    PURCHASE_SPOT: "spot",
}

HOURS_PER_MONTH = 730  # Google Cloud's billing convention for monthly figures
