#!/usr/bin/env python3
"""Which reservation blocks and sub-blocks the run's GPU nodes are in, after the NCCL pre-flight.

    python3 topology_report.py --report /data/<run>/checkpoints/preflight-nccl.json

Runs in the submitter pod right after the preflight-nccl step. The pre-flight's report (its --json-out) names the
Kubernetes node of every rank (the GPU workers get their node's name through the downward API, NODE_NAME); node
labels are not in the downward API, so this script asks the Kubernetes API for each node
(GET /api/v1/nodes/NAME) with the submitter's projected token, whose account may `get` nodes and nothing more on
them (jobs/launcher/job.py). It prints one line per block and sub-block, from GKE's labels
cloud.google.com/gce-topology-block and -subblock; nodes without them (spot or flex-start nodes outside a
reservation) are counted apart. Informational: it always exits 0, and says why when it cannot tell (no token with
stopOnDelete false, an API that does not answer, a report without node names).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

BLOCK_LABEL = "cloud.google.com/gce-topology-block"
SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
NO_LABEL = "(no topology labels)"


def node_names(report: Mapping[str, Any]) -> list[str]:
    """The distinct Kubernetes nodes the pre-flight's ranks ran on, in rank order."""
    names = [str(rank.get("node_name") or "") for rank in report.get("ranks") or []]
    return list(dict.fromkeys(name for name in names if name))


def summary_lines(labels_by_node: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Blocks and sub-blocks with their node counts, most nodes first; one sub-block is the fastest fabric."""
    blocks: Counter[str] = Counter()
    subblocks: Counter[str] = Counter()
    unlabelled = 0
    for labels in labels_by_node.values():
        block, subblock = labels.get(BLOCK_LABEL), labels.get(SUBBLOCK_LABEL)
        if not block:
            unlabelled += 1
            continue
        blocks[block] += 1
        subblocks[f"{block}/{subblock or '?'}"] += 1

    def listed(counts: Counter[str]) -> str:
        return ", ".join(f"{name}: {count}" for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    total = len(labels_by_node)
    lines = [f"topology: {total} GPU node{'s' if total != 1 else ''} of the run"]
    if blocks:
        lines.append(f"topology: {len(blocks)} block{'s' if len(blocks) != 1 else ''} ({listed(blocks)})")
        lines.append(f"topology: {len(subblocks)} sub-block{'s' if len(subblocks) != 1 else ''} ({listed(subblocks)})")
        if len(blocks) > 1:
            lines.append("topology: the nodes span blocks: all-reduce between blocks is slower than within one")
    if unlabelled:
        lines.append(f"topology: {unlabelled} node(s) {NO_LABEL}: not placed by a reservation's blocks")
    return lines


def report_lines(report: Mapping[str, Any], get_node: Callable[[str], Mapping[str, Any] | None]) -> list[str]:
    names = node_names(report)
    if not names:
        return ["topology unknown: the pre-flight's report names no Kubernetes node (NODE_NAME unset on the workers)"]
    labels: dict[str, Mapping[str, str]] = {}
    for name in names:
        try:
            node = get_node(name)
        except Exception as exc:  # no token (stopOnDelete false), or the API refuses or does not answer
            return [
                f"topology unknown: could not read node {name} from the Kubernetes API ({type(exc).__name__}: {exc})"
            ]
        labels[name] = dict(((node or {}).get("metadata") or {}).get("labels") or {})
    return summary_lines(labels)


def api_get_node(sa_dir: str) -> Callable[[str], Mapping[str, Any] | None]:
    from submitter.stop_on_delete import K8sRun

    api = K8sRun(namespace="", job="", marker="", sa_dir=sa_dir)
    return lambda name: api.get(f"/api/v1/nodes/{name}")


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", required=True, help="the NCCL pre-flight's --json-out file")
    parser.add_argument("--sa-dir", default="/var/run/secrets/kubernetes.io/serviceaccount")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        with open(args.report, encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"topology unknown: no pre-flight report at {args.report} ({exc})", flush=True)
        return 0
    for line in report_lines(report, api_get_node(args.sa_dir)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
