"""jobs/preflight/nccl_allreduce.py: arithmetic, sizes, placement, verdict, log parsing, and the collective path
over gloo (two local processes, and optionally two Ray actors)."""

from __future__ import annotations

import ast
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "preflight" / "nccl_allreduce.py"


na = load_script("jobs/preflight/nccl_allreduce.py", "preflight_nccl_allreduce")
MIB, GIB = 1 << 20, 1 << 30


# ------------------------------------------------------------------------------------------------- arithmetic


def test_algbw_is_bytes_over_seconds_in_decimal_gb() -> None:
    assert na.algbw_gbps(10**9, 0.01) == pytest.approx(100.0)
    assert na.algbw_gbps(8 * GIB, 0.05) == pytest.approx(171.798692, rel=1e-6)


@pytest.mark.parametrize(
    ("world_size", "factor"),
    [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), (16, 1.875), (64, 126 / 64)],
)
def test_busbw_factor_is_two_n_minus_one_over_n(world_size: int, factor: float) -> None:
    assert na.busbw_factor(world_size) == pytest.approx(factor)
    assert na.busbw_gbps(100.0, world_size) == pytest.approx(100.0 * factor)


def test_bandwidth_rows_known_numbers() -> None:
    # 8 GiB in 50 ms over 16 ranks: algbw 171.80 GB/s, busbw 171.80 x 1.875 = 322.12 GB/s.
    rows = na.bandwidth_rows([MIB, 8 * GIB], [100e-6, 0.05], 16)
    assert rows[0].time_us == pytest.approx(100.0)
    assert rows[0].algbw_gbps == pytest.approx(10.48576)
    assert rows[0].busbw_gbps == pytest.approx(10.48576 * 1.875)
    assert rows[1].algbw_gbps == pytest.approx(171.7987, rel=1e-5)
    assert rows[1].busbw_gbps == pytest.approx(322.1225, rel=1e-5)
    with pytest.raises(ValueError):
        na.bandwidth_rows([MIB], [1.0, 2.0], 2)
    with pytest.raises(ValueError):
        na.algbw_gbps(MIB, 0.0)


def test_default_message_sizes_are_fourteen_doublings_from_1_mib_to_8_gib() -> None:
    sizes = na.message_sizes(MIB, 8 * GIB)
    assert len(sizes) == 14
    assert sizes[0] == MIB and sizes[-1] == 8 * GIB
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    args = na.parse_args([])
    assert round(args.min_size_mib * MIB) == MIB and round(args.max_size_gib * GIB) == 8 * GIB


def test_message_sizes_stop_at_or_below_the_maximum_and_reject_bad_ranges() -> None:
    assert na.message_sizes(MIB, 5 * MIB) == [MIB, 2 * MIB, 4 * MIB]
    assert na.message_sizes(MIB, MIB) == [MIB]
    with pytest.raises(ValueError):
        na.message_sizes(0, MIB)
    with pytest.raises(ValueError):
        na.message_sizes(2 * MIB, MIB)


def test_table_has_the_columns_and_one_row_per_size() -> None:
    rows = na.bandwidth_rows([MIB, 2 * MIB], [1e-4, 1e-4], 8)
    table = na.format_table(rows, 8, "float32", "nccl")
    for column in ("size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        assert column in table
    data = [line.split() for line in table.splitlines() if not line.startswith("#")]
    assert [int(d[0]) for d in data] == [MIB, 2 * MIB]
    assert float(data[1][-1]) == pytest.approx(2 * MIB / 1e-4 / 1e9 * 1.75, abs=0.01)
    assert "Avg bus bandwidth" in table


# ------------------------------------------------------------------------------------------------- placement


def test_placement_plan_one_bundle_per_node_one_actor_per_gpu() -> None:
    plan = na.placement_plan(nodes=2, gpus_per_node=8)
    assert plan.strategy == "STRICT_SPREAD"
    assert plan.bundles == [{"GPU": 8.0, "CPU": 8.0}, {"GPU": 8.0, "CPU": 8.0}]
    assert plan.world_size == 16
    assert [a.global_rank for a in plan.actors] == list(range(16))
    for actor in plan.actors:
        assert actor.global_rank == actor.bundle_index * 8 + actor.local_rank
    assert [a.local_rank for a in plan.actors if a.bundle_index == 1] == list(range(8))


def test_placement_plan_cpu_only_and_cpus_per_actor() -> None:
    plan = na.placement_plan(nodes=3, gpus_per_node=2, cpus_per_actor=4, use_gpus=False)
    assert plan.bundles == [{"CPU": 8}] * 3
    assert [(a.bundle_index, a.local_rank, a.global_rank) for a in plan.actors] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 3),
        (2, 0, 4),
        (2, 1, 5),
    ]
    with pytest.raises(ValueError):
        na.placement_plan(nodes=0, gpus_per_node=8)


def test_cluster_shape_counts_alive_gpu_nodes() -> None:
    nodes = [
        {"Alive": True, "Resources": {"CPU": 32.0}},  # head, no GPUs
        {"Alive": True, "Resources": {"CPU": 200.0, "GPU": 8.0}},
        {"Alive": True, "Resources": {"CPU": 200.0, "GPU": 8.0}},
        {"Alive": False, "Resources": {"CPU": 200.0, "GPU": 8.0}},
    ]
    assert na.cluster_shape(nodes, None, None) == (2, 8)
    assert na.cluster_shape(nodes, 1, None) == (1, 8)
    assert na.cluster_shape(nodes, None, 4) == (2, 4)
    with pytest.raises(na.PreflightError, match="no alive Ray node has GPUs"):
        na.cluster_shape(nodes[:1], None, None)


# ------------------------------------------------------------------------------------------------- verdict


def test_verdict_passes_at_and_above_the_threshold() -> None:
    at = na.busbw_verdict(100.0, 100.0, 8 * GIB, nodes=2, world_size=16)
    assert at.ok and at.message.startswith("PASS") and "8 GiB" in at.message
    assert na.busbw_verdict(350.0, 100.0, 8 * GIB, nodes=2, world_size=16).ok


def test_multi_node_failure_says_what_to_check() -> None:
    verdict = na.busbw_verdict(12.5, 100.0, 8 * GIB, nodes=2, world_size=16, transports=("NET/Socket/0",))
    assert not verdict.ok
    msg = verdict.message
    assert msg.startswith("FAIL") and "12.5 GB/s" in msg and "100 GB/s" in msg and "--min-busbw-gbps" in msg
    assert "networking.gke.io/interfaces" in msg and "eth2..eth9" in msg
    assert "/usr/local/gib/lib64" in msg and "NCCL WARN network gIB not found" in msg
    assert "reservation" in msg and "compact placement" in msg
    assert "TCP sockets" in msg


def test_single_node_failure_points_at_nvlink_not_rdma() -> None:
    verdict = na.busbw_verdict(20.0, 100.0, 8 * GIB, nodes=1, world_size=8, transports=("SHM/direct/direct",))
    assert not verdict.ok
    assert "NVLink" in verdict.message and "host memory" in verdict.message
    assert "networking.gke.io/interfaces" not in verdict.message


def test_network_other_than_gib_is_named_between_nodes() -> None:
    msg = na.busbw_verdict(5.0, 100.0, 8 * GIB, nodes=4, world_size=32, networks=("Socket",)).message
    assert "network was Socket, not gIB" in msg


def _fake_results(times: list[float], errors: list[str] | None = None) -> list[dict]:
    base = {
        "hostname": "node-a",
        "device": "cpu",
        "times_s": times,
        "nccl_version": None,
        "nccl_log": None,
        "nccl_env": {},
        "net": {"interfaces": ["eth0"], "rdma_devices": [], "gib_on_ld_library_path": False},
    }
    return [{**base, "rank": 0, "errors": errors or []}, {**base, "rank": 1, "errors": []}]


def test_evaluate_fails_on_wrong_values_even_when_fast() -> None:
    cfg = {"sizes": [MIB], "dtype": "float32", "backend": "gloo"}
    status, text, _ = na.evaluate(_fake_results([1e-9]), 1, cfg, 100.0)
    assert status == 0 and "PASS" in text
    status, text, _ = na.evaluate(_fake_results([1e-9], ["1 MiB: 3 of 262144 elements differ"]), 1, cfg, 100.0)
    assert status == 1 and "wrong values" in text and "rank 0: 1 MiB" in text


# ------------------------------------------------------------------------------------------------- NCCL log

# Lines in the shape NCCL 2.2x prints with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET (written for this test).
NCCL_LOG_GIB = """\
host-a:101:101 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
host-a:101:101 [0] NCCL INFO NET/Plugin: Loaded net plugin gIB (v8)
host-a:101:101 [0] NCCL INFO Bootstrap : Using eth0:10.128.0.5<0>
host-a:101:101 [0] NCCL INFO NET/gIB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.128.0.5<0>
host-a:101:101 [0] NCCL INFO Using network gIB
host-a:101:101 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
host-a:101:101 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/gIB/0/GDRDMA
host-a:101:101 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
"""

NCCL_LOG_FALLBACK = """\
host-b:7:7 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so
host-b:7:7 [0] NCCL INFO Failed to initialize NET plugin IB
host-b:7:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.128.0.6<0> [1]eth1:10.0.1.6<0>
host-b:7:7 [0] NCCL INFO Initialized NET plugin Socket
host-b:7:7 [0] NCCL INFO Using network Socket
host-b:7:7 [0] NCCL WARN Error: network gIB not found.
host-b:7:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0
"""


def test_parse_nccl_log_names_plugin_network_devices_and_transports() -> None:
    found = na.parse_nccl_log(NCCL_LOG_GIB)
    assert found["version"] == ["2.21.5+cuda12.4"]
    assert found["plugin"] == ["Loaded net plugin gIB (v8)"]
    assert found["network"] == ["gIB"]
    assert found["devices"] == ["mlx5_0:1/RoCE", "mlx5_1:1/RoCE"]
    assert found["bootstrap"] == ["eth0:10.128.0.5"]
    assert found["transports"] == ["P2P/CUMEM/read", "NET/gIB/0/GDRDMA"]
    assert found["warnings"] == []


def test_parse_nccl_log_sees_the_socket_fallback_and_the_warning() -> None:
    found = na.parse_nccl_log(NCCL_LOG_FALLBACK)
    assert found["network"] == ["Socket"]
    assert "IB failed" in found["plugin"] and "Socket initialized" in found["plugin"]
    assert found["devices"] == ["eth0:10.128.0.6", "eth1:10.0.1.6"]
    assert found["transports"] == ["NET/Socket/0"]
    assert len(found["warnings"]) == 1 and "network gIB not found" in found["warnings"][0]


def test_node_report_lists_network_and_interfaces() -> None:
    results = _fake_results([1e-3])
    for r in results:
        r["nccl_log"] = na.parse_nccl_log(NCCL_LOG_FALLBACK)
        r["nccl_env"] = {"NCCL_NET": "gIB", "NCCL_DEBUG": "INFO"}
    text = "\n".join(na.node_reports(results))
    assert "network: Socket" in text and "eth0" in text and "network gIB not found" in text
    assert "NCCL_NET=gIB" in text and "NCCL_DEBUG=INFO" not in text  # what the run itself set is left out
    assert "/usr/local/gib/lib64 on LD_LIBRARY_PATH: no" in text


def test_local_net_info_reads_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lo", "eth0", "eth2"):
        (tmp_path / "class" / "net" / name).mkdir(parents=True)
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64:/usr/local/gib/lib64")
    info = na.local_net_info(str(tmp_path))
    assert info == {"interfaces": ["eth0", "eth2"], "rdma_devices": ["mlx5_0"], "gib_on_ld_library_path": True}


# ------------------------------------------------------------------------------------------------- collective path

WORLD = 2
SMALL = ["--min-size-mib", "1", "--max-size-gib", str(4 / 1024), "--warmup", "1", "--iters", "2"]


def _run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=240, cwd=ROOT, check=False
    )


def _expected_sum(index: int, world: int) -> float:
    """What rank r holds at element i is r + 1 + (i % 128) % 7; the sum over every rank, computed here."""
    return float(sum(r + 1 + (index % na.PATTERN_ROW) % na.PATTERN_MOD for r in range(world)))


def _table_sizes(stdout: str) -> list[int]:
    """Sizes of the table's rows: the lines whose first field is a whole number."""
    return [int(line.split()[0]) for line in stdout.splitlines() if line.split() and line.split()[0].isdigit()]


@pytest.mark.timeout(300)
def test_local_gloo_run_prints_the_table_and_reduces_correctly(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = _run_script(
        "--local",
        "--backend",
        "gloo",
        "--world-size",
        str(WORLD),
        *SMALL,
        "--min-busbw-gbps",
        "0",
        "--json-out",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw (GB/s)" in proc.stdout and "PASS" in proc.stdout
    assert _table_sizes(proc.stdout) == [MIB, 2 * MIB, 4 * MIB]
    result = json.loads(out.read_text())
    assert result["status"] == 0 and result["world_size"] == WORLD
    assert [row["size_bytes"] for row in result["rows"]] == [MIB, 2 * MIB, 4 * MIB]
    for row in result["rows"]:
        assert row["time_us"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # n=2: factor 1
    want = [_expected_sum(i, WORLD) for i in range(na.SAMPLE_ELEMS)]
    assert want == [3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0, 3.0]
    assert sorted(r["rank"] for r in result["ranks"]) == [0, 1]
    for rank in result["ranks"]:
        assert rank["errors"] == []
        assert set(rank["samples"]) == {str(MIB), str(2 * MIB), str(4 * MIB)}
        for values in rank["samples"].values():
            assert values == want


@pytest.mark.timeout(300)
def test_local_gloo_run_fails_an_impossible_threshold() -> None:
    proc = _run_script("--local", "--backend", "gloo", "--world-size", str(WORLD), *SMALL, "--min-busbw-gbps", "1e9")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "busbw (GB/s)" in proc.stdout
    assert "FAIL: all_reduce bus bandwidth at 4 MiB" in proc.stdout and "1e+09 GB/s" in proc.stdout


def test_one_rank_is_refused_before_starting() -> None:
    assert na.main(["--local", "--backend", "gloo", "--world-size", "1", *SMALL]) == 2


# ------------------------------------------------------------------------------------------------- Ray path


# 9 s alone; 98 s in a full `make unit` and over 180 s in a CI run on two busy cores (two actors start and import
# torch). The script's own placement (200 s) and collective (120 s, results 240 s) timeouts say what they waited on
# before this one ends it.
@pytest.mark.timeout(600)
def test_ray_placement_group_and_actors_over_gloo(ray_gcs_address: str, capsys: pytest.CaptureFixture[str]) -> None:
    """On the session head (2 logical GPUs, 2 CPUs): its whole capacity in one bundle, for a few seconds."""
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(na)  # the workers cannot import the module by name
    ray.init(address=ray_gcs_address, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        # The head is shared: other tests' placement groups (a worker wait's, say) may be there at the same time.
        before = set(ray.util.placement_group_table())
        status = na.main(
            ["--backend", "gloo", "--nodes", "1", "--gpus-per-node", "2", *SMALL, "--min-busbw-gbps", "0",
             "--placement-timeout-s", "200", "--timeout-s", "120"]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert status == 0, out
        assert "STRICT_SPREAD" in out and "rendezvous on rank 0 at" in out
        assert _table_sizes(out) == [MIB, 2 * MIB, 4 * MIB]
        assert "ranks [0, 1]" in out and "PASS" in out
        ours = [pg for pid, pg in ray.util.placement_group_table().items() if pid not in before]
        placing = re.search(r"placing 1 bundle\(s\) of (\{.*?\}) with", out)
        assert placing, out
        placed = ast.literal_eval(placing.group(1))
        ours = [pg for pg in ours if list(pg["bundles"].values()) == [placed]]
        assert ours and all(pg["state"] == "REMOVED" for pg in ours), ours
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(na)
