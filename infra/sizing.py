"""Kubernetes quantities and what a GKE node leaves to pods. Pure functions, no Pulumi."""

from __future__ import annotations

import re
from decimal import Decimal

_MEMORY_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_MEMORY_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(k|M|G|T|Ki|Mi|Gi|Ti)?$")
_CPU_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m)?$")

GIB = 2**30
# What we hold back on every node for GKE's own DaemonSets (netd, anetd, gke-metadata-server, logging,
# device plugin, the gIB installer, ...). An estimate with headroom: GKE documents the node reservations
# below but not the DaemonSet footprint, which varies by version and add-on.
DAEMONSET_CPU = 2.0
DAEMONSET_MEMORY_BYTES = 8 * GIB


def memory_bytes(quantity: str) -> int:
    """Bytes in a Kubernetes memory quantity such as '500G' or '2400Gi'."""
    match = _MEMORY_RE.match(str(quantity).strip())
    if not match:
        raise ValueError(f"not a Kubernetes memory quantity: {quantity!r}")
    number, suffix = match.groups()
    return int(Decimal(number) * _MEMORY_SUFFIXES[suffix or ""])


def cpu_cores(quantity: str | int | float) -> float:
    """Cores in a Kubernetes CPU quantity such as '64', 64 or '500m'."""
    match = _CPU_RE.match(str(quantity).strip())
    if not match:
        raise ValueError(f"not a Kubernetes CPU quantity: {quantity!r}")
    number, milli = match.groups()
    return float(Decimal(number) / (1000 if milli else 1))


def _tiered(total: float, tiers: list[tuple[float, float]], rest_rate: float) -> float:
    reserved, remaining = 0.0, total
    for size, rate in tiers:
        portion = min(remaining, size)
        reserved += portion * rate
        remaining -= portion
    return reserved + max(remaining, 0.0) * rest_rate


def allocatable_cpu(vcpus: int) -> float:
    """Cores left to pods on a GKE Standard node: 6% of the first core, 1% of the next, 0.5% of the
    next two, 0.25% of the rest (GKE's documented kube-reserved), less our DaemonSet allowance."""
    reserved = _tiered(vcpus, [(1, 0.06), (1, 0.01), (2, 0.005)], 0.0025)
    return vcpus - reserved - DAEMONSET_CPU


def allocatable_memory_bytes(memory_total_bytes: int) -> int:
    """Bytes left to pods on a GKE Standard node: 25% of the first 4 GiB, 20% of the next 4, 10% of the
    next 8, 6% of the next 112, 2% of the rest, plus the 100 MiB eviction threshold (GKE's documented
    reservations), less our DaemonSet allowance."""
    gib_total = memory_total_bytes / GIB
    reserved_gib = _tiered(gib_total, [(4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06)], 0.02)
    return int(memory_total_bytes - reserved_gib * GIB - 100 * 2**20 - DAEMONSET_MEMORY_BYTES)
