"""The fence around every Ray pod. Ray's own authentication exists only from Ray 2.52 (workloads/ray_auth.py); with an
older image these policies are all that keeps other pods away from Ray, which runs whatever it is sent.

Two ingress policies, additive as NetworkPolicies are:
- every pod of this RayCluster (head, workers, any group added later) accepts traffic from this RayCluster's pods
  only, on every port (Ray nodes talk on many, some chosen at random);
- the head also accepts the submitter pods on the Jobs API and Ray Client ports, and Managed Prometheus (gmp-system)
  on the metrics port.
Nothing else reaches a Ray pod: not other pods of the namespace, not other namespaces. `kubectl port-forward` still
works: the kubelet connects inside the pod's network namespace, which no NetworkPolicy sees. Probes are exec probes.

Selectors match the labels KubeRay puts on the pods it creates (ray.io/cluster, ray.io/node-type: a template cannot
override them), held against the real chart's render in tests/test_ray_pods.py. A label is a claim, not an
identity: any pod whose creator copies `ray.io/cluster=<name>` or the submitter label passes. So the fence is only as
tight as who may create pods in the namespace (docs/security.md's threat table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

# The job stack puts this label on its submitter pods; its value is the RayCluster's name.
SUBMITTER_LABEL = "nemo-rl-gke/ray-submitter"
# Set by KubeRay on every pod of a RayCluster, from the RayCluster's name and the pod's role.
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
# Managed Prometheus's collectors run in this namespace.
PROMETHEUS_NAMESPACE = "gmp-system"


@dataclass(frozen=True)
class RayPoliciesArgs:
    namespace: pulumi.Input[str]
    ray_cluster: str
    dashboard_port: int
    client_port: int
    metrics_port: int


def cluster_pods_selector(ray_cluster: str) -> dict[str, Any]:
    return {"matchLabels": {CLUSTER_LABEL: ray_cluster}}


def head_selector(ray_cluster: str) -> dict[str, Any]:
    return {"matchLabels": {CLUSTER_LABEL: ray_cluster, NODE_TYPE_LABEL: "head"}}


def submitter_selector(ray_cluster: str) -> dict[str, Any]:
    return {"matchLabels": {SUBMITTER_LABEL: ray_cluster}}


def prometheus_selector() -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}}


def cluster_policy_spec(args: RayPoliciesArgs) -> dict[str, Any]:
    """Every Ray pod of this cluster: ingress from this cluster's Ray pods only, on any port."""
    return {
        "podSelector": cluster_pods_selector(args.ray_cluster),
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": cluster_pods_selector(args.ray_cluster)}]}],
    }


def head_policy_spec(args: RayPoliciesArgs) -> dict[str, Any]:
    """The head, in addition: the Jobs API and Ray Client ports from the submitter pods, metrics from Prometheus."""
    return {
        "podSelector": head_selector(args.ray_cluster),
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"podSelector": submitter_selector(args.ray_cluster)}],
                "ports": [{"protocol": "TCP", "port": port} for port in (args.dashboard_port, args.client_port)],
            },
            {
                "from": [{"namespaceSelector": prometheus_selector()}],
                "ports": [{"protocol": "TCP", "port": args.metrics_port}],
            },
        ],
    }


class RayPolicies(pulumi.ComponentResource):
    cluster_policy: k8s.networking.v1.NetworkPolicy
    head_policy: k8s.networking.v1.NetworkPolicy

    def __init__(self, name: str, args: RayPoliciesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:RayPolicies", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.cluster_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-pods",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{args.ray_cluster}-pods", namespace=args.namespace),
            spec=cast(k8s.networking.v1.NetworkPolicySpecArgsDict, cluster_policy_spec(args)),
            opts=child,
        )
        self.head_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-head",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{args.ray_cluster}-head", namespace=args.namespace),
            spec=cast(k8s.networking.v1.NetworkPolicySpecArgsDict, head_policy_spec(args)),
            opts=child,
        )
        self.register_outputs({"policies": [self.cluster_policy.metadata.name, self.head_policy.metadata.name]})
