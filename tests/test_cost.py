"""The cost estimate: the arithmetic per provisioning mode and Lustre tier, unknown regions and machines, the
price table's own consistency, and that it covers what the shipped stacks use."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import INFRA_STACKS, ROOT

from infra import cost, prices
from infra.cost import CostInputs, estimate, summary_lines
from infra.prices import FLEX_START, ON_DEMAND, SPOT, Price
from infra.settings import build_settings
from infra.stack import cost_inputs
from tools.offline import load_stack_config

REGION = "test-region1"
GPU, CPU = 80.0, 5.0  # dollars per hour in the test table
LUSTRE = {125: 0.1, 250: 0.2, 500: 0.3, 1000: 0.4}  # dollars per GiB-month

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
)


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A known table, so the arithmetic is checked against numbers chosen here, not the dated ones."""
    machines = {
        "a3-ultragpu-8g": {REGION: {ON_DEMAND: Price(GPU, "not-found"), SPOT: Price(GPU / 2, "not-found"),
                                    FLEX_START: Price(GPU / 4, "not-found")}},
        "n2-highmem-80": {REGION: {ON_DEMAND: Price(CPU, "not-found")}},
    }  # fmt: skip
    monkeypatch.setattr(cost, "MACHINE_HOURLY", machines)
    monkeypatch.setattr(cost, "LUSTRE_GIB_MONTH", {tier: Price(usd, "not-found") for tier, usd in LUSTRE.items()})


@pytest.mark.parametrize(
    ("mode", "gpu_hourly"), [("reservation", GPU), ("spot", GPU / 2), ("flexStart", GPU / 4)], ids=str
)
@pytest.mark.parametrize("autoscaling", [False, True])
def test_hourly_arithmetic_per_mode(table: None, mode: str, gpu_hourly: float, autoscaling: bool):
    result = estimate(replace(INPUTS, gpu_provisioning=mode, gpu_autoscaling=autoscaling))
    lustre_hourly = 18_000 * LUSTRE[500] / 730
    assert result.complete and result.notes == []
    assert result.gpu_node_hourly == gpu_hourly
    if mode == "reservation":
        # The reservation bills all 3 reserved nodes, run or not, autoscaler or not.
        assert result.per_hour_idle == pytest.approx(CPU + lustre_hourly + 3 * gpu_hourly)
        assert result.per_hour_while_gpus_run == pytest.approx(CPU + lustre_hourly + 3 * gpu_hourly)
    else:
        idle_gpus = 0 if autoscaling else 2  # released by the autoscaler, or held by the Ray cluster
        assert result.per_hour_idle == pytest.approx(CPU + lustre_hourly + idle_gpus * gpu_hourly)
        assert result.per_hour_while_gpus_run == pytest.approx(CPU + lustre_hourly + 2 * gpu_hourly)


@pytest.mark.parametrize("tier", sorted(LUSTRE))
def test_lustre_per_month_per_tier_and_after_destroy(table: None, tier: int):
    capacity = 72_000
    result = estimate(replace(INPUTS, lustre_capacity_gib=capacity, lustre_tier=tier))
    assert result.lustre_monthly == pytest.approx(capacity * LUSTRE[tier])
    assert result.per_month_after_destroy == pytest.approx(capacity * LUSTRE[tier])  # protectData keeps it
    unprotected = estimate(replace(INPUTS, lustre_capacity_gib=capacity, lustre_tier=tier, protect_data=False))
    assert unprotected.per_month_after_destroy == 0.0


def test_unknown_region_machine_and_tier_give_notes_not_errors(table: None):
    result = estimate(replace(INPUTS, region="mars-north1", cpu_machine_type="x9-huge-1", lustre_tier=42))
    assert not result.complete
    assert result.gpu_node_hourly is None and result.cpu_node_hourly is None and result.lustre_monthly is None
    assert result.per_hour_while_gpus_run == 0.0  # nothing known: nothing added, and said so
    assert result.per_month_after_destroy is None
    assert any("no price for a3-ultragpu-8g (spot) in mars-north1" in note for note in result.notes)
    assert any("no price for x9-huge-1 (onDemand) in mars-north1" in note for note in result.notes)
    assert any("no price for Managed Lustre at 42 MB/s/TiB" in note for note in result.notes)
    lines = summary_lines(result.as_output())
    assert "per hour while the GPUs run: at least $0.00" in lines
    assert "one GPU node per hour:       unknown" in lines
    assert sum(line.startswith("note: no price for") for line in lines) == 3


def test_output_is_in_cents_and_names_its_date_and_sources(table: None):
    output = estimate(INPUTS).as_output()
    assert output["currency"] == "USD" and output["pricesReadOn"] == prices.PRICES_READ_ON
    assert output["perHourWhileGpusRun"] == round(CPU + 18_000 * LUSTRE[500] / 730 + 2 * GPU / 2, 2)
    assert output["complete"] is True
    assert any("skypilot-catalog" in source for source in output["sources"])


def test_every_price_names_a_source_and_the_table_a_date():
    assert prices.PRICES_READ_ON.count("-") == 2
    for regions in prices.MACHINE_HOURLY.values():
        for modes in regions.values():
            for price in modes.values():
                assert price.source in prices.SOURCES
                assert (price.usd is None) == (price.source == "not-found")
    with pytest.raises(ValueError, match="unknown price source"):
        Price(1.0, "a blog")


def _shipped_stack_inputs() -> list[CostInputs]:
    """What the estimate reads for each shipped example stack (a user's own stack may be anywhere), through the
    program's own path: stack file plus Pulumi.yaml defaults, validated settings, cost inputs."""
    inputs = []
    for stack in INFRA_STACKS:
        project, config = load_stack_config(ROOT, stack)
        values = {key.removeprefix(f"{project}:"): value for key, value in config.items()}
        inputs.append(cost_inputs(build_settings(values)))
    assert inputs
    return inputs


def test_the_table_covers_what_the_shipped_stacks_use():
    """Every shipped stack's machines, region, mode and tier have a row (a figure, or a stated "not found")."""
    for used in _shipped_stack_inputs():
        machine, region = used.gpu_machine_type, used.region
        mode = prices.PRICE_MODE_OF_PROVISIONING[used.gpu_provisioning]
        assert mode in prices.MACHINE_HOURLY[machine][region]
        # The on-demand rate (what a reservation bills) was found for every shipped stack's GPU machine and region.
        assert prices.MACHINE_HOURLY[machine][region][ON_DEMAND].usd is not None, (machine, region)
        assert prices.MACHINE_HOURLY[used.cpu_machine_type][region][ON_DEMAND].usd is not None
        assert used.lustre_tier in prices.LUSTRE_GIB_MONTH
