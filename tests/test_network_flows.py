"""Every flow a run needs, and foreign ones, held against the NetworkPolicies both programs render (infra and job
stack, as `make plan` runs them), with the Ray pods' labels from the real chart's render (tests/netpol.py evaluates
NetworkPolicy semantics). The table is what docs/security.md and workloads/network_policy.py say is open."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from netpol import Address, Pod, allowed
from upstream import reference

from infra.settings import NetworkRanges
from tools import plan_run, ray_pods, render
from workloads.network_policy import SUBMITTER_LABEL

POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
RELEASE = "kubernetes:helm.sh/v3:Release"
INTERNET = Address("203.0.113.10")  # any public address: the hub, nvcr.io, W&B, Google APIs
METADATA_WI = Address("169.254.169.252")
METADATA = Address("169.254.169.254")


class Rendered:
    def __init__(self, stack: str) -> None:
        reference("kuberay-v1.5.1")
        result = plan_run.run_plan(stack)
        self.infra = result.infra
        self.policies: list[dict[str, Any]] = [
            render._number(r.inputs) for run in (result.infra, result.jobs) for r in run.resources if r.type == POLICY
        ]
        release = result.infra.one(RELEASE).inputs
        self.namespace = release["namespace"]
        cluster = ray_pods.render_raycluster(
            render._number(release["values"]), release["name"], self.namespace, ray_pods.CHART_DIR
        )
        self.name = cluster["metadata"]["name"]
        self.autoscaling = bool(cluster["spec"].get("enableInTreeAutoscaling"))
        pods = ray_pods.ray_pods(cluster)
        ips = iter(ipaddress.ip_network("10.16.0.0/24").hosts())
        self.head = next(
            Pod(self.namespace, p["metadata"]["labels"], str(next(ips)))
            for p in pods
            if "head" in p["metadata"]["name"]
        )
        self.worker = next(
            Pod(self.namespace, p["metadata"]["labels"], str(next(ips)))
            for p in pods
            if "worker" in p["metadata"]["name"]
        )
        (job,) = [r for r in result.jobs.resources if r.type == "kubernetes:batch/v1:Job"]
        self.submitter = Pod(self.namespace, job.inputs["spec"]["template"]["metadata"]["labels"], str(next(ips)))
        subnet = ipaddress.ip_network(
            NetworkRanges.model_validate({}).cluster_subnet
        )  # no shipped stack sets networkRanges
        self.api_server = Address(str(subnet[2]))
        self.node = Address(str(subnet[5]))


@pytest.fixture(scope="module", params=["dev", "h200"])
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return Rendered(request.param)


def flows(r: Rendered) -> list[tuple[str, Any, Any, int, str, bool]]:
    """(what, source, destination, port, protocol, allowed?)"""
    ns = r.namespace
    dns = Pod("kube-system", {"k8s-app": "kube-dns"}, "10.16.1.2")
    collector = Pod("gmp-system", {"app.kubernetes.io/name": "collector"}, "10.16.1.3")
    stranger = Pod(ns, {"app": "anything-else"}, "10.16.1.4")
    copied_elsewhere = Pod("default", dict(r.head.labels), "10.16.1.5")  # a Ray label, in another namespace
    other_cluster = Pod(ns, {**r.worker.labels, "ray.io/cluster": "another-ray"}, "10.16.1.6")
    foreign_submitter = Pod(ns, {SUBMITTER_LABEL: "another-ray"}, "10.16.1.7")
    head, worker, submitter = r.head, r.worker, r.submitter
    table = [
        # Ray among its own pods: GCS, raylet, agent, the pinned worker ports, NCCL/TCPStore/vLLM ports.
        ("worker to GCS", worker, head, 6379, "TCP", True),
        ("head to a worker's agent", head, worker, 52365, "TCP", True),
        ("head to a Ray worker port (low end)", head, worker, 10002, "TCP", True),
        ("worker to a Ray worker port (high end)", worker, worker, 11000, "TCP", True),
        ("worker to vLLM HTTP (v0.7.0)", worker, worker, 11001, "TCP", True),
        ("worker to the TCPStore (v0.7.0)", worker, worker, 25000, "TCP", True),
        ("worker to the TCPStore (v0.5.0, ephemeral)", worker, worker, 45000, "TCP", True),
        # Managed Prometheus: the metrics port of every Ray pod, nothing else.
        ("collector to the head's metrics", collector, head, 8080, "TCP", True),
        ("collector to a worker's metrics", collector, worker, 8080, "TCP", True),
        ("collector to a worker's agent", collector, worker, 52365, "TCP", False),
        ("collector to GCS", collector, head, 6379, "TCP", False),
        # The submitter: the Jobs API, Ray Client only with the autoscaler, DNS, the API server; nothing else.
        ("submitter to the Jobs API", submitter, head, 8265, "TCP", True),
        ("submitter to Ray Client", submitter, head, 10001, "TCP", r.autoscaling),
        ("submitter to DNS (UDP)", submitter, dns, 53, "UDP", True),
        ("submitter to DNS (TCP)", submitter, dns, 53, "TCP", True),
        ("submitter to the API server", submitter, r.api_server, 443, "TCP", True),
        ("submitter to GCS", submitter, head, 6379, "TCP", False),
        ("submitter to a worker", submitter, worker, 8265, "TCP", False),
        ("submitter to the internet", submitter, INTERNET, 443, "TCP", False),
        ("submitter to the metadata server", submitter, METADATA_WI, 988, "TCP", False),
        ("submitter to another pod", submitter, stranger, 8080, "TCP", False),
        # The Ray pods out: DNS, the metadata server (Workload Identity), the internet's HTTPS, the API server (head).
        ("worker to DNS", worker, dns, 53, "UDP", True),
        ("head to DNS", head, dns, 53, "UDP", True),
        ("worker to the metadata server (WI)", worker, METADATA_WI, 988, "TCP", True),
        ("worker to the metadata server", worker, METADATA, 80, "TCP", True),
        ("head to the metadata server (WI)", head, METADATA_WI, 988, "TCP", True),
        ("worker to the hub, nvcr.io, W&B", worker, INTERNET, 443, "TCP", True),
        ("head to the hub, nvcr.io, W&B", head, INTERNET, 443, "TCP", True),
        ("head's autoscaler to the API server", head, r.api_server, 443, "TCP", True),
        ("worker to the API server", worker, r.api_server, 443, "TCP", False),
        ("worker to the internet on HTTP", worker, INTERNET, 80, "TCP", False),
        ("head to the internet on SSH", head, INTERNET, 22, "TCP", False),
        ("head to a node's SSH", head, r.node, 22, "TCP", False),
        ("worker to another pod of the namespace", worker, stranger, 8080, "TCP", False),
        ("worker to another Ray cluster", worker, other_cluster, 6379, "TCP", False),
        ("worker to a pod of another namespace", worker, copied_elsewhere, 6379, "TCP", False),
        # Foreign pods in: refused on every Ray port.
        ("a pod of the namespace to GCS", stranger, head, 6379, "TCP", False),
        ("a pod of the namespace to a worker's metrics", stranger, worker, 8080, "TCP", False),
        ("another namespace's pod with the Ray label", copied_elsewhere, worker, 10002, "TCP", False),
        ("another Ray cluster to the head", other_cluster, head, 6379, "TCP", False),
        ("another cluster's submitter to the Jobs API", foreign_submitter, head, 8265, "TCP", False),
    ]
    return table


def test_every_needed_flow_is_allowed_and_every_foreign_one_refused(rendered: Rendered):
    wrong = [
        f"{what}: {'refused' if expected else 'allowed'}, should be {'allowed' if expected else 'refused'}"
        for what, source, destination, port, protocol, expected in flows(rendered)
        if allowed(rendered.policies, source, destination, port, protocol) != expected
    ]
    assert not wrong, "\n".join(wrong)


def test_every_ray_pod_and_the_submitter_have_egress_policies(rendered: Rendered):
    """Without the egress policies every flow out would be open: the refusals above are the policies' doing."""
    without_egress = [
        {**p, "spec": {**p["spec"], "policyTypes": [t for t in p["spec"]["policyTypes"] if t != "Egress"]}}
        for p in rendered.policies
    ]
    for source in (rendered.head, rendered.worker, rendered.submitter):
        assert allowed(without_egress, source, INTERNET, 22)
        assert not allowed(rendered.policies, source, INTERNET, 22)


def test_the_stacks_cover_both_ray_client_cases(rendered: Rendered):
    """dev (flex-start) runs the autoscaler, so Ray Client is open to the submitter; h200 (a reservation) does not."""
    assert rendered.autoscaling == (rendered.infra.outputs["rayClusterName"] == "nemo-rl-dev-ray")
