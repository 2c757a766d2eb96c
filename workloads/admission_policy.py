"""Admission for pods by what a pod claims: ValidatingAdmissionPolicies (admissionregistration v1, GA since
Kubernetes 1.30) and their bindings. Two are bound to the Ray namespace, one to the whole cluster.

Pod Security stays at `enforce: privileged` in the Ray namespace (workloads/pod_security.py: the GPU workers' two
hostPath volumes are beyond Baseline). `PREFIX-pod-fence` is the finer fence inside it. A pod of the namespace,
whoever creates it (KubeRay's operator too), may not:
- run a privileged container, or use the host's network, PID or IPC namespace, or a host port;
- mount a hostPath other than the two directories the GPU workers read (the node's NVIDIA driver and the gIB NCCL
  plugin), nor mount those writable;
- carry the submitter label (workloads/network_policy.py's SUBMITTER_LABEL) unless the Job controller creates it
  (it creates the submitter's pods from the job stack's Job).

`PREFIX-ray-pod-label`: `ray.io/cluster: X` (which admits a pod into the Ray pods' NetworkPolicies when X is ours)
only on a pod that (1) has KubeRay's controller reference to the RayCluster X, exactly as KubeRay 1.5.1 sets it
(ray-operator/controllers/ray/raycluster_controller.go buildHeadPod/buildWorkerPod call controller-runtime's
SetControllerReference: apiVersion ray.io/v1, kind RayCluster, controller and blockOwnerDeletion true), and (2) is
created by a user the API server's authorizer lets `update` that RayCluster. The second part is what a namespace
user cannot forge: anyone who may create pods may write any ownerReference (Kubernetes' OwnerReferencesPermission-
Enforcement plugin would ask for `update` on rayclusters/finalizers because of blockOwnerDeletion, but GKE does not
document enabling it, so nothing here relies on it). Who may update the RayCluster could anyway have KubeRay create
any pod for it by editing its pod template, so the rule gives nobody a pod they could not already get. KubeRay's
operator updates RayClusters in its own work (the same file: r.Update on the RayCluster for the GCS fault-tolerance
finalizer; its role, generated from the file's kubebuilder markers, grants `update` on rayclusters), so its pods
pass without naming the user GKE's hosted operator runs as, which Google does not publish. GKE does not publish that
operator's role either: were `update` missing from it, every Ray pod would be refused, loudly, with this rule's
message naming the user (the RayCluster's events; docs/security.md says how to check).

`PREFIX-gpu-networks`, bound cluster-wide: the gVNIC and RDMA Network objects (workloads/network_objects.py) are
cluster-scoped, and a pod of any namespace could name them in its `networking.gke.io/interfaces` annotation (how
GKE multi-networking attaches a pod to a Network; workloads/nics.py writes ours) and get a NIC on the GPU nodes'
extra VPCs, where Ray's 0.0.0.0-bound servers and torch's TCPStore listen with no NetworkPolicy in front. So a pod
creation that names one of them is refused unless the pod is in the Ray namespace and carries `ray.io/cluster`
with our RayCluster's name (which the rule above holds to pods KubeRay makes for it). A JSON escape (a backslash)
in the annotation of such a pod is refused as well: it could spell a network's name past the match.

A label already on a pod may stay through an update (the kubelet and the operator patch running pods); adding or
changing one is a create as far as these rules go.

failurePolicy Fail: if the API server cannot evaluate a rule (a CEL error, a cost limit), the pod is refused, not let
through. validationActions Deny: a refusal, with the rule's message, to whoever created the pod (for the Ray pods,
the operator: the RayCluster's events show it).

Every rule is a CEL expression built here from data; tests/test_admission_policy.py evaluates each one (cel-python,
with a stand-in for the API server's authorizer) on the pods the real ray-cluster chart renders, on the submitter
Job's pod, and on crafted pods it must refuse.
"""

from __future__ import annotations

import re
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
FAILURE_POLICY = "Fail"
DENY = ["Deny"]
# KubeRay's controller reference on the pods it creates (controller-runtime SetControllerReference on the RayCluster).
RAY_OWNER_API_VERSION = "ray.io/v1"
RAY_OWNER_KIND = "RayCluster"
RAY_GROUP, RAY_RESOURCE = "ray.io", "rayclusters"
# GKE multi-networking: the pod annotation that attaches a pod to Network objects (workloads/nics.py).
INTERFACES_ANNOTATION = "networking.gke.io/interfaces"
_NETWORK_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# Where container-level rules apply. Ephemeral containers (kubectl debug) come in through their own subresource.
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
POD_RESOURCES = ("pods", "pods/ephemeralcontainers")


@dataclass(frozen=True)
class Validation:
    expression: str
    message: str | None = None
    message_expression: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"expression": self.expression, "message": self.message, "messageExpression": self.message_expression}
        return {key: value for key, value in out.items() if value is not None}


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


def _label_absent_or_kept(label: str) -> str:
    """The label is absent, or unchanged by this update."""
    labels, old = "object.metadata.labels", "oldObject.metadata.labels"
    return (
        f"!has({labels}) || !('{label}' in {labels}) "
        f"|| (request.operation == 'UPDATE' && has({old}) && '{label}' in {old} "
        f"&& {old}['{label}'] == {labels}['{label}'])"
    )


def _label_kept_or_set_by(label: str, usernames: tuple[str, ...]) -> str:
    """The label is absent, unchanged by this update, or set by one of `usernames`."""
    return f"{_label_absent_or_kept(label)} || request.userInfo.username in {_cel_list(usernames)}"


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


def ray_label_validations() -> list[Validation]:
    """`ray.io/cluster: X` only with KubeRay's controller reference to the RayCluster X, and only from a user who may
    update that RayCluster (module docstring)."""
    cluster = f"object.metadata.labels['{CLUSTER_LABEL}']"
    owned = (
        "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
        f"r.apiVersion == '{RAY_OWNER_API_VERSION}' && r.kind == '{RAY_OWNER_KIND}' && r.name == {cluster} "
        "&& has(r.controller) && r.controller == true && has(r.blockOwnerDeletion) && r.blockOwnerDeletion == true)"
    )
    may_update = (
        f"authorizer.group('{RAY_GROUP}').resource('{RAY_RESOURCE}').namespace(request.namespace)"
        f".name({cluster}).check('update').allowed()"
    )
    kept = _label_absent_or_kept(CLUSTER_LABEL)
    return [
        Validation(
            f"{kept} || ({owned})",
            message_expression=(
                f"'label {CLUSTER_LABEL} is only for pods KubeRay creates for that RayCluster: a controller "
                f"ownerReference to {RAY_OWNER_API_VERSION} {RAY_OWNER_KIND} ' + {cluster} "
                "+ ' with blockOwnerDeletion is missing'"
            ),
        ),
        Validation(
            f"{kept} || {may_update}",
            message_expression=(
                f"'label {CLUSTER_LABEL}=' + {cluster} + ' is set only by who may update the RayCluster ' "
                f"+ {cluster} + ' in ' + request.namespace + ', not by ' + request.userInfo.username"
            ),
        ),
    ]


def network_names_pattern(networks: tuple[str, ...]) -> str:
    """An RE2 pattern that finds any of `networks` as a JSON string in the interfaces annotation."""
    for network in networks:
        if not _NETWORK_NAME_RE.match(network):
            raise ValueError(f"network {network!r} is not a Kubernetes object name (lowercase letters, digits, '-')")
    return '"(' + "|".join(networks) + ')"'


def gpu_network_validation(namespace: str, ray_cluster: str, networks: tuple[str, ...]) -> Validation:
    """Only our RayCluster's pods, in the Ray namespace, may name the GPU nodes' extra networks."""
    if not networks:
        raise ValueError("networks: at least one Network name, or the rule guards nothing")
    annotations, labels = "object.metadata.annotations", "object.metadata.labels"
    interfaces = f"{annotations}['{INTERFACES_ANNOTATION}']"
    ours = (
        f"request.namespace == '{namespace}' && has({labels}) && '{CLUSTER_LABEL}' in {labels} "
        f"&& {labels}['{CLUSTER_LABEL}'] == '{ray_cluster}'"
    )
    names_ours = f"{interfaces}.contains('\\\\') || {interfaces}.matches('{network_names_pattern(networks)}')"
    return Validation(
        f"!has({annotations}) || !('{INTERFACES_ANNOTATION}' in {annotations}) || ({ours}) || !({names_ours})",
        message_expression=(
            f"'the networks {', '.join(networks)} (annotation {INTERFACES_ANNOTATION}, in which a backslash counts "
            f"as naming them) are only for the pods of RayCluster {ray_cluster} in namespace {namespace}; refused to ' "
            "+ request.userInfo.username + ' in namespace ' + request.namespace"
        ),
    )


def policy_body(name: str, validations: list[Validation], operations: tuple[str, ...]) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy over pods (where it applies is chosen by its binding)."""
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
                        "operations": list(operations),
                        "resources": list(POD_RESOURCES),
                    }
                ]
            },
            "validations": [validation.as_dict() for validation in validations],
        },
    }


def binding_body(name: str, policy_name: str, namespace: str | None) -> dict[str, Any]:
    """Bound to one namespace, or with `namespace` None to every namespace of the cluster."""
    spec: dict[str, Any] = {"policyName": policy_name, "validationActions": DENY}
    if namespace is not None:
        spec["matchResources"] = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": spec,
    }


@dataclass(frozen=True)
class PolicyNames:
    fence: str  # host rules and the submitter label, in the Ray namespace
    ray_label: str  # ray.io/cluster, in the Ray namespace
    gpu_networks: str  # the GPU networks, cluster-wide


def policy_names(prefix: str) -> PolicyNames:
    return PolicyNames(f"{prefix}-pod-fence", f"{prefix}-ray-pod-label", f"{prefix}-gpu-networks")


# Creates and updates: a label or a volume may be added to a running pod. Creates only: a NIC is attached when the
# pod is created, and pods that predate the policy keep their updates.
CREATE_AND_UPDATE = ("CREATE", "UPDATE")
CREATE = ("CREATE",)


def admission_objects(prefix: str, namespace: str, ray_cluster: str, networks: tuple[str, ...]) -> list[dict[str, Any]]:
    """The three policies, each followed by its binding."""
    names = policy_names(prefix)
    return [
        policy_body(names.fence, [*host_validations(), submitter_label_validation()], CREATE_AND_UPDATE),
        binding_body(names.fence, names.fence, namespace),
        policy_body(names.ray_label, ray_label_validations(), CREATE_AND_UPDATE),
        binding_body(names.ray_label, names.ray_label, namespace),
        policy_body(names.gpu_networks, [gpu_network_validation(namespace, ray_cluster, networks)], CREATE),
        binding_body(names.gpu_networks, names.gpu_networks, None),
    ]


@dataclass(frozen=True)
class PodAdmissionArgs:
    prefix: str
    # The Ray namespace's name (the namespaced bindings select it by its kubernetes.io/metadata.name label).
    namespace: str
    ray_cluster: str  # the RayCluster's name: its pods alone may use the GPU networks
    networks: tuple[str, ...]  # the GPU nodes' extra Network objects (workloads/nics.py)


class PodAdmission(pulumi.ComponentResource):
    policies: list[k8s.admissionregistration.v1.ValidatingAdmissionPolicy]
    bindings: list[k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding]

    def __init__(self, name: str, args: PodAdmissionArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:PodAdmission", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.policies, self.bindings = [], []
        for obj in admission_objects(args.prefix, args.namespace, args.ray_cluster, args.networks):
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
