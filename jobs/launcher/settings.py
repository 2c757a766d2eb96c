"""Job settings and the infra stack's outputs, validated before any resource is registered."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from launcher import checkpoints, performance
from launcher.performance import PerformanceRecipe
from launcher.step_times import Published, published_for

# A Kubernetes name that also suits a Ray submission id; suffixes of up to 16 characters are added to it.
_RUN_NAME_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?$")
# Hydra's override forms: key=value, +key=value (append), ++key=value (append or override), ~key[=value] (delete).
_OVERRIDE_RE = re.compile(r"^(\+{0,2}[A-Za-z_][A-Za-z0-9_.\-]*=.*|~[A-Za-z_][A-Za-z0-9_.\-]*(=.*)?)$")
_STACK_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+){0,2}$")
# Each retry resumes from the newest checkpoint; past a handful, a run that keeps failing needs a person.
MAX_RESTARTS = 20
MAX_RERUN = 999  # keeps a rerun's submission id (<runName>-<step>-rerunN-rK) within Ray's and our limits
DEFAULT_RECIPE = "examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-long.yaml"
# vLLM on GPUs of its own: vLLM's own default share. Colocated with training it takes the recipe's value (NeMo RL's
# base config sets 0.6 there, leaving the rest to the trainer).
DEDICATED_VLLM_GPU_MEMORY_UTILIZATION = 0.9
# NeMo RL keys the launcher derives from job settings: an extra override of one would break what was validated.
DERIVED_OVERRIDES = {
    "policy.train_global_batch_size": "numPromptsPerStep x numGenerationsPerPrompt",
    "grpo.num_prompts_per_step": "numPromptsPerStep",
    "grpo.num_generations_per_prompt": "numGenerationsPerPrompt",
    "cluster.num_nodes": "numNodes",
    "cluster.gpus_per_node": "the infra's gpusPerNode",
    "policy.dtensor_cfg.tensor_parallel_size": "dtensorTensorParallelSize",
    "grpo.async_grpo.enabled": "asyncGrpo",
    "grpo.async_grpo.max_trajectory_age_steps": "maxTrajectoryAgeSteps",
    # One way to say which model the run trains: the evaluations and the plan's notes follow the job setting.
    "policy.model_name": "model",
}
# A Hugging Face repository id as the hub accepts one: [owner/]name, each part 1-96 letters, digits, '-', '_' or
# '.', neither starting nor ending with '-' or '.', and no '--' or '..' anywhere.
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HF_REPO_RE = re.compile(rf"^(?:{_HF_PART}/)?{_HF_PART}$")
# The job setting dataset: where the rows come from, and which of their fields hold the problem and the answer.
_GS_SOURCE_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,61}[a-z0-9])/(\S+\.jsonl)$")
_HF_SOURCE_RE = re.compile(rf"^hf://datasets/({_HF_PART}/{_HF_PART})(?:@([A-Za-z0-9._/-]{{1,100}}))?/(\S+\.jsonl)$")
_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_DATASET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,39}$")
DATASET_FIELDS = ("source", "problemField", "answerField", "testSource", "name")


class ConfigError(pulumi.RunError):
    """A config value or infra output that cannot work. Pulumi prints the message alone."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        shown = "is not set" if value is None else f"= {value!r} is not allowed"
        super().__init__(f"config '{key}' {shown}: {allowed}")


class UnknownKeyError(ConfigError):
    """A config key the program does not read: it would be ignored without a word."""

    def __init__(self, key: str, hint: str) -> None:
        self.key, self.value, self.allowed = key, None, hint
        pulumi.RunError.__init__(self, f"config '{key}' is not a key this program reads: {hint}")


@dataclass(frozen=True)
class BenchmarkRecipe:
    """One performance recipe the benchmark runs, unchanged, on its own cluster shape, and NVIDIA's figure for it."""

    recipe: PerformanceRecipe
    # NVIDIA's figure for the recipe (the image's release's summary first, else the newest other release's for a
    # recipe of that name); None when no summary has one: the log then says the figure is unknown.
    published: Published | None

    @property
    def label(self) -> str:
        """The recipe's file name: its train step is train-<label>, its logs and checkpoints <label>/."""
        return self.recipe.name


# NeMo RL's Llama 3.1 8B performance recipes (2 nodes x 8 GPUs): on-policy, 1-step off-policy, and 1-step off-policy
# in FP8; the benchmark's recipes when the job setting benchmarkRecipes is unset.
DEFAULT_BENCHMARK_RECIPES = (
    "grpo-llama3.1-8b-instruct-2n8g",
    "grpo-llama3.1-8b-instruct-2n8g-async-1off",
    "grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off",
)
# Steps per mode by default, and the fewest that leave 5 measured steps between the first (start-up) and the last
# (which validates and saves a checkpoint: val_period and save_period are 10 in the recipes' base config).
BENCHMARK_STEPS, BENCHMARK_MIN_STEPS, BENCHMARK_MEASURED_STEPS = 10, 7, 5
# Job settings the benchmark has no use for (it runs NVIDIA's recipes as they are): set, they would be ignored.
# Each with its default (jobs/Pulumi.yaml's): the CLI hands every default over, so only another value is refused.
BENCHMARK_IGNORES: dict[str, Any] = {
    "recipe": DEFAULT_RECIPE, "numNodes": 2, "generationNodes": 1, "numPromptsPerStep": 16,
    "numGenerationsPerPrompt": 32, "vllmTensorParallelSize": 8, "vllmGpuMemoryUtilization": "",
    "dtensorTensorParallelSize": 8, "asyncGrpo": False, "maxTrajectoryAgeSteps": 1, "extraOverrides": [],
    "secondsPerStep": "", "model": "", "dataset": None,
}  # fmt: skip
# The sizes a Megatron recipe (NeMo RL's performance recipes; launcher/performance.py) trains with, tensor, pipeline
# and context parallel, which extraOverrides may change; every other recipe is taken to train with DTensor.
MEGATRON_PARALLEL_KEYS = (
    "policy.megatron_cfg.tensor_model_parallel_size",
    "policy.megatron_cfg.pipeline_model_parallel_size",
    "policy.megatron_cfg.context_parallel_size",
)
# Async GRPO at NeMo RL v0.5.0 and v0.7.0 (examples/run_grpo*.py, algorithms/grpo.py async_grpo_train and setup):
# what the pipeline sets for it, and what an extraOverride may not change under it (key -> what it must stay).
ASYNC_REQUIRED = {
    "loss_fn.use_importance_sampling_correction": "true (off-policy samples need the importance-sampling correction)",
    "policy.generation.vllm_cfg.async_engine": "true (async_grpo_train asserts vLLM's async engine)",
    "grpo.async_grpo.in_flight_weight_updates": "true (NVIDIA's 1-step off-policy recipes; beyond one step NeMo RL "
    "warns the extra age buys nothing without it)",
    "policy.generation.backend": "vllm",
    "policy.generation.colocated.enabled": "false (asserted by async_grpo_train)",
}
# Features run_grpo.py refuses with async GRPO (DAPO's, v0.7.0's multiple dataloaders), and the FP8 KV cache that
# grpo.py's setup refuses with async rollouts: an extraOverride turning one on is refused.
ASYNC_REFUSED_FEATURES = {
    "grpo.use_dynamic_sampling": "dynamic sampling (DAPO)",
    "grpo.reward_scaling.enabled": "reward scaling (DAPO)",
    "grpo.reward_shaping.enabled": "reward shaping (DAPO)",
    "data.use_multiple_dataloader": "multiple dataloaders",
}
# Minutes one GSM8K evaluation (eval-base, eval-final) holds the run's GPU nodes: 6-8 minutes for Gemma 3 27B on one
# 8-GPU node, most of it vLLM start-up (the GKE sample's logs). An estimate, taken at its upper end.
EVAL_MINUTES = 8.0


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


@dataclass(frozen=True)
class PreflightSettings:
    enabled: bool
    min_busbw_gbps: float
    lustre_gib_per_node: float
    lustre_min_fraction: float


@dataclass(frozen=True)
class DatasetSettings:
    """The user's own JSONL rows instead of GSM8K (the job setting dataset), prepared on Lustre by prepare_jsonl.py."""

    source: str  # gs://BUCKET/OBJECT.jsonl, a file under the Lustre mount, or hf://datasets/OWNER/NAME[@REV]/FILE.jsonl
    problem_field: str
    answer_field: str
    test_source: str = ""  # "" holds a share of source out for validation and evaluation
    name: str = ""  # in the accuracy line; "" names it after the source file

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        hub = _HF_SOURCE_RE.match(self.source)
        if hub:
            return hub[1].split("/")[1]
        return self.source.rsplit("/", 1)[1].removesuffix(".jsonl")

    @property
    def folder(self) -> str:
        """The prepared files' folder under datasets/: one per source and fields, so a change prepares anew."""
        what = json.dumps([self.source, self.test_source, self.problem_field, self.answer_field])
        return f"jsonl-{hashlib.sha256(what.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class JobSettings:
    infra_stack: str
    run_name: str
    recipe: str
    num_nodes: int
    generation_nodes: int
    max_num_steps: int
    num_prompts_per_step: int
    num_generations_per_prompt: int
    vllm_tensor_parallel_size: int
    vllm_gpu_memory_utilization: float | None  # None: the recipe's value
    dtensor_tensor_parallel_size: int
    convert_to_hf: bool
    extra_overrides: tuple[str, ...]
    preflight: PreflightSettings
    wait_for_workers_minutes: int
    max_restarts: int  # retries of a FAILED train attempt (ray_submit.py --max-retries)
    stop_on_delete: bool  # stop the run's Ray jobs when the job stack is destroyed
    # Run estimate (jobs/launcher/cost.py): the user's secondsPerStep, seconds one GRPO step takes on numNodes
    # nodes; None takes the step-time table's figure for the recipe (launcher/step_times.py), or says it is unknown.
    seconds_per_step: float | None = None
    # 1-step (or maxTrajectoryAgeSteps) off-policy GRPO: generation and training overlap on their own nodes.
    async_grpo: bool = False
    max_trajectory_age_steps: int = 1
    # NeMo RL's performance recipes, unchanged, one after the other, instead of the run (benchmarkRecipes).
    benchmark: bool = False
    benchmark_recipes: tuple[BenchmarkRecipe, ...] = ()
    # The recipe's training backend: "megatron" for NeMo RL's performance recipes (policy.megatron_cfg.enabled),
    # "dtensor" for any other; and its tensor, pipeline and context parallel sizes (DTensor: dtensorTensorParallelSize,
    # 1, 1; Megatron: the recipe's policy.megatron_cfg sizes, or the extraOverrides that change them).
    training_backend: str = performance.DTENSOR
    training_parallel: tuple[int, int, int] = (1, 1, 1)
    # GSM8K test accuracy before training (the recipe's model) and after it (the converted model).
    eval_base: bool = True
    eval_final: bool = True
    # Steps to run again under a new submission id and outcome record (`<id>-rerunN`, `<step>.rerunN.json`): the
    # step name and its rerun number, in the order given. launcher.steps checks the names against the run's steps.
    rerun: tuple[tuple[str, int], ...] = ()
    # The Hugging Face model the run trains (policy.model_name and the tokenizer's name); "" is the recipe's own.
    model: str = ""
    # The user's own JSONL rows; None is GSM8K.
    dataset: DatasetSettings | None = None
    # A last step copying the newest checkpoint (and the HF conversion) to the infra's export bucket, verified.
    archive: bool = False

    @property
    def train_global_batch_size(self) -> int:
        """Samples per GRPO step, all trained on in one optimizer step. NeMo RL's trainer makes
        samples // train_global_batch_size optimizer steps: with a larger batch none runs (an UnboundLocalError),
        with a smaller one the step is split, or refused when the batch does not divide the samples."""
        return self.num_prompts_per_step * self.num_generations_per_prompt


def _int(key: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return int(str(value))
    except (TypeError, ValueError):
        raise ConfigError(key, value, "a whole number") from None


def _float(key: str, value: Any) -> float:
    try:
        return float(str(value))
    except (TypeError, ValueError):
        raise ConfigError(key, value, "a number") from None


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ConfigError(key, value, "true or false")


def _positive(key: str, value: Any) -> int:
    number = _int(key, value)
    if number < 1:
        raise ConfigError(key, number, "1 or more")
    return number


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


def build_job_settings(values: Mapping[str, Any], infra: InfraOutputs) -> JobSettings:
    """Validate job config (camelCase keys, as in jobs/Pulumi.yaml) against the infra it runs on. Pure."""
    infra_stack = str(values.get("infraStack") or "")
    if not _STACK_RE.match(infra_stack):
        raise ConfigError("infraStack", infra_stack or None, "the infra stack, e.g. organization/nemo-rl-gke/h200")
    run_name = str(values.get("runName", "grpo-gsm8k"))
    if not _RUN_NAME_RE.match(run_name):
        raise ConfigError(
            "runName",
            run_name,
            "1-40 characters: a lowercase letter, then lowercase letters, digits or '-', "
            "ending in a letter or digit (a Kubernetes name and Ray submission id prefix)",
        )
    recipe = str(values.get("recipe", DEFAULT_RECIPE))
    if not recipe.startswith("examples/configs/") or not recipe.endswith(".yaml") or ".." in recipe:
        raise ConfigError("recipe", recipe, "a NeMo RL recipe path under examples/configs/ ending in .yaml")

    # The benchmark runs its recipes on their own cluster shape: the run holds the largest of them.
    benchmark_recipes = _benchmark(values, infra)
    benchmark = bool(benchmark_recipes)
    if benchmark:
        num_nodes = max(item.recipe.num_nodes for item in benchmark_recipes)
    else:
        num_nodes = _positive("numNodes", values.get("numNodes", 2))
    if num_nodes > infra.ray_worker_replicas:
        raise ConfigError(
            "numNodes",
            num_nodes,
            f"at most the infra's Ray GPU workers (rayWorkerReplicas = {infra.ray_worker_replicas})",
        )
    generation_nodes = _int("generationNodes", values.get("generationNodes", 1))
    if generation_nodes < 0 or generation_nodes >= num_nodes:
        raise ConfigError(
            "generationNodes",
            generation_nodes,
            f"0 (generation colocated with training) or 1..{num_nodes - 1}: below numNodes ({num_nodes}) so that "
            "training keeps at least one node",
        )
    gpus = infra.gpus_per_node
    training_gpus = (num_nodes - generation_nodes) * gpus
    generation_gpus = generation_nodes * gpus if generation_nodes else num_nodes * gpus
    vllm_tp = _positive("vllmTensorParallelSize", values.get("vllmTensorParallelSize", 8))
    if generation_gpus % vllm_tp or vllm_tp > gpus:
        raise ConfigError(
            "vllmTensorParallelSize",
            vllm_tp,
            f"a divisor of the {generation_gpus} generation GPUs, at most {gpus} (one node)",
        )
    extra_items = values.get("extraOverrides", [])
    backend, parallel = _training_parallel(values, recipe, infra, training_gpus, extra_items, benchmark)
    dtensor_tp = parallel[0] if backend == performance.DTENSOR else BENCHMARK_IGNORES["dtensorTensorParallelSize"]
    utilization: float | None = DEDICATED_VLLM_GPU_MEMORY_UTILIZATION if generation_nodes else None
    if values.get("vllmGpuMemoryUtilization") not in (None, ""):
        utilization = _float("vllmGpuMemoryUtilization", values["vllmGpuMemoryUtilization"])
        if not 0 < utilization <= 1:
            raise ConfigError("vllmGpuMemoryUtilization", utilization, "a fraction in (0, 1]")

    prompts = _positive("numPromptsPerStep", values.get("numPromptsPerStep", 16))
    generations = _positive("numGenerationsPerPrompt", values.get("numGenerationsPerPrompt", 32))
    # NeMo RL shards each training batch over its data-parallel ranks (training GPUs / (TP x CP x PP); the DTensor
    # recipes run CP = PP = 1) and asserts that they divide it.
    tp, pp, cp = parallel
    data_parallel = training_gpus // (tp * pp * cp)
    if not benchmark and (prompts * generations) % data_parallel:
        sizes = (
            f"dtensorTensorParallelSize {tp}"
            if backend == performance.DTENSOR
            else f"the recipe's Megatron TP x PP x CP = {tp} x {pp} x {cp}"
        )
        raise ConfigError(
            "numPromptsPerStep",
            prompts,
            f"numPromptsPerStep x numGenerationsPerPrompt ({prompts} x {generations} = {prompts * generations}) is "
            f"the training batch (policy.train_global_batch_size) and must be a multiple of the {data_parallel} "
            f"data-parallel ranks ({training_gpus} training GPUs / {sizes})",
        )

    extra = values.get("extraOverrides", [])
    if not isinstance(extra, list):
        raise ConfigError("extraOverrides", extra, "a list of key=value NeMo RL overrides")
    for item in extra:
        if not isinstance(item, str) or not _OVERRIDE_RE.match(item):
            raise ConfigError("extraOverrides", item, "key=value, +key=value, ++key=value or ~key (Hydra syntax)")
        key = item.split("=", 1)[0].lstrip("+~")
        if key in DERIVED_OVERRIDES:
            raise ConfigError("extraOverrides", item, f"{key} is derived from {DERIVED_OVERRIDES[key]}: set that")

    min_busbw = _float("preflightMinBusbwGbps", values.get("preflightMinBusbwGbps", 100))
    lustre_gib = _float("preflightLustreGibPerNode", values.get("preflightLustreGibPerNode", 16))
    lustre_fraction = _float("preflightLustreMinFraction", values.get("preflightLustreMinFraction", 0.5))
    if min_busbw <= 0:
        raise ConfigError("preflightMinBusbwGbps", min_busbw, "a positive GB/s figure")
    if lustre_gib <= 0:
        raise ConfigError("preflightLustreGibPerNode", lustre_gib, "a positive size in GiB")
    if not 0 < lustre_fraction <= 1:
        raise ConfigError("preflightLustreMinFraction", lustre_fraction, "a fraction in (0, 1]")

    async_grpo, max_age = _async_grpo(values, generation_nodes, extra)
    max_num_steps = _positive("maxNumSteps", values.get("maxNumSteps", BENCHMARK_STEPS if benchmark else 10))
    if benchmark and max_num_steps < BENCHMARK_MIN_STEPS:
        raise ConfigError(
            "maxNumSteps",
            max_num_steps,
            f"{BENCHMARK_MIN_STEPS} or more with benchmark: the summary averages {BENCHMARK_MEASURED_STEPS} steps "
            "after the first (start-up) and before the last (validation and checkpoint)",
        )

    wait_minutes = _positive("waitForWorkersMinutes", values.get("waitForWorkersMinutes", 60))
    seconds_per_step = None
    if values.get("secondsPerStep") not in (None, ""):
        seconds_per_step = _float("secondsPerStep", values["secondsPerStep"])
        if not 0 < seconds_per_step < float("inf"):
            raise ConfigError("secondsPerStep", seconds_per_step, "a positive number of seconds")
    max_restarts = _int("maxRestarts", values.get("maxRestarts", 3))
    if not 0 <= max_restarts <= MAX_RESTARTS:
        raise ConfigError(
            "maxRestarts", max_restarts, f"0..{MAX_RESTARTS}: retries of a failed training attempt (0 = none)"
        )

    model = _model(values.get("model"))
    dataset = _dataset(values.get("dataset"), infra)
    convert_to_hf = _bool("convertToHf", values.get("convertToHf", not benchmark))
    eval_final = _bool("evalFinal", values.get("evalFinal", not benchmark))
    if eval_final and not convert_to_hf:
        raise ConfigError(
            "evalFinal", eval_final, "false when convertToHf is false: the trained model is evaluated in HF format"
        )

    archive = _archive(values, infra)
    if convert_to_hf and backend == performance.MEGATRON:
        raise ConfigError(
            "convertToHf",
            True,
            f"false with {recipe}: it trains with Megatron (policy.megatron_cfg.enabled), and the conversion step "
            "converts DTensor checkpoints only (NeMo RL's examples/converters/convert_dcp_to_hf.py); evalFinal needs "
            "the conversion, so set it false too",
        )
    # Lustre holds the checkpoints the run keeps, the weights and the converted model (launcher/checkpoints.py).
    trained = checkpoints.model_of(model, recipe, infra.nemo_rl_release.tag)
    need = checkpoints.lustre_need(trained, max_num_steps, extra, convert_to_hf)
    space = checkpoints.lustre_space_problem(need, infra.lustre_capacity_gib) if need else None
    if space:
        raise ConfigError("model" if model else "recipe", model or recipe, space)
    too_big = checkpoints.eval_fit_problem(trained, infra.gpu_type, infra.gpus_per_node)
    for key, on in (("evalBase", _bool("evalBase", values.get("evalBase", not benchmark))), ("evalFinal", eval_final)):
        if on and too_big:
            raise ConfigError(key, on, too_big)

    return JobSettings(
        infra_stack=infra_stack,
        run_name=run_name,
        recipe=recipe,
        num_nodes=num_nodes,
        generation_nodes=generation_nodes,
        max_num_steps=max_num_steps,
        num_prompts_per_step=prompts,
        num_generations_per_prompt=generations,
        vllm_tensor_parallel_size=vllm_tp,
        vllm_gpu_memory_utilization=utilization,
        dtensor_tensor_parallel_size=dtensor_tp,
        convert_to_hf=convert_to_hf,
        extra_overrides=tuple(extra),
        preflight=PreflightSettings(
            enabled=_bool("preflight", values.get("preflight", True)),
            min_busbw_gbps=min_busbw,
            lustre_gib_per_node=lustre_gib,
            lustre_min_fraction=lustre_fraction,
        ),
        wait_for_workers_minutes=wait_minutes,
        seconds_per_step=seconds_per_step,
        max_restarts=max_restarts,
        stop_on_delete=_bool("stopOnDelete", values.get("stopOnDelete", True)),
        async_grpo=async_grpo,
        max_trajectory_age_steps=max_age,
        benchmark=benchmark,
        benchmark_recipes=benchmark_recipes,
        training_backend=backend,
        training_parallel=parallel,
        eval_base=_bool("evalBase", values.get("evalBase", not benchmark)),
        eval_final=eval_final,
        rerun=_rerun(values.get("rerun", {})),
        model=model,
        dataset=dataset,
        archive=archive,
    )


def _model(raw: Any) -> str:
    """`model`: a Hugging Face model id, or "" for the recipe's own."""
    model = "" if raw is None else str(raw).strip()
    if model and (not _HF_REPO_RE.match(model) or "--" in model or ".." in model):
        raise ConfigError(
            "model",
            raw,
            "a Hugging Face model id, OWNER/NAME (e.g. Qwen/Qwen2.5-Math-7B-Instruct): letters, digits, '-', '_', '.', "
            "each part at most 96 characters, not starting or ending with '-' or '.', no '--' or '..'; empty for the "
            "recipe's policy.model_name",
        )
    return model


def _dataset(raw: Any, infra: InfraOutputs) -> DatasetSettings | None:
    """`dataset`: unset (GSM8K), or an object naming the user's JSONL source and its problem and answer fields."""
    if raw in (None, "", {}):
        return None
    shape = "an object {source, problemField, answerField[, testSource, name]}, or unset for GSM8K"
    if not isinstance(raw, Mapping):
        raise ConfigError("dataset", raw, shape)
    for field in raw:
        if field not in DATASET_FIELDS:
            match = difflib.get_close_matches(str(field), DATASET_FIELDS, n=1)
            hint = f"; did you mean '{match[0]}'?" if match else ""
            raise ConfigError(f"dataset.{field}", raw[field], f"a field of dataset: {', '.join(DATASET_FIELDS)}{hint}")
    source = _dataset_source("dataset.source", raw.get("source"), infra)
    test_source = _dataset_source("dataset.testSource", raw["testSource"], infra) if raw.get("testSource") else ""
    fields = {}
    for key in ("problemField", "answerField"):
        value = raw.get(key)
        if not isinstance(value, str) or not _FIELD_RE.match(value):
            raise ConfigError(
                f"dataset.{key}",
                value,
                "the name of a top-level field of every row: a letter or '_', then letters, digits, '_' or '-', "
                "at most 64 characters",
            )
        fields[key] = value
    if fields["problemField"] == fields["answerField"]:
        raise ConfigError("dataset.answerField", fields["answerField"], "a field other than dataset.problemField")
    name = raw.get("name") or ""
    if name and not (isinstance(name, str) and _DATASET_NAME_RE.match(name)):
        raise ConfigError(
            "dataset.name", name, "1-40 letters, digits, spaces, '.', '_' or '-', starting with a letter or digit"
        )
    return DatasetSettings(source, fields["problemField"], fields["answerField"], test_source, name)


def _dataset_source(key: str, raw: Any, infra: InfraOutputs) -> str:
    value = raw if isinstance(raw, str) else None
    mount = f"{infra.mount_path}/"
    if value is not None and value.startswith(mount):
        if value.endswith(".jsonl") and ".." not in value.split("/") and not re.search(r"\s", value):
            return value
    elif value is not None and (_GS_SOURCE_RE.match(value) or _HF_SOURCE_RE.match(value)):
        return value
    raise ConfigError(
        key,
        raw,
        f"a JSONL file: gs://BUCKET/PATH.jsonl (read with the Ray service account), a file on Lustre under {mount} "
        f"(e.g. {mount}datasets/mine/rows.jsonl), or hf://datasets/OWNER/NAME[@REVISION]/PATH.jsonl on the Hugging "
        "Face hub (read with HF_TOKEN)",
    )


def _archive(values: Mapping[str, Any], infra: InfraOutputs) -> bool:
    """archive: needs a bucket to copy to, the infra's exportBucket."""
    archive = _bool("archive", values.get("archive", False))
    if archive and not infra.export_bucket:
        raise ConfigError(
            "archive",
            True,
            "false unless the infra stack has an export bucket to copy the checkpoints to: set exportBucket there "
            "(create, or the name of a bucket you own) and run `pulumi up` in the infra project first",
        )
    return archive


def _rerun(raw: Any) -> tuple[tuple[str, int], ...]:
    """`rerun`: a map of step name to rerun number (0 = none). A number, not a flag, so that a new pod of the same
    Job (an eviction, a retry) skips a rerun that already succeeded, and raising it reruns the step once more."""
    if raw in (None, ""):
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError("rerun", raw, 'a map of step name to rerun number, e.g. {"eval-final": 1}')
    reruns: list[tuple[str, int]] = []
    for name, given in raw.items():
        number = int(given) if isinstance(given, str) and given.isdigit() else given
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= MAX_RERUN:
            raise ConfigError(
                f"rerun.{name}", given, f"a whole number 0..{MAX_RERUN}: raise it by one to run the step again"
            )
        if number:
            reruns.append((str(name), number))
    return tuple(reruns)


def _override_key(item: str) -> str:
    return item.split("=", 1)[0].lstrip("+~")


def _async_grpo(values: Mapping[str, Any], generation_nodes: int, extra: list[str]) -> tuple[bool, int]:
    """asyncGrpo and maxTrajectoryAgeSteps, refused where NeMo RL's async path would refuse them or do nothing."""
    enabled = _bool("asyncGrpo", values.get("asyncGrpo", False))
    max_age = _positive("maxTrajectoryAgeSteps", values.get("maxTrajectoryAgeSteps", 1))
    if not enabled:
        if max_age != 1:
            raise ConfigError("maxTrajectoryAgeSteps", max_age, "1 unless asyncGrpo is true (it is the off-policy age)")
        return False, max_age
    if generation_nodes == 0:
        raise ConfigError(
            "asyncGrpo",
            True,
            "false with colocated generation (generationNodes = 0): generation and training share the GPUs, so "
            "nothing overlaps (NeMo RL's async_grpo_train refuses it); give generation its own nodes "
            "(generationNodes 1 or more) to use it",
        )
    for item in extra:
        key, value = _override_key(item), item.split("=", 1)[1].strip().lower()
        if key in ASYNC_REQUIRED and value != ASYNC_REQUIRED[key].split(" ", 1)[0]:
            raise ConfigError("extraOverrides", item, f"with asyncGrpo, {key} must stay {ASYNC_REQUIRED[key]}")
        if key in ASYNC_REFUSED_FEATURES and value == "true":
            raise ConfigError(
                "extraOverrides", item, f"NeMo RL refuses {ASYNC_REFUSED_FEATURES[key]} with async GRPO (asyncGrpo)"
            )
        if key == "policy.generation.vllm_cfg.kv_cache_dtype" and value.startswith("fp8"):
            raise ConfigError("extraOverrides", item, "NeMo RL refuses an FP8 KV cache with async rollouts (asyncGrpo)")
    return True, max_age


def _training_parallel(
    values: Mapping[str, Any], recipe: str, infra: InfraOutputs, training_gpus: int, extra: Any, benchmark: bool
) -> tuple[str, tuple[int, int, int]]:
    """The recipe's training backend and its (TP, PP, CP): a performance recipe trains with Megatron, with the
    recipe's policy.megatron_cfg sizes unless extraOverrides change them, and dtensorTensorParallelSize would be
    ignored; any other recipe with DTensor at dtensorTensorParallelSize. The training GPUs must divide by them."""
    default_tp = BENCHMARK_IGNORES["dtensorTensorParallelSize"]
    shape = None if benchmark else performance.find_by_path(infra.nemo_rl_release.tag, recipe)
    if shape is None or shape.backend != performance.MEGATRON:
        tp = _positive("dtensorTensorParallelSize", values.get("dtensorTensorParallelSize", default_tp))
        if not benchmark and training_gpus % tp:
            raise ConfigError("dtensorTensorParallelSize", tp, f"a divisor of the {training_gpus} training GPUs")
        return performance.DTENSOR, (tp, 1, 1)
    given = values.get("dtensorTensorParallelSize")
    if given not in (None, "") and str(given) != str(default_tp):
        raise ConfigError(
            "dtensorTensorParallelSize",
            given,
            f"unset with {recipe}: it trains with Megatron (policy.megatron_cfg.enabled), whose tensor parallel size "
            f"is policy.megatron_cfg.tensor_model_parallel_size ({shape.parallel[0]} in the recipe); change that in "
            "extraOverrides",
        )
    sizes = list(shape.parallel)
    items = extra if isinstance(extra, list) else []
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            continue  # the extraOverrides check names it
        key, value = _override_key(item), item.split("=", 1)[1].strip()
        if key in MEGATRON_PARALLEL_KEYS:
            sizes[MEGATRON_PARALLEL_KEYS.index(key)] = _positive("extraOverrides", value)
    tp, pp, cp = sizes
    if training_gpus % (tp * pp * cp):
        raise ConfigError(
            "numNodes",
            values.get("numNodes", 2),
            f"training GPUs ((numNodes - generationNodes) x gpusPerNode = {training_gpus}) that divide by {recipe}'s "
            f"Megatron TP x PP x CP ({tp} x {pp} x {cp} = {tp * pp * cp}; policy.megatron_cfg "
            "tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size)",
        )
    return performance.MEGATRON, (tp, pp, cp)


def _recipe_names(raw: Any) -> list[str]:
    """benchmarkRecipes: one recipe name, or a list of them; unset, the Llama 3.1 8B trio."""
    if raw in (None, "", []):
        return list(DEFAULT_BENCHMARK_RECIPES)
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(item, str) and item.strip() for item in raw):
        raise ConfigError(
            "benchmarkRecipes",
            raw,
            "a performance recipe's name (e.g. grpo-qwen3-32b-4n8g), or a list of them, run one after the other",
        )
    return [performance.recipe_name(item) for item in raw]


def _benchmark(values: Mapping[str, Any], infra: InfraOutputs) -> tuple[BenchmarkRecipe, ...]:
    """benchmark: NVIDIA's performance recipes of the image's release (benchmarkRecipes), as they are, each on its own
    cluster shape, which the infra must hold; keys it would ignore are refused. Empty without benchmark."""
    if not _bool("benchmark", values.get("benchmark", False)):
        if values.get("benchmarkRecipes") not in (None, "", []):
            raise ConfigError("benchmarkRecipes", values["benchmarkRecipes"], "unset unless benchmark is true")
        return ()
    release = infra.nemo_rl_release.tag
    available = performance.recipes_of(release)

    def fits(recipe: PerformanceRecipe) -> bool:
        return recipe.gpus_per_node == infra.gpus_per_node and recipe.num_nodes <= infra.ray_worker_replicas

    runnable = [name for name, r in available.items() if fits(r) and r.hub_model and r.dataset == performance.OPEN_MATH]
    infra_shape = (
        f"this infra has {infra.ray_worker_replicas} GPU workers of {infra.gpus_per_node} GPUs (rayWorkerReplicas, "
        f"gpusPerNode); the recipes that fit it: {', '.join(runnable) or 'none'}"
    )
    names = _recipe_names(values.get("benchmarkRecipes"))
    chosen: list[BenchmarkRecipe] = []
    for name in names:
        recipe = available.get(name)
        if recipe is None:
            match = difflib.get_close_matches(name, list(available), n=1)
            hint = f"did you mean '{match[0]}'? " if match else ""
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"{hint}a recipe of NeMo RL {release}'s {performance.PERFORMANCE_DIR}/ (the image's release); "
                f"{infra_shape}",
            )
        if not fits(recipe):
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"a recipe whose cluster the infra holds: it needs {recipe.num_nodes} nodes of {recipe.gpus_per_node} "
                f"GPUs (cluster.num_nodes x cluster.gpus_per_node = {recipe.gpus} GPUs); {infra_shape}",
            )
        if recipe.dataset != performance.OPEN_MATH:
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"a recipe that trains on {performance.OPEN_MATH} (the data the benchmark prepares on Lustre); this "
                f"one trains on {recipe.dataset}",
            )
        if not recipe.hub_model:
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"a recipe whose model is on the Hugging Face hub: its policy.model_name is NVIDIA's placeholder "
                f"({recipe.model!r}) for a checkpoint you convert first, so it cannot run unchanged",
            )
        if any(item.recipe.name == name for item in chosen):
            raise ConfigError("benchmarkRecipes", name, "each recipe once")
        chosen.append(BenchmarkRecipe(recipe, published_for(release, name)))

    def changed(key: str) -> bool:
        value, default = values.get(key), BENCHMARK_IGNORES[key]
        return value is not None and str(value).lower() != str(default).lower()

    ignored = [key for key in BENCHMARK_IGNORES if changed(key)]
    if ignored:
        raise ConfigError(
            "benchmark",
            True,
            f"runs NeMo RL's performance recipes unchanged (but for paths and maxNumSteps), so {', '.join(ignored)} "
            "would be ignored: remove them from the benchmark's job stack",
        )
    for key in ("convertToHf", "archive"):
        if _bool(key, values.get(key, False)):
            raise ConfigError(key, True, "false with benchmark: its checkpoints are not a model to keep")
    for key in ("evalBase", "evalFinal"):
        if _bool(key, values.get(key, False)):
            raise ConfigError(key, True, "false with benchmark: it measures speed, on NVIDIA's data, not accuracy")
    return tuple(chosen)


_PLAIN_KEYS = (
    "infraStack", "runName", "recipe", "numNodes", "generationNodes", "maxNumSteps", "numPromptsPerStep",
    "numGenerationsPerPrompt", "vllmTensorParallelSize", "vllmGpuMemoryUtilization", "dtensorTensorParallelSize",
    "convertToHf", "preflight", "preflightMinBusbwGbps", "preflightLustreGibPerNode", "preflightLustreMinFraction",
    "waitForWorkersMinutes", "secondsPerStep", "maxRestarts", "stopOnDelete", "asyncGrpo", "maxTrajectoryAgeSteps",
    "benchmark",
    "evalBase", "evalFinal", "model", "archive",
)  # fmt: skip


_OBJECT_KEYS = ("extraOverrides", "rerun", "dataset", "benchmarkRecipes")


# The GKE NeMo RL tutorial's variables (its `export NAME=...` lines), by their letters alone (case, '_' and '-'
# dropped), that a job stack sets under another name or not at all: the hint for each.
KEY_ALIASES = {
    "replicacount": "did you mean 'numNodes'? (the run's GPU nodes; the infra's rayWorkerReplicas is the most)",
    "worldsize": "did you mean 'numNodes'? (the run's GPUs are numNodes x the infra's gpusPerNode)",
    "hftoken": "the token is the infra stack's secret: pulumi config set --secret hfToken hf_... in the infra project",
    "wandbapikey": "the key is the infra stack's secret: pulumi config set --secret wandbApiKey KEY in the infra "
    "project",
}


def check_keys(project: str, keys: Iterable[str]) -> None:
    """Refuse a key in this project's namespace that the program does not read (or in a near miss of the
    namespace): it would be ignored without a word. Names the closest known key."""
    known = [*_PLAIN_KEYS, *_OBJECT_KEYS]
    for full_key in sorted(keys):
        namespace, _, key = full_key.rpartition(":")
        if namespace == project and key not in known:
            alias = KEY_ALIASES.get(re.sub(r"[^a-z0-9]", "", key.lower()))
            match = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = (
                alias
                if alias
                else f"did you mean '{match[0]}'?"
                if match
                else "see the job stack's table in docs/configuration.md"
            )
            raise UnknownKeyError(full_key, hint)
        if namespace != project and difflib.get_close_matches(namespace, [project]):
            raise UnknownKeyError(full_key, f"its namespace is not {project!r}; did you mean '{project}:{key}'?")


def read_config() -> dict[str, Any]:
    """The job settings, after refusing keys the program would ignore (`pulumi up` hands every key over in
    PULUMI_CONFIG; mocks set the runtime's map)."""
    check_keys(
        pulumi.get_project(), set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.config.get_config_env())
    )
    config = pulumi.Config()
    values: dict[str, Any] = {key: config.get(key) for key in _PLAIN_KEYS if config.get(key) not in (None, "")}
    for key in _OBJECT_KEYS:
        try:
            value = config.get_object(key)
        except pulumi.ConfigTypeError:
            if key != "benchmarkRecipes":
                raise
            value = config.get(key)  # one recipe's name, set as plain text: `pulumi config set benchmarkRecipes X`
        if value is not None:
            values[key] = value
    return values


async def read_infra_outputs(ref: pulumi.StackReference, stack: str) -> InfraOutputs:
    """The infra stack's plain outputs, validated. Secret outputs (the kubeconfig) are not read here: they stay
    secret Outputs, taken with `ref.require_output`."""
    plain: dict[str, Any] = {}
    for name in (await ref.outputs.future()) or {}:
        details = await ref.get_output_details(name)
        if details.value is not None:
            plain[name] = details.value
    return build_infra_outputs(plain, stack=stack)
