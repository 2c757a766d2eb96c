"""The pod admission policies (workloads/admission_policy.py): rendered as the plan deploys them, valid for the
cluster's Kubernetes, and every CEL rule evaluated (cel-python) on the Ray pods the real chart renders (the golden
plans' ray-pods/, held to the chart by tests/test_plan.py), on the submitter Job's and TensorBoard's pods (they pass,
created by the identities that create them on the cluster) and on crafted pods (each refused by its rule alone).
The API server's authorizer, which the Ray label rule asks, is stood in for by a table of granted rights."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes
from conftest import ROOT

from workloads import admission_policy as ap
from workloads.network_policy import CLUSTER_LABEL, SUBMITTER_LABEL
from workloads.nics import extra_nics
from workloads.ray_values import GIB_HOST_DIR, NVIDIA_DIR, NVIDIA_HOST_DIR, VOLUME_GIB, VOLUME_NVIDIA

GOLDEN = ROOT / "tests" / "golden"
STACKS = sorted(path.name for path in GOLDEN.iterdir() if (path / "manifests").is_dir())
NAMESPACE = "nemo-rl"
RAY_CLUSTER = "nemo-rl-h200-ray"
NETWORKS = tuple(nic.network for nic in extra_nics())
OPERATOR = "system:serviceaccount:example:ray-operator"  # stands in for the operator's (unpublished) name
USER = "alice@example.com"
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
# The head's service account: KubeRay's autoscaler Role lets it patch pods and the RayCluster, not update it.
AUTOSCALER = f"system:serviceaccount:{NAMESPACE}:generic-ksa"
ENV = celpy.Environment()


@dataclass(frozen=True)
class Grant:
    user: str
    verb: str
    name: str = RAY_CLUSTER
    namespace: str = NAMESPACE
    group: str = "ray.io"
    resource: str = "rayclusters"


# Who may do what to RayClusters, as RBAC would say: the operator updates them (its role), the autoscaler patches.
GRANTS = (Grant(OPERATOR, "update"), Grant(OPERATOR, "patch"), Grant(AUTOSCALER, "patch"))


@dataclass(frozen=True)
class Authorizer:
    """The API server's `authorizer` CEL variable for one user: group(..).resource(..)...check(verb).allowed()."""

    user: str
    grants: tuple[Grant, ...]
    query: dict[str, str] = field(default_factory=dict)

    def with_(self, key: str, value: Any) -> Authorizer:
        return Authorizer(self.user, self.grants, {**self.query, key: str(value)})

    def allowed(self) -> bool:
        q = self.query
        want = Grant(self.user, q["verb"], q.get("name", ""), q.get("namespace", ""), q["group"], q["resource"])
        return "subresource" not in q and want in self.grants


def _builder(key: str):
    return lambda authorizer, value: authorizer.with_(key, value)


AUTHORIZER_FUNCTIONS = {
    **{key: _builder(key) for key in ("group", "resource", "subresource", "namespace", "name")},
    "check": _builder("verb"),
    "allowed": lambda authorizer: celtypes.BoolType(authorizer.allowed()),
}


def manifests(stack: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in sorted((GOLDEN / stack / "manifests").glob("*.yaml"))]


def ray_pods(stack: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in sorted((GOLDEN / stack / "ray-pods").glob("*.yaml"))]


def pod_of(template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def refusals(
    validations: list[dict[str, str]],
    pod: dict[str, Any],
    username: str,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    namespace: str = NAMESPACE,
    grants: tuple[Grant, ...] = GRANTS,
) -> list[str]:
    """The messages of the validations `pod` fails, as the API server would evaluate them."""
    # The authorizer is a plain object the stand-in functions take apart (celpy's types do not name it).
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(pod),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(
            {"operation": operation, "namespace": namespace, "userInfo": {"username": username}}
        ),
        "authorizer": Authorizer(username, grants),
    }
    messages = []
    for validation in validations:
        program = ENV.program(ENV.compile(validation["expression"]), functions=AUTHORIZER_FUNCTIONS)
        result = program.evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            if "messageExpression" in validation:
                messages.append(str(ENV.program(ENV.compile(validation["messageExpression"])).evaluate(activation)))
            else:
                messages.append(validation["message"])
    return messages


def objects_for_h200() -> list[dict[str, Any]]:
    return ap.admission_objects("nemo-rl-h200", NAMESPACE, RAY_CLUSTER, NETWORKS)


def validations_of(name: str) -> list[dict[str, str]]:
    (policy,) = [
        o for o in objects_for_h200() if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    ]
    return policy["spec"]["validations"]


NAMES = ap.policy_names("nemo-rl-h200")


def all_validations() -> list[dict[str, str]]:
    """Every rule that meets a pod of the Ray namespace (the GPU networks' rule meets pods everywhere)."""
    return [v for name in (NAMES.fence, NAMES.ray_label, NAMES.gpu_networks) for v in validations_of(name)]


@pytest.mark.parametrize("stack", STACKS)
def test_the_plan_deploys_the_policies_bound_to_the_ray_namespace_and_the_cluster(stack: str):
    objects = manifests(stack)
    (namespace,) = {
        obj["metadata"]["namespace"] for obj in of_kind(objects, "NetworkPolicy") if "ray" in obj["metadata"]["name"]
    }
    (ray_cluster,) = {p["metadata"]["labels"][CLUSTER_LABEL] for p in ray_pods(stack)}
    # The networks the rule guards are the Network objects the plan creates, every one of them.
    networks = tuple(obj["metadata"]["name"] for obj in of_kind(objects, "Network"))
    assert len(networks) == 9
    policies, bindings = (
        of_kind(objects, "ValidatingAdmissionPolicy"),
        of_kind(objects, "ValidatingAdmissionPolicyBinding"),
    )
    (prefix,) = {
        p["metadata"]["name"].removesuffix("-pod-fence") for p in policies if "pod-fence" in p["metadata"]["name"]
    }
    # What the plan holds is what the builder makes (the tests below evaluate the builder's rules).
    expected = ap.admission_objects(prefix, namespace, ray_cluster, networks)
    assert sorted(map(yaml.safe_dump, policies + bindings)) == sorted(map(yaml.safe_dump, expected))
    names = ap.policy_names(prefix)
    by_name = {p["metadata"]["name"]: p for p in policies}
    assert set(by_name) == {names.fence, names.ray_label, names.gpu_networks}
    for name, policy in by_name.items():
        assert policy["spec"]["failurePolicy"] == "Fail"
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule["resources"] == ["pods", "pods/ephemeralcontainers"]
        assert rule["operations"] == (["CREATE"] if name == names.gpu_networks else ["CREATE", "UPDATE"])
    by_policy = {b["spec"]["policyName"]: b for b in bindings}
    assert set(by_policy) == set(by_name)
    for binding in bindings:
        # Every rule refuses, none only warns.
        assert binding["spec"]["validationActions"] == ["Deny"]
    for name in (names.fence, names.ray_label):
        assert by_policy[name]["spec"]["matchResources"] == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
    # The GPU networks' rule meets pods of every namespace.
    assert "matchResources" not in by_policy[names.gpu_networks]["spec"]


def test_objects_validate_strictly_for_the_cluster_version():
    minor = yaml.safe_load((GOLDEN / "h200" / "outputs.json").read_text())["infra"]["kubernetesMinorVersion"]
    objects = objects_for_h200()
    for obj in objects:
        kubernetes_validate.validate(obj, minor, strict=True)
    broken = copy.deepcopy(objects[1])
    broken["spec"]["validationActions"] = "Deny"  # a list in the schema
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, minor, strict=True)


@pytest.mark.parametrize("stack", STACKS)
def test_our_pods_pass_created_by_whom_creates_them(stack: str):
    objects = manifests(stack)
    # The rules as this stack's plan renders them, every policy's.
    validations = [v for policy in of_kind(objects, "ValidatingAdmissionPolicy") for v in policy["spec"]["validations"]]
    pods = ray_pods(stack)
    (cluster,) = {p["metadata"]["labels"][CLUSTER_LABEL] for p in pods}
    (namespace,) = {p["metadata"]["namespace"] for p in pods}
    grants = (Grant(OPERATOR, "update", cluster, namespace),)
    # The workers ask for the GPU networks: the rule that guards them meets a pod that names them.
    assert {
        n
        for p in pods
        for n in NETWORKS
        if f'"{n}"' in p["metadata"].get("annotations", {}).get(ap.INTERFACES_ANNOTATION, "")
    } == set(NETWORKS)
    assert {p["metadata"]["labels"]["ray.io/node-type"] for p in pods} == {"head", "worker"}
    workers = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
    # The rules meet the workers' hostPath volumes: the real ones, not an empty case.
    assert sorted(v["hostPath"]["path"] for v in workers[0]["spec"]["volumes"] if "hostPath" in v) == sorted(
        ap.ALLOWED_HOST_PATHS
    )
    for pod in pods:
        assert refusals(validations, pod, OPERATOR, namespace=namespace, grants=grants) == [], pod["metadata"]["name"]
        # The kubelet's and the operator's updates of a running pod keep its labels.
        assert refusals(validations, pod, "system:node:gke-node", "UPDATE", pod, namespace, ()) == []
    (job,) = of_kind(objects, "Job")
    submitter = pod_of(job["spec"]["template"])
    assert SUBMITTER_LABEL in submitter["metadata"]["labels"]
    assert refusals(validations, submitter, ap.JOB_CONTROLLER_USERNAME, namespace=namespace, grants=()) == []
    for deployment in of_kind(objects, "Deployment"):  # TensorBoard
        tensorboard = pod_of(deployment["spec"]["template"])
        assert refusals(validations, tensorboard, REPLICASET_CONTROLLER, namespace=namespace, grants=()) == []


def _worker() -> dict[str, Any]:
    (worker,) = [p for p in ray_pods("h200") if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
    return worker


def _plain(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy without KubeRay's labels, owner and the GPU networks, as a user would write it."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["labels"] = {"app": "mine"}
    pod["metadata"].pop("ownerReferences", None)
    pod["metadata"].pop("annotations", None)
    return pod


def _set(path: str, value: Any):
    def change(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = pod
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[last] = value

    return change


def _add_volume(path: str, read_only: bool):
    def change(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"].append({"name": "extra", "hostPath": {"path": path, "type": "Directory"}})
        pod["spec"]["containers"][0]["volumeMounts"].append(
            {"name": "extra", "mountPath": "/extra", "readOnly": read_only}
        )

    return change


def _writable_allowed_mount(pod: dict[str, Any]) -> None:
    for mount in pod["spec"]["containers"][0]["volumeMounts"]:
        if mount["mountPath"] == NVIDIA_DIR:
            mount["readOnly"] = False
            return
    raise AssertionError("the worker mounts the driver")


def _init(container: dict[str, Any]):
    return lambda pod: pod["spec"].setdefault("initContainers", []).append(container)


def _ephemeral(container: dict[str, Any]):
    return lambda pod: pod["spec"].setdefault("ephemeralContainers", []).append(container)


FENCE = "privileged containers are not allowed in this namespace"
CRAFTED = {
    "privileged container": (_set("spec.containers.0.securityContext.privileged", True), FENCE),
    "privileged init container": (_init({"name": "i", "image": "x", "securityContext": {"privileged": True}}), FENCE),
    "privileged ephemeral container": (
        _ephemeral({"name": "d", "image": "x", "securityContext": {"privileged": True}}),
        FENCE,
    ),
    "hostNetwork": (_set("spec.hostNetwork", True), "hostNetwork is not allowed in this namespace"),
    "hostPID": (_set("spec.hostPID", True), "hostPID is not allowed in this namespace"),
    "hostIPC": (_set("spec.hostIPC", True), "hostIPC is not allowed in this namespace"),
    "hostPort": (
        _set("spec.containers.0.ports", [{"containerPort": 8265, "hostPort": 8265}]),
        "hostPort is not allowed in this namespace",
    ),
    "hostPort on an init container": (
        _init({"name": "i", "image": "x", "ports": [{"containerPort": 1, "hostPort": 1}]}),
        "hostPort is not allowed in this namespace",
    ),
    "another hostPath": (
        _add_volume("/var/run", read_only=True),
        f"hostPath volumes may only be {NVIDIA_HOST_DIR} and {GIB_HOST_DIR}",
    ),
    "the driver's hostPath writable": (_writable_allowed_mount, "hostPath volumes must be mounted readOnly"),
    "an allowed hostPath writable in an init container": (
        _init({"name": "i", "image": "x", "volumeMounts": [{"name": VOLUME_NVIDIA, "mountPath": "/n"}]}),
        "hostPath volumes must be mounted readOnly",
    ),
    "an allowed hostPath writable in an ephemeral container": (
        _ephemeral(
            {"name": "d", "image": "x", "volumeMounts": [{"name": VOLUME_GIB, "mountPath": "/g", "readOnly": False}]}
        ),
        "hostPath volumes must be mounted readOnly",
    ),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_pods_are_refused_by_their_rule_alone(case: str):
    change, message = CRAFTED[case]
    for pod, username in ((_worker(), OPERATOR), (_plain(_worker()), USER)):
        volumes = {v["name"] for v in pod["spec"]["volumes"]}
        assert {VOLUME_NVIDIA, VOLUME_GIB} <= volumes  # the names the crafted mounts refer to
        change(pod)
        # Whoever creates it, the operator too.
        assert refusals(all_validations(), pod, username) == [message], username


def test_every_rule_refuses_one_crafted_pod():
    refused = {message for _, message in CRAFTED.values()}
    fence = [v for v in all_validations() if "message" in v]
    assert {v["message"] for v in fence} == refused


def _user_pod() -> dict[str, Any]:
    """A pod a user could write: the worker's, without its host directories."""
    pod = _plain(_worker())
    pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if "hostPath" not in v]
    for container in pod["spec"]["containers"]:
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts", []) if m["name"] not in (VOLUME_NVIDIA, VOLUME_GIB)
        ]
    return pod


def _labelled(label: str, value: str) -> dict[str, Any]:
    pod = _user_pod()
    pod["metadata"]["labels"][label] = value
    return pod


OWNER_MISSING = (
    f"label {CLUSTER_LABEL} is only for pods KubeRay creates for that RayCluster: a controller ownerReference to "
    f"ray.io/v1 RayCluster {RAY_CLUSTER} with blockOwnerDeletion is missing"
)


def not_updater(user: str) -> str:
    return (
        f"label {CLUSTER_LABEL}={RAY_CLUSTER} is set only by who may update the RayCluster {RAY_CLUSTER} in "
        f"{NAMESPACE}, not by {user}"
    )


def _owned(pod: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`pod` with KubeRay's controller reference to our RayCluster, as a forger would copy it (fields changed)."""
    pod = copy.deepcopy(pod)
    reference = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "name": RAY_CLUSTER,
        "uid": "4a1e6c1e-0000-4000-8000-000000000001",
        "controller": True,
        "blockOwnerDeletion": True,
        **changes,
    }
    pod["metadata"]["ownerReferences"] = [{k: v for k, v in reference.items() if v is not None}]
    return pod


def test_a_copied_ray_cluster_label_is_refused_to_a_user():
    pod = _labelled(CLUSTER_LABEL, RAY_CLUSTER)
    assert refusals(all_validations(), pod, USER) == [OWNER_MISSING, not_updater(USER)]
    # Without KubeRay's reference, not even the operator may label a pod.
    assert refusals(all_validations(), pod, OPERATOR) == [OWNER_MISSING]


def test_a_forged_owner_reference_does_not_pass_without_the_right_to_update_the_raycluster():
    forged = _owned(_labelled(CLUSTER_LABEL, RAY_CLUSTER))
    assert refusals(all_validations(), forged, USER) == [not_updater(USER)]
    # The autoscaler's account may patch the RayCluster, not update it.
    assert refusals(all_validations(), forged, AUTOSCALER) == [not_updater(AUTOSCALER)]
    # Who may update the RayCluster passes (docs/security.md: they could have KubeRay make any pod for it anyway).
    assert refusals(all_validations(), forged, USER, grants=(Grant(USER, "update"),)) == []
    # A right on another RayCluster, or in another namespace, is not this one.
    for grant in (Grant(USER, "update", name="other-ray"), Grant(USER, "update", namespace="other")):
        assert refusals(all_validations(), forged, USER, grants=(grant,)) == [not_updater(USER)]


@pytest.mark.parametrize(
    "changes",
    [
        {"controller": None},
        {"controller": False},
        {"blockOwnerDeletion": None},
        {"name": "other-ray"},
        {"kind": "ReplicaSet", "apiVersion": "apps/v1"},
        {"apiVersion": "ray.io/v1alpha1"},
    ],
    ids=["no-controller", "not-controller", "no-block", "other-cluster", "replicaset", "old-api"],
)
def test_only_kubernetes_own_shape_of_the_reference_passes(changes: dict[str, Any]):
    pod = _owned(_labelled(CLUSTER_LABEL, RAY_CLUSTER), **changes)
    # Created by the operator, who may update the RayCluster: refused for the reference alone.
    assert refusals(all_validations(), pod, OPERATOR) == [OWNER_MISSING]


def test_a_workload_controller_cannot_make_ray_pods():
    """A Deployment, Job or other workload whose template copies the label: its controller owns the pod."""
    pod = _owned(_labelled(CLUSTER_LABEL, RAY_CLUSTER), kind="ReplicaSet", apiVersion="apps/v1", name="rs")
    assert refusals(all_validations(), pod, REPLICASET_CONTROLLER) == [
        OWNER_MISSING,
        not_updater(REPLICASET_CONTROLLER),
    ]


def test_relabelling_a_running_pod_into_the_cluster_is_refused():
    old = _user_pod()
    new = _owned(old)
    new["metadata"]["labels"][CLUSTER_LABEL] = RAY_CLUSTER
    # The autoscaler's account may patch pods: adding the label and a reference is refused all the same.
    assert refusals(all_validations(), new, AUTOSCALER, "UPDATE", old) == [not_updater(AUTOSCALER)]


def test_a_copied_submitter_label_is_refused_to_a_user():
    pod = _labelled(SUBMITTER_LABEL, "nemo-rl-h200-ray")
    message = f"label {SUBMITTER_LABEL} is set only by the Job controller on the submitter Job pods, not by "
    assert refusals(all_validations(), pod, USER) == [message + USER]
    assert refusals(all_validations(), pod, OPERATOR) == [message + OPERATOR]
    assert refusals(all_validations(), pod, ap.JOB_CONTROLLER_USERNAME) == []


@pytest.mark.parametrize("label", [CLUSTER_LABEL, SUBMITTER_LABEL])
def test_a_label_may_be_kept_through_an_update_but_not_added_or_changed(label: str):
    old = _labelled(label, "nemo-rl-h200-ray")
    unlabelled = _plain(old)
    # Each label's own rules refuse it: one for the submitter label, two (reference, right) for ray.io/cluster.
    rules = 2 if label == CLUSTER_LABEL else 1
    assert refusals(all_validations(), old, USER, "UPDATE", old) == []
    assert len(refusals(all_validations(), old, USER, "UPDATE", unlabelled)) == rules
    changed = _labelled(label, "another")
    assert len(refusals(all_validations(), changed, USER, "UPDATE", old)) == rules


def _networked(interfaces: Any, namespace_labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = _user_pod()
    if namespace_labels:
        pod["metadata"]["labels"].update(namespace_labels)
    pod["metadata"]["annotations"] = {
        "networking.gke.io/default-interface": "eth0",
        ap.INTERFACES_ANNOTATION: interfaces if isinstance(interfaces, str) else json.dumps(interfaces),
    }
    return pod


def networks_refused(user: str, namespace: str) -> str:
    return (
        f"the networks {', '.join(NETWORKS)} (annotation {ap.INTERFACES_ANNOTATION}, in which a backslash counts as "
        f"naming them) are only for the pods of RayCluster {RAY_CLUSTER} in namespace {NAMESPACE}; refused to {user} "
        f"in namespace {namespace}"
    )


def test_the_ray_workers_alone_get_the_gpu_networks():
    rule = validations_of(NAMES.gpu_networks)
    worker = _worker()
    assert refusals(rule, worker, OPERATOR) == []
    # The same pod in another namespace (the Network objects are cluster-scoped): refused, whoever creates it.
    for user in (USER, OPERATOR, REPLICASET_CONTROLLER):
        assert refusals(rule, worker, user, namespace="team-b") == [networks_refused(user, "team-b")]
    # In the Ray namespace, only with our RayCluster's label (which the label rules hold to KubeRay's pods).
    for labels in (None, {CLUSTER_LABEL: "other-ray"}):
        pod = _networked(json.loads(worker["metadata"]["annotations"][ap.INTERFACES_ANNOTATION]), labels)
        assert refusals(rule, pod, USER) == [networks_refused(USER, NAMESPACE)]


@pytest.mark.parametrize(
    "interfaces",
    [
        [{"interfaceName": "eth0", "network": "default"}, {"interfaceName": "eth1", "network": "rdma-3"}],
        '[{"interfaceName":"eth1","network":"gvnic-1"}]',  # no spaces
        '[{"interfaceName":"eth1",\n "network" :\t"rdma-7"}]',  # odd spacing
        '[{"interfaceName":"eth1","network":"rdma\\u002d0"}]',  # a JSON escape spelling rdma-0
        '[{"interfaceName":"eth1","netw\\u006frk":"gvnic-1"}]',  # an escaped key
    ],
    ids=["one-rdma-nic", "compact", "spacing", "escaped-name", "escaped-key"],
)
def test_a_pod_elsewhere_cannot_name_a_gpu_network_in_any_spelling(interfaces: Any):
    pod = _networked(interfaces)
    assert refusals(validations_of(NAMES.gpu_networks), pod, USER, namespace="team-b") == [
        networks_refused(USER, "team-b")
    ]


def test_other_pods_and_other_networks_pass_everywhere():
    rule = validations_of(NAMES.gpu_networks)
    other = _networked(
        [{"interfaceName": "eth1", "network": "blue-net"}, {"interfaceName": "eth2", "network": "rdma-10"}]
    )
    for namespace in ("team-b", NAMESPACE):
        assert refusals(rule, other, USER, namespace=namespace) == []
        assert refusals(rule, _user_pod(), USER, namespace=namespace) == []  # no annotation at all
    head = next(p for p in ray_pods("h200") if p["metadata"]["labels"]["ray.io/node-type"] == "head")
    assert refusals(rule, head, OPERATOR) == []


def test_network_names_must_be_object_names():
    with pytest.raises(ValueError, match="not a Kubernetes object name"):
        ap.network_names_pattern(("rdma-0", "rdma|.*"))
    with pytest.raises(ValueError, match="at least one Network"):
        ap.gpu_network_validation(NAMESPACE, RAY_CLUSTER, ())
