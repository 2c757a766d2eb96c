"""Kubernetes NetworkPolicy semantics (networking.k8s.io/v1), evaluated over rendered policy objects, for tests.

A flow from `source` to `destination` on (protocol, port) is allowed when both ends allow it:
- egress: if any policy of the source pod's namespace selects the source and lists Egress in policyTypes, one of
  those policies' egress rules must match the destination and the port; a pod no such policy selects sends freely;
- ingress: likewise at the destination pod, with ingress rules matching the source.
Policies are additive (any matching rule of any selecting policy allows). A rule with no `to`/`from` matches every
peer, a rule with no `ports` every port. Peers: podSelector alone (pods of the policy's namespace),
namespaceSelector (with an optional podSelector: pods of the selected namespaces), ipBlock (cidr less except, matched
against the peer's IP: an address outside the cluster, or a pod's IP). An address that is not a pod (the internet,
the metadata server, the API server) has no ingress side here. Named ports are not supported (the project uses
none); endPort is.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    ip: str = "10.16.0.10"
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


@dataclass(frozen=True)
class Address:
    ip: str


Endpoint = Pod | Address


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector; an empty one selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def _namespace(policy: dict[str, Any]) -> str:
    return policy["metadata"]["namespace"]


def _peer_matches(peer: dict[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(other.ip)
        if ip not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(ip in ipaddress.ip_network(cidr) for cidr in block.get("except") or [])
    if not isinstance(other, Pod):
        return False  # pod and namespace selectors select pods only
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.ns_labels()):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector"), other.labels)


def _port_matches(rule: dict[str, Any], protocol: str, port: int) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        if "port" not in entry:
            return True
        if not isinstance(entry["port"], int):
            raise ValueError(f"named port {entry['port']!r} is not supported by this evaluator")
        if entry["port"] <= port <= entry.get("endPort", entry["port"]):
            return True
    return False


def _direction_allows(
    policies: list[dict[str, Any]], kind: str, pod: Pod, other: Endpoint, protocol: str, port: int
) -> bool:
    key, peers = ("egress", "to") if kind == "Egress" else ("ingress", "from")
    selecting = [
        p
        for p in policies
        if _namespace(p) == pod.namespace
        and selects(p["spec"]["podSelector"], pod.labels)
        and kind in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            if not _port_matches(rule, protocol, port):
                continue
            rule_peers = rule.get(peers)
            if not rule_peers or any(_peer_matches(peer, _namespace(policy), other) for peer in rule_peers):
                return True
    return False


def allowed(
    policies: list[dict[str, Any]], source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Would the policies let `source` open a connection to `destination` on `port`?"""
    if isinstance(source, Pod) and not _direction_allows(policies, "Egress", source, destination, protocol, port):
        return False
    if isinstance(destination, Pod):
        return _direction_allows(policies, "Ingress", destination, source, protocol, port)
    return True
