"""The pod admission policies (workloads/admission_policy.py): rendered as the plan deploys them, valid for the
cluster's Kubernetes, and every CEL rule evaluated (cel-python) on the Ray pods the real chart renders (the golden
plans' ray-pods/, held to the chart by tests/test_plan.py), on the submitter Job's and TensorBoard's pods (they pass,
created by the identities that create them on the cluster) and on crafted pods (each refused by its rule alone)."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from conftest import ROOT

from workloads import admission_policy as ap
from workloads.network_policy import CLUSTER_LABEL, SUBMITTER_LABEL
from workloads.ray_values import GIB_HOST_DIR, NVIDIA_DIR, NVIDIA_HOST_DIR, VOLUME_GIB, VOLUME_NVIDIA

GOLDEN = ROOT / "tests" / "golden"
STACKS = sorted(path.name for path in GOLDEN.iterdir() if (path / "manifests").is_dir())
OPERATOR = "system:serviceaccount:example:ray-operator"  # stands in for the operator's (unknown) name
USER = "alice@example.com"
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
ENV = celpy.Environment()


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
) -> list[str]:
    """The messages of the validations `pod` fails, as the API server would evaluate them."""
    activation = {
        "object": celpy.json_to_cel(pod),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation, "userInfo": {"username": username}}),
    }
    messages = []
    for validation in validations:
        result = ENV.program(ENV.compile(validation["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            if "messageExpression" in validation:
                messages.append(str(ENV.program(ENV.compile(validation["messageExpression"])).evaluate(activation)))
            else:
                messages.append(validation["message"])
    return messages


def all_validations(operator_usernames: tuple[str, ...] = (OPERATOR,)) -> list[dict[str, str]]:
    objects = ap.admission_objects("nemo-rl-h200", "nemo-rl", operator_usernames)
    return [v for policy in of_kind(objects, "ValidatingAdmissionPolicy") for v in policy["spec"]["validations"]]


@pytest.mark.parametrize("stack", STACKS)
def test_the_plan_deploys_the_policies_bound_to_the_ray_namespace(stack: str):
    objects = manifests(stack)
    (namespace,) = {
        obj["metadata"]["namespace"] for obj in of_kind(objects, "NetworkPolicy") if "ray" in obj["metadata"]["name"]
    }
    policies, bindings = (
        of_kind(objects, "ValidatingAdmissionPolicy"),
        of_kind(objects, "ValidatingAdmissionPolicyBinding"),
    )
    prefix = policies[0]["metadata"]["name"].removesuffix("-pod-fence").removesuffix("-ray-pod-label")
    # What the plan holds is what the builder makes (the tests below evaluate the builder's rules).
    expected = ap.admission_objects(prefix, namespace)
    assert sorted(map(yaml.safe_dump, policies + bindings)) == sorted(map(yaml.safe_dump, expected))
    for policy in policies:
        assert policy["spec"]["failurePolicy"] == "Fail"
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule["resources"] == ["pods", "pods/ephemeralcontainers"] and rule["operations"] == ["CREATE", "UPDATE"]
    by_policy = {b["spec"]["policyName"]: b for b in bindings}
    assert set(by_policy) == {p["metadata"]["name"] for p in policies}
    for binding in bindings:
        assert binding["spec"]["matchResources"] == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
    fence, label = ap.policy_names(prefix)
    assert by_policy[fence]["spec"]["validationActions"] == ["Deny"]
    # The operator's identity is not known yet: the Ray label rule warns and audits, refusing nothing.
    assert ap.RAY_OPERATOR_USERNAMES == ()
    assert by_policy[label]["spec"]["validationActions"] == ["Warn", "Audit"]


def test_the_ray_label_rule_denies_once_the_operator_is_named():
    assert ap.label_actions((OPERATOR,)) == ["Deny"]
    assert ap.label_actions(()) == ["Warn", "Audit"]


def test_objects_validate_strictly_for_the_cluster_version():
    minor = yaml.safe_load((GOLDEN / "h200" / "outputs.json").read_text())["infra"]["kubernetesMinorVersion"]
    objects = ap.admission_objects("nemo-rl-h200", "nemo-rl")
    for obj in objects:
        kubernetes_validate.validate(obj, minor, strict=True)
    broken = copy.deepcopy(objects[1])
    broken["spec"]["validationActions"] = "Deny"  # a list in the schema
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, minor, strict=True)


@pytest.mark.parametrize("stack", STACKS)
def test_our_pods_pass_created_by_whom_creates_them(stack: str):
    validations = all_validations()
    pods = ray_pods(stack)
    assert {p["metadata"]["labels"]["ray.io/node-type"] for p in pods} == {"head", "worker"}
    workers = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
    # The rules meet the workers' hostPath volumes: the real ones, not an empty case.
    assert sorted(v["hostPath"]["path"] for v in workers[0]["spec"]["volumes"] if "hostPath" in v) == sorted(
        ap.ALLOWED_HOST_PATHS
    )
    for pod in pods:
        assert refusals(validations, pod, OPERATOR) == [], pod["metadata"]["name"]
        # The kubelet's and the operator's updates of a running pod keep its labels.
        assert refusals(validations, pod, "system:node:gke-node", "UPDATE", pod) == []
    objects = manifests(stack)
    (job,) = of_kind(objects, "Job")
    submitter = pod_of(job["spec"]["template"])
    assert SUBMITTER_LABEL in submitter["metadata"]["labels"]
    assert refusals(validations, submitter, ap.JOB_CONTROLLER_USERNAME) == []
    for deployment in of_kind(objects, "Deployment"):  # TensorBoard
        assert refusals(validations, pod_of(deployment["spec"]["template"]), REPLICASET_CONTROLLER) == []


def _worker() -> dict[str, Any]:
    (worker,) = [p for p in ray_pods("h200") if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
    return worker


def _plain(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy without KubeRay's labels, as a user would write it."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["labels"] = {"app": "mine"}
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


def _labelled(label: str, value: str) -> dict[str, Any]:
    pod = _plain(_worker())
    pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if "hostPath" not in v]
    for container in pod["spec"]["containers"]:
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts", []) if m["name"] not in (VOLUME_NVIDIA, VOLUME_GIB)
        ]
    pod["metadata"]["labels"][label] = value
    return pod


def test_a_copied_ray_cluster_label_is_refused_to_a_user():
    pod = _labelled(CLUSTER_LABEL, "nemo-rl-h200-ray")
    assert refusals(all_validations(), pod, USER) == [
        f"label {CLUSTER_LABEL} is set only by the KubeRay operator, not by {USER}"
    ]
    assert refusals(all_validations(), pod, OPERATOR) == []
    # With no operator named (today), the rule fails for every creator: warned and audited with the creator's name.
    assert refusals(all_validations(()), pod, OPERATOR) == [
        f"label {CLUSTER_LABEL} is set only by the KubeRay operator, not by {OPERATOR}"
    ]


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
    assert refusals(all_validations(), old, USER, "UPDATE", old) == []
    assert len(refusals(all_validations(), old, USER, "UPDATE", unlabelled)) == 1
    changed = _labelled(label, "another")
    assert len(refusals(all_validations(), changed, USER, "UPDATE", old)) == 1
