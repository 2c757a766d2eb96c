"""Values for the KubeRay `ray-cluster` chart (workloads/ray_chart.py): one Ray head on the CPU pool and
one group of GPU workers, one per GPU node. Pure functions of the settings; no Pulumi resources here.

How the pods start. The chart's top-level `annotations` put `ray.io/overwrite-container-cmd: "true"` on
the RayCluster. KubeRay (>= 1.1; GKE's RayOperator add-on is KubeRay) then copies that annotation to every
pod template and leaves our container command alone instead of replacing it with its own
`ulimit -n 65536; ray start ...`. It still puts the generated `ray start ...` line into the Ray container's
environment as KUBERAY_GEN_RAY_START_CMD, so our scripts prepare the container and `exec` that line. Because
the annotation covers the whole cluster, the head needs a command too, not only the workers.

No privileged mode. The gIB NCCL test pods for A3 Ultra and A4 in GoogleCloudPlatform/
container-engine-accelerators (gpudirect-rdma/nccl-test.yaml, nccl-test-a4.yaml) use RDMA with no
securityContext at all: GKE hands the RDMA NICs to the pod through the networking.gke.io annotations, and
the GPUs through the device plugin. Only the installer DaemonSet, which writes to the host, is privileged.
So the Ray containers get no privileged flag and no added capabilities.

Hardening (workloads/pod_security.py says which Pod Security level this leaves): every pod runs under the
runtime's default seccomp filter and no container may gain privileges (setuid binaries, file capabilities). The Ray
containers drop the capabilities they do not need (RAY_DROPPED_CAPABILITIES: NET_RAW and MKNOD among them) and run
as the image's user, root: the worker's start script
registers the node's driver libraries with ldconfig (it writes /etc/ld.so.cache), NeMo RL builds its per-worker
virtualenvs inside the image and every pod writes the run's files on the shared Lustre volume as root. Nothing here
needs more: RDMA needs neither IPC_LOCK nor privileged mode (the locked-memory limit the runtime gives containers is
enough for NCCL's registrations, as in Google's NCCL test pods, which set no securityContext), and `ulimit -n 65536`
only raises the soft open-file limit up to the hard one, which needs no capability. The workers' one need beyond the
Baseline level is two read-only hostPath volumes: the node's driver and the gIB plugin.

Service accounts: the head runs as the Workload Identity account (logs to Cloud Logging); its Kubernetes token, which
KubeRay's autoscaler RBAC lets patch pods and the RayCluster, is mounted only into the autoscaler container, never
into the Ray container where jobs run (the service account sets automountServiceAccountToken: false). The workers run
as their own account, with no Kubernetes token at all, bound to the same GCP account for their log shipping.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from infra.settings import AUTOSCALER, LOG_SIDECAR, PodResources, RaySettings
from infra.sizing import memory_bytes
from workloads.nics import DEFAULT_INTERFACE, extra_nics, pod_network_annotations
from workloads.ray_auth import auth_env

# Where things are inside the Ray containers.
LUSTRE_MOUNT_PATH = "/data"
HF_HOME = f"{LUSTRE_MOUNT_PATH}/hf-cache"  # models and datasets download once, for every pod
# Compile caches on Lustre, shared by every Ray pod and kept across runs: a re-run or a retried attempt loads vLLM's
# torch.compile artifacts and Inductor's kernels instead of compiling again. The variable names are the ones the
# image's releases read: VLLM_CACHE_ROOT (vllm/envs.py; default ~/.cache/vllm, whose torch_compile_cache/ vLLM's
# docs say may be copied to skip compilation: docs.vllm.ai/en/v0.11.2/design/torch_compile/) and
# TORCHINDUCTOR_CACHE_DIR (torch/_inductor/runtime/cache_dir_utils.py; default /tmp/torchinductor_<user>).
COMPILE_CACHE_DIR = f"{LUSTRE_MOUNT_PATH}/compile-cache"
COMPILE_CACHE_ENV = {
    "VLLM_CACHE_ROOT": f"{COMPILE_CACHE_DIR}/vllm",
    "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE_DIR}/torchinductor",
}
RAY_TMP_DIR = "/tmp/ray"
RAY_LOG_DIR = f"{RAY_TMP_DIR}/session_latest/logs"
SHM_DIR = "/dev/shm"

# Ray's ports on the head (KubeRay's defaults; the port names are the ones KubeRay looks up).
GCS_PORT = 6379
DASHBOARD_PORT = 8265  # dashboard and Jobs API
CLIENT_PORT = 10001
METRICS_PORT = 8080
# The ports Ray's worker processes (one a task or actor) listen on, on every Ray pod. Ray's default, 10002-19999
# (ray/scripts/scripts.py), overlaps NeMo RL v0.7.0's vLLM/SGLang HTTP range 11001-15000 and its NeMo Gym range
# 15001-20000 (nemo_rl/distributed/virtual_cluster.py), and one bind could take the other's port. NeMo RL's own
# ray.sub keeps Ray's worker ports at or below 11000 for that reason (FACTS.md); so does this. Nothing of NeMo RL
# v0.5.0 or v0.7.0 lies in it: v0.7.0's ranges start at 11001 (and its TCPStore range is 25000-28000), v0.5.0 takes
# its master port from the kernel's ephemeral range (bind to port 0). tests/test_ray_values.py reads both releases.
MIN_WORKER_PORT = 10002
MAX_WORKER_PORT = 11000
WORKER_PORT_PARAMS = {"min-worker-port": str(MIN_WORKER_PORT), "max-worker-port": str(MAX_WORKER_PORT)}

WORKER_GROUP = "gpu-workers"

# The GPU node's driver and the gIB NCCL plugin, as GKE and the nccl-rdma-installer DaemonSet leave them.
NVIDIA_HOST_DIR = "/home/kubernetes/bin/nvidia"
NVIDIA_DIR = "/usr/local/nvidia"
GIB_HOST_DIR = "/home/kubernetes/bin/gib"
GIB_DIR = "/usr/local/gib"

# Official Fluent Bit image, pinned (the tag of fluent/helm-charts' fluent-bit chart appVersion 5.1.1).
FLUENT_BIT_IMAGE = "cr.fluentbit.io/fluent/fluent-bit:5.1.1"
FLUENT_BIT_CONFIG_DIR = "/fluent-bit/config"  # beside the image's own /fluent-bit/etc, not over it
FLUENT_BIT_CONFIG_FILE = "fluent-bit.conf"
# Set on the sidecar, read by fluent_bit_config() as ${...}.
FLUENT_BIT_POD_ENV = "POD_NAME"
FLUENT_BIT_LOCATION_ENV = "CLUSTER_LOCATION"
LOG_NAME = "ray"  # Cloud Logging log id of the shipped Ray logs

# The dashboard's static files are symlinks in NeMo RL's image (v0.5.0 syncs its venv with `uv sync --link-mode
# symlink`, so ray/dashboard/client/build points into uv's cache). Ray serves /static with aiohttp's static route,
# which without follow_symlinks refuses (404) a file whose real path leaves the folder: index.html loads, its
# scripts do not, and the dashboard is blank (NVIDIA-NeMo/RL#1476). Ray 2.49.2 and 2.55.1 turn follow_symlinks on
# when this is "1" (dashboard/http_server_head.py). Only the head serves the dashboard.
DASHBOARD_FOLLOW_SYMLINKS_ENV = "RAY_DASHBOARD_BUILD_FOLLOW_SYMLINKS"

OVERWRITE_CONTAINER_CMD = "ray.io/overwrite-container-cmd"
GENERATED_START_CMD_ENV = "KUBERAY_GEN_RAY_START_CMD"
# Run admission by Ray's scheduler (jobs/submitter/admission.py): the head offers one unit of this custom resource per
# GPU worker the cluster may have, and each run's place job asks for its nodes' worth. Given as `ray start` reads
# node resources from its environment (ray._private.ray_constants.RESOURCES_ENVIRONMENT_VARIABLE, Ray 2.49.2 and
# 2.55.1): a rayStartParams entry would reach `ray start` through KUBERAY_GEN_RAY_START_CMD, which our start script
# expands unquoted, so the JSON's quotes would not survive.
PLACE_RESOURCE = "gpu_node"
NODE_RESOURCES_ENV = "RAY_OVERRIDE_RESOURCES"
# How long Ray lets a job stay PENDING before it fails it (the dashboard's job manager; 900 s by default): a queued
# run's place waits this long, then its holder asks again at the end of the queue (docs/operations.md).
JOB_START_TIMEOUT_ENV = "RAY_JOB_START_TIMEOUT_SECONDS"
JOB_START_TIMEOUT_S = 7 * 24 * 3600

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
# GKE's node labels for where an A3 Ultra / A4 VM sits in its reservation: nodes of one sub-block share the fastest
# fabric, then nodes of one block (GKE docs: how-to/gpu-bandwidth-gpudirect-rdma and the AI Hypercomputer topology
# pages, which place workloads with these labels).
TOPOLOGY_SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
TOPOLOGY_BLOCK_LABEL = "cloud.google.com/gce-topology-block"
# Preferred-affinity weights (1..100): one sub-block first, one block next. The scheduler adds the weights of the
# terms a node satisfies, so a node in the workers' sub-block (and hence their block) scores 100 + 50, one in their
# block only 50.
SUBBLOCK_AFFINITY_WEIGHT = 100
BLOCK_AFFINITY_WEIGHT = 50
# Labels KubeRay sets on every Ray pod it creates (tools/ray_pods.py models them: labelPod at v1.5.1).
KUBERAY_CLUSTER_LABEL = "ray.io/cluster"
KUBERAY_GROUP_LABEL = "ray.io/group"
PART_OF = "nemo-rl-gke"

# Pod volume names.
VOLUME_LOGS = "ray-logs"
VOLUME_SHM = "dshm"
VOLUME_NVIDIA = "nvidia-install-dir"
VOLUME_GIB = "gib-nccl-plugin"
VOLUME_DATA = "lustre-data"
VOLUME_FLUENT_BIT = "fluent-bit-config"

_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class RayClusterRefs:
    """Names of objects the program creates elsewhere, which the Ray pods refer to."""

    cluster_name: str  # RayCluster object name, passed as fullnameOverride
    cpu_pool_name: str  # GKE node pool of the CPU pool (head nodeSelector cloud.google.com/gke-nodepool)
    pvc_name: str  # Lustre claim, mounted at /data
    secret_name: str  # Secret holding the tokens
    secret_keys: tuple[str, ...]  # env var names stored in the Secret: ("HF_TOKEN",) or ("HF_TOKEN", "WANDB_API_KEY")
    service_account: str  # Kubernetes service account (Workload Identity) the Ray head runs as
    fluentbit_configmap: str  # ConfigMap with fluent-bit's config, created by the program
    worker_service_account: str = ""  # the GPU workers' own account (no Kubernetes token); "" = service_account
    auth_secret: str | None = None  # Secret with RAY_AUTH_TOKEN (Ray token authentication), None without it

    def __post_init__(self) -> None:
        if not self.secret_keys:
            raise ValueError("secret_keys: at least HF_TOKEN")
        for key in self.secret_keys:
            if not _ENV_NAME_RE.match(key):
                raise ValueError(f"secret key {key!r} is not an environment variable name")


def head_service_name(cluster_name: str) -> str:
    """The Service KubeRay creates in front of the head pod."""
    return f"{cluster_name}-head-svc"


def split_image(reference: str) -> tuple[str, str]:
    """'nvcr.io/nvidia/nemo-rl:v0.5.0' -> ('nvcr.io/nvidia/nemo-rl', 'v0.5.0'). The tag never holds a '/'. A digest
    stays with the tag ('v0.5.0@sha256:...'): the chart writes `repository:tag`, so the pod gets the full reference."""
    named, at, digest = reference.partition("@")
    repository, colon, tag = named.rpartition(":")
    if not colon or not repository or not tag or "/" in tag:
        raise ValueError(f"image {reference!r} has no tag")
    return repository, f"{tag}{at}{digest}"


def _fixed_resources(resources: dict[str, str | int]) -> dict[str, Any]:
    """Requests equal to limits: the pod gets exactly what it asks for (Guaranteed when every container does)."""
    return {"requests": dict(resources), "limits": dict(resources)}


def _pod_resources(resources: PodResources) -> dict[str, str | int]:
    return {"cpu": resources.cpu, "memory": resources.memory}


# ${VAR:?...} stops the shell with that message if the variable is unset or empty, instead of `exec` with
# no arguments, which would end the container with status 0.
_EXEC_GENERATED = (
    f"exec ${{{GENERATED_START_CMD_ENV}:?KubeRay did not set {GENERATED_START_CMD_ENV}; "
    f"the RayCluster needs the annotation {OVERWRITE_CONTAINER_CMD}=true}}"
)
# KubeRay adds this to the command it writes itself; with our own command it is ours to add.
_RAISE_FILE_LIMIT = "ulimit -n 65536 || echo 'could not raise the open-file limit to 65536' >&2"


def head_start_script() -> str:
    """The head's container script: no GPUs, no NCCL; start Ray as KubeRay would."""
    return "\n".join([_RAISE_FILE_LIMIT, _EXEC_GENERATED]) + "\n"


def worker_start_script(nvidia_dir: str = NVIDIA_DIR, gib_dir: str = GIB_DIR) -> str:
    """The GPU workers' container script. Nothing is installed at start: the image has what it needs."""
    nccl_env = f"{gib_dir}/scripts/set_nccl_env.sh"
    lines = [
        _RAISE_FILE_LIMIT,
        # Register the node's driver libraries (libcuda, libnvidia-ml) with the dynamic linker.
        f"ldconfig {nvidia_dir}/lib64 || {{ echo 'ldconfig {nvidia_dir}/lib64 failed' >&2; exit 1; }}",
        # Prepend, not replace: the image's own library path (CUDA, torch) must survive. A pod env entry would
        # replace it, which is why this is set here. Newer CUDA images may leave the driver directory out,
        # and then Ray sees no GPUs; without the gIB directory NCCL reports "network gIB not found".
        f'export LD_LIBRARY_PATH="{nvidia_dir}/lib64:{gib_dir}/lib64${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
        # Without the plugin NCCL falls back or fails late; fail now so the pod restarts until the
        # nccl-rdma-installer DaemonSet has put it on the node.
        f"if [ ! -r {nccl_env} ]; then",
        f"  echo 'gIB NCCL plugin not found at {nccl_env}: is the nccl-rdma-installer DaemonSet running?' >&2",
        "  exit 1",
        "fi",
        f"source {nccl_env}",
        _EXEC_GENERATED,
    ]
    return "\n".join(lines) + "\n"


def _bash(script: str) -> list[str]:
    return ["/bin/bash", "-c", script]


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _shared_env(refs: RayClusterRefs) -> list[dict[str, Any]]:
    """Env for the Ray container of every group: the Hugging Face cache on Lustre and the tokens, each read
    from the Secret by reference (the values never enter the chart values), and Ray's own token when the cluster
    requires one (KubeRay's wait-gcs-ready init container copies this env, so its `ray health-check` has it too)."""
    env = [_env("HF_HOME", HF_HOME)]
    env += [_env(name, path) for name, path in COMPILE_CACHE_ENV.items()]
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": refs.secret_name, "key": key}}} for key in refs.secret_keys
    ]
    if refs.auth_secret:
        env += auth_env(refs.auth_secret)
    return env


# The runtime's default capabilities (containerd's: CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW, SETGID,
# SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE) the Ray containers give up: raw sockets
# and packet capture (NET_RAW), device nodes (MKNOD), chroot, file capabilities, capability bounding, ports below 1024
# (every Ray, NCCL and vLLM port is above) and audit records. They keep CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL,
# SETGID and SETUID: they run as root over files not all their own (uv and pip unpack archives with their owners and
# modes, the run's files on Lustre are shared by every pod and by the submitter, Ray signals the processes it starts).
RAY_DROPPED_CAPABILITIES = (
    "NET_RAW",
    "MKNOD",
    "SYS_CHROOT",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "AUDIT_WRITE",
)
# Every pod: the container runtime's default seccomp filter (the pod level covers containers KubeRay adds).
POD_SECURITY_CONTEXT: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
# The Ray containers (and the wait-gcs-ready init container, which copies it): see the module docstring for why
# capabilities and the user stay the image's.
RAY_CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": list(RAY_DROPPED_CAPABILITIES)},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Containers that only read files and talk over the network (the log sidecar, the autoscaler): no capability at all.
LOCKED_DOWN_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The log sidecar, in addition, runs as a user of its own. Fluent Bit's image declares no USER (root by default), but
# its base, gcr.io/distroless/cc (fluent/fluent-bit dockerfiles/Dockerfile, `production` stage), defines
# nonroot, 65532:65532, in /etc/passwd. The sidecar only reads: Ray creates its session folders and log files with
# the default modes (0755, 0644 under the runtime's umask 022: no chmod in ray/_private), which any user may read,
# and the emptyDir they lie on is world-readable; it writes nothing but to Cloud Logging.
FLUENT_BIT_USER = 65532
FLUENT_BIT_SECURITY_CONTEXT: dict[str, Any] = {
    **LOCKED_DOWN_SECURITY_CONTEXT,
    "runAsNonRoot": True,
    "runAsUser": FLUENT_BIT_USER,
    "runAsGroup": FLUENT_BIT_USER,
}
# The autoscaler's Kubernetes credentials, mounted where its client reads them, in that container only.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
VOLUME_AUTOSCALER_TOKEN = "autoscaler-api-token"
TOKEN_SECONDS = 3600  # the kubelet renews it well before; the autoscaler rereads it every minute


def _autoscaler_token_volume() -> dict[str, Any]:
    """The service account's token and the cluster CA, projected as in-cluster clients expect them."""
    return {
        "name": VOLUME_AUTOSCALER_TOKEN,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ]
        },
    }


NODE_NAME_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _nccl_env(settings: RaySettings) -> list[dict[str, Any]]:
    return [
        _env("NCCL_NET", "gIB"),
        _env("NCCL_IB_GID_INDEX", "3"),
        _env("NCCL_CROSS_NIC", "0"),
        _env("NCCL_NET_GDR_LEVEL", "PIX"),
        _env("NCCL_SOCKET_IFNAME", DEFAULT_INTERFACE),
        _env("GLOO_SOCKET_IFNAME", DEFAULT_INTERFACE),
        _env("TP_SOCKET_IFNAME", DEFAULT_INTERFACE),
        _env("NCCL_TUNER_CONFIG_PATH", f"{GIB_DIR}/configs/{settings.preset.tuner_config}"),
    ]


def _log_sidecar(settings: RaySettings) -> dict[str, Any]:
    """Fluent Bit beside the Ray container: tails Ray's log files and ships them to Cloud Logging."""
    return {
        "name": "fluent-bit",
        "image": FLUENT_BIT_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/fluent-bit/bin/fluent-bit"],
        "args": ["-c", f"{FLUENT_BIT_CONFIG_DIR}/{FLUENT_BIT_CONFIG_FILE}"],
        "env": [
            {"name": FLUENT_BIT_POD_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            _env(FLUENT_BIT_LOCATION_ENV, settings.region),
        ],
        # Exactly what infra.settings.check_fits reserved for it on every node.
        "resources": _fixed_resources(_pod_resources(LOG_SIDECAR)),
        "securityContext": FLUENT_BIT_SECURITY_CONTEXT,
        "volumeMounts": [
            {"name": VOLUME_LOGS, "mountPath": RAY_TMP_DIR, "readOnly": True},
            {"name": VOLUME_FLUENT_BIT, "mountPath": FLUENT_BIT_CONFIG_DIR, "readOnly": True},
        ],
    }


def _head_shm_size(settings: RaySettings) -> str:
    # Memory-backed, so it counts against the head's memory limit: half of it leaves Ray's default
    # object store (30% of memory) room without letting /dev/shm crowd out the rest.
    return f"{memory_bytes(settings.ray_head.memory) // 2 // 2**20}Mi"


def _head(settings: RaySettings, refs: RayClusterRefs) -> dict[str, Any]:
    return {
        "rayVersion": settings.ray_version,
        "enableInTreeAutoscaling": settings.gpu_autoscaling,
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0", **WORKER_PORT_PARAMS},
        "labels": {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/component": "ray-head"},
        "serviceAccountName": refs.service_account,
        "podSecurityContext": POD_SECURITY_CONTEXT,
        "securityContext": RAY_CONTAINER_SECURITY_CONTEXT,
        "containerEnv": [
            _env(DASHBOARD_FOLLOW_SYMLINKS_ENV, "1"),
            _env(NODE_RESOURCES_ENV, json.dumps({PLACE_RESOURCE: settings.ray_worker_replicas})),
            _env(JOB_START_TIMEOUT_ENV, str(JOB_START_TIMEOUT_S)),
        ],
        "command": _bash(head_start_script()),
        "ports": [
            {"name": "gcs-server", "containerPort": GCS_PORT},
            {"name": "dashboard", "containerPort": DASHBOARD_PORT},
            {"name": "client", "containerPort": CLIENT_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "resources": _fixed_resources(_pod_resources(settings.ray_head)),
        # On the CPU pool, and never on a GPU node: no GPU toleration, and no node with an accelerator.
        "nodeSelector": {NODE_POOL_LABEL: refs.cpu_pool_name},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": ACCELERATOR_LABEL, "operator": "DoesNotExist"}]}
                    ]
                }
            }
        },
        # Setting volumes replaces the chart's default /tmp/ray volume, so it is declared here.
        "volumes": [
            {"name": VOLUME_LOGS, "emptyDir": {}},
            {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": _head_shm_size(settings)}},
            {"name": VOLUME_DATA, "persistentVolumeClaim": {"claimName": refs.pvc_name}},
            {"name": VOLUME_FLUENT_BIT, "configMap": {"name": refs.fluentbit_configmap}},
            *([_autoscaler_token_volume()] if settings.gpu_autoscaling else []),
        ],
        "volumeMounts": [
            {"name": VOLUME_LOGS, "mountPath": RAY_TMP_DIR},
            {"name": VOLUME_SHM, "mountPath": SHM_DIR},
            {"name": VOLUME_DATA, "mountPath": LUSTRE_MOUNT_PATH},
        ],
        "sidecarContainers": [_log_sidecar(settings)],
        **({"autoscalerOptions": _autoscaler_options(settings, refs)} if settings.gpu_autoscaling else {}),
    }


def _autoscaler_options(settings: RaySettings, refs: RayClusterRefs) -> dict[str, Any]:
    """KubeRay's autoscaler container in the head pod. No image is set: KubeRay then runs the autoscaler from the
    head's own image, the pinned NeMo RL image, whose Ray version matches the cluster's. It is a Ray client of the
    GCS: with token authentication it needs the token, which KubeRay gives it only when authOptions is set (it is
    not: see workloads/ray_auth.py). It alone gets the service account's Kubernetes token."""
    return {
        "idleTimeoutSeconds": settings.idle_timeout_seconds,
        "upscalingMode": "Default",
        "imagePullPolicy": "IfNotPresent",
        # Exactly what infra.settings.check_fits reserved for it beside the head.
        "resources": _fixed_resources(_pod_resources(AUTOSCALER)),
        **({"env": auth_env(refs.auth_secret)} if refs.auth_secret else {}),
        "volumeMounts": [{"name": VOLUME_AUTOSCALER_TOKEN, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}],
        "securityContext": LOCKED_DOWN_SECURITY_CONTEXT,
    }


def _gpu_workers(settings: RaySettings, refs: RayClusterRefs) -> dict[str, Any]:
    preset = settings.preset
    replicas = settings.ray_worker_replicas
    # With the autoscaler the group starts empty and grows when a run asks for GPUs (jobs/wait_for_workers.py).
    floor = 0 if settings.gpu_autoscaling else replicas
    return {
        "disabled": False,
        "replicas": floor,
        "minReplicas": floor,
        "maxReplicas": replicas,
        "numOfHosts": 1,
        "labels": {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/component": "ray-worker"},
        # The extra gVNIC and the RDMA NICs, attached by GKE multi-networking.
        "annotations": pod_network_annotations(extra_nics(preset.rdma_nics)),
        "rayStartParams": dict(WORKER_PORT_PARAMS),
        "serviceAccountName": refs.worker_service_account or refs.service_account,
        "podSecurityContext": POD_SECURITY_CONTEXT,
        "securityContext": RAY_CONTAINER_SECURITY_CONTEXT,
        "command": _bash(worker_start_script()),
        # The node's name for the NCCL pre-flight's report (its blocks and sub-blocks: jobs/scripts/topology_report.py).
        "containerEnv": [*_nccl_env(settings), NODE_NAME_ENV],
        "resources": _fixed_resources(
            {**_pod_resources(settings.ray_worker), GPU_RESOURCE: preset.gpus_per_node},
        ),
        "nodeSelector": {ACCELERATOR_LABEL: preset.gpu_type},
        "affinity": topology_affinity(refs.cluster_name),
        # GKE's GPU taint only: not the tutorial's impending-node-termination or user-workload tolerations, nor its
        # unmounted ray-tmp volume (docs/design.md#left-out says why).
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [
            {"name": VOLUME_LOGS, "emptyDir": {}},
            {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
            {"name": VOLUME_NVIDIA, "hostPath": {"path": NVIDIA_HOST_DIR, "type": "Directory"}},
            {"name": VOLUME_GIB, "hostPath": {"path": GIB_HOST_DIR, "type": "Directory"}},
            {"name": VOLUME_DATA, "persistentVolumeClaim": {"claimName": refs.pvc_name}},
            {"name": VOLUME_FLUENT_BIT, "configMap": {"name": refs.fluentbit_configmap}},
        ],
        "volumeMounts": [
            {"name": VOLUME_LOGS, "mountPath": RAY_TMP_DIR},
            {"name": VOLUME_SHM, "mountPath": SHM_DIR},
            {"name": VOLUME_NVIDIA, "mountPath": NVIDIA_DIR, "readOnly": True},
            {"name": VOLUME_GIB, "mountPath": GIB_DIR, "readOnly": True},
            {"name": VOLUME_DATA, "mountPath": LUSTRE_MOUNT_PATH},
        ],
        "sidecarContainers": [_log_sidecar(settings)],
    }


def topology_affinity(cluster_name: str) -> dict[str, Any]:
    """Preferred pod affinity of the GPU workers to each other: a worker prefers a node whose reservation
    sub-block already holds workers of this Ray cluster, then one whose block does. Preferred, not required: the
    first worker has no peer to follow, spot and flex-start nodes may carry no block labels, and a run must still
    start when its sub-block is full. Pod affinity rather than Kueue topology-aware scheduling: the project runs no
    Kueue (runs queue in the submitter, jobs/submitter/admission.py), and KubeRay creates the worker pods itself."""
    selector = {"matchLabels": {KUBERAY_CLUSTER_LABEL: cluster_name, KUBERAY_GROUP_LABEL: WORKER_GROUP}}
    return {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "podAffinityTerm": {"labelSelector": selector, "topologyKey": key},
                }
                for weight, key in (
                    (SUBBLOCK_AFFINITY_WEIGHT, TOPOLOGY_SUBBLOCK_LABEL),
                    (BLOCK_AFFINITY_WEIGHT, TOPOLOGY_BLOCK_LABEL),
                )
            ]
        }
    }


def build_ray_values(settings: RaySettings, refs: RayClusterRefs) -> dict[str, Any]:
    """Values for the pinned ray-cluster chart. Every key is one the chart reads (see ray_chart)."""
    repository, tag = split_image(settings.nemo_rl_image)
    return {
        "fullnameOverride": refs.cluster_name,
        # On the RayCluster object: keep our container commands (see the module docstring).
        "annotations": {OVERWRITE_CONTAINER_CMD: "true"},
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "common": {"containerEnv": _shared_env(refs)},
        "service": {"type": "ClusterIP"},
        "head": _head(settings, refs),
        # The chart's default group is off; ours is named, so its pods are `<cluster>-gpu-workers-...`.
        "worker": {"disabled": True},
        "additionalWorkerGroups": {WORKER_GROUP: _gpu_workers(settings, refs)},
    }


# What KubeRay 1.5.1 applies to a running cluster: the worker counts (reconcilePods scales the group) and the
# autoscaler's idle timeout (the autoscaler reads the RayCluster). Everything else only reaches new pods.
_APPLIED_TO_RUNNING_PODS = (("replicas",), ("minReplicas",), ("maxReplicas",))
_HEAD_APPLIED = ("autoscalerOptions", "idleTimeoutSeconds")


def pod_template_digest(values: dict[str, Any]) -> str:
    """A digest of what KubeRay creates Ray pods from: the chart values without what it applies to running pods.
    It changes exactly when running pods would differ from new ones, and then the RayCluster is replaced
    (workloads/raycluster.py) and the day-2 guard asks first (infra/day2.py). One exception: the head's admission
    capacity (NODE_RESOURCES_ENV, the worker count) is left out, as replacing the cluster for it would kill the very
    training the new count is for; a running head keeps its count until it next starts (docs/operations.md)."""
    template = copy.deepcopy(values)
    head = template.get("head", {})
    head.get(_HEAD_APPLIED[0], {}).pop(_HEAD_APPLIED[1], None)
    head["containerEnv"] = [e for e in head.get("containerEnv", []) if e.get("name") != NODE_RESOURCES_ENV]
    for group in [template.get("worker", {}), *template.get("additionalWorkerGroups", {}).values()]:
        for (field,) in _APPLIED_TO_RUNNING_PODS:
            group.pop(field, None)
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def fluent_bit_config(cluster_name: str) -> dict[str, str]:
    """ConfigMap data for the log sidecar: every file Ray writes under session_latest/logs goes to Cloud
    Logging (log id `ray`) as a generic_node whose namespace is the RayCluster and node_id the pod.

    generic_node keeps the output plugin away from instance metadata the GKE metadata server may not
    serve; the project id and the token (Workload Identity) still come from it. ${POD_NAME} and
    ${CLUSTER_LOCATION} are set on the sidecar by build_ray_values.
    """
    config = f"""\
[SERVICE]
    Flush             5
    Log_Level         info
    Daemon            off

[INPUT]
    Name              tail
    Tag               {LOG_NAME}
    Path              {RAY_LOG_DIR}/*
    Exclude_Path      {RAY_LOG_DIR}/debug_state*.txt
    Path_Key          file
    Refresh_Interval  5
    Read_from_Head    true
    Skip_Long_Lines   on
    Mem_Buf_Limit     64MB

[FILTER]
    Name              modify
    Match             {LOG_NAME}
    Add               ray_cluster {cluster_name}
    Add               pod ${{{FLUENT_BIT_POD_ENV}}}

[OUTPUT]
    Name              stackdriver
    Match             {LOG_NAME}
    resource          generic_node
    location          ${{{FLUENT_BIT_LOCATION_ENV}}}
    namespace         {cluster_name}
    node_id           ${{{FLUENT_BIT_POD_ENV}}}
"""
    return {FLUENT_BIT_CONFIG_FILE: config}
