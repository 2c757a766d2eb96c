"""Ray token authentication (Ray >= 2.52): a random token made by the stack, kept in a Secret, read by every Ray
container and every Ray client through secretKeyRef. The token is a Pulumi secret from the moment it is made and never
appears in a manifest, Helm value, output or log: pods name the Secret, not the value.

With the image's Ray older than 2.52 (NeMo RL v0.5.0 ships 2.49.2) Ray has no authentication: nothing is made here,
and the NetworkPolicies (workloads/network_policy.py) and the admission policies that hold their labels
(workloads/admission_policy.py) are the only fence around the Ray pods. With it, the token guards Ray's own servers
only, not torch's TCPStore, NCCL's bootstrap, vLLM's ports or the metrics port (docs/security.md's threat table).

KubeRay 1.5.1 has `spec.authOptions`, but the ray-cluster chart does not expose it and GKE's RayOperator add-on decides
the operator's version; so the variables are set on the containers themselves, which works with any operator. Then the
operator injects nothing: the Ray containers get them through the chart's common.containerEnv, the autoscaler sidecar
through autoscalerOptions.env, and the operator's wait-gcs-ready init container (`ray health-check`, which needs the
token too) copies the worker's Ray container env (ray-operator/controllers/ray/common/pod.go at v1.5.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

# The infra side's one copy; the jobs project (only jobs/ on its import path) has its own: jobs/submitter/ray_auth.py.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_KEY = AUTH_TOKEN_ENV  # the Secret's key; the job stack reads the same key
# The first Ray release with token authentication (RAY_AUTH_MODE=token).
MIN_RAY_VERSION = (2, 52)
TOKEN_LENGTH = 48  # letters and digits: ~285 bits, and nothing a shell or an HTTP header could mangle


def supports_token_auth(ray_version: str) -> bool:
    """True when this Ray release (e.g. '2.55.1') has token authentication."""
    match = re.match(r"^(\d+)\.(\d+)", ray_version)
    if not match:
        raise ValueError(f"not a Ray version: {ray_version!r}")
    return (int(match[1]), int(match[2])) >= MIN_RAY_VERSION


def auth_env(secret_name: str) -> list[dict[str, Any]]:
    """The two variables Ray's servers and clients read, the token by reference to the Secret."""
    return [
        {"name": AUTH_MODE_ENV, "value": "token"},
        {"name": AUTH_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": TOKEN_KEY}}},
    ]


@dataclass(frozen=True)
class RayAuthTokenArgs:
    secret_name: str
    namespace: pulumi.Input[str]


class RayAuthToken(pulumi.ComponentResource):
    """The token (pulumi-random's RandomPassword: made once, kept in the state as a secret, stable across updates)
    and the Secret the pods read it from."""

    password: random.RandomPassword
    secret: k8s.core.v1.Secret

    def __init__(self, name: str, args: RayAuthTokenArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:RayAuthToken", name, None, opts)
        self.password = random.RandomPassword(
            f"{name}-token",
            length=TOKEN_LENGTH,
            special=False,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["result"]),
        )
        self.secret = k8s.core.v1.Secret(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.secret_name, namespace=args.namespace),
            type="Opaque",
            string_data={TOKEN_KEY: self.password.result},  # secret: RandomPassword marks `result` so
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["data", "stringData"]),
        )
        self.register_outputs({"name": self.secret.metadata.name})
