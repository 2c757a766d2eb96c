"""The fence around every Ray pod and the job stack's submitter. Ray's own authentication exists only from Ray 2.52
(workloads/ray_auth.py) and covers Ray's servers only; these policies are what keeps other pods away from the rest.

What is allowed, and why (held against the rendered objects, flow by flow, in tests/test_network_flows.py):

Ingress
- every pod of this RayCluster (head, workers, any group added later) accepts this RayCluster's pods on every port:
  Ray nodes talk on many, some chosen at random (raylet, object manager, the worker ports, which ray_values pins to
  10002-11000), and so do NCCL's bootstrap, torch's TCPStore and vLLM;
- every pod of this RayCluster accepts Managed Prometheus's collectors (namespace gmp-system) on the metrics port
  8080 only: KubeRay 1.5.1 gives the head and every worker a `metrics` port 8080 (`--metrics-export-port=8080`), and
  KubeRay's own PodMonitor scrapes that port on head and workers alike (FACTS.md; the GKE Ray add-on's own
  monitoring config is not published, so the policy admits what KubeRay's does);
- the head, in addition, accepts the submitter pods on the Jobs API port 8265, and on the Ray Client port 10001 only
  where the stack runs the autoscaler (rayAutoscaling: the submitter asks it for GPU workers through Ray Client).
Egress
- every pod of this RayCluster may reach: this RayCluster's pods (any port); kube-dns (kube-system pods
  k8s-app=kube-dns, UDP and TCP 53); the GKE metadata server, where Workload Identity hands out the Google token
  (169.254.169.252/32 TCP 988 and 169.254.169.254/32 TCP 80, as GKE's Workload Identity docs list for network
  policies); and the internet on TCP 443 only (Hugging Face hub, nvcr.io, Weights & Biases, Google APIs for Cloud
  Logging and Cloud Storage, PyPI): every address but the private, shared and link-local ranges, so no other pod,
  node or service of the VPC;
- the head, in addition: the Kubernetes API server (its autoscaler), TCP 443 to the cluster subnet (the API
  server's endpoint is a private address of that subnet: the control plane is reached through Private Service
  Connect). NetworkPolicy cannot select the API server by label, so this is the subnet's range, which also holds
  the nodes: a pod of the head may open TCP 443 on a node too;
- the submitter pods: kube-dns, the head's 8265 (and 10001 where Ray Client is used), the API server as above.
  Nothing else: no internet, no other pod.

Not fenced by these policies (docs/security.md's threat table): traffic from the pod's own node, which includes every
hostNetwork pod on that node (always admitted; workloads/admission_policy.py refuses hostNetwork in the Ray namespace
only); the extra gVNIC and RDMA NICs (NetworkPolicy applies to the pod's default network only: Ray's gRPC servers and
torch's TCPStore listen on 0.0.0.0, so on those NICs too; the cluster-wide admission policy keeps every pod but this
RayCluster's off those networks); `kubectl port-forward` (the kubelet connects inside the pod's network namespace).
Probes are exec probes.

Selectors match the labels KubeRay puts on the pods it creates (ray.io/cluster, ray.io/node-type: a template cannot
override them), held against the real chart's render in tests/test_ray_pods.py. A label is a claim, not an
identity; the admission policies decide who may make it: `ray.io/cluster=<name>` only on a pod with KubeRay's
controller reference to that RayCluster, created by a user who may update it; the submitter label only on pods the
Job controller creates, so anyone who may create Jobs in the namespace can still claim it.
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
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# The cluster DNS: GKE's kube-dns pods (the cluster enables no NodeLocal DNSCache and no Cloud DNS).
DNS_NAMESPACE = "kube-system"
DNS_POD_LABELS = {"k8s-app": "kube-dns"}
DNS_PORT = 53
# The GKE metadata server as pods reach it under Workload Identity (GKE's Workload Identity docs, network policy).
METADATA_SERVER = (("169.254.169.252/32", 988), ("169.254.169.254/32", 80))
HTTPS_PORT = 443
API_SERVER_PORT = 443
# What "the internet" leaves out: private (RFC 1918), shared (RFC 6598) and link-local (RFC 3927) addresses, where
# the VPC's nodes, pods, services and the metadata server live.
NOT_INTERNET = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")


@dataclass(frozen=True)
class RayPoliciesArgs:
    namespace: pulumi.Input[str]
    ray_cluster: str
    dashboard_port: int
    client_port: int | None  # Ray Client, open to the submitter; None where the stack does not use it
    metrics_port: int
    api_server_cidrs: tuple[str, ...]  # where the Kubernetes API server's endpoint is (the cluster subnet)


def cluster_pods_selector(ray_cluster: str) -> dict[str, Any]:
    return {"matchLabels": {CLUSTER_LABEL: ray_cluster}}


def head_selector(ray_cluster: str) -> dict[str, Any]:
    return {"matchLabels": {CLUSTER_LABEL: ray_cluster, NODE_TYPE_LABEL: "head"}}


def submitter_selector(ray_cluster: str) -> dict[str, Any]:
    return {"matchLabels": {SUBMITTER_LABEL: ray_cluster}}


def prometheus_selector() -> dict[str, Any]:
    return {"matchLabels": {NAMESPACE_NAME_LABEL: PROMETHEUS_NAMESPACE}}


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def dns_rule() -> dict[str, Any]:
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: DNS_NAMESPACE}},
                "podSelector": {"matchLabels": dict(DNS_POD_LABELS)},
            }
        ],
        "ports": [{"protocol": protocol, "port": DNS_PORT} for protocol in ("UDP", "TCP")],
    }


def api_server_rule(args: RayPoliciesArgs) -> dict[str, Any]:
    return {"to": [{"ipBlock": {"cidr": cidr}} for cidr in args.api_server_cidrs], "ports": _tcp(API_SERVER_PORT)}


def submitter_ports(args: RayPoliciesArgs) -> tuple[int, ...]:
    """The head's ports the submitter reaches: the Jobs API, and Ray Client where it is used."""
    return (args.dashboard_port,) if args.client_port is None else (args.dashboard_port, args.client_port)


def cluster_policy_spec(args: RayPoliciesArgs) -> dict[str, Any]:
    """Every Ray pod of this cluster: ingress from this cluster's Ray pods on any port, and from Managed
    Prometheus on the metrics port only."""
    return {
        "podSelector": cluster_pods_selector(args.ray_cluster),
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": cluster_pods_selector(args.ray_cluster)}]},
            {"from": [{"namespaceSelector": prometheus_selector()}], "ports": _tcp(args.metrics_port)},
        ],
    }


def head_policy_spec(args: RayPoliciesArgs) -> dict[str, Any]:
    """The head, in addition: the submitter pods in (Jobs API, Ray Client where used); the API server out."""
    return {
        "podSelector": head_selector(args.ray_cluster),
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {"from": [{"podSelector": submitter_selector(args.ray_cluster)}], "ports": _tcp(*submitter_ports(args))}
        ],
        "egress": [api_server_rule(args)],
    }


def cluster_egress_spec(args: RayPoliciesArgs) -> dict[str, Any]:
    """Every Ray pod of this cluster: out to its own cluster's pods, DNS, the metadata server and the internet's
    HTTPS only."""
    return {
        "podSelector": cluster_pods_selector(args.ray_cluster),
        "policyTypes": ["Egress"],
        "egress": [
            {"to": [{"podSelector": cluster_pods_selector(args.ray_cluster)}]},
            dns_rule(),
            *({"to": [{"ipBlock": {"cidr": cidr}}], "ports": _tcp(port)} for cidr, port in METADATA_SERVER),
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NOT_INTERNET)}}], "ports": _tcp(HTTPS_PORT)},
        ],
    }


def submitter_egress_spec(args: RayPoliciesArgs) -> dict[str, Any]:
    """The job stack's submitter pods: out to DNS, the head's Jobs API (and Ray Client where used) and the API
    server, nothing else."""
    return {
        "podSelector": submitter_selector(args.ray_cluster),
        "policyTypes": ["Egress"],
        "egress": [
            dns_rule(),
            {"to": [{"podSelector": head_selector(args.ray_cluster)}], "ports": _tcp(*submitter_ports(args))},
            api_server_rule(args),
        ],
    }


# Object name suffix -> spec builder: every policy the component registers, named `<ray_cluster>-<suffix>`.
POLICIES = {
    "pods": cluster_policy_spec,
    "head": head_policy_spec,
    "egress": cluster_egress_spec,
    "submitter-egress": submitter_egress_spec,
}


class RayPolicies(pulumi.ComponentResource):
    policies: dict[str, k8s.networking.v1.NetworkPolicy]

    def __init__(self, name: str, args: RayPoliciesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:RayPolicies", name, None, opts)
        if not args.api_server_cidrs:
            raise ValueError("api_server_cidrs: at least one range, or the head and the submitter lose the API server")
        child = pulumi.ResourceOptions(parent=self)
        self.policies = {
            suffix: k8s.networking.v1.NetworkPolicy(
                f"{name}-{suffix}",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{args.ray_cluster}-{suffix}", namespace=args.namespace),
                spec=cast(k8s.networking.v1.NetworkPolicySpecArgsDict, build(args)),
                opts=child,
            )
            for suffix, build in POLICIES.items()
        }
        self.register_outputs({"policies": [policy.metadata.name for policy in self.policies.values()]})
