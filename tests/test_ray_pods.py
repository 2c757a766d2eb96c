"""The Ray pods as they will run: the infra program's Helm values rendered by the real ray-cluster chart (1.5.1,
../shared/reference) and turned into the Pods KubeRay creates (tools/ray_pods.py). Held to them: the NetworkPolicies'
selectors, the Pod Security level of the namespace, Ray's token on every Ray process, the service accounts and the
container hardening. The submitter's pod comes from the job program, fed the same infra outputs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import ROOT
from netpol import selects
from pod_security_rules import LEVELS, strictest_level, violations
from upstream import reference

from tools import plan_run, ray_pods, render
from workloads.network_policy import (
    RayPoliciesArgs,
    cluster_policy_spec,
    head_policy_spec,
    prometheus_selector,
)
from workloads.pod_security import AUDIT_LEVEL, ENFORCE_LEVEL, WARN_LEVEL
from workloads.ray_values import CLIENT_PORT, DASHBOARD_PORT, METRICS_PORT

RELEASE = "kubernetes:helm.sh/v3:Release"
V070 = "nvcr.io/nvidia/nemo-rl:v0.7.0"
# (stack, overrides): the default image and v0.7.0's, with and without the autoscaler.
CASES = {
    "dev": ("dev", {}),
    "h200": ("h200", {}),
    "dev-v0.7.0": ("dev", {"nemoRlImage": V070}),
    "h200-v0.7.0": ("h200", {"nemoRlImage": V070}),
}


class Cluster:
    def __init__(self, stack: str, overrides: dict[str, Any]) -> None:
        reference("kuberay-v1.5.1")  # skips (fails under CI) without the chart
        # Both programs, as `make plan` runs them: the submitter's pod comes from the job program on these outputs.
        self.plan = plan_run.run_plan(stack, infra_overrides=[f"{key}={value}" for key, value in overrides.items()])
        self.run = self.plan.infra
        (job,) = [r for r in self.plan.jobs.resources if r.type == "kubernetes:batch/v1:Job"]
        self.submitter = job.inputs["spec"]["template"]
        release = self.run.one(RELEASE).inputs
        self.namespace = release["namespace"]
        self.cluster = ray_pods.render_raycluster(
            render._number(release["values"]), release["name"], self.namespace, ray_pods.CHART_DIR
        )
        self.pods = ray_pods.ray_pods(self.cluster)
        self.name = self.cluster["metadata"]["name"]
        self.args = RayPoliciesArgs(
            self.namespace, self.name, DASHBOARD_PORT, CLIENT_PORT, METRICS_PORT, ("10.0.0.0/20",)
        )
        self.auth_secret = self.run.outputs["rayAuthSecret"]

    @property
    def head(self) -> dict[str, Any]:
        (head,) = [p for p in self.pods if p["metadata"]["labels"]["ray.io/node-type"] == "head"]
        return head

    @property
    def workers(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]


@pytest.fixture(scope="module", params=sorted(CASES))
def cluster(request: pytest.FixtureRequest) -> Cluster:
    stack, overrides = CASES[request.param]
    return Cluster(stack, overrides)


def admitted(policies: list[dict[str, Any]], target: dict[str, str], source: dict[str, str], port: int) -> bool:
    """Would a pod labelled `source`, in the same namespace, reach `port` on a pod labelled `target`? (Pods no
    policy selects are open; selected ones accept what any selecting policy's rule admits.)"""
    selecting = [p for p in policies if selects(p["podSelector"], target)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy.get("ingress") or []:
            ports = [p["port"] for p in rule.get("ports") or []]
            if ports and port not in ports:
                continue
            for peer in rule.get("from") or []:
                if "namespaceSelector" not in peer and selects(peer["podSelector"], source):
                    return True
    return False


def test_the_chart_renders_a_head_and_the_gpu_workers(cluster: Cluster):
    assert [p["metadata"]["name"] for p in cluster.pods] == [
        f"{cluster.name}-head",
        f"{cluster.name}-gpu-workers-worker",
    ]
    assert {p["metadata"]["namespace"] for p in cluster.pods} == {"nemo-rl"}


def test_every_ray_pod_is_fenced_by_the_policies(cluster: Cluster):
    policies = [cluster_policy_spec(cluster.args), head_policy_spec(cluster.args)]
    head = cluster.head["metadata"]["labels"]
    workers = [w["metadata"]["labels"] for w in cluster.workers]
    submitter = cluster.submitter["metadata"]["labels"]
    stranger = {"app": "anything-else-in-the-namespace"}
    other_cluster = {**head, "ray.io/cluster": "another-ray"}
    for target in [head, *workers]:
        assert selects(cluster_policy_spec(cluster.args)["podSelector"], target)
        for source in [head, *workers]:  # the cluster's own pods reach each other on any port
            assert admitted(policies, target, source, 6379) and admitted(policies, target, source, 52365)
        for port in (6379, 8265, 10001, 52365, 8080):
            assert not admitted(policies, target, stranger, port), (target, port)
            assert not admitted(policies, target, other_cluster, port), (target, port)
    # The submitter reaches the head's Jobs API and Ray Client ports, and nothing else of the cluster.
    assert admitted(policies, head, submitter, DASHBOARD_PORT) and admitted(policies, head, submitter, CLIENT_PORT)
    assert not admitted(policies, head, submitter, 6379) and not admitted(policies, head, submitter, METRICS_PORT)
    for worker in workers:
        assert not selects(head_policy_spec(cluster.args)["podSelector"], worker)
        assert not any(admitted(policies, worker, submitter, p) for p in (DASHBOARD_PORT, 52365, 6379))


def test_managed_prometheus_reaches_every_ray_pods_metrics_port_only():
    rule = next(
        r
        for r in cluster_policy_spec(RayPoliciesArgs("ns", "c", 1, 2, 3, ("10.0.0.0/20",)))["ingress"]
        if "namespaceSelector" in r["from"][0]
    )
    assert rule == {"from": [{"namespaceSelector": prometheus_selector()}], "ports": [{"protocol": "TCP", "port": 3}]}
    assert selects(prometheus_selector(), {"kubernetes.io/metadata.name": "gmp-system"})


def test_the_fence_check_is_real(cluster: Cluster):
    """Without the cluster policy the workers would be open to any pod: the check above can fail."""
    only_head = [head_policy_spec(cluster.args)]
    assert admitted(only_head, cluster.workers[0]["metadata"]["labels"], {"app": "x"}, 52365)


def test_the_namespace_level_is_the_strictest_every_workload_allows(cluster: Cluster):
    levels = {p["metadata"]["name"]: strictest_level(p["spec"]) for p in cluster.pods}
    levels["submitter"] = strictest_level(cluster.submitter["spec"])
    # Anything else the stack runs in the namespace (TensorBoard) counts too.
    for deployment in cluster.run.of_type("kubernetes:apps/v1:Deployment"):
        assert deployment.inputs["metadata"]["namespace"] == cluster.namespace
        levels[deployment.name] = strictest_level(deployment.inputs["spec"]["template"]["spec"])
        assert levels[deployment.name] != "privileged", violations(
            deployment.inputs["spec"]["template"]["spec"], "baseline"
        )
    assert levels[f"{cluster.name}-head"] == "baseline"
    assert levels["submitter"] == "baseline"
    # The workers need Privileged for their two read-only hostPath volumes, and nothing else.
    for worker in cluster.workers:
        assert levels[worker["metadata"]["name"]] == "privileged"
        reasons = violations(worker["spec"], "baseline")
        assert reasons and all(r.startswith("hostPath volume") for r in reasons), reasons
        host_mounts = {
            m["mountPath"]: m.get("readOnly")
            for c in worker["spec"]["containers"]
            for m in c.get("volumeMounts", [])
            if m["name"] in {v["name"] for v in worker["spec"]["volumes"] if "hostPath" in v}
        }
        assert host_mounts and all(host_mounts.values()), host_mounts
    strictest_allowed = min(levels.values(), key=LEVELS.index)
    assert strictest_allowed == ENFORCE_LEVEL
    # audit and warn one step stricter: exactly the known exception shows, and anything new with it.
    assert AUDIT_LEVEL == WARN_LEVEL == "baseline"


def test_token_auth_reaches_every_ray_process(cluster: Cluster):
    """v0.7.0: the Ray containers, KubeRay's autoscaler and its wait-gcs-ready init container (which runs
    `ray health-check`, refused without the token: test_ray_token_auth.py) all read the token from the Secret."""
    containers = [c for p in cluster.pods for c in [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]]
    ray_clients = [c for c in containers if c["name"] in ("ray-head", "ray-worker", "autoscaler", "wait-gcs-ready")]
    names = {c["name"] for c in ray_clients}
    assert {"ray-head", "ray-worker", "wait-gcs-ready"} <= names
    assert ("autoscaler" in names) == bool(cluster.cluster["spec"].get("enableInTreeAutoscaling"))
    for container in ray_clients:
        env = {e["name"]: e for e in container.get("env", [])}
        if cluster.auth_secret is None:
            assert "RAY_AUTH_MODE" not in env and "RAY_AUTH_TOKEN" not in env
            continue
        assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, container["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {
            "secretKeyRef": {"name": cluster.auth_secret, "key": "RAY_AUTH_TOKEN"}
        }, container["name"]
    assert "fluent-bit" not in names  # the log shipper talks to no Ray process: it gets no token
    for container in containers:
        if container["name"] == "fluent-bit":
            assert "RAY_AUTH_TOKEN" not in {e["name"] for e in container.get("env", [])}


def test_service_accounts_and_kubernetes_tokens(cluster: Cluster):
    prefix = cluster.name.removesuffix("-ray")
    assert cluster.head["spec"]["serviceAccountName"] == "generic-ksa"
    for worker in cluster.workers:
        assert worker["spec"]["serviceAccountName"] == f"{prefix}-ray-worker"
        assert not any("projected" in v for v in worker["spec"]["volumes"])
    # Only the autoscaler mounts the head account's token, where Kubernetes clients read it.
    mounts = {
        c["name"]: [m for m in c.get("volumeMounts", []) if m["mountPath"].startswith("/var/run/secrets/kubernetes.io")]
        for c in cluster.head["spec"]["containers"]
    }
    autoscaling = bool(cluster.cluster["spec"].get("enableInTreeAutoscaling"))
    assert {name for name, found in mounts.items() if found} == ({"autoscaler"} if autoscaling else set())
    projected = [v for v in cluster.head["spec"]["volumes"] if "projected" in v]
    assert len(projected) == (1 if autoscaling else 0)


def test_every_container_is_hardened(cluster: Cluster):
    for pod in cluster.pods:
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            context = container.get("securityContext") or {}
            assert context.get("allowPrivilegeEscalation") is False, (pod["metadata"]["name"], container["name"])
            assert not context.get("privileged") and not (context.get("capabilities") or {}).get("add")
            if container["name"] in ("fluent-bit", "autoscaler"):
                assert context["capabilities"]["drop"] == ["ALL"]
            if container["name"] == "fluent-bit":  # the distroless base's nonroot user
                assert context["runAsNonRoot"] is True and context["runAsUser"] == context["runAsGroup"] == 65532
            elif container["name"] != "autoscaler":  # Ray containers; wait-gcs-ready copies their context
                assert {"NET_RAW", "MKNOD"} <= set(context["capabilities"]["drop"]), container["name"]


def test_plan_writes_the_pods_checkov_scans():
    reference("kuberay-v1.5.1")
    files = render.render_files(plan_run.run_plan("dev"))
    written = sorted(name for name in files if name.startswith(f"{render.RAY_PODS_DIR}/"))
    assert written == ["ray-pods/nemo-rl-dev-ray-gpu-workers-worker.yaml", "ray-pods/nemo-rl-dev-ray-head.yaml"]
    head = yaml.safe_load(files["ray-pods/nemo-rl-dev-ray-head.yaml"])
    assert head["kind"] == "Pod" and head["metadata"]["labels"]["ray.io/node-type"] == "head"
    assert (ROOT / "tests" / "golden" / "dev" / "ray-pods").is_dir()
