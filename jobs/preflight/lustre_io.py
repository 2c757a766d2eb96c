#!/usr/bin/env python3
"""Pre-flight check: Managed Lustre write and read throughput from every GPU worker node.

The pipeline submits it as a Ray job (step preflight-lustre): the submitter pod first copies the job scripts onto
Lustre, to /data/<run>/scripts/, and the job's entrypoint, run on the Ray head pod in NeMo RL's environment, is

    cd /opt/nemo-rl && uv run python /data/<run>/scripts/lustre_io.py --path=/data/<run>/preflight-io \
        --nodes=N --capacity-gib=18000 --tier-mbps-per-tib=1000 [--gib-per-node=G --min-fraction=F]

(<run> is the job's run name; --path defaults to /data/preflight). With --local it checks only the host it runs on,
without Ray.

One actor per worker node (node-affinity scheduling onto every alive Ray node that has GPUs, or the first
--nodes of them) writes --gib-per-node GiB in --streams parallel files of large sequential writes, each ending
with fsync; once every node has written, every node reads. Then all files are removed, also when a phase fails:
the actors are killed first (a stuck write or read would hold them), and fresh tasks remove the files.

Reads and the page cache: a node's own page cache would serve reads of what it just wrote, at memory speed.
  - cross-node (default with 2+ nodes): node i reads the files node i+1 wrote, with buffered reads; the reader
    never had those pages, and the writer dropped its own after fsync (posix_fadvise DONTNEED).
  - direct (default with 1 node, and --local): O_DIRECT reads of the node's own files, bypassing the page cache;
    where the file system refuses O_DIRECT (tmpfs, some overlays) it falls back to buffered reads after
    POSIX_FADV_DONTNEED and says so: those numbers can be inflated by the cache.
  - buffered: the node's own files, buffered, after POSIX_FADV_DONTNEED (can be inflated).
Dropping /proc/sys/vm/drop_caches would need a privileged pod; this check does not ask for one.

Throughput per node is bytes over that node's time; the total is all bytes over the span from the first node's
start to the last node's end of the phase (wall clocks of GCE nodes are NTP-synchronised).

Threshold: the instance should deliver capacity_gib / 1024 x tier_mbps_per_tib / 1000 GB/s, but only to
enough clients - a few nodes cannot saturate a large instance. So the pass mark is
    min_fraction x min(instance GB/s, nodes x node_limit_gbps)
for both the write total and the read total (see DEFAULT_* below for the defaults and why).

Exit status: 0 pass; 1 a total under the threshold, the path not on the expected file system, or data read back
differing from what was written; 2 the check could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import random
import shutil
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1 << 20
GIB = 1 << 30

# Fraction of the achievable throughput a run must reach. Lustre throughput from a handful of clients swings
# with file striping, other jobs on the instance, and how the streams land on the storage servers, so a pass
# mark near the full figure would fail healthy systems. The faults worth stopping a training run for - /data not
# being the Lustre mount (container disk), an instance smaller or of a lower tier than configured, traffic on a
# slow path - cost a factor of several, so half the achievable figure separates the two.
DEFAULT_MIN_FRACTION = 0.5
# What one worker node is assumed to drive, GB/s. Lustre traffic leaves an A3 Ultra / A4 node over its primary
# gVNIC (not the RDMA NICs), and a single Lustre client with a few dozen streams reaches well under that NIC's
# line rate; 5 GB/s is a conservative per-client figure, so the threshold with few nodes stays within what those
# nodes can do. Raise it once a healthy run has shown what your nodes reach.
DEFAULT_NODE_LIMIT_GBPS = 5.0
DEFAULT_GIB_PER_NODE = 16.0
DEFAULT_STREAMS = 16
DEFAULT_BLOCK_MIB = 16
DEFAULT_PATH = "/data/preflight"
READ_MODES = ("auto", "cross-node", "direct", "buffered")
# How long the removal of a run's files may take under Ray, s. Removing a few dozen files is quick; a removal that
# takes longer is stuck on the same fault as the phase before it, and is reported as files left behind.
CLEANUP_TIMEOUT_S = 120.0
# How long the node actors may take to start and report their file system, s, at least: not an I/O phase, and a worker
# process on a busy node can take many seconds to start, which a short --timeout-s should not count against the writes.
ACTOR_START_TIMEOUT_S = 300.0


class PreflightError(RuntimeError):
    """The check could not run (exit status 2)."""


# ----------------------------------------------------------------------------------------------- pure helpers


def expected_instance_gbps(capacity_gib: float, tier_mbps_per_tib: float) -> float:
    """Aggregate throughput the instance is provisioned for: TiB x MB/s per TiB, in GB/s."""
    if capacity_gib <= 0 or tier_mbps_per_tib <= 0:
        raise ValueError("capacity and tier must be positive")
    return capacity_gib / 1024 * tier_mbps_per_tib / 1000


@dataclass(frozen=True)
class IoThreshold:
    instance_gbps: float  # what the instance is provisioned for
    nodes_gbps: float  # what the nodes in the run are assumed to drive
    min_fraction: float
    threshold_gbps: float

    @property
    def limited_by(self) -> str:
        return "instance" if self.instance_gbps <= self.nodes_gbps else "nodes"


def io_threshold(
    capacity_gib: float, tier_mbps_per_tib: float, nodes: int, node_limit_gbps: float, min_fraction: float
) -> IoThreshold:
    if nodes < 1 or node_limit_gbps <= 0 or not 0 < min_fraction <= 1:
        raise ValueError("need nodes >= 1, node limit > 0 and 0 < fraction <= 1")
    instance = expected_instance_gbps(capacity_gib, tier_mbps_per_tib)
    drivable = nodes * node_limit_gbps
    return IoThreshold(instance, drivable, min_fraction, min_fraction * min(instance, drivable))


def stream_sizes(bytes_per_node: int, streams: int, align: int = MIB) -> list[int]:
    """Bytes per stream file: an equal share, rounded down to `align` (O_DIRECT wants aligned sizes), >= align."""
    if streams < 1:
        raise ValueError("need at least one stream")
    share = max(align, bytes_per_node // streams // align * align)
    return [share] * streams


def resolve_read_mode(requested: str, nodes: int) -> str:
    if requested not in READ_MODES:
        raise ValueError(f"unknown read mode {requested!r}")
    if requested == "auto":
        return "cross-node" if nodes > 1 else "direct"
    if requested == "cross-node" and nodes < 2:
        raise ValueError("cross-node reads need at least 2 nodes")
    return requested


def read_sources(nodes: int, mode: str) -> list[int]:
    """Whose files each node reads: the next node's for cross-node, its own otherwise."""
    if mode == "cross-node":
        return [(i + 1) % nodes for i in range(nodes)]
    return list(range(nodes))


def aggregate_gbps(phases: list[dict[str, Any]]) -> float:
    """All bytes of a phase over the span from the earliest start to the latest end, GB/s."""
    total = sum(p["bytes"] for p in phases)
    span = max(p["end"] for p in phases) - min(p["start"] for p in phases)
    return total / span / 1e9 if span > 0 else float("inf")


def _unescape_mount_field(text: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def mount_of(path: str, mounts_text: str) -> tuple[str, str, str]:
    """(mount point, file system type, source) of the mount that holds `path` (longest matching mount point)."""
    path = os.path.normpath(path)
    best = ("", "", "")
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        source, point, fstype = _unescape_mount_field(parts[0]), _unescape_mount_field(parts[1]), parts[2]
        point = os.path.normpath(point)
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fstype, source)
    return best


def select_nodes(ray_nodes: list[dict[str, Any]], nodes: int | None, all_nodes: bool) -> list[dict[str, Any]]:
    """Alive Ray nodes with GPUs (or every alive node with all_nodes), in a stable order; the first `nodes`."""
    alive = [n for n in ray_nodes if n.get("Alive")]
    pool = alive if all_nodes else [n for n in alive if n.get("Resources", {}).get("GPU", 0) > 0]
    pool = sorted(pool, key=lambda n: (n.get("NodeManagerAddress", ""), n.get("NodeID", "")))
    if not pool:
        raise PreflightError("no alive Ray node with GPUs (use --all-nodes to include CPU nodes)")
    if nodes is None:
        return pool
    if nodes > len(pool):
        raise PreflightError(f"--nodes {nodes} but only {len(pool)} eligible Ray node(s) are alive")
    return pool[:nodes]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


def fmt_gbps(value: float) -> str:
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def io_verdict(write_gbps: float, read_gbps: float, thr: IoThreshold, nodes: int) -> Verdict:
    basis = (
        f"{thr.min_fraction:g} x min(instance {fmt_gbps(thr.instance_gbps)} GB/s, "
        f"{nodes} node(s) x {thr.nodes_gbps / nodes:g} GB/s = {fmt_gbps(thr.nodes_gbps)} GB/s)"
    )
    low = [
        f"{name} {fmt_gbps(gbps)} GB/s"
        for name, gbps in (("write", write_gbps), ("read", read_gbps))
        if gbps < thr.threshold_gbps
    ]
    if not low:
        return Verdict(
            True,
            f"PASS: write {fmt_gbps(write_gbps)} GB/s and read {fmt_gbps(read_gbps)} GB/s in total are >= "
            f"{fmt_gbps(thr.threshold_gbps)} GB/s = {basis}.",
        )
    lines = [
        f"FAIL: Lustre {' and '.join(low)} in total, under the threshold of "
        f"{fmt_gbps(thr.threshold_gbps)} GB/s = {basis}.",
        "Check:",
        "  - the mount: the path must be on the Managed Lustre instance (file system type lustre; the report above "
        "shows each node's mount), not the container's own disk;",
        "  - the flags: --capacity-gib and --tier-mbps-per-tib must match the instance (its capacity and per-unit "
        "storage throughput);",
        "  - the network path: the instance in the same zone and VPC as the nodes, the VPC's MTU (8896), the nodes' "
        "primary NIC;",
        "  - other load: another job reading or writing the instance at the same time;",
        "  - the scale of the test: with few nodes or streams the nodes, not the instance, set the pace; "
        "--node-limit-gbps, --streams and --gib-per-node tune that.",
    ]
    return Verdict(False, "\n".join(lines))


# ------------------------------------------------------------------------------------------------------- I/O


def block_pattern(writer_index: int, stream: int, block_bytes: int) -> bytes:
    """The block a writer repeats in one stream file: pseudo-random (no zeros, nothing to compress)."""
    return random.Random(f"{writer_index}/{stream}").randbytes(block_bytes)


def stream_path(node_dir: str, stream: int) -> str:
    return os.path.join(node_dir, f"stream-{stream:03d}.bin")


def node_dir_of(run_dir: str, node_index: int) -> str:
    return os.path.join(run_dir, f"node-{node_index:03d}")


def _drop_cached(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def write_node(run_dir: str, node_index: int, sizes: list[int], block_bytes: int) -> dict[str, Any]:
    node_dir = node_dir_of(run_dir, node_index)
    os.makedirs(node_dir, exist_ok=True)

    def write_stream(stream: int) -> int:
        pattern = memoryview(block_pattern(node_index, stream, block_bytes))
        fd = os.open(stream_path(node_dir, stream), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = sizes[stream]
            while left > 0:
                chunk = pattern[: min(block_bytes, left)]
                while chunk:
                    written = os.write(fd, chunk)
                    chunk = chunk[written:]
                    left -= written
            os.fsync(fd)
            _drop_cached(fd)
        finally:
            os.close(fd)
        return sizes[stream]

    start = time.time()
    with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
        written = sum(pool.map(write_stream, range(len(sizes))))
    end = time.time()
    return {"node": node_index, "bytes": written, "start": start, "end": end, "seconds": end - start}


def read_node(run_dir: str, writer_index: int, sizes: list[int], block_bytes: int, mode: str) -> dict[str, Any]:
    """Read every stream file `writer_index` wrote; verify the first block of each against its pattern."""
    node_dir = node_dir_of(run_dir, writer_index)
    o_direct = getattr(os, "O_DIRECT", 0)
    modes_used: set[str] = set()
    lock = threading.Lock()

    def open_for_read(path: str, direct: bool) -> int:
        fd = os.open(path, os.O_RDONLY | (o_direct if direct else 0))
        if not direct:
            _drop_cached(fd)  # whatever this node still caches of the file
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def read_stream(stream: int) -> tuple[int, bool]:
        path = stream_path(node_dir, stream)
        direct = mode == "direct" and o_direct != 0
        buf = mmap.mmap(-1, block_bytes)  # page-aligned, as O_DIRECT requires
        try:
            try:
                fd = open_for_read(path, direct)
            except OSError:
                if not direct:
                    raise
                direct = False  # the file system refuses O_DIRECT
                fd = open_for_read(path, direct)
            total = 0
            first_ok = False
            try:
                while True:
                    try:
                        n = os.preadv(fd, [buf], total)
                    except OSError:
                        if not direct or total:
                            raise
                        os.close(fd)  # accepted O_DIRECT at open, refused it at read
                        direct = False
                        fd = open_for_read(path, direct)
                        continue
                    if n == 0:
                        break
                    if total == 0:
                        want = block_pattern(writer_index, stream, block_bytes)[:n]
                        first_ok = buf[:n] == want
                    total += n
            finally:
                os.close(fd)
        finally:
            buf.close()
        with lock:
            modes_used.add("direct" if direct else "buffered")
        return total, first_ok and total == sizes[stream]

    start = time.time()
    with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
        per_stream = list(pool.map(read_stream, range(len(sizes))))
    end = time.time()
    return {
        "writer": writer_index,
        "bytes": sum(n for n, _ in per_stream),
        "start": start,
        "end": end,
        "seconds": end - start,
        "verified": all(ok for _, ok in per_stream),
        "bad_streams": [i for i, (_, ok) in enumerate(per_stream) if not ok],
        "mode": "+".join(sorted(modes_used)),
    }


def node_info(path: str) -> dict[str, Any]:
    try:
        with open("/proc/self/mounts") as fh:
            mounts = fh.read()
    except OSError:
        mounts = ""
    point, fstype, source = mount_of(os.path.realpath(path), mounts)
    return {"hostname": socket.gethostname(), "mount_point": point, "fstype": fstype, "source": source}


def remove_run_dir(run_dir: str) -> bool:
    shutil.rmtree(run_dir, ignore_errors=True)
    return not os.path.exists(run_dir)


class LustreActor:
    """One per node; wrapped with ray.remote when the job runs."""

    def info(self, path: str) -> dict[str, Any]:
        import ray

        return {**node_info(path), "ip": ray.util.get_node_ip_address()}

    def write(self, run_dir: str, node_index: int, sizes: list[int], block_bytes: int) -> dict[str, Any]:
        return write_node(run_dir, node_index, sizes, block_bytes)

    def read(self, run_dir: str, writer_index: int, sizes: list[int], block_bytes: int, mode: str) -> dict[str, Any]:
        return read_node(run_dir, writer_index, sizes, block_bytes, mode)


# ---------------------------------------------------------------------------------------------- orchestration


def new_run_dir(path: str) -> str:
    return os.path.join(path, f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}")


def run_phases(
    nodes: int,
    infos: list[dict[str, Any]],
    write_all: Callable[[], list[dict[str, Any]]],
    read_all: Callable[[list[int]], list[dict[str, Any]]],
    cleanup: Callable[[], bool],
    mode: str,
    run_dir: str,
) -> dict[str, Any]:
    """Write on every node, then read on every node; clean up whatever happens.

    cleanup() returns whether the run's files are gone. After a failed phase there is no report to carry that, so
    it is printed to stderr before the error propagates."""
    sources = read_sources(nodes, mode)
    try:
        writes = write_all()
        reads = read_all(sources)
    except BaseException:
        removed = cleanup()
        state = "removed" if removed else "NOT removed - remove them by hand"
        print(f"# after the failure, the files under {run_dir}: {state}", file=sys.stderr, flush=True)
        raise
    removed = cleanup()
    return {"infos": infos, "writes": writes, "reads": reads, "sources": sources, "removed": removed}


def run_local(cfg: dict[str, Any]) -> dict[str, Any]:
    os.makedirs(cfg["path"], exist_ok=True)
    run_dir = new_run_dir(cfg["path"])
    sizes, block = cfg["sizes"], cfg["block_bytes"]
    return run_phases(
        1,
        [node_info(cfg["path"])],
        lambda: [write_node(run_dir, 0, sizes, block)],
        lambda sources: [read_node(run_dir, sources[0], sizes, block, cfg["mode"])],
        lambda: remove_run_dir(run_dir),
        cfg["mode"],
        run_dir,
    )


def remove_with_fresh_tasks(ray: Any, remover: Any, node_ids: list[str], run_dir: str, timeout_s: float) -> bool:
    """Remove run_dir with one new task pinned to each node (any of them can: the dir is on shared storage).

    True once one task reports the dir gone; False when none does within timeout_s (a node that died or hangs on
    the file system does not hold the others up). Tasks still running then are cancelled."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pending = [
        remover.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote(run_dir)
        for node_id in node_ids
    ]
    deadline = time.monotonic() + timeout_s
    removed = False
    while pending and not removed:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            try:
                removed = bool(ray.get(ref)) or removed
            except ray.exceptions.RayError:
                continue
    for ref in pending:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    return removed


def run_ray(nodes: int | None, all_nodes: bool, requested_mode: str, cfg: dict[str, Any]) -> dict[str, Any]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    chosen = select_nodes(ray.nodes(), nodes, all_nodes)
    n = len(chosen)
    try:
        cfg["mode"] = resolve_read_mode(requested_mode, n)
    except ValueError as exc:
        raise PreflightError(str(exc)) from exc
    actor_cls = ray.remote(LustreActor)
    actors: list[Any] = [
        actor_cls.options(
            num_cpus=cfg["cpus_per_actor"],
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False),
        ).remote()
        for node in chosen
    ]
    timeout = cfg["timeout_s"]
    sizes, block = cfg["sizes"], cfg["block_bytes"]
    run_dir = new_run_dir(cfg["path"])

    def cleanup() -> bool:
        # Kill the actors first. Each runs one call at a time, so a call sent to an actor whose write or read is
        # stuck (a phase that timed out) would queue behind it and never run; fresh tasks remove the files instead.
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        node_ids = [node["NodeID"] for node in chosen]
        return remove_with_fresh_tasks(ray, ray.remote(remove_run_dir), node_ids, run_dir, CLEANUP_TIMEOUT_S)

    start_timeout = max(timeout, ACTOR_START_TIMEOUT_S)
    try:
        try:
            infos = ray.get([a.info.remote(cfg["path"]) for a in actors], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise PreflightError(f"the node actors did not start within {start_timeout} s") from exc
        return run_phases(
            n,
            infos,
            lambda: ray.get([a.write.remote(run_dir, i, sizes, block) for i, a in enumerate(actors)], timeout=timeout),
            lambda sources: ray.get(
                [a.read.remote(run_dir, sources[i], sizes, block, cfg["mode"]) for i, a in enumerate(actors)],
                timeout=timeout,
            ),
            cleanup,
            cfg["mode"],
            run_dir,
        )
    except ray.exceptions.GetTimeoutError as exc:
        raise PreflightError(f"a phase did not finish within {timeout} s") from exc
    except ray.exceptions.RayError as exc:
        raise PreflightError(f"a node failed:\n{exc}") from exc
    finally:
        for actor in actors:  # cleanup() has killed them already, unless the info call failed
            with contextlib.suppress(Exception):
                ray.kill(actor)


# ---------------------------------------------------------------------------------------------------- report


def report(run: dict[str, Any], cfg: dict[str, Any], thr: IoThreshold) -> tuple[int, str, dict[str, Any]]:
    infos, writes, reads, sources = run["infos"], run["writes"], run["reads"], run["sources"]
    nodes = len(writes)
    per_stream = cfg["sizes"][0]
    mode_text = {
        "cross-node": "cross-node: each node reads the files the next node wrote (buffered; not in its page cache)",
        "direct": "own files with O_DIRECT (page cache bypassed)",
        "buffered": "own files, buffered, after POSIX_FADV_DONTNEED (the page cache may inflate them)",
    }[cfg["mode"]]
    lines = [
        f"# Lustre I/O pre-flight under {cfg['path']}: {nodes} node(s) x {len(cfg['sizes'])} streams x "
        f"{per_stream / MIB:g} MiB = {sum(cfg['sizes']) / GIB:.3g} GiB per node, {cfg['block_bytes'] / MIB:g} MiB I/Os",
        "# writes: sequential, one file per stream, fsync before the clock stops",
        f"# reads: {mode_text}",
        f"#{'node':>4} {'host':<40} {'mount (fstype)':<28} {'write GB/s':>10} {'read GB/s':>10} {'reads of':>8}  mode",
    ]
    for i, (info, w, r) in enumerate(zip(infos, writes, reads, strict=True)):
        mount = f"{info['mount_point'] or '?'} ({info['fstype'] or '?'})"
        lines.append(
            f"{i:>5} {info['hostname'][:40]:<40} {mount[:28]:<28} {fmt_gbps(w['bytes'] / w['seconds'] / 1e9):>10} "
            f"{fmt_gbps(r['bytes'] / r['seconds'] / 1e9):>10} {'node ' + str(sources[i]):>8}  {r['mode']}"
        )
    write_total, read_total = aggregate_gbps(writes), aggregate_gbps(reads)
    lines.append(
        f"# total: write {fmt_gbps(write_total)} GB/s, read {fmt_gbps(read_total)} GB/s "
        "(all bytes over each phase's span)"
    )
    if any("buffered" in r["mode"] for r in reads) and cfg["mode"] == "direct":
        lines.append("# note: the file system refused O_DIRECT; reads were buffered and may come from the page cache")
    lines.append(f"# files removed: {'yes' if run['removed'] else 'NO - remove them by hand'}")

    status = 0
    wrong_fs = [info for info in infos if cfg["expect_fstype"] and info["fstype"] != cfg["expect_fstype"]]
    bad_data = [
        f"node {i} reading node {r['writer']}: streams {r['bad_streams']}"
        for i, r in enumerate(reads)
        if not r["verified"]
    ]
    if wrong_fs:
        status = 1
        lines.append(
            f"FAIL: {cfg['path']} is not on a {cfg['expect_fstype']} file system on "
            + ", ".join(f"{i['hostname']} ({i['fstype'] or 'unknown'} at {i['mount_point'] or '?'})" for i in wrong_fs)
            + ". Check the worker pods' volume mount of the Lustre PersistentVolumeClaim."
        )
    if bad_data:
        status = 1
        lines.append("FAIL: data read back differs from what was written: " + "; ".join(bad_data))
    verdict = io_verdict(write_total, read_total, thr, nodes)
    lines.append(verdict.message)
    if not verdict.ok:
        status = 1
    summary = {
        "status": status,
        "nodes": nodes,
        "write_total_gbps": write_total,
        "read_total_gbps": read_total,
        "threshold": asdict(thr),
        "read_mode": cfg["mode"],
        "removed": run["removed"],
        "infos": infos,
        "writes": writes,
        "reads": reads,
        "sources": sources,
    }
    return status, "\n".join(lines), summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Managed Lustre write/read throughput pre-flight (Ray job or --local).")
    p.add_argument("--path", default=DEFAULT_PATH, help=f"directory on the Lustre mount ({DEFAULT_PATH})")
    p.add_argument("--capacity-gib", type=float, required=True, help="the instance's capacity, GiB")
    p.add_argument("--tier-mbps-per-tib", type=float, required=True, help="the instance's tier, MB/s per TiB")
    p.add_argument(
        "--min-fraction",
        type=float,
        default=DEFAULT_MIN_FRACTION,
        help=f"pass mark as a fraction of min(instance, nodes x node limit) ({DEFAULT_MIN_FRACTION:g})",
    )
    p.add_argument(
        "--node-limit-gbps",
        type=float,
        default=DEFAULT_NODE_LIMIT_GBPS,
        help=f"GB/s one node is assumed to drive ({DEFAULT_NODE_LIMIT_GBPS:g})",
    )
    p.add_argument(
        "--gib-per-node",
        type=float,
        default=DEFAULT_GIB_PER_NODE,
        help=f"GiB each node writes and reads ({DEFAULT_GIB_PER_NODE:g})",
    )
    p.add_argument("--streams", type=int, default=DEFAULT_STREAMS, help=f"parallel files per node ({DEFAULT_STREAMS})")
    p.add_argument("--block-mib", type=int, default=DEFAULT_BLOCK_MIB, help=f"I/O size, MiB ({DEFAULT_BLOCK_MIB})")
    p.add_argument("--read-mode", choices=READ_MODES, default="auto", help="see the module docstring (auto)")
    p.add_argument("--nodes", type=int, default=None, help="use the first N GPU nodes (default: all)")
    p.add_argument("--all-nodes", action="store_true", help="include alive Ray nodes without GPUs")
    p.add_argument(
        "--expect-fstype",
        default=None,
        help="fail unless the path is on this file system type (default: lustre under Ray, no check with --local)",
    )
    p.add_argument("--local", action="store_true", help="this host only, no Ray")
    p.add_argument("--cpus-per-actor", type=float, default=1.0, help="Ray CPUs reserved per node actor (1)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="limit per phase under Ray, s (1800)")
    p.add_argument("--json-out", default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.gib_per_node <= 0 or args.block_mib < 1:
            raise PreflightError("--gib-per-node must be > 0 and --block-mib >= 1")
        sizes = stream_sizes(int(args.gib_per_node * GIB), args.streams)
        block_bytes = min(args.block_mib * MIB, sizes[0])
        io_threshold(args.capacity_gib, args.tier_mbps_per_tib, 1, args.node_limit_gbps, args.min_fraction)
    except (ValueError, PreflightError) as exc:
        print(f"PREFLIGHT ERROR: {exc}", file=sys.stderr)
        return 2
    expect = args.expect_fstype if args.expect_fstype is not None else ("" if args.local else "lustre")
    cfg: dict[str, Any] = {
        "path": args.path,
        "sizes": sizes,
        "block_bytes": block_bytes,
        "expect_fstype": expect,
        "cpus_per_actor": args.cpus_per_actor,
        "timeout_s": args.timeout_s,
    }
    try:
        if args.local:
            try:
                cfg["mode"] = resolve_read_mode(args.read_mode, 1)
            except ValueError as exc:
                raise PreflightError(str(exc)) from exc
            run = run_local(cfg)
        else:
            run = run_ray(args.nodes, args.all_nodes, args.read_mode, cfg)
    except PreflightError as exc:
        print(f"PREFLIGHT ERROR: {exc}", file=sys.stderr)
        return 2
    except Exception:
        print(f"PREFLIGHT ERROR: the check could not run:\n{traceback.format_exc()}", file=sys.stderr)
        return 2
    thr = io_threshold(
        args.capacity_gib, args.tier_mbps_per_tib, len(run["writes"]), args.node_limit_gbps, args.min_fraction
    )
    status, text, summary = report(run, cfg, thr)
    print(text, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(summary, fh, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
