"""The cost estimate: the arithmetic per provisioning mode, Lustre tier, boot disks, GKE fee and Cloud NAT; derived,
borrowed and user figures named; unknown regions and machines; the price table's own consistency and its sourced
figures; what the shipped stacks print; and that the dev stack's Lustre is the cheapest that passes its pre-flight."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml
from config_rules import validated
from conftest import INFRA_STACKS, ROOT, run_infra_stack
from script_loader import load_script

from infra import cost, prices
from infra.cost import USER_RATE, CostInputs, estimate, summary_lines
from infra.prices import FLEX_START, ON_DEMAND, SPOT, Other, Price
from infra.settings import LUSTRE_TIERS, ConfigError, InfraSettings
from infra.stack import cost_inputs
from tools.offline import load_stack_config

lustre_io = load_script("jobs/preflight/lustre_io.py", "preflight_lustre_io")

REGION, NEIGHBOUR = "test-region1", "test-region2"
GPU, CPU = 80.0, 5.0  # dollars per hour in the test table
GPU_DISK, CPU_DISK = 0.08, 0.10  # dollars per GiB-month
LUSTRE = {125: 0.1, 250: 0.2, 500: 0.3, 1000: 0.4}  # dollars per GiB-month
GKE = prices.GKE_CLUSTER_HOURLY.usd
H = prices.HOURS_PER_MONTH

INPUTS = CostInputs(
    region=REGION,
    gpu_machine_type="a3-ultragpu-8g",
    gpu_provisioning="spot",
    gpu_nodes=3,
    ray_worker_replicas=2,
    gpu_autoscaling=False,
    cpu_machine_type="n2-highmem-80",
    cpu_nodes=1,
    lustre_capacity_gib=18_000,
    lustre_tier=500,
    protect_data=True,
    gpu_boot_disk_gib=500,
    cpu_boot_disk_gib=400,
)
GPU_DISK_HOURLY = 500 * GPU_DISK / H
CPU_DISK_HOURLY = 400 * CPU_DISK / H


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A known table, so the arithmetic is checked against numbers chosen here, not the dated ones."""
    machines = {
        "a3-ultragpu-8g": {REGION: {ON_DEMAND: Price(GPU, "skypilot-catalog"), SPOT: Price(GPU / 2, "skypilot-catalog"),
                                    FLEX_START: Price(GPU / 4, "skypilot-catalog")}},
        "n2-highmem-80": {REGION: {ON_DEMAND: Price(CPU, "skypilot-catalog")}},
    }  # fmt: skip
    monkeypatch.setattr(cost, "MACHINE_HOURLY", machines)
    monkeypatch.setattr(
        cost, "LUSTRE_GIB_MONTH", {REGION: {tier: Price(usd, "lustre-billing-skus") for tier, usd in LUSTRE.items()}}
    )
    monkeypatch.setattr(
        cost,
        "DISK_GIB_MONTH",
        {
            "hyperdisk-balanced": {REGION: Price(GPU_DISK, "disk-pricing")},
            "pd-balanced": {REGION: Price(CPU_DISK, "disk-pricing")},
        },
    )
    monkeypatch.setattr(cost, "STORAGE_GB_MONTH", {REGION: Price(0.02, "storage-pricing")})
    monkeypatch.setattr(cost, "NEAREST_PUBLISHED_REGIONS", {NEIGHBOUR: ("mars-north1", REGION)})


def always(lustre_per_gib_month: float = LUSTRE[500]) -> float:
    """What runs whatever the GPUs do: the GKE fee, the CPU node and its disk, Lustre."""
    return GKE + CPU + CPU_DISK_HOURLY + 18_000 * lustre_per_gib_month / H


@pytest.mark.parametrize(
    ("mode", "gpu_hourly"), [("reservation", GPU), ("spot", GPU / 2), ("flexStart", GPU / 4)], ids=str
)
@pytest.mark.parametrize("autoscaling", [False, True])
def test_hourly_arithmetic_per_mode(table: None, mode: str, gpu_hourly: float, autoscaling: bool):
    result = estimate(replace(INPUTS, gpu_provisioning=mode, gpu_autoscaling=autoscaling))
    assert result.complete and result.unpriced == []
    assert result.gpu_node_hourly == gpu_hourly and result.gpu_node_price_from == "table"
    assert result.gke_cluster_hourly == GKE == 0.10
    running_idle = 0 if autoscaling else 2  # released by the autoscaler, or held by the Ray cluster
    if mode == "reservation":
        # The reservation bills all 3 reserved VMs, run or not; only the nodes that exist have a boot disk. Its rate
        # is a range: the on-demand list rate (the upper end) less up to 53% (committed use or calendar mode).
        low = gpu_hourly * (1 - 0.53)
        assert result.gpu_node_hourly_low == pytest.approx(low)
        assert result.per_hour_idle == pytest.approx(always() + 3 * gpu_hourly + running_idle * GPU_DISK_HOURLY)
        assert result.per_hour_idle_low == pytest.approx(always() + 3 * low + running_idle * GPU_DISK_HOURLY)
        assert result.per_hour_while_gpus_run == pytest.approx(always() + 3 * gpu_hourly + 2 * GPU_DISK_HOURLY)
        assert result.per_hour_while_gpus_run_low == pytest.approx(always() + 3 * low + 2 * GPU_DISK_HOURLY)
        assert any("reservation bills all 3 reserved VM(s) for the whole reservation period" in n for n in result.notes)
    else:
        assert result.gpu_node_hourly_low == result.gpu_node_hourly
        assert result.per_hour_idle == pytest.approx(always() + running_idle * (gpu_hourly + GPU_DISK_HOURLY))
        assert result.per_hour_while_gpus_run == pytest.approx(always() + 2 * (gpu_hourly + GPU_DISK_HOURLY))
        assert result.per_hour_while_gpus_run_low == result.per_hour_while_gpus_run
        assert not any("reservation" in n for n in result.notes)


@pytest.mark.parametrize("tier", sorted(LUSTRE))
def test_lustre_per_month_per_tier_and_after_destroy(table: None, tier: int):
    capacity = 72_000
    result = estimate(replace(INPUTS, lustre_capacity_gib=capacity, lustre_tier=tier))
    assert result.lustre_monthly == pytest.approx(capacity * LUSTRE[tier])
    assert result.per_month_after_destroy == pytest.approx(capacity * LUSTRE[tier])  # protectData keeps it
    line = cost.after_destroy_line(result.as_output())
    assert f"${capacity * LUSTRE[tier]:,.2f}" in line and f"72,000 GiB at {tier} MB/s/TiB" in line
    unprotected = estimate(replace(INPUTS, lustre_capacity_gib=capacity, lustre_tier=tier, protect_data=False))
    assert unprotected.per_month_after_destroy == 0.0
    assert "nothing: protectData is off" in cost.after_destroy_line(unprotected.as_output())


def test_export_bucket_is_priced_per_gb_month_and_outlives_a_destroy(table: None):
    assert estimate(INPUTS).export_bucket_gb_month is None
    output = estimate(replace(INPUTS, export_bucket=True)).as_output()
    assert output["exportBucketPerGbMonth"] == 0.02
    assert "plus $0.020 per GB-month in the export bucket" in cost.after_destroy_line(output)


def test_cloud_nat_per_vm_capped_plus_one_address(table: None):
    def running(inputs: CostInputs) -> float:
        value = estimate(inputs).per_hour_while_gpus_run
        assert value is not None
        return value

    # 1 CPU node + 2 GPU nodes use the gateway while the GPUs run; 1 + 2 with no run (no autoscaler).
    assert running(replace(INPUTS, cloud_nat=True)) - running(INPUTS) == pytest.approx(3 * 0.0014 + 0.005)
    many = replace(INPUTS, cloud_nat=True, gpu_nodes=60, ray_worker_replicas=60)
    extra = running(many) - running(replace(many, cloud_nat=False))
    assert extra == pytest.approx(0.044 + 0.005)  # capped at 32 VMs


def test_the_users_gpu_rate_replaces_the_tables(table: None):
    result = estimate(replace(INPUTS, gpu_provisioning="reservation", gpu_node_hourly_price=61.5))
    assert result.gpu_node_hourly == 61.5 and result.gpu_node_price_from == USER_RATE
    assert result.per_hour_idle == pytest.approx(always() + 3 * 61.5 + 2 * GPU_DISK_HOURLY)
    assert any(
        "$61.50/h is your figure (gpuNodeHourlyPrice); it replaces the table's $80.00" in n for n in result.notes
    )
    assert result.gpu_node_hourly_low == 61.5 and result.gpu_node_price_basis == cost.BASIS_USER  # no range
    assert result.per_hour_idle_low == result.per_hour_idle
    lines = summary_lines(result.as_output())
    assert "one GPU node per hour:       $61.50 (your gpuNodeHourlyPrice)" in lines
    assert not any(" to $" in line for line in lines if line.startswith("per hour"))
    # Also where the table has no figure at all: the user's rate makes the estimate complete.
    unknown = estimate(replace(INPUTS, gpu_machine_type="x9-gpu-8g", gpu_node_hourly_price=40.0))
    assert unknown.complete and unknown.gpu_node_hourly == 40.0
    assert any("replaces the table, which has none" in n for n in unknown.notes)


def test_a_region_without_figures_borrows_the_nearest_published_and_says_so(table: None):
    result = estimate(replace(INPUTS, region=NEIGHBOUR))
    assert result.complete and result.gpu_node_hourly == GPU / 2 and result.lustre_monthly == 18_000 * LUSTRE[500]
    assert f"borrowed: a3-ultragpu-8g (spot) has no {NEIGHBOUR} figure; {REGION}'s is used" in result.notes
    assert f"borrowed: Managed Lustre at 500 MB/s/TiB has no {NEIGHBOUR} figure; {REGION}'s is used" in result.notes


def test_a_derived_figure_is_named_with_its_derivation(table: None, monkeypatch: pytest.MonkeyPatch):
    derived = Price(GPU / 4, "skypilot-catalog", derived="the spot figure halved, for this test")
    monkeypatch.setitem(cost.MACHINE_HOURLY["a3-ultragpu-8g"][REGION], FLEX_START, derived)
    result = estimate(replace(INPUTS, gpu_provisioning="flexStart"))
    assert result.complete
    assert "derived: a3-ultragpu-8g (flexStart) $20.00: the spot figure halved, for this test" in result.notes
    assert "note: derived: a3-ultragpu-8g (flexStart) $20.00: the spot figure halved, for this test" in (
        summary_lines(result.as_output())
    )


def test_unknown_region_machine_and_tier_are_named_not_errors(table: None):
    result = estimate(replace(INPUTS, region="mars-north1", cpu_machine_type="x9-huge-1", lustre_tier=42))
    assert not result.complete
    assert result.gpu_node_hourly is None and result.cpu_node_hourly is None and result.lustre_monthly is None
    assert result.per_month_after_destroy is None
    assert any(item.startswith("a3-ultragpu-8g (spot) in mars-north1") for item in result.unpriced)
    assert any(item.startswith("x9-huge-1 (onDemand) in mars-north1") for item in result.unpriced)
    assert any(item.startswith("Managed Lustre at 42 MB/s/TiB in mars-north1") for item in result.unpriced)
    lines = summary_lines(result.as_output())
    assert "one GPU node per hour:       unknown (the table's spot rate)" in lines
    assert sum(line.startswith("missing price: ") for line in lines) == 5  # + the two boot disks


@pytest.mark.parametrize("mode", ["reservation", "spot", "flexStart"])
def test_an_unpriced_region_prints_no_dollar_total_and_names_the_missing_prices(table: None, mode: str):
    """Only the GKE fee is known there: no total may read as a dollar figure ("at least $0.10" was one)."""
    result = estimate(replace(INPUTS, region="mars-north1", gpu_provisioning=mode))
    assert result.per_hour_while_gpus_run is None and result.per_hour_idle is None
    assert result.per_hour_while_gpus_run_low is None and result.per_hour_idle_low is None
    output = result.as_output()
    assert output["perHourWhileGpusRun"] is None and output["perHourIdle"] is None and output["complete"] is False
    lines = summary_lines(output)
    for prefix in ("per hour while the GPUs run:", "per hour idle (no run):"):
        (line,) = [line for line in lines if line.startswith(prefix)]
        assert "$" not in line and "at least" not in line and "unknown" in line and "missing price" in line
    missing = [line.removeprefix("missing price: ") for line in lines if line.startswith("missing price: ")]
    gpu_mode = "onDemand" if mode == "reservation" else mode
    assert {item.split(" in mars-north1")[0] for item in missing} == {
        f"a3-ultragpu-8g ({gpu_mode})",
        "n2-highmem-80 (onDemand)",
        "hyperdisk-balanced boot disk",
        "pd-balanced boot disk",
        "Managed Lustre at 500 MB/s/TiB",
    }
    # One missing item is enough: a known GPU rate (the user's) does not turn the rest into a total.
    partial = estimate(replace(INPUTS, region="mars-north1", gpu_node_hourly_price=50.0))
    assert partial.per_hour_while_gpus_run is None and partial.gpu_node_hourly == 50.0


def test_after_destroy_follows_protect_data_never_an_unknown_price(table: None):
    unpriced = replace(INPUTS, region="mars-north1")
    protected = estimate(unpriced).as_output()
    assert protected["protectData"] is True and protected["perMonthAfterDestroy"] is None
    line = cost.after_destroy_line(protected)
    assert "nothing" not in line and "protectData is off" not in line
    assert line.startswith("per month after destroy:     unknown (the Lustre instance protectData keeps, 18,000 GiB")
    off = estimate(replace(unpriced, protect_data=False)).as_output()
    assert off["perMonthAfterDestroy"] == 0.0  # nothing is kept, priced or not
    assert cost.after_destroy_line(off) == "per month after destroy:     $0.00 (nothing: protectData is off)"


def test_a_reservation_shows_a_range_and_names_its_assumption(table: None):
    output = estimate(replace(INPUTS, gpu_provisioning="reservation")).as_output()
    assert output["gpuNodePriceBasis"] == cost.BASIS_RESERVATION
    assert (output["gpuNodePerHourLow"], output["gpuNodePerHour"]) == (round(GPU * 0.47, 2), GPU)
    lines = summary_lines(output)
    (gpu_line,) = [line for line in lines if line.startswith("one GPU node per hour: ")]
    assert gpu_line.startswith(
        "one GPU node per hour:       $37.60 to $80.00 (reservation: on-demand list less up to 53%"
    )
    assert "committed-use or calendar-mode reservation" in gpu_line and "upper bound" in gpu_line
    low, high = output["perHourWhileGpusRunLow"], output["perHourWhileGpusRun"]
    assert f"per hour while the GPUs run: ${low:,.2f} to ${high:,.2f}" in lines and low < high
    assert any("Cluster Director: choose a consumption option" in note for note in output["notes"])


def test_every_way_of_buying_the_gpu_vm_is_listed_with_its_source(table: None):
    bought = {p["how"]: p for p in estimate(INPUTS).as_output()["gpuNodeByPurchase"]}
    assert list(bought) == list(prices.PURCHASES)
    assert (bought["onDemandList"]["usdLow"], bought["onDemandList"]["usdHigh"]) == (GPU, GPU)
    assert (bought["committedUseReservation"]["usdLow"], bought["committedUseReservation"]["usdHigh"]) == (37.6, GPU)
    assert "up to 53% off the list rate (Cluster Director" in bought["committedUseReservation"]["source"]
    assert bought["calendarModeOrFlexStart"]["usdHigh"] == GPU / 4 and bought["spot"]["usdHigh"] == GPU / 2
    assert all("SkyPilot catalog" in bought[k]["source"] for k in ("onDemandList", "spot", "calendarModeOrFlexStart"))
    lines = summary_lines(estimate(INPUTS).as_output())
    assert "  committed-use reservation:        $37.60 to $80.00 (up to 53% off the list rate" in "\n".join(lines)
    # A machine the table does not know: every way says unknown, none invents a figure.
    unknown = {
        p["how"]: p for p in estimate(replace(INPUTS, gpu_machine_type="x9-gpu-8g")).as_output()["gpuNodeByPurchase"]
    }
    assert all(p["usdHigh"] is None and p["usdLow"] is None and "no " in p["source"] for p in unknown.values())


def test_output_is_in_cents_and_names_its_date_and_sources(table: None):
    output = estimate(INPUTS).as_output()
    assert output["currency"] == "USD" and output["pricesReadOn"] == prices.PRICES_READ_ON
    assert output["perHourWhileGpusRun"] == round(always() + 2 * (GPU / 2 + GPU_DISK_HOURLY), 2)
    assert output["gkeClusterPerHour"] == 0.1 and output["gpuNodeBootDiskPerMonth"] == 40.0
    assert output["complete"] is True and output["unpriced"] == []
    assert any("SkyPilot catalog" in s and "third-party catalog" in s for s in output["sources"])
    assert any("Google Kubernetes Engine pricing (official page" in s for s in output["sources"])


# --- The dated table ---------------------------------------------------------------------------------------------


def _all_prices() -> list[Price]:
    found = [p for regions in prices.MACHINE_HOURLY.values() for modes in regions.values() for p in modes.values()]
    found += [p for tiers in prices.LUSTRE_GIB_MONTH.values() for p in tiers.values()]
    found += [p for regions in prices.DISK_GIB_MONTH.values() for p in regions.values()]
    found += [*prices.STORAGE_GB_MONTH.values(), prices.GKE_CLUSTER_HOURLY]
    found += [prices.NAT_PER_VM_HOURLY, prices.NAT_MAX_HOURLY, prices.NAT_IP_HOURLY, prices.NAT_PER_GIB]
    return found


def test_every_price_names_a_source_with_its_reliability_and_date():
    assert prices.PRICES_READ_ON.count("-") == 2
    for price in _all_prices():
        source = prices.SOURCES[price.source]
        assert source.reliability in prices.RELIABILITIES and source.read_on.count("-") == 2
        assert price.usd > 0 or price.source == "skypilot-catalog"  # SkyPilot's A4 machine rows are 0.0 + GPUs
        for other in price.others:
            assert other.source != price.source or other.usd != price.usd
            assert len(other.why_not) > 20, "a figure not used says why"
    with pytest.raises(ValueError, match="unknown price source"):
        Price(1.0, "a blog")
    with pytest.raises(ValueError, match="unknown price source"):
        Price(1.0, "gke-pricing", others=(Other(2.0, "a blog", "because"),))
    with pytest.raises(ValueError, match="unknown reliability"):
        prices.Source("t", "w", "x", reliability="a hunch")


def test_every_flex_start_figure_is_marked_derived():
    """No source publishes a flex-start VM price for these machines: each one says how it was worked out."""
    for machine, regions in prices.MACHINE_HOURLY.items():
        for region, modes in regions.items():
            if FLEX_START in modes:
                assert "flex-start" in modes[FLEX_START].derived, (machine, region)


def test_the_issue_21_figures():
    """The figures the issue questioned, as resolved: each with the competing figure kept beside it."""
    # A3 Ultra on-demand: the whole-VM figure (its own vCPU/memory SKUs), not SkyPilot's GPU row + an A3 High-rate
    # machine row, which is kept beside it (issue 28).
    a3u = prices.MACHINE_HOURLY["a3-ultragpu-8g"]["us-central1"][ON_DEMAND]
    assert round(a3u.usd, 2) == 83.49 and a3u.source == "gpu-list-prices"
    assert [(round(o.usd, 2), o.source) for o in a3u.others] == [(86.76, "skypilot-catalog")]
    assert round(prices.MACHINE_HOURLY["a3-ultragpu-8g"]["europe-west1"][ON_DEMAND].usd, 2) == 91.95
    assert "second-hand" in prices.SOURCES["gpu-list-prices"].title
    assert "second-hand" in prices.SOURCES["billing-catalog-a4"].title  # A4's list rate has no first-hand source
    assert prices.RESERVATION_MAX_DISCOUNT == 0.53
    assert prices.SOURCES[prices.RESERVATION_DISCOUNT_SOURCE].reliability == prices.OFFICIAL
    a4 = prices.MACHINE_HOURLY["a4-highgpu-8g"]["us-central1"]
    assert a4[ON_DEMAND].usd == pytest.approx(8 * 16.11) and a4[ON_DEMAND].source == "billing-catalog-a4"
    (skypilot,) = a4[ON_DEMAND].others
    assert skypilot.usd == pytest.approx(0.70 * a4[ON_DEMAND].usd)  # the discounted-looking figure, recorded
    assert a4[FLEX_START].usd == pytest.approx(0.50 * a4[ON_DEMAND].usd)
    # SkyPilot's europe-west1 H200 x8 Price sits below its spot price: used as flex-start, not as on-demand.
    assert prices._H200_X8_FLEX < prices._H200_X8_EUROPE_WEST1_SPOT
    ew1 = prices.MACHINE_HOURLY["a3-ultragpu-8g"]["europe-west1"]
    assert ew1[SPOT].usd < ew1[FLEX_START].usd < ew1[ON_DEMAND].usd
    assert ew1[FLEX_START].usd == pytest.approx(prices._H200_X8_FLEX + 13.50609)
    assert {t: p.usd for t, p in prices.LUSTRE_GIB_MONTH["us-central1"].items()} == {
        125: 0.145,
        250: 0.21,
        500: 0.34,
        1000: 0.60,
    }
    assert prices.GKE_CLUSTER_HOURLY.usd == 0.10 and prices.STORAGE_GB_MONTH["europe-west1"].usd == 0.020
    assert prices.RESERVATION_PRICE_MODE == ON_DEMAND
    assert prices.SOURCES[prices.RESERVATION_BILLING_SOURCE].reliability == prices.OFFICIAL


# --- The shipped stacks ------------------------------------------------------------------------------------------


def _shipped(stack: str, **overrides: object) -> CostInputs:
    """What the estimate reads for a shipped example stack, through the program's own path: stack file plus
    Pulumi.yaml defaults, validated settings, cost inputs."""
    project, config = load_stack_config(ROOT, stack)
    values = {key.removeprefix(f"{project}:"): value for key, value in config.items()}
    return cost_inputs(validated(InfraSettings, {**values, **overrides}))


@pytest.mark.parametrize("stack", ["h200", "b200"])
def test_a_shipped_reservation_stack_prices_its_gpu_nodes_as_a_named_range(stack: str):
    result = estimate(_shipped(stack))
    assert result.gpu_node_price_basis == cost.BASIS_RESERVATION and result.gpu_node_hourly is not None
    assert result.gpu_node_hourly_low == pytest.approx(result.gpu_node_hourly * 0.47)
    lines = summary_lines(result.as_output())
    assert any(line.startswith("per hour while the GPUs run: $") and " to $" in line for line in lines), lines
    assert any("(reservation: on-demand list less up to 53%" in line for line in lines)
    # The user's figure wins: no range, no assumption.
    mine = summary_lines(estimate(_shipped(stack, gpuNodeHourlyPrice="61.5")).as_output())
    assert "one GPU node per hour:       $61.50 (your gpuNodeHourlyPrice)" in mine
    assert not any(line.startswith("per hour") and " to $" in line for line in mine)


def test_a4_in_europe_west1_is_borrowed_and_said_so():
    """Google lists A4 in europe-west1, but no source read prices it there: the nearest published figures are used."""
    result = estimate(_shipped("b200", **{"gcp:region": "europe-west1", "zone": "europe-west1-b"}))
    assert result.complete
    assert "borrowed: a4-highgpu-8g (onDemand) has no europe-west1 figure; europe-west4's is used" in result.notes


@pytest.mark.parametrize("stack", INFRA_STACKS)
def test_every_shipped_stack_has_a_complete_estimate(stack: str):
    result = estimate(_shipped(stack))
    assert result.complete, result.unpriced
    lines = summary_lines(result.as_output())
    assert not any("unknown" in line or "at least" in line for line in lines), lines
    assert "GKE cluster fee per hour:    $0.10" in lines
    assert result.gpu_boot_disk_monthly and result.cpu_boot_disk_monthly and result.lustre_monthly
    # The fee, Lustre, the CPU node and its disk.
    assert result.per_hour_idle is not None and result.per_hour_idle > GKE + result.lustre_monthly / H


def test_dev_names_its_derived_and_borrowed_figures():
    notes = estimate(_shipped("dev")).notes
    assert any(n.startswith("derived: a3-ultragpu-8g (flexStart)") for n in notes)
    assert "borrowed: Managed Lustre at 1000 MB/s/TiB has no europe-west1 figure; us-central1's is used" in notes


def test_gpu_node_hourly_price_is_validated_and_reaches_the_estimate():
    assert _shipped("h200").gpu_node_hourly_price is None  # the declared default "" means the table's rate
    assert _shipped("h200", gpuNodeHourlyPrice="61.5").gpu_node_hourly_price == 61.5
    for bad in ("0", "-3", "cheap", "nan", "inf", True):
        with pytest.raises(ConfigError, match=r"gpuNodeHourlyPrice.*positive number of US dollars per GPU node-hour"):
            _shipped("h200", gpuNodeHourlyPrice=bad)
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]["gpuNodeHourlyPrice"]
    assert declared == {**declared, "type": "string", "default": ""}
    output = run_infra_stack("h200", overrides={"gpuNodeHourlyPrice": "61.5"}).outputs["estimatedCost"]
    assert output["gpuNodePerHour"] == 61.5 and output["gpuNodePriceFrom"] == USER_RATE
    assert any("is your figure (gpuNodeHourlyPrice)" in note for note in output["notes"])


def test_boot_disks_counted_are_the_ones_the_pools_register():
    run = run_infra_stack("b200")
    pools = {pool.name: pool.inputs["nodeConfig"] for pool in run.of_type("gcp:container/nodePool:NodePool")}
    used = _shipped("b200")
    assert (pools["gpu"]["diskType"], pools["gpu"]["diskSizeGb"]) == (used.gpu_boot_disk_type, used.gpu_boot_disk_gib)
    assert (pools["gke-cpu"]["diskType"], pools["gke-cpu"]["diskSizeGb"]) == (
        used.cpu_boot_disk_type,
        used.cpu_boot_disk_gib,
    )


def test_dev_lustre_is_the_cheapest_that_passes_its_own_preflight_for_one_node():
    """Every Managed Lustre configuration (tier, smallest capacity: more capacity only costs more) against the
    dev stack's one-node pre-flight, with the pipeline's own defaults. The cheapest passing one is dev's."""
    dev = _shipped("dev")
    rates = prices.LUSTRE_GIB_MONTH["us-central1"]
    passing = {}
    for tier, (minimum, *_rest) in LUSTRE_TIERS.items():
        mark = lustre_io.io_threshold(
            minimum, tier, 1, lustre_io.DEFAULT_NODE_LIMIT_GBPS, lustre_io.DEFAULT_MIN_FRACTION
        )
        # A healthy instance delivers what it is provisioned for; it passes if that reaches the pass mark, and the
        # check must measure the node, not a starved instance (the pass mark is set by the node, not the instance).
        if mark.instance_gbps >= mark.threshold_gbps and mark.limited_by == "nodes":
            passing[(tier, minimum)] = minimum * rates[tier].usd
    cheapest = min(passing, key=lambda config: passing[config])
    assert cheapest == (dev.lustre_tier, dev.lustre_capacity_gib) == (1000, 9000)
    assert math.isclose(passing[cheapest], 5400.0)
