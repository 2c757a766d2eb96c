"""Turn what a program registered (tools.offline) into Kubernetes manifests, secrets redacted."""

from __future__ import annotations

from typing import Any

from tools.offline import REDACTED, SECRET_SIG, SECRET_SIG_KEY, ProgramRun, Registered

# Pulumi-only inputs that are not part of a Kubernetes object.
_NOT_MANIFEST = {"__defaults", "__inputs"}


def redact(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            inner = value.get("value")
            # A secret map keeps its keys visible: which tokens exist is not itself a secret.
            return {k: REDACTED for k in inner} if isinstance(inner, dict) else REDACTED
        return {k: redact(v) for k, v in value.items() if k not in _NOT_MANIFEST}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def api_version_and_kind(type_token: str) -> tuple[str, str] | None:
    """'kubernetes:core/v1:PersistentVolume' -> ('v1', 'PersistentVolume'); None for non-objects (providers,
    Helm releases, YAML components)."""
    if not type_token.startswith("kubernetes:"):
        return None
    _, group_version, kind = type_token.split(":")
    if group_version.startswith(("helm.sh/", "yaml/", "kustomize/")):
        return None
    group, version = group_version.rsplit("/", 1)
    return (version if group == "core" else f"{group}/{version}"), kind


def manifest(resource: Registered) -> dict[str, Any] | None:
    """The object the provider would send to the API server, secrets shown as '[secret]'."""
    kind_info = api_version_and_kind(resource.type)
    if kind_info is None:
        return None
    api_version, kind = kind_info
    body = redact(resource.raw_inputs)
    body["apiVersion"], body["kind"] = api_version, kind
    ordered = {"apiVersion": api_version, "kind": kind, "metadata": body.pop("metadata", {})}
    ordered.update({k: v for k, v in body.items() if k not in ("apiVersion", "kind")})
    return ordered


def manifests(run: ProgramRun) -> list[dict[str, Any]]:
    return [m for m in (manifest(r) for r in run.resources) if m is not None]


def is_built_in(obj: dict[str, Any]) -> bool:
    """Kinds the Kubernetes OpenAPI schema knows (custom resources such as GKE's Network are not in it)."""
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    return group == "" or group.endswith(".k8s.io") or group in ("apps", "batch", "policy", "autoscaling")
