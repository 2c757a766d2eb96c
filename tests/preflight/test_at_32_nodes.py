"""The pre-flights at 32 nodes (issue 34): the NCCL check places one bundle per node and one rank per GPU, and its
pass mark is a bus bandwidth, which nccl-tests' 2(n-1)/n correction keeps comparable from 2 nodes to 32 (a ring
moves the same bytes per link whatever the ring's length); the Lustre check's pass mark is capped by what the
instance is provisioned for, which 32 nodes outrun, not by what they could drive."""

from __future__ import annotations

import pytest
from script_loader import load_script

na = load_script("jobs/preflight/nccl_allreduce.py", "preflight_nccl_allreduce_32")
lio = load_script("jobs/preflight/lustre_io.py", "preflight_lustre_io_32")
NODES, GPUS = 32, 8


def test_the_nccl_check_spreads_one_bundle_per_node_and_a_rank_per_gpu():
    plan = na.placement_plan(NODES, GPUS)
    assert plan.strategy == "STRICT_SPREAD" and len(plan.bundles) == NODES
    assert plan.world_size == NODES * GPUS == 256
    assert sorted(slot.global_rank for slot in plan.actors) == list(range(256))
    # Every alive GPU node counts when the pipeline does not pass --nodes: 32 of them here.
    ray_nodes = [{"Alive": True, "Resources": {"GPU": 8.0}} for _ in range(NODES)] + [{"Alive": True, "Resources": {}}]
    assert na.cluster_shape(ray_nodes, None, None) == (NODES, GPUS)


def test_the_nccl_pass_mark_means_the_same_at_32_nodes_as_at_2():
    # The same per-link traffic: algbw x 2(n-1)/n. At 256 ranks the factor is 1.99, at 16 it is 1.875.
    assert na.busbw_factor(256) == pytest.approx(2 * 255 / 256)
    seconds = 8 * 2**30 / (52e9)  # an 8 GiB all-reduce at 52 GB/s algbw
    busbw = na.busbw_gbps(na.algbw_gbps(8 * 2**30, seconds), 256)
    assert busbw == pytest.approx(52 * 2 * 255 / 256)
    verdict = na.busbw_verdict(busbw, na.DEFAULT_MIN_BUSBW_GBPS, 8 * 2**30, NODES, 256)
    assert verdict.ok and "256 ranks on 32 nodes" in verdict.message
    low = na.busbw_verdict(40.0, na.DEFAULT_MIN_BUSBW_GBPS, 8 * 2**30, NODES, 256)
    assert not low.ok and "reservation" in low.message  # the hint that the nodes span blocks


def test_the_lustre_pass_mark_is_the_instances_at_32_nodes():
    # 18,000 GiB at 500 MB/s per TiB: 8.8 GB/s for the instance; 32 nodes could drive 160 GB/s.
    threshold = lio.io_threshold(18_000, 500, NODES, lio.DEFAULT_NODE_LIMIT_GBPS, lio.DEFAULT_MIN_FRACTION)
    assert threshold.limited_by == "instance"
    assert threshold.threshold_gbps == pytest.approx(0.5 * 18_000 / 1024 * 500 / 1000)
    # One node is the limit on the same instance, so the pass mark does not demand what one client cannot do.
    assert lio.io_threshold(18_000, 500, 1, lio.DEFAULT_NODE_LIMIT_GBPS, 0.5).limited_by == "nodes"
