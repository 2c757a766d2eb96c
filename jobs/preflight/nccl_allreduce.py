#!/usr/bin/env python3
"""Pre-flight check: NCCL all-reduce bandwidth over every GPU of the Ray cluster.

The pipeline submits it as a Ray job (step preflight-nccl): the submitter pod first copies the job scripts onto
Lustre, to /data/<run>/scripts/, and the job's entrypoint, run on the Ray head pod in NeMo RL's environment (torch,
ray), is

    cd /opt/nemo-rl && uv run python /data/<run>/scripts/nccl_allreduce.py --nodes=N --gpus-per-node=8 \
        --min-busbw-gbps=100

(<run> is the job's run name).

It places one bundle {"GPU": gpus_per_node, "CPU": ...} per node (STRICT_SPREAD, so every bundle is a different
node), starts one actor per GPU in each bundle, joins them into one torch.distributed NCCL group (rendezvous on the
rank-0 actor's IP and a free port), and times all_reduce(sum) from --min-size-mib up to --max-size-gib, doubling.
The NCCL_* variables of the worker pods are used as they are; only when NCCL_DEBUG is unset does the run turn on
NCCL_DEBUG=INFO (subsystems INIT,NET) into a temporary file, to report which network and transports NCCL chose.

`--local` runs the same measurement on the GPUs of this host, one process per GPU (torch.multiprocessing, spawn),
without Ray. `--backend gloo` uses CPU tensors and a host clock; the tests use it.

Exit status: 0 pass; 1 the bus bandwidth at the largest size is under --min-busbw-gbps, or all_reduce returned
wrong values; 2 the check could not run (placement, rendezvous, a worker died, bad arguments).

The pure helpers (sizes, bandwidth arithmetic, placement plan, verdict, NCCL log parsing) import neither torch
nor Ray, so they can be tested anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1 << 20
GIB = 1 << 30

# Default pass mark for the bus bandwidth at the largest message size, in GB/s (10^9 bytes/s, as nccl-tests).
# Cluster Toolkit's daily A3 Ultra health check asserts an nccl-tests average bus bandwidth >= 100 GB/s across
# nodes; we keep the same number so the two checks can be compared, and apply it to the largest size, where the
# bandwidth is at its steady state. It is deliberately a floor, not a target: each A3 Ultra / A4 node has eight
# 400 Gb/s RDMA NICs (400 GB/s per node each way), so a healthy set of nodes sits well above it, while the faults
# this pre-flight exists to catch - gIB not loaded and NCCL falling back to TCP sockets over the gVNIC, RDMA NICs
# missing from the pods, intra-node traffic through host memory - land far below it. A run that only just passes
# still deserves a look at the per-node report.
DEFAULT_MIN_BUSBW_GBPS = 100.0
DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}

# Input on rank r, element i: r + 1 + PATTERN[i % len(PATTERN)], so a correct sum over W ranks is
# W * (W + 1) / 2 + W * PATTERN[i % len(PATTERN)]. Position-dependent, so misplaced chunks show up too.
PATTERN_ROW = 128
PATTERN_MOD = 7
SAMPLE_ELEMS = 8

GIB_PLUGIN_DIR = "/usr/local/gib/lib64"
NODE_NAME_ENV = "NODE_NAME"
NCCL_VARS_WE_SET = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


class PreflightError(RuntimeError):
    """The check could not run (exit status 2)."""


# ----------------------------------------------------------------------------------------------- pure helpers


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, 2*min_bytes, ... up to and including max_bytes when it lies on the doubling sequence."""
    if min_bytes <= 0:
        raise ValueError(f"minimum size must be positive, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValueError(f"maximum size {max_bytes} is below the minimum {min_bytes}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth: bytes of the buffer over the time of one all_reduce, in GB/s (10^9)."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return size_bytes / seconds / 1e9


def busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce correction 2(n-1)/n: what each rank's links carry relative to the buffer size."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return 2.0 * (world_size - 1) / world_size


def busbw_gbps(algbw: float, world_size: int) -> float:
    return algbw * busbw_factor(world_size)


@dataclass(frozen=True)
class BandwidthRow:
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def bandwidth_rows(sizes: list[int], seconds: list[float], world_size: int) -> list[BandwidthRow]:
    if len(sizes) != len(seconds):
        raise ValueError("one time per size is needed")
    rows = []
    for size, sec in zip(sizes, seconds, strict=True):
        alg = algbw_gbps(size, sec)
        rows.append(BandwidthRow(size, sec * 1e6, alg, busbw_gbps(alg, world_size)))
    return rows


def human_size(size_bytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if size_bytes >= scale:
            value = size_bytes / scale
            return f"{value:g} {unit}"
    return f"{size_bytes} B"


def format_table(rows: list[BandwidthRow], world_size: int, dtype: str, backend: str) -> str:
    lines = [
        f"# all_reduce(sum) {dtype}, {backend}, {world_size} ranks; time = slowest rank's mean per iteration",
        f"# busbw = algbw x 2(n-1)/n = algbw x {busbw_factor(world_size):.4f}; GB/s = 10^9 bytes/s",
        f"#{'size (B)':>13} {'size':>9} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}",
    ]
    for row in rows:
        lines.append(
            f"{row.size_bytes:>14} {human_size(row.size_bytes):>9} {row.time_us:>12.1f} "
            f"{row.algbw_gbps:>13.2f} {row.busbw_gbps:>13.2f}"
        )
    if rows:
        avg = sum(r.busbw_gbps for r in rows) / len(rows)
        lines.append(f"# Avg bus bandwidth over {len(rows)} sizes: {avg:.2f} GB/s")
    return "\n".join(lines)


@dataclass(frozen=True)
class ActorSlot:
    bundle_index: int  # which node (bundle) the actor lives on
    local_rank: int  # its GPU within that node
    global_rank: int


@dataclass(frozen=True)
class PlacementPlan:
    bundles: list[dict[str, float]]
    actors: list[ActorSlot]
    strategy: str = "STRICT_SPREAD"

    @property
    def world_size(self) -> int:
        return len(self.actors)


def placement_plan(nodes: int, gpus_per_node: int, cpus_per_actor: float = 1.0, use_gpus: bool = True) -> PlacementPlan:
    """One bundle per node holding all its GPUs; one actor per GPU, ranks numbered node-major."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"need at least one node and one GPU per node, got {nodes} x {gpus_per_node}")
    bundle: dict[str, float] = {"CPU": cpus_per_actor * gpus_per_node}
    if use_gpus:
        bundle = {"GPU": float(gpus_per_node), **bundle}
    actors = [
        ActorSlot(bundle_index=node, local_rank=local, global_rank=node * gpus_per_node + local)
        for node in range(nodes)
        for local in range(gpus_per_node)
    ]
    return PlacementPlan(bundles=[dict(bundle) for _ in range(nodes)], actors=actors)


def cluster_shape(ray_nodes: list[dict[str, Any]], nodes: int | None, gpus_per_node: int | None) -> tuple[int, int]:
    """(nodes, gpus per node) for the run: the flags where given, else every alive Ray node that has GPUs."""
    gpu_counts = [
        int(node.get("Resources", {}).get("GPU", 0)) for node in ray_nodes if node.get("Alive", node.get("alive"))
    ]
    gpu_counts = [count for count in gpu_counts if count > 0]
    if gpus_per_node is None:
        if not gpu_counts:
            raise PreflightError("no alive Ray node has GPUs; pass --nodes and --gpus-per-node or check the workers")
        gpus_per_node = min(gpu_counts)
    if nodes is None:
        nodes = sum(1 for count in gpu_counts if count >= gpus_per_node)
        if nodes == 0:
            raise PreflightError(f"no alive Ray node has {gpus_per_node} GPUs")
    return nodes, gpus_per_node


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


def busbw_verdict(
    busbw: float,
    min_busbw: float,
    size_bytes: int,
    nodes: int,
    world_size: int,
    transports: tuple[str, ...] = (),
    networks: tuple[str, ...] = (),
) -> Verdict:
    where = f"{world_size} ranks on {nodes} node{'s' if nodes != 1 else ''}"
    if busbw >= min_busbw:
        return Verdict(
            True,
            f"PASS: all_reduce bus bandwidth at {human_size(size_bytes)} is {busbw:.1f} GB/s "
            f">= {min_busbw:g} GB/s ({where}).",
        )
    lines = [
        f"FAIL: all_reduce bus bandwidth at {human_size(size_bytes)} is {busbw:.1f} GB/s, under the "
        f"--min-busbw-gbps threshold of {min_busbw:g} GB/s ({where}).",
    ]
    if any(t.startswith("SHM") for t in transports):
        lines.append("NCCL moved data between GPUs of one node through host memory (transport SHM), not NVLink.")
    if any("Socket" in t for t in transports):
        lines.append("NCCL used TCP sockets between nodes (NET/Socket), not RDMA.")
    if nodes > 1 and networks and "gIB" not in networks:
        lines.append(f"NCCL's network was {', '.join(networks)}, not gIB.")
    lines.append("Check:")
    if nodes > 1:
        lines += [
            "  - RDMA interfaces in the worker pods: the pod annotation networking.gke.io/interfaces must name "
            "eth2..eth9 on the RDMA networks, and each pod must show eth2..eth9 in /sys/class/net (the per-node "
            "report above lists the interfaces each node saw).",
            f"  - the gIB NCCL plugin: LD_LIBRARY_PATH in the worker container must contain {GIB_PLUGIN_DIR} (put "
            "there by the nccl-rdma-installer DaemonSet); 'NCCL WARN network gIB not found' in the report, or a "
            "network of Socket, means NCCL fell back to TCP.",
            "  - reservation topology: the nodes should come from one block of the reservation (compact placement); "
            "nodes in different blocks have less bandwidth between them.",
        ]
    lines.append(
        "  - inside each node: NVLink peer-to-peer between the GPUs (`nvidia-smi topo -m` shows NV# links between "
        "them; NCCL_P2P_DISABLE or NCCL_P2P_LEVEL in the environment can turn it off)."
    )
    return Verdict(False, "\n".join(lines))


def _unique(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


_NCCL_VERSION = re.compile(r"NCCL version (\S+)")
_NET_PLUGIN = re.compile(r"NET/Plugin\s*:?\s*(.+?)\s*$")
_NET_PLUGIN_STATE = re.compile(r"(Initialized|Failed to initialize|Assigned) NET plugin (\S+)")
_PLUGIN_STATE_WORDS = {"Initialized": "initialized", "Failed to initialize": "failed", "Assigned": "assigned"}
_USING_NETWORK = re.compile(r"Using network (\S+)")
_NET_DEVICES = re.compile(r"NET/(\S+?)\s*:\s*Using\s+(.+?)\s*$")
_DEVICE = re.compile(r"\[\d+\](\S+)")
_BOOTSTRAP = re.compile(r"Bootstrap\s*:\s*Using\s+(\S+)")
_VIA = re.compile(r"\bvia\s+(\S+)")


def parse_nccl_log(text: str) -> dict[str, list[str]]:
    """What NCCL_DEBUG=INFO (INIT,NET) says about the network it picked: plugin, network, devices, transports."""
    found: dict[str, list[str]] = {
        key: [] for key in ("version", "plugin", "network", "devices", "bootstrap", "transports", "warnings")
    }
    for line in text.splitlines():
        if m := _NCCL_VERSION.search(line):
            found["version"].append(m.group(1))
        if m := _NET_PLUGIN.search(line):
            found["plugin"].append(m.group(1))
        if m := _NET_PLUGIN_STATE.search(line):
            found["plugin"].append(f"{m.group(2)} {_PLUGIN_STATE_WORDS[m.group(1)]}")
        if m := _USING_NETWORK.search(line):
            found["network"].append(m.group(1))
        m = _NET_DEVICES.search(line)
        if m and m.group(1) != "Plugin":
            found["devices"] += [re.sub(r"<\d+>$", "", d) for d in _DEVICE.findall(m.group(2))]
        if m := _BOOTSTRAP.search(line):
            found["bootstrap"].append(re.sub(r"<\d+>$", "", m.group(1)))
        if m := _VIA.search(line):
            found["transports"].append(m.group(1).rstrip(",;"))
        if " WARN " in line or line.startswith("WARN"):
            found["warnings"].append(line.strip())
    return {key: _unique(values) for key, values in found.items()}


def local_net_info(sys_root: str = "/sys") -> dict[str, Any]:
    """Interfaces and RDMA devices this process can see, and the NCCL settings it inherited."""

    def listing(sub: str) -> list[str]:
        try:
            return sorted(os.listdir(os.path.join(sys_root, sub)))
        except OSError:
            return []

    return {
        "interfaces": [name for name in listing("class/net") if name != "lo"],
        "rdma_devices": listing("class/infiniband"),
        "gib_on_ld_library_path": GIB_PLUGIN_DIR in os.environ.get("LD_LIBRARY_PATH", "").split(":"),
    }


def rendezvous_store(world_size: int, timeout_s: float) -> Any:
    """The rendezvous's key-value server (torch's TCPStore), on a port the kernel picks as it binds, held until the
    group has formed: a port chosen free and bound later can be taken by any other bind or connection meanwhile."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(
        "0.0.0.0", 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


# ----------------------------------------------------------------------------------------- the measurement


def run_collective(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device_index: int | None,
    cfg: dict[str, Any],
    store: Any = None,
) -> dict[str, Any]:
    """One rank of the measurement: check all_reduce's result, then time it at every size. Same code for every
    launcher (Ray actor, local process) and backend (nccl on GPUs, gloo on CPU). The rank that holds the rendezvous
    store's server passes it as `store`; the others connect to it at master_addr:master_port."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    backend = cfg["backend"]
    inherited_nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    debug_file = None
    if backend == "nccl" and "NCCL_DEBUG" not in os.environ and "NCCL_DEBUG_FILE" not in os.environ:
        log_dir = cfg.get("nccl_log_dir") or tempfile.gettempdir()
        os.makedirs(log_dir, exist_ok=True)
        debug_file = os.path.join(log_dir, f"nccl-preflight-rank{rank}-{socket.gethostname()}-{os.getpid()}.log")
        os.environ["NCCL_DEBUG"] = "INFO"
        os.environ["NCCL_DEBUG_SUBSYS"] = os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,NET")
        os.environ["NCCL_DEBUG_FILE"] = debug_file

    use_cuda = backend == "nccl"
    if use_cuda:
        assert device_index is not None
        torch.cuda.set_device(device_index)
        device = torch.device("cuda", device_index)
        device_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        device_name = "cpu"

    if store is None:
        store = dist.TCPStore(
            master_addr, master_port, world_size, is_master=False, timeout=timedelta(seconds=cfg["timeout_s"])
        )
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=cfg["timeout_s"]),
    )
    try:
        dtype = getattr(torch, cfg["dtype"])
        esize = DTYPE_BYTES[cfg["dtype"]]
        sizes: list[int] = cfg["sizes"]
        buf = torch.empty(sizes[-1] // esize, dtype=dtype, device=device)
        row = (torch.arange(PATTERN_ROW, device=device) % PATTERN_MOD).to(dtype)
        w = world_size
        exact = cfg["dtype"] == "float32"
        times: list[float] = []
        errors: list[str] = []
        samples: dict[str, list[float]] = {}
        for size in sizes:
            count = size // esize
            view = buf[:count]
            width = PATTERN_ROW if count % PATTERN_ROW == 0 else 1
            grid = view.view(-1, width)
            grid.copy_(row[:width] + (rank + 1))
            dist.all_reduce(view)
            expected = row[:width] * w + w * (w + 1) / 2
            # float32 sums of these small integers are exact; bf16 rounds partial sums once W(W+1)/2 passes 256.
            good = bool((grid == expected).all() if exact else ((grid - expected).abs() <= 0.02 * expected).all())
            if not good:
                bad = int((grid != expected).sum())
                errors.append(f"{human_size(size)}: {bad} of {count} elements differ from the expected sum")
            samples[str(size)] = [float(x) for x in view[:SAMPLE_ELEMS].tolist()]
            # The buffer keeps being summed in place from here on; its values grow (possibly to inf), which does
            # not change how fast NCCL or gloo move it.
            for _ in range(cfg["warmup"]):
                dist.all_reduce(view)
            if use_cuda:
                torch.cuda.synchronize(device)
                dist.barrier(device_ids=[device_index])
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(cfg["iters"]):
                    dist.all_reduce(view)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / cfg["iters"])
            else:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(cfg["iters"]):
                    dist.all_reduce(view)
                times.append((time.perf_counter() - t0) / cfg["iters"])
        del buf
        slowest = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version()) if use_cuda else None
    finally:
        dist.destroy_process_group()

    nccl_log: dict[str, list[str]] | None = None
    if debug_file is not None:
        try:
            with open(debug_file, errors="replace") as fh:
                nccl_log = parse_nccl_log(fh.read())
            if not cfg.get("nccl_log_dir"):
                os.unlink(debug_file)
        except OSError:
            nccl_log = None
    return {
        "rank": rank,
        "hostname": socket.gethostname(),
        "device": device_name,
        "device_index": device_index,
        "times_s": [float(t) for t in slowest.tolist()],
        "errors": errors,
        "samples": samples,
        "nccl_version": nccl_version,
        "nccl_log": nccl_log,
        "nccl_env": inherited_nccl,
        "net": local_net_info(),
    }


def _local_entry(rank: int, world_size: int, port: int, cfg: dict[str, Any], out_dir: str) -> None:
    device_index: int | None = None
    if cfg["backend"] == "nccl":
        if cfg["isolate_gpus"]:
            # Like a Ray actor: the process sees only its own GPU.
            os.environ["CUDA_VISIBLE_DEVICES"] = cfg["visible_devices"][rank]
            device_index = 0
        else:
            device_index = rank
    result = run_collective(rank, world_size, "127.0.0.1", port, device_index, cfg)
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as fh:
        json.dump(result, fh)


def run_local(world_size: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    # This process holds the store's server; every rank connects to it.
    store = rendezvous_store(world_size, cfg["timeout_s"])
    port = int(store.port)
    with tempfile.TemporaryDirectory(prefix="nccl-preflight-") as out_dir:
        try:
            mp.start_processes(
                _local_entry,
                args=(world_size, port, cfg, out_dir),
                nprocs=world_size,
                join=True,
                start_method="spawn",
            )
        except Exception as exc:  # ProcessRaisedException / ProcessExitedException carry the child's traceback
            raise PreflightError(f"a local rank failed:\n{exc}") from exc
        results = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"rank-{rank}.json")) as fh:
                results.append(json.load(fh))
    return results


class NcclActor:
    """One per GPU; wrapped with ray.remote when the job runs."""

    def __init__(self, slot: dict[str, int]) -> None:
        self.slot = slot
        self.store: Any = None

    def rendezvous(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        """On rank 0: start the rendezvous store's server here, and say where the other ranks find it."""
        import ray

        self.store = rendezvous_store(world_size, timeout_s)
        return ray.util.get_node_ip_address(), int(self.store.port)

    def run(self, world_size: int, master_addr: str, master_port: int, cfg: dict[str, Any]) -> dict[str, Any]:
        device_index: int | None = None
        if cfg["backend"] == "nccl":
            import ray
            import torch

            # Ray narrows CUDA_VISIBLE_DEVICES to the actor's GPU unless the cluster turned that off.
            device_index = 0 if torch.cuda.device_count() == 1 else int(ray.get_gpu_ids()[0])
        result = run_collective(
            self.slot["global_rank"], world_size, master_addr, master_port, device_index, cfg, self.store
        )
        self.store = None
        result.update(self.slot)
        # The Kubernetes node (the workers get it through the downward API): scripts/topology_report.py looks up its
        # reservation block and sub-block.
        result["node_name"] = os.environ.get(NODE_NAME_ENV, "")
        return result


def run_ray(nodes: int | None, gpus_per_node: int | None, cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    use_gpus = cfg["backend"] == "nccl"
    if use_gpus:
        nodes, gpus_per_node = cluster_shape(ray.nodes(), nodes, gpus_per_node)
    elif nodes is None or gpus_per_node is None:
        raise PreflightError("--backend gloo under Ray needs --nodes and --gpus-per-node (actors per node)")
    plan = placement_plan(nodes, gpus_per_node, cfg["cpus_per_actor"], use_gpus=use_gpus)
    print(f"placing {nodes} bundle(s) of {plan.bundles[0]} with {plan.strategy}", flush=True)
    pg = placement_group(plan.bundles, strategy=plan.strategy)
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([pg.ready()], timeout=cfg["placement_timeout_s"])
        if not ready:
            raise PreflightError(
                f"could not place {nodes} bundle(s) of {plan.bundles[0]} on {nodes} distinct node(s) within "
                f"{cfg['placement_timeout_s']} s; the cluster has: "
                + ", ".join(
                    f"{n.get('NodeManagerAddress')}={n.get('Resources', {}).get('GPU', 0):g} GPU"
                    for n in ray.nodes()
                    if n.get("Alive")
                )
            )
        actor_cls = ray.remote(NcclActor)
        for slot in plan.actors:
            actors.append(
                actor_cls.options(
                    num_gpus=1 if use_gpus else 0,
                    num_cpus=cfg["cpus_per_actor"],
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=slot.bundle_index
                    ),
                ).remote(asdict(slot))
            )
        addr, port = ray.get(actors[0].rendezvous.remote(plan.world_size, cfg["timeout_s"]), timeout=cfg["timeout_s"])
        print(f"rendezvous on rank 0 at {addr}:{port}, world size {plan.world_size}", flush=True)
        refs = [actor.run.remote(plan.world_size, addr, port, cfg) for actor in actors]
        try:
            results = ray.get(refs, timeout=cfg["timeout_s"] * 2)
        except ray.exceptions.GetTimeoutError as exc:
            raise PreflightError(f"the measurement did not finish within {cfg['timeout_s'] * 2} s") from exc
        except ray.exceptions.RayError as exc:
            raise PreflightError(f"an actor failed:\n{exc}") from exc
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(pg)
    return sorted(results, key=lambda r: r["rank"]), nodes


# ---------------------------------------------------------------------------------------------------- report


def node_reports(results: list[dict[str, Any]]) -> list[str]:
    """Per node: where ranks ran, which network NCCL picked, what the pod's network looks like."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for res in results:
        by_host.setdefault(res["hostname"], []).append(res)
    lines = []
    for host, ranks in by_host.items():
        first = ranks[0]
        devices = _unique([r["device"] for r in ranks])
        on = f" on Kubernetes node {first['node_name']}" if first.get("node_name") else ""
        lines.append(f"# node {host}{on}: ranks {[r['rank'] for r in ranks]}, {len(ranks)} x {', '.join(devices)}")
        logs = [r["nccl_log"] for r in ranks if r.get("nccl_log")]
        if logs:
            merged = {key: _unique([v for log in logs for v in log[key]]) for key in logs[0]}
            lines.append(f"#   NCCL {', '.join(merged['version']) or first.get('nccl_version') or '?'}")
            lines.append(f"#   NET plugin: {'; '.join(merged['plugin']) or '(none reported: internal)'}")
            lines.append(f"#   network: {', '.join(merged['network']) or '(not reported)'}")
            if merged["devices"]:
                lines.append(f"#   NET devices: {', '.join(merged['devices'])}")
            if merged["bootstrap"]:
                lines.append(f"#   bootstrap interface: {', '.join(merged['bootstrap'])}")
            lines.append(f"#   transports: {', '.join(merged['transports']) or '(not reported)'}")
            for warn in merged["warnings"][:10]:
                lines.append(f"#   {warn}")
        elif first.get("nccl_version"):
            lines.append(
                f"#   NCCL {first['nccl_version']}; NCCL_DEBUG was already set by the environment, so NCCL's own "
                "report is in the worker logs"
            )
        net = first["net"]
        lines.append(f"#   interfaces (/sys/class/net): {', '.join(net['interfaces']) or '(none)'}")
        lines.append(f"#   RDMA devices (/sys/class/infiniband): {', '.join(net['rdma_devices']) or '(none)'}")
        lines.append(f"#   {GIB_PLUGIN_DIR} on LD_LIBRARY_PATH: {'yes' if net['gib_on_ld_library_path'] else 'no'}")
        env = {k: v for k, v in first.get("nccl_env", {}).items() if k not in NCCL_VARS_WE_SET}
        if env:
            lines.append("#   NCCL env: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return lines


def evaluate(
    results: list[dict[str, Any]], nodes: int, cfg: dict[str, Any], min_busbw: float
) -> tuple[int, str, list[BandwidthRow]]:
    world_size = len(results)
    rows = bandwidth_rows(cfg["sizes"], results[0]["times_s"], world_size)
    out = [format_table(rows, world_size, cfg["dtype"], cfg["backend"]), *node_reports(results)]
    wrong = [f"rank {r['rank']}: {e}" for r in results for e in r["errors"]]
    if wrong:
        out.append("FAIL: all_reduce returned wrong values:\n  " + "\n  ".join(wrong[:20]))
        return 1, "\n".join(out), rows
    logs = [r["nccl_log"] for r in results if r.get("nccl_log")]
    transports = tuple(_unique([t for log in logs for t in log["transports"]]))
    networks = tuple(_unique([n for log in logs for n in log["network"]]))
    if nodes > 1 and networks and "gIB" not in networks:
        out.append(f"WARNING: NCCL chose network {', '.join(networks)} between nodes, not gIB (RDMA).")
    verdict = busbw_verdict(
        rows[-1].busbw_gbps, min_busbw, rows[-1].size_bytes, nodes, world_size, transports, networks
    )
    out.append(verdict.message)
    return (0 if verdict.ok else 1), "\n".join(out), rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="NCCL all-reduce bus bandwidth pre-flight (Ray job or --local).")
    p.add_argument("--nodes", type=int, default=None, help="GPU nodes to use (default: every alive GPU node)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs (actors) per node (default: detected)")
    p.add_argument("--min-size-mib", type=float, default=1.0, help="smallest message, MiB (default 1)")
    p.add_argument("--max-size-gib", type=float, default=8.0, help="largest message, GiB (default 8)")
    p.add_argument(
        "--warmup", type=int, default=DEFAULT_WARMUP, help=f"untimed all_reduces per size ({DEFAULT_WARMUP})"
    )
    p.add_argument("--iters", type=int, default=DEFAULT_ITERS, help=f"timed all_reduces per size ({DEFAULT_ITERS})")
    p.add_argument(
        "--min-busbw-gbps",
        type=float,
        default=DEFAULT_MIN_BUSBW_GBPS,
        help=f"fail when busbw at the largest size is below this, GB/s ({DEFAULT_MIN_BUSBW_GBPS:g})",
    )
    p.add_argument("--local", action="store_true", help="all GPUs of this host, one process each, no Ray")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--world-size", type=int, default=None, help="--local: ranks (default: all visible GPUs; gloo 2)")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="float32")
    p.add_argument(
        "--isolate-gpus",
        action="store_true",
        help="--local: give each process only its own GPU in CUDA_VISIBLE_DEVICES, as Ray does for its actors",
    )
    p.add_argument("--cpus-per-actor", type=float, default=1.0, help="Ray CPUs reserved per actor (default 1)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="collective/rendezvous timeout, s (default 600)")
    p.add_argument(
        "--placement-timeout-s", type=float, default=300.0, help="wait for the placement group, s (default 300)"
    )
    p.add_argument(
        "--nccl-log-dir",
        default=None,
        help="keep NCCL's INFO log of each rank in this directory (on each node) instead of deleting it",
    )
    p.add_argument("--json-out", default=None, help="also write table, per-rank results and verdict as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    esize = DTYPE_BYTES[args.dtype]
    min_bytes = round(args.min_size_mib * MIB)
    max_bytes = round(args.max_size_gib * GIB)
    try:
        if min_bytes % esize:
            raise PreflightError(f"--min-size-mib must be a whole number of {args.dtype} elements")
        if args.warmup < 0 or args.iters < 1:
            raise PreflightError("--warmup must be >= 0 and --iters >= 1")
        sizes = message_sizes(min_bytes, max_bytes)
    except (ValueError, PreflightError) as exc:
        print(f"PREFLIGHT ERROR: {exc}", file=sys.stderr)
        return 2
    cfg: dict[str, Any] = {
        "backend": args.backend,
        "dtype": args.dtype,
        "sizes": sizes,
        "warmup": args.warmup,
        "iters": args.iters,
        "timeout_s": args.timeout_s,
        "placement_timeout_s": args.placement_timeout_s,
        "cpus_per_actor": args.cpus_per_actor,
        "isolate_gpus": args.isolate_gpus,
        "nccl_log_dir": args.nccl_log_dir,
    }
    started = time.time()
    try:
        if args.local:
            world_size = args.world_size
            if args.backend == "nccl":
                import torch

                visible = torch.cuda.device_count()
                if world_size is None:
                    world_size = visible
                if world_size > visible:
                    raise PreflightError(f"--world-size {world_size} but only {visible} GPU(s) are visible")
                env_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                cfg["visible_devices"] = env_visible.split(",") if env_visible else [str(i) for i in range(visible)]
            elif world_size is None:
                world_size = 2
            if world_size < 2:
                raise PreflightError(f"need at least 2 ranks for a bus bandwidth, got {world_size}")
            print(f"local run: {world_size} ranks, backend {args.backend}, sizes {len(sizes)}", flush=True)
            results = run_local(world_size, cfg)
            nodes = 1
        else:
            results, nodes = run_ray(args.nodes, args.gpus_per_node, cfg)
            if len(results) < 2:
                raise PreflightError(f"need at least 2 ranks for a bus bandwidth, got {len(results)}")
    except PreflightError as exc:
        print(f"PREFLIGHT ERROR: {exc}", file=sys.stderr)
        return 2
    except Exception:
        print(f"PREFLIGHT ERROR: the check could not run:\n{traceback.format_exc()}", file=sys.stderr)
        return 2
    status, text, rows = evaluate(results, nodes, cfg, args.min_busbw_gbps)
    print(text, flush=True)
    print(f"# wall time {time.time() - started:.1f} s", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(
                {
                    "status": status,
                    "nodes": nodes,
                    "world_size": len(results),
                    "min_busbw_gbps": args.min_busbw_gbps,
                    "rows": [asdict(r) for r in rows],
                    "ranks": results,
                },
                fh,
                indent=1,
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
