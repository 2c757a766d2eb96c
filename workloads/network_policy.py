"""Ray has no authentication: only this Ray cluster's pods and the job submitter may reach its head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

# The job stack puts this label on its submitter pods; its value is the RayCluster's name.
SUBMITTER_LABEL = "nemo-rl-gke/ray-submitter"


@dataclass(frozen=True)
class RayHeadPolicyArgs:
    name: str
    namespace: pulumi.Input[str]
    ray_cluster: str
    dashboard_port: int
    client_port: int
    metrics_port: int


def head_policy_spec(args: RayHeadPolicyArgs) -> dict[str, Any]:
    """Ingress to the head: every port from this cluster's own Ray pods (Ray nodes talk on many ports), the
    Jobs API and client ports from the submitter pods, and the metrics port from Managed Prometheus."""
    cluster_pods = {"podSelector": {"matchLabels": {"ray.io/cluster": args.ray_cluster}}}
    submitters = {"podSelector": {"matchLabels": {SUBMITTER_LABEL: args.ray_cluster}}}
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}}}
    return {
        "podSelector": {"matchLabels": {"ray.io/cluster": args.ray_cluster, "ray.io/node-type": "head"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [cluster_pods]},
            {
                "from": [submitters],
                "ports": [{"protocol": "TCP", "port": port} for port in (args.dashboard_port, args.client_port)],
            },
            {"from": [prometheus], "ports": [{"protocol": "TCP", "port": args.metrics_port}]},
        ],
    }


class RayHeadPolicy(pulumi.ComponentResource):
    def __init__(self, name: str, args: RayHeadPolicyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:RayHeadPolicy", name, None, opts)
        self.policy = k8s.networking.v1.NetworkPolicy(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.name, namespace=args.namespace),
            spec=cast(k8s.networking.v1.NetworkPolicySpecArgsDict, head_policy_spec(args)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"name": self.policy.metadata.name})
