"""The infra stack's outputs the job stack runs on: its contract, checked before any resource is registered."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
from config_rules import ConfigError

# The data layouts the pipeline writes overrides for; the infra's release table (infra/nemo_rl_releases.py) names one
# per release: FLAT_DATA up to NeMo RL v0.5.0, PER_SPLIT_DATA (data.train / data.validation) from v0.6.0.
FLAT_DATA = "flat"
PER_SPLIT_DATA = "per-split"
DATA_LAYOUTS = (FLAT_DATA, PER_SPLIT_DATA)


@dataclass(frozen=True)
class NemoRlRelease:
    """The infra's `nemoRlRelease` output: what the pipeline must do differently for the image's NeMo RL release."""

    tag: str
    grpo_entrypoint: str  # relative to the NeMo RL sources in the image
    data_layout: str  # one of DATA_LAYOUTS
    # From this DTensor tensor-parallel size on, NeMo RL needs policy.logprob_batch_size equal to the micro batch
    # size (v0.7.0's batch-variant accuracy check); None when the release has no such check.
    logprob_batch_check_from_tp: int | None


@dataclass(frozen=True)
class InfraOutputs:
    """What the job stack needs from the infra stack's outputs (kubeconfig stays a secret Output)."""

    namespace: str
    ray_address: str
    pvc_name: str
    mount_path: str
    secret_keys: tuple[str, ...]
    submitter_label: tuple[str, str]
    gpus_per_node: int
    ray_worker_replicas: int
    image: str
    ray_version: str
    nemo_rl_release: NemoRlRelease
    cpu_node_pool: str
    lustre_capacity_gib: int
    lustre_throughput_mbps_per_tib: int
    dashboard_port_forward: str
    # The infra's cluster id: the Kubernetes provider's cluster_identifier (a kubeconfig change is then an update).
    cluster_id: str
    # Optional: GPU workers scale from zero (KubeRay autoscaler), asked for through Ray Client before the run.
    ray_autoscaling: bool = False
    ray_client_address: str | None = None
    # From the infra's estimatedCost: one GPU node per hour in dollars (None: no price) and the table's date.
    gpu_node_hourly_usd: float | None = None
    # The lower end of that rate (a reservation's largest published discount); the same figure when no range.
    gpu_node_hourly_low_usd: float | None = None
    prices_read_on: str = ""
    # Where that rate comes from: "table" (infra/prices.py) or "gpuNodeHourlyPrice" (the user's own figure).
    gpu_node_price_from: str = "table"
    export_bucket: str = ""  # where the HF checkpoint is copied; "" when the infra has no export bucket
    gpu_type: str = ""  # the infra's gpuType (the step-time table is per GPU type); "" when an older infra has none
    # The Secret with Ray's token (key RAY_AUTH_TOKEN) when the cluster requires one (Ray >= 2.52), else None.
    ray_auth_secret: str | None = None


def build_infra_outputs(outputs: Mapping[str, Any], stack: str = "infra") -> InfraOutputs:
    """Check the infra stack's outputs: a missing or malformed one names the output and the stack."""

    def need(name: str, kind: type | tuple[type, ...]) -> Any:
        if name not in outputs or outputs[name] is None:
            raise ConfigError(
                f"infraStack output '{name}'", None, f"an output of {stack}: run `pulumi up` in the infra project first"
            )
        value = outputs[name]
        if isinstance(kind, tuple) and int in kind and isinstance(value, float) and value.is_integer():
            value = int(value)  # numbers cross the stack boundary as floats
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ConfigError(f"infraStack output '{name}'", value, f"a {getattr(kind, '__name__', kind)}")
        return value

    label = need("submitterPodLabel", dict)
    if len(label) != 1:
        raise ConfigError("infraStack output 'submitterPodLabel'", label, "one label key and value")
    address = need("rayAddress", str)
    if not re.match(r"^http://[a-z0-9.\-]+:[0-9]+$", address):
        raise ConfigError("infraStack output 'rayAddress'", address, "http://HOST:PORT")
    gpus = need("gpusPerNode", (int,))
    replicas = need("rayWorkerReplicas", (int,))
    if gpus < 1 or replicas < 1:
        raise ConfigError("infraStack output 'gpusPerNode/rayWorkerReplicas'", (gpus, replicas), "positive numbers")
    keys = need("secretKeys", list)
    autoscaling = outputs.get("rayAutoscaling") is True
    client_address = outputs.get("rayClientAddress")
    if autoscaling and not (
        isinstance(client_address, str) and re.match(r"^ray://[a-z0-9.\-]+:[0-9]+$", client_address)
    ):
        raise ConfigError("infraStack output 'rayClientAddress'", client_address, "ray://HOST:PORT when rayAutoscaling")
    found = outputs.get("estimatedCost")
    cost: Mapping[str, Any] = found if isinstance(found, Mapping) else {}

    def dollars(key: str) -> float | None:
        value = cost.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    image = need("nemoRlImage", str)
    auth_secret = outputs.get("rayAuthSecret")
    if auth_secret is not None and not (
        isinstance(auth_secret, str) and re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", auth_secret)
    ):
        raise ConfigError("infraStack output 'rayAuthSecret'", auth_secret, "a Secret name, or null")
    return InfraOutputs(
        namespace=need("namespace", str),
        ray_address=address,
        pvc_name=need("lustrePvcName", str),
        mount_path=need("lustreMountPath", str).rstrip("/"),
        secret_keys=tuple(str(k) for k in keys),
        submitter_label=next((str(k), str(v)) for k, v in label.items()),
        gpus_per_node=gpus,
        ray_worker_replicas=replicas,
        image=image,
        ray_version=need("rayVersion", str),
        nemo_rl_release=_release(outputs.get("nemoRlRelease"), image, stack),
        cpu_node_pool=need("cpuNodePool", str),
        lustre_capacity_gib=need("lustreCapacityGib", (int,)),
        lustre_throughput_mbps_per_tib=need("lustreThroughputMbpsPerTib", (int,)),
        dashboard_port_forward=need("dashboardPortForward", str),
        # The cluster instance (its id and DNS endpoint, which names the cluster's uid) where the infra stack
        # exports it: a cluster replaced under the same name has a new one. Older infra stacks: the id alone.
        cluster_id=need("clusterInstance" if "clusterInstance" in outputs else "clusterId", str),
        export_bucket=str(outputs.get("exportBucket") or ""),  # optional: older infra stacks have none
        gpu_type=str(outputs.get("gpuType") or ""),  # optional too
        ray_autoscaling=autoscaling,
        ray_client_address=client_address if autoscaling else None,
        gpu_node_hourly_usd=dollars("gpuNodePerHour"),
        # Older infra stacks export no lower end: their one rate is both ends.
        gpu_node_hourly_low_usd=dollars("gpuNodePerHourLow" if "gpuNodePerHourLow" in cost else "gpuNodePerHour"),
        prices_read_on=str(cost.get("pricesReadOn") or ""),
        gpu_node_price_from=str(cost.get("gpuNodePriceFrom") or "table"),
        ray_auth_secret=auth_secret,
    )


def _release(raw: Any, image: str, stack: str) -> NemoRlRelease:
    key = "infraStack output 'nemoRlRelease'"
    if raw is None:
        raise ConfigError(
            key,
            None,
            f"the NeMo RL release of the infra's image {image}: its tag is not a release the pipeline knows "
            f"(see docs/configuration.md, NeMo RL versions), or {stack} predates this output "
            "(run `pulumi up` in the infra project)",
        )
    fields = ("tag", "grpoEntrypoint", "dataLayout")
    if not isinstance(raw, Mapping) or any(not isinstance(raw.get(name), str) for name in fields):
        raise ConfigError(key, raw, f"an object with the strings {', '.join(fields)}")
    if not re.fullmatch(r"examples/[A-Za-z0-9_./\-]+\.py", raw["grpoEntrypoint"]) or ".." in raw["grpoEntrypoint"]:
        raise ConfigError(f"{key}.grpoEntrypoint", raw["grpoEntrypoint"], "a script under examples/ ending in .py")
    if raw["dataLayout"] not in DATA_LAYOUTS:
        raise ConfigError(f"{key}.dataLayout", raw["dataLayout"], f"one of {list(DATA_LAYOUTS)}")
    check_from_tp = raw.get("logprobBatchCheckFromTp")
    if isinstance(check_from_tp, float) and check_from_tp.is_integer():
        check_from_tp = int(check_from_tp)  # numbers cross the stack boundary as floats
    if check_from_tp is not None and (not isinstance(check_from_tp, int) or isinstance(check_from_tp, bool)):
        raise ConfigError(f"{key}.logprobBatchCheckFromTp", check_from_tp, "a tensor-parallel size or null")
    return NemoRlRelease(
        tag=raw["tag"],
        grpo_entrypoint=raw["grpoEntrypoint"],
        data_layout=raw["dataLayout"],
        logprob_batch_check_from_tp=check_from_tp,
    )


async def read_infra_outputs(ref: pulumi.StackReference, stack: str) -> InfraOutputs:
    """The infra stack's plain outputs, validated. Secret outputs (the kubeconfig) are not read here: they stay
    secret Outputs, taken with `ref.require_output`."""
    plain: dict[str, Any] = {}
    for name in (await ref.outputs.future()) or {}:
        details = await ref.get_output_details(name)
        if details.value is not None:
            plain[name] = details.value
    return build_infra_outputs(plain, stack=stack)
