"""Beyond two nodes: what a stack of N GPU nodes needs from its address ranges, its Ray head and its GPU pool
(infra/scale.py), refused by the settings before anything is registered; and where the GPU workers of one run are
placed (compact placement for spot and flex-start pools, pod affinity to one reservation sub-block, then block)."""

from __future__ import annotations

from typing import Any

import pytest
from config_rules import validated
from conftest import RunInfra

from infra import scale
from infra.settings import ConfigError, InfraSettings
from workloads import ray_values

NODE_POOL = "gcp:container/nodePool:NodePool"
BASE: dict[str, Any] = {
    "gcp:project": "p",
    "gcp:region": "europe-west1",
    "zone": "europe-west1-b",
    "gpuType": "nvidia-h200-141gb",
    "reservation": "blk",
}
N32 = {**BASE, "gpuNodes": 32}


def refused(key: str, value: str, allowed: str, **changes: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        validated(InfraSettings, {**N32, **changes})
    error = caught.value
    assert error.key == key, str(error)
    assert f"'{key}' = " in str(error) and value in str(error) and allowed in str(error), str(error)
    return error


def test_the_default_ranges_hold_32_gpu_nodes_and_their_pods():
    settings = validated(InfraSettings, N32)
    assert settings.gpu_nodes == settings.ray_worker_replicas == 32
    assert (
        scale.range_problems(
            settings.ranges.cluster_subnet,
            settings.ranges.pods,
            settings.ranges.services,
            settings.ranges.gvnic_subnet,
            settings.ranges.rdma_subnets,
            32,
            settings.cpu_pool_max_nodes,
        )
        == []
    )


def test_pod_blocks_follow_gke_max_pods():
    assert scale.pod_block_prefix() == 24  # 110 pods -> 220 addresses -> /24
    assert scale.pod_block_prefix(32) == 26
    assert scale.pod_block_prefix(8) == 28


def test_a_pod_range_too_small_for_n_nodes_is_refused():
    # A /20 holds 16 node blocks of /24: 32 GPU + 5 CPU + 1 surge nodes need 38, so a /18.
    refused("networkRanges.pods", "10.16.0.0/20", "a /18 or larger", networkRanges={"pods": "10.16.0.0/20"})
    # The same range carries two nodes.
    validated(InfraSettings, {**BASE, "cpuPoolMaxNodes": 2, "networkRanges": {"pods": "10.16.0.0/20"}})


def test_a_node_subnet_too_small_for_n_nodes_is_refused():
    # /27: 32 addresses, 28 usable, for 38 nodes.
    subnet = {"clusterSubnet": "10.0.0.0/27"}
    refused("networkRanges.clusterSubnet", "10.0.0.0/27", "28 usable addresses", networkRanges=subnet)


def test_rdma_and_gvnic_subnets_need_an_address_per_gpu_node():
    rdma = [f"192.168.{n}.0/27" for n in range(1, 9)]
    refused("networkRanges.rdmaSubnets[0]", "192.168.1.0/27", "one RDMA NIC each", networkRanges={"rdmaSubnets": rdma})
    gvnic = {"gvnicSubnet": "192.168.0.0/27"}
    refused("networkRanges.gvnicSubnet", "192.168.0.0/27", "32 GPU nodes", networkRanges=gvnic)
    # /27 RDMA subnets hold 28 nodes: fine for two.
    validated(InfraSettings, {**BASE, "networkRanges": {"rdmaSubnets": rdma, "gvnicSubnet": "192.168.0.0/27"}})


def test_services_range_below_gkes_minimum_is_refused():
    refused("networkRanges.services", "10.20.0.0/28", "/27 or larger", networkRanges={"services": "10.20.0.0/28"})


def test_the_ray_head_grows_with_the_workers():
    cores, size = scale.head_minimum(32)
    assert cores == 40 and size == 32 * 10**9 + 32 * 8 * 2**30
    # Enough for two workers, not for 32: named with the key, the value and the rule.
    validated(InfraSettings, {**BASE, "rayHead": {"cpu": "16", "memory": "64G"}})
    refused("rayHead.cpu", "16", "at least 40 cores for 32 GPU workers", rayHead={"cpu": "16", "memory": "400G"})
    refused("rayHead.memory", "64G", "at least 286Gi", rayHead={"cpu": "48", "memory": "64G"})
    validated(InfraSettings, N32)  # the default head (64 cores, 500G) carries 32 workers


def test_compact_placement_only_where_gke_allows_it():
    assert scale.compact_placement("spot", "a3-ultragpu-8g", 32)
    assert scale.compact_placement("flexStart", "a4-highgpu-8g", 32)
    assert not scale.compact_placement("reservation", "a3-ultragpu-8g", 32)  # the reservation places its nodes
    assert not scale.compact_placement("spot", "a3-ultragpu-8g", scale.COMPACT_PLACEMENT_MAX_NODES + 1)
    assert not scale.compact_placement("spot", "n2-highmem-80", 2)
    error = scale.compact_placement_problem("spot", "a3-ultragpu-8g", 1501)
    assert error and error.key == "gpuNodes" and "1500" in error.allowed
    assert scale.compact_placement_problem("reservation", "a3-ultragpu-8g", 1501) is None


def test_spot_and_flex_start_pools_register_compact_placement(run_infra: RunInfra):
    for mode in ("spot", "flexStart"):
        pool = run_infra("h200", {"gpuProvisioning": mode, "reservation": None, "gpuNodes": 32}).one(NODE_POOL, "gpu")
        assert pool.inputs["placementPolicy"] == {"type": "COMPACT"}, mode
    reserved = run_infra("h200", {"gpuNodes": 32}).one(NODE_POOL, "gpu")
    assert "placementPolicy" not in reserved.inputs


def test_scale_problems_stop_the_program_before_anything_is_registered(run_infra: RunInfra):
    from test_day2 import registered_types

    def refused() -> None:
        with pytest.raises(ConfigError, match=r"networkRanges\.pods"):
            run_infra("h200", {"gpuNodes": 32, "networkRanges": {"pods": "10.16.0.0/20"}})

    assert registered_types(refused) == []


def test_gpu_workers_prefer_one_subblock_then_one_block():
    from test_ray_values import make_refs

    values = ray_values.build_ray_values(validated(InfraSettings, N32), make_refs())
    group = values["additionalWorkerGroups"][ray_values.WORKER_GROUP]
    terms = group["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    by_key = {t["podAffinityTerm"]["topologyKey"]: t for t in terms}
    assert set(by_key) == {"cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block"}
    assert (
        by_key["cloud.google.com/gce-topology-subblock"]["weight"]
        > by_key["cloud.google.com/gce-topology-block"]["weight"]
    )
    for term in terms:
        # Its own Ray cluster's GPU workers, by the labels KubeRay puts on them.
        assert term["podAffinityTerm"]["labelSelector"] == {
            "matchLabels": {"ray.io/cluster": "nemo-rl", "ray.io/group": ray_values.WORKER_GROUP}
        }
    # Preferred, never required: a run must start when its sub-block is full.
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in group["affinity"]["podAffinity"]
    assert "affinity" in values["head"] and "podAffinity" not in values["head"]["affinity"]


def test_the_cost_estimate_counts_every_gpu_node():
    from infra.cost import estimate
    from infra.prices import HOURS_PER_MONTH
    from infra.stack import cost_inputs

    two, many = (estimate(cost_inputs(validated(InfraSettings, {**BASE, "gpuNodes": n}))).as_output() for n in (2, 32))
    per_node = many["gpuNodePerHour"]
    assert per_node == two["gpuNodePerHour"]  # the rate does not change with the count
    # 30 more nodes, each with its boot disk.
    per_node_hour = per_node + many["gpuNodeBootDiskPerMonth"] / HOURS_PER_MONTH
    assert many["perHourWhileGpusRun"] - two["perHourWhileGpusRun"] == pytest.approx(30 * per_node_hour, abs=0.05)
