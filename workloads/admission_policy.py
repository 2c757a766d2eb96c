"""Admission for pods in the Ray namespace, by what a pod claims: a ValidatingAdmissionPolicy (admissionregistration
v1, GA since Kubernetes 1.30) and its binding, scoped to the namespace.

Pod Security stays at `enforce: privileged` there (workloads/pod_security.py: the GPU workers' two hostPath volumes
are beyond Baseline). These policies are the finer fence inside it. A pod, whoever creates it (KubeRay's operator
too), may not:
- run a privileged container, or use the host's network, PID or IPC namespace, or a host port;
- mount a hostPath other than the two directories the GPU workers read (the node's NVIDIA driver and the gIB NCCL
  plugin), nor mount those writable.
And two labels are accepted only from the identity that sets them on our own pods:
- the submitter label (workloads/network_policy.py's SUBMITTER_LABEL) from the Job controller, which creates the
  submitter's pods from the job stack's Job;
- `ray.io/cluster`, which admits a pod into the Ray pods' NetworkPolicies, from KubeRay's operator.
A pod that already carries a label may keep it through an update (the kubelet and the operator patch running pods);
adding or changing one is a create as far as these rules go.

failurePolicy Fail: if the API server cannot evaluate a rule (a CEL error, a cost limit), the pod is refused, not let
through. validationActions Deny for the host rules and the submitter label: a refusal, with the rule's message, to
whoever created the pod (for the Ray pods, the operator: the RayCluster's events show it).

The KubeRay operator's identity on GKE is not published: GKE's RayOperator add-on "installs and hosts" the operator
(FACTS.md, GKE Ray Operator add-on; Google's "About Ray on GKE" page), and neither names the Kubernetes user it
creates pods as (the upstream kuberay-operator chart's `system:serviceaccount:<namespace>:kuberay-operator` is the
self-installed operator, which we do not install). So RAY_OPERATOR_USERNAMES is empty, and the `ray.io/cluster` rule
is bound apart, with validationActions Warn and Audit: it refuses nothing, and its message names the user that set
the label, in the API server's audit log. docs/security.md says how to read it off the first Ray pod's creation;
put it in RAY_OPERATOR_USERNAMES and the rule is bound with Deny like the others (label_actions). A wrong name in
Deny mode would refuse every Ray pod, so it is not guessed.

Every rule is a CEL expression built here from data; tests/test_admission_policy.py evaluates each one (cel-python)
on the pods the real ray-cluster chart renders, on the submitter Job's pod, and on crafted pods it must refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from workloads.network_policy import CLUSTER_LABEL, SUBMITTER_LABEL
from workloads.ray_values import GIB_HOST_DIR, NVIDIA_HOST_DIR

API_VERSION = "admissionregistration.k8s.io/v1"
# The only hostPath directories a pod of the namespace may mount, read-only: the GPU workers' two.
ALLOWED_HOST_PATHS = (NVIDIA_HOST_DIR, GIB_HOST_DIR)
# kube-controller-manager runs each controller as its own service account (--use-service-account-credentials):
# the Job controller creates a Job's pods as this user.
JOB_CONTROLLER_USERNAME = "system:serviceaccount:kube-system:job-controller"
# Who creates the Ray pods: unknown for GKE's hosted KubeRay (module docstring); read it from the audit log
# (docs/security.md) and add it here.
RAY_OPERATOR_USERNAMES: tuple[str, ...] = ()
FAILURE_POLICY = "Fail"
DENY = ["Deny"]
WARN_AND_AUDIT = ["Warn", "Audit"]
# Where container-level rules apply. Ephemeral containers (kubectl debug) come in through their own subresource.
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
POD_RESOURCES = ("pods", "pods/ephemeralcontainers")


@dataclass(frozen=True)
class Validation:
    expression: str
    message: str | None = None
    message_expression: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"expression": self.expression}
        if self.message is not None:
            out["message"] = self.message
        if self.message_expression is not None:
            out["messageExpression"] = self.message_expression
        return out


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


def _every_container(field: str, condition: str) -> str:
    """`condition` (over `c`) holds for every container of every kind the pod has."""
    return " && ".join(
        f"(!has(object.spec.{field_list}) || object.spec.{field_list}.all(c, {condition}))"
        if field_list != "containers"
        else f"object.spec.containers.all(c, {condition})"
        for field_list in CONTAINER_LISTS
        if field in ("*", field_list)
    )


def _unset_or_false(path: str, field: str) -> str:
    return f"(!has({path}.{field}) || {path}.{field} == false)"


def _label_kept_or_set_by(label: str, usernames: tuple[str, ...]) -> str:
    """The label is absent, unchanged by this update, or set by one of `usernames`."""
    labels, old = "object.metadata.labels", "oldObject.metadata.labels"
    return (
        f"!has({labels}) || !('{label}' in {labels}) "
        f"|| request.userInfo.username in {_cel_list(usernames)} "
        f"|| (request.operation == 'UPDATE' && has({old}) && '{label}' in {old} "
        f"&& {old}['{label}'] == {labels}['{label}'])"
    )


def host_validations() -> list[Validation]:
    """No privilege, no host namespace or port, hostPath only the GPU workers' two directories, read-only."""
    host_path_volume = "object.spec.volumes.exists(v, v.name == m.name && has(v.hostPath))"
    return [
        Validation(
            _every_container("*", f"!has(c.securityContext) || {_unset_or_false('c.securityContext', 'privileged')}"),
            message="privileged containers are not allowed in this namespace",
        ),
        Validation(
            _unset_or_false("object.spec", "hostNetwork"), message="hostNetwork is not allowed in this namespace"
        ),
        Validation(_unset_or_false("object.spec", "hostPID"), message="hostPID is not allowed in this namespace"),
        Validation(_unset_or_false("object.spec", "hostIPC"), message="hostIPC is not allowed in this namespace"),
        Validation(
            # Ephemeral containers may not declare ports at all (API validation).
            " && ".join(
                _every_container(kind, "!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)")
                for kind in ("containers", "initContainers")
            ),
            message="hostPort is not allowed in this namespace",
        ),
        Validation(
            "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || v.hostPath.path in "
            f"{_cel_list(ALLOWED_HOST_PATHS)})",
            message=f"hostPath volumes may only be {' and '.join(ALLOWED_HOST_PATHS)}",
        ),
        Validation(
            _every_container(
                "*",
                "!has(c.volumeMounts) || c.volumeMounts.all(m, !has(object.spec.volumes) "
                f"|| !{host_path_volume} || (has(m.readOnly) && m.readOnly == true))",
            ),
            message="hostPath volumes must be mounted readOnly",
        ),
    ]


def submitter_label_validation() -> Validation:
    return Validation(
        _label_kept_or_set_by(SUBMITTER_LABEL, (JOB_CONTROLLER_USERNAME,)),
        message_expression=(
            f"'label {SUBMITTER_LABEL} is set only by the Job controller on the submitter Job pods, not by ' "
            "+ request.userInfo.username"
        ),
    )


def ray_label_validation(operator_usernames: tuple[str, ...]) -> Validation:
    return Validation(
        _label_kept_or_set_by(CLUSTER_LABEL, operator_usernames),
        message_expression=(
            f"'label {CLUSTER_LABEL} is set only by the KubeRay operator, not by ' + request.userInfo.username"
        ),
    )


def label_actions(operator_usernames: tuple[str, ...]) -> list[str]:
    """Deny once the operator's identity is known; until then warn and audit (module docstring)."""
    return DENY if operator_usernames else WARN_AND_AUDIT


def policy_body(name: str, validations: list[Validation]) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy over pod creates and updates (the namespace is chosen by its binding)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": FAILURE_POLICY,
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": list(POD_RESOURCES),
                    }
                ]
            },
            "validations": [validation.as_dict() for validation in validations],
        },
    }


def binding_body(name: str, policy_name: str, namespace: str, actions: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": policy_name,
            "validationActions": actions,
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            },
        },
    }


def policy_names(prefix: str) -> tuple[str, str]:
    """(host and submitter rules, Ray label rule)."""
    return f"{prefix}-pod-fence", f"{prefix}-ray-pod-label"


def admission_objects(
    prefix: str, namespace: str, operator_usernames: tuple[str, ...] = RAY_OPERATOR_USERNAMES
) -> list[dict[str, Any]]:
    """The two policies and their bindings (the Ray label's apart: its actions depend on what is known)."""
    fence, label = policy_names(prefix)
    return [
        policy_body(fence, [*host_validations(), submitter_label_validation()]),
        binding_body(fence, fence, namespace, DENY),
        policy_body(label, [ray_label_validation(operator_usernames)]),
        binding_body(label, label, namespace, label_actions(operator_usernames)),
    ]


@dataclass(frozen=True)
class PodAdmissionArgs:
    prefix: str
    # The Ray namespace's name (the binding selects it by its kubernetes.io/metadata.name label).
    namespace: str


class PodAdmission(pulumi.ComponentResource):
    policies: list[k8s.admissionregistration.v1.ValidatingAdmissionPolicy]
    bindings: list[k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding]

    def __init__(self, name: str, args: PodAdmissionArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:PodAdmission", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.policies, self.bindings = [], []
        for obj in admission_objects(args.prefix, args.namespace):
            object_name = obj["metadata"]["name"]
            metadata = k8s.meta.v1.ObjectMetaArgs(name=object_name)
            if obj["kind"] == "ValidatingAdmissionPolicy":
                self.policies.append(
                    k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
                        f"{name}-{object_name}",
                        metadata=metadata,
                        spec=cast(k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgsDict, obj["spec"]),
                        opts=child,
                    )
                )
            else:
                # Each binding follows its policy.
                self.bindings.append(
                    k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                        f"{name}-{object_name}-binding",
                        metadata=metadata,
                        spec=cast(
                            k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgsDict, obj["spec"]
                        ),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[self.policies[-1]]),
                    )
                )
        self.register_outputs({"policies": [policy.metadata.name for policy in self.policies]})
