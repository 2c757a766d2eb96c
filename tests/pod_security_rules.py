"""The Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards, as of Kubernetes 1.35), as
checks on a pod spec, so tests can say which level a rendered pod meets, and why not a stricter one. Written from the
standard's tables: Baseline's controls, then Restricted's on top. Windows-only and AppArmor-annotation controls are
left out (nothing here sets them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

LEVELS = ("privileged", "baseline", "restricted")  # weakest first

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    found = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key}")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']} ({volume['hostPath']['path']})")
    pod_context = spec.get("securityContext") or {}
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    contexts = [("pod", pod_context)] + [(c["name"], c.get("securityContext") or {}) for c in _containers(spec)]
    for name, context in contexts:
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"{name}: seccomp Unconfined")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"{name}: seLinuxOptions")
        if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.append(f"{name}: AppArmor Unconfined")
    for container in _containers(spec):
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{container['name']}: privileged")
        added = set((context.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            found.append(f"{container['name']}: adds {sorted(added)}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{container['name']}: procMount")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{container['name']}: hostPort {port['hostPort']}")
    return found


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    found = baseline_violations(spec)
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} of type {sorted(kinds)}")
    pod_context = spec.get("securityContext") or {}
    for container in _containers(spec):
        context = container.get("securityContext") or {}
        name = container["name"]
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccomp {seccomp or 'unset'}")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities")
    return found


def violations(spec: dict[str, Any], level: str) -> list[str]:
    if level == "privileged":
        return []
    return baseline_violations(spec) if level == "baseline" else restricted_violations(spec)


def strictest_level(spec: dict[str, Any]) -> str:
    """The strictest level whose checks the pod spec passes."""
    return [level for level in LEVELS if not violations(spec, level)][-1]
