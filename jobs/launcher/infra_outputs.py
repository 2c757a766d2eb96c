"""The infra stack's outputs the job stack runs on (the aliases are their names), checked before any resource."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import pulumi
from config_rules import Allowed, ConfigError, Text, config_error
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

# The data layouts the pipeline writes overrides for; the infra's release table (infra/nemo_rl_releases.py) names one
# per release: FLAT_DATA up to NeMo RL v0.5.0, PER_SPLIT_DATA (data.train / data.validation) from v0.6.0.
DataLayout = Literal["flat", "per-split"]
FLAT_DATA: DataLayout = "flat"
PER_SPLIT_DATA: DataLayout = "per-split"
DATA_LAYOUTS = get_args(DataLayout)
# python-re: the entrypoint's rule needs a lookahead (no '..' anywhere).
_CONFIG = ConfigDict(frozen=True, extra="ignore", regex_engine="python-re")


def _count(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # numbers cross the stack boundary as floats
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise PydanticCustomError("count", "a whole number")


def _text_or(default: str) -> BeforeValidator:
    """An optional output: older infra stacks have none."""
    return BeforeValidator(lambda value: str(value or default))


def _one_label(label: Any) -> Any:
    if isinstance(label, Mapping) and len(label) == 1:
        return next((str(key), str(value)) for key, value in label.items())
    raise PydanticCustomError("label", "one label key and value")


def _dollars(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


Count = Annotated[int, BeforeValidator(_count)]
Dollars = Annotated[float | None, BeforeValidator(_dollars)]  # from the infra's estimatedCost; None: no price


class NemoRlRelease(BaseModel):
    """The infra's `nemoRlRelease` output: what the pipeline must do differently for the image's NeMo RL release."""

    model_config = _CONFIG

    tag: str
    # Relative to the NeMo RL sources in the image.
    grpo_entrypoint: Annotated[
        str,
        Field(alias="grpoEntrypoint", pattern=r"^(?!.*\.\.)examples/[A-Za-z0-9_./\-]+\.py$"),
        Allowed("a script under examples/ ending in .py"),
    ]
    data_layout: DataLayout = Field(alias="dataLayout")
    # From this DTensor tensor-parallel size on, NeMo RL needs policy.logprob_batch_size equal to the micro batch
    # size (v0.7.0's batch-variant accuracy check); None when the release has no such check.
    logprob_batch_check_from_tp: Annotated[
        Count | None, Field(alias="logprobBatchCheckFromTp"), Allowed("a tensor-parallel size or null")
    ] = None


class InfraOutputs(BaseModel):
    """What the job stack needs from the infra stack's outputs (kubeconfig stays a secret Output)."""

    model_config = _CONFIG

    namespace: str
    ray_address: Annotated[
        str, Field(alias="rayAddress", pattern=r"^http://[a-z0-9.\-]+:[0-9]+$"), Allowed("http://HOST:PORT")
    ]
    pvc_name: str = Field(alias="lustrePvcName")
    mount_path: Annotated[str, Field(alias="lustreMountPath"), AfterValidator(lambda path: path.rstrip("/"))]
    secret_keys: tuple[Text, ...] = Field(alias="secretKeys")
    submitter_label: Annotated[tuple[str, str], BeforeValidator(_one_label), Field(alias="submitterPodLabel")]
    gpus_per_node: Count = Field(alias="gpusPerNode", ge=1)
    ray_worker_replicas: Count = Field(alias="rayWorkerReplicas", ge=1)
    image: str = Field(alias="nemoRlImage")
    ray_version: str = Field(alias="rayVersion")
    nemo_rl_release: NemoRlRelease = Field(alias="nemoRlRelease")
    cpu_node_pool: str = Field(alias="cpuNodePool")
    lustre_capacity_gib: Count = Field(alias="lustreCapacityGib")
    lustre_throughput_mbps_per_tib: Count = Field(alias="lustreThroughputMbpsPerTib")
    dashboard_port_forward: str = Field(alias="dashboardPortForward")
    # The infra's cluster id: the Kubernetes provider's cluster_identifier (a kubeconfig change is then an update).
    cluster_id: str = Field(alias="clusterId")
    # Optional: GPU workers scale from zero (KubeRay autoscaler), asked for through Ray Client before the run.
    ray_autoscaling: Annotated[bool, BeforeValidator(lambda value: value is True), Field(alias="rayAutoscaling")] = (
        False
    )
    ray_client_address: str | None = Field(None, alias="rayClientAddress")
    # From the infra's estimatedCost: one GPU node per hour in dollars (None: no price) and the table's date.
    gpu_node_hourly_usd: Dollars = Field(None, alias="gpuNodePerHour")
    # The lower end of that rate (a reservation's largest published discount); the same figure when no range.
    gpu_node_hourly_low_usd: Dollars = Field(None, alias="gpuNodePerHourLow")
    prices_read_on: Annotated[str, _text_or("")] = Field("", alias="pricesReadOn")
    # Where that rate comes from: "table" (infra/prices.py) or "gpuNodeHourlyPrice" (the user's own figure).
    gpu_node_price_from: Annotated[str, _text_or("table")] = Field("table", alias="gpuNodePriceFrom")
    # Where the HF checkpoint is copied; "" when the infra has no export bucket.
    export_bucket: Annotated[str, _text_or("")] = Field("", alias="exportBucket")
    # The infra's gpuType (the step-time table is per GPU type); "" when an older infra has none.
    gpu_type: Annotated[str, _text_or("")] = Field("", alias="gpuType")
    # The Secret with Ray's token (key RAY_AUTH_TOKEN) when the cluster requires one (Ray >= 2.52), else None.
    ray_auth_secret: Annotated[
        Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")] | None,
        Field(alias="rayAuthSecret"),
        Allowed("a Secret name, or null"),
    ] = None

    @model_validator(mode="after")
    def _client_when_autoscaling(self) -> InfraOutputs:
        address = self.ray_client_address
        if not self.ray_autoscaling:
            self.__dict__["ray_client_address"] = None
        elif not (address and re.match(r"^ray://[a-z0-9.\-]+:[0-9]+$", address)):
            raise ConfigError("infraStack output 'rayClientAddress'", address, "ray://HOST:PORT when rayAutoscaling")
        return self


def build_infra_outputs(outputs: Mapping[str, Any], stack: str = "infra") -> InfraOutputs:
    """Check the infra stack's outputs: a missing or malformed one names the output and the stack."""
    given = {name: value for name, value in outputs.items() if value is not None}
    if "nemoRlRelease" not in given and "nemoRlImage" in given:
        raise ConfigError(
            "infraStack output 'nemoRlRelease'",
            None,
            f"the NeMo RL release of the infra's image {given['nemoRlImage']}: its tag is not a release the pipeline "
            f"knows (see docs/configuration.md, NeMo RL versions), or {stack} predates this output "
            "(run `pulumi up` in the infra project)",
        )
    found = given.get("estimatedCost")
    cost: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    as_read = {
        **given,
        # The cluster instance (its id and DNS endpoint, which names the cluster's uid) where the infra stack exports
        # it: a cluster replaced under the same name has a new one. Older infra stacks: the id alone.
        "clusterId": given.get("clusterInstance", given.get("clusterId")),
        "gpuNodePerHour": cost.get("gpuNodePerHour"),
        # Older infra stacks export no lower end: their one rate is both ends.
        "gpuNodePerHourLow": cost.get("gpuNodePerHourLow", cost.get("gpuNodePerHour")),
        "pricesReadOn": cost.get("pricesReadOn"),
        "gpuNodePriceFrom": cost.get("gpuNodePriceFrom"),
    }
    try:
        return InfraOutputs.model_validate(as_read)
    except ValidationError as error:
        refusal = config_error(error, InfraOutputs)
    name, dot, field = refusal.key.partition(".")
    missing = refusal.value is None and not dot
    rule = f"an output of {stack}: run `pulumi up` in the infra project first" if missing else refusal.allowed
    raise ConfigError(f"infraStack output '{name}'{dot}{field}", refusal.value, rule) from None


async def read_infra_outputs(ref: pulumi.StackReference, stack: str) -> InfraOutputs:
    """The infra stack's plain outputs, validated. Secret outputs (the kubeconfig) are not read here: they stay
    secret Outputs, taken with `ref.require_output`."""
    plain: dict[str, Any] = {}
    for name in (await ref.outputs.future()) or {}:
        details = await ref.get_output_details(name)
        if details.value is not None:
            plain[name] = details.value
    return build_infra_outputs(plain, stack=stack)
