"""TensorBoard over every run's event files on Lustre: a Deployment on the CPU pool, a ClusterIP Service and a
NetworkPolicy that admits nothing. It is reached with `kubectl port-forward` (the tensorboardPortForward output),
which the API server hands to the kubelet and the kubelet opens inside the pod: no network path a NetworkPolicy
governs, so none needs to be allowed. Pure spec builders, then one component.

The image is the pinned NeMo RL image (TensorBoard is one of NeMo RL's core dependencies at v0.5.0 and v0.7.0, on
PATH in its venv): the CPU node already holds it for the Ray head, and nothing else is pulled or installed.

It runs as that image's user, root, because no other user can run it: the venv's interpreter is uv's Python, which
the image's build installs as root under root's home, and the venv's packages are symlinks into root's uv cache
(docker/Dockerfile of v0.5.0 and v0.7.0, held by tests/test_tensorboard_user.py); Ubuntu images keep /root at mode
0700 (not checked on the NeMo RL image itself). Instead it gets no capability at all, so root cannot pass file modes
(no DAC_OVERRIDE), no privilege escalation, a read-only root file system and the claim mounted read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

TENSORBOARD_PORT = 6006
COMPONENT_LABELS = {"app.kubernetes.io/part-of": "nemo-rl-gke", "app.kubernetes.io/component": "tensorboard"}
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"


@dataclass(frozen=True)
class TensorBoardArgs:
    name: str
    namespace: pulumi.Input[str]
    image: str
    cpu_pool_name: str
    pvc_name: pulumi.Input[str]  # the claim resource's name output: the Deployment waits for the claim through it
    mount_path: str  # the Lustre volume, as the Ray pods mount it (/data); runs write logs under <run>/logs


def labels(args: TensorBoardArgs) -> dict[str, str]:
    return {**COMPONENT_LABELS, "app.kubernetes.io/instance": args.name}


def port_forward_command(namespace: str, name: str) -> str:
    return f"kubectl --namespace {namespace} port-forward service/{name} {TENSORBOARD_PORT}:{TENSORBOARD_PORT}"


def pod_spec(args: TensorBoardArgs) -> dict[str, Any]:
    """Read-only everywhere: the Lustre claim mounted read-only, a read-only root filesystem with a small /tmp, no
    capabilities, no privilege escalation, the runtime's seccomp filter, no service account token."""
    return {
        "nodeSelector": {NODE_POOL_LABEL: args.cpu_pool_name},
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "tensorboard",
                "image": args.image,
                "imagePullPolicy": "IfNotPresent",
                # TensorBoard walks the logdir for event files; every run's logger.log_dir is /data/<run>/logs.
                "command": ["tensorboard"],
                "args": ["--logdir", args.mount_path, "--host", "0.0.0.0", "--port", str(TENSORBOARD_PORT)],
                "env": [{"name": "HOME", "value": "/tmp"}],  # anything it caches goes to the writable /tmp
                "ports": [{"name": "http", "containerPort": TENSORBOARD_PORT, "protocol": "TCP"}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 10},
                "livenessProbe": {
                    "httpGet": {"path": "/", "port": "http"},
                    "initialDelaySeconds": 60,
                    "periodSeconds": 30,
                    "failureThreshold": 5,
                },
                "resources": {
                    "requests": {"cpu": "500m", "memory": "2Gi"},
                    "limits": {"cpu": "2", "memory": "8Gi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [
                    {"name": "data", "mountPath": args.mount_path, "readOnly": True},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": args.pvc_name, "readOnly": True}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        ],
    }


def network_policy_spec(args: TensorBoardArgs) -> dict[str, Any]:
    """Nothing in, nothing out: port-forward reaches the pod through the kubelet, and TensorBoard reads only its
    volume (mounted by the node, not through the pod's network)."""
    return {"podSelector": {"matchLabels": labels(args)}, "policyTypes": ["Ingress", "Egress"]}


class TensorBoard(pulumi.ComponentResource):
    deployment: k8s.apps.v1.Deployment
    service: k8s.core.v1.Service
    network_policy: k8s.networking.v1.NetworkPolicy

    def __init__(self, name: str, args: TensorBoardArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:TensorBoard", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        meta = k8s.meta.v1.ObjectMetaArgs(name=args.name, namespace=args.namespace, labels=labels(args))
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-isolated",
            metadata=meta,
            spec=cast(k8s.networking.v1.NetworkPolicySpecArgsDict, network_policy_spec(args)),
            opts=child,
        )
        self.deployment = k8s.apps.v1.Deployment(
            name,
            metadata=meta,
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels(args)),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels(args)),
                    spec=cast(k8s.core.v1.PodSpecArgs, pod_spec(args)),
                ),
            ),
            # The policy first: the pod never runs unisolated.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.network_policy]),
        )
        self.service = k8s.core.v1.Service(
            name,
            metadata=meta,
            spec=k8s.core.v1.ServiceSpecArgs(
                type="ClusterIP",
                selector=labels(args),
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=TENSORBOARD_PORT, target_port="http")],
            ),
            opts=child,
        )
        self.register_outputs({"service": self.service.metadata.name})
