"""NeMo RL's own rules for a run, checked against the job settings before anything is registered: how its nodes,
GPUs and batch divide, which overrides the launcher derives, what async GRPO needs, and what the recipe's model
needs of Lustre and the GPUs. Each refusal names the job setting to change."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from config_rules import ConfigError

from launcher import checkpoints, performance
from launcher.infra_outputs import InfraOutputs

if TYPE_CHECKING:
    from launcher.job_settings import JobSettings

# Hydra's override forms: key=value, +key=value (append), ++key=value (append or override), ~key[=value] (delete).
_OVERRIDE_RE = re.compile(r"^(\+{0,2}[A-Za-z_][A-Za-z0-9_.\-]*=.*|~[A-Za-z_][A-Za-z0-9_.\-]*(=.*)?)$")
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


def _key_and_value(item: str) -> tuple[str, str]:
    key, _, value = item.partition("=")
    return key.lstrip("+~"), value.strip()


def check_cluster(job: JobSettings, infra: InfraOutputs) -> tuple[str, tuple[int, int, int]]:
    """The run's nodes, GPUs and batch as NeMo RL divides them; returns the recipe's training backend and its
    (TP, PP, CP)."""
    if job.num_nodes > infra.ray_worker_replicas:
        raise ConfigError(
            "numNodes",
            job.num_nodes,
            f"at most the infra's Ray GPU workers (rayWorkerReplicas = {infra.ray_worker_replicas})",
        )
    if not 0 <= job.generation_nodes < job.num_nodes:
        raise ConfigError(
            "generationNodes",
            job.generation_nodes,
            f"0 (generation colocated with training) or 1..{job.num_nodes - 1}: below numNodes ({job.num_nodes}) so "
            "that training keeps at least one node",
        )
    gpus = infra.gpus_per_node
    training_gpus = (job.num_nodes - job.generation_nodes) * gpus
    generation_gpus = (job.generation_nodes or job.num_nodes) * gpus
    if generation_gpus % job.vllm_tensor_parallel_size or job.vllm_tensor_parallel_size > gpus:
        raise ConfigError(
            "vllmTensorParallelSize",
            job.vllm_tensor_parallel_size,
            f"a divisor of the {generation_gpus} generation GPUs, at most {gpus} (one node)",
        )
    backend, (tp, pp, cp) = _training_parallel(job, infra, training_gpus)
    # NeMo RL shards each training batch over its data-parallel ranks (training GPUs / (TP x CP x PP); the DTensor
    # recipes run CP = PP = 1) and asserts that they divide it.
    data_parallel = training_gpus // (tp * pp * cp)
    batch = job.train_global_batch_size
    if not job.benchmark and batch % data_parallel:
        sizes = (
            f"dtensorTensorParallelSize {tp}"
            if backend == performance.DTENSOR
            else f"the recipe's Megatron TP x PP x CP = {tp} x {pp} x {cp}"
        )
        raise ConfigError(
            "numPromptsPerStep",
            job.num_prompts_per_step,
            f"numPromptsPerStep x numGenerationsPerPrompt ({job.num_prompts_per_step} x "
            f"{job.num_generations_per_prompt} = {batch}) is the training batch (policy.train_global_batch_size) and "
            f"must be a multiple of the {data_parallel} data-parallel ranks ({training_gpus} training GPUs / {sizes})",
        )
    return backend, (tp, pp, cp)


def _training_parallel(job: JobSettings, infra: InfraOutputs, training_gpus: int) -> tuple[str, tuple[int, int, int]]:
    """A performance recipe trains with Megatron, with the recipe's policy.megatron_cfg sizes unless extraOverrides
    change them, and dtensorTensorParallelSize would be ignored; any other recipe with DTensor at
    dtensorTensorParallelSize. The training GPUs must divide by them."""
    tp = job.dtensor_tensor_parallel_size
    shape = None if job.benchmark else performance.find_by_path(infra.nemo_rl_release.tag, job.recipe)
    if shape is None or shape.backend != performance.MEGATRON:
        if not job.benchmark and training_gpus % tp:
            raise ConfigError("dtensorTensorParallelSize", tp, f"a divisor of the {training_gpus} training GPUs")
        return performance.DTENSOR, (tp, 1, 1)
    if tp != type(job).model_fields["dtensor_tensor_parallel_size"].default:
        raise ConfigError(
            "dtensorTensorParallelSize",
            tp,
            f"unset with {job.recipe}: it trains with Megatron (policy.megatron_cfg.enabled), whose tensor parallel "
            f"size is policy.megatron_cfg.tensor_model_parallel_size ({shape.parallel[0]} in the recipe); change that "
            "in extraOverrides",
        )
    sizes = list(shape.parallel)
    for item in job.extra_overrides:
        key, value = _key_and_value(item)
        if key in MEGATRON_PARALLEL_KEYS:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError("extraOverrides", item, f"{key} a whole number, 1 or more")
            sizes[MEGATRON_PARALLEL_KEYS.index(key)] = int(value)
    tp, pp, cp = sizes
    if training_gpus % (tp * pp * cp):
        raise ConfigError(
            "numNodes",
            job.num_nodes,
            f"training GPUs ((numNodes - generationNodes) x gpusPerNode = {training_gpus}) that divide by "
            f"{job.recipe}'s Megatron TP x PP x CP ({tp} x {pp} x {cp} = {tp * pp * cp}; policy.megatron_cfg "
            "tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size)",
        )
    return performance.MEGATRON, (tp, pp, cp)


def check_overrides(job: JobSettings) -> None:
    """extraOverrides in Hydra's syntax, none of a key the launcher derives, and none that breaks async GRPO."""
    for item in job.extra_overrides:
        if not _OVERRIDE_RE.match(item):
            raise ConfigError("extraOverrides", item, "key=value, +key=value, ++key=value or ~key (Hydra syntax)")
        key, value = _key_and_value(item)
        if key in DERIVED_OVERRIDES:
            raise ConfigError("extraOverrides", item, f"{key} is derived from {DERIVED_OVERRIDES[key]}: set that")
    if not job.async_grpo:
        if job.max_trajectory_age_steps != 1:
            raise ConfigError(
                "maxTrajectoryAgeSteps",
                job.max_trajectory_age_steps,
                "1 unless asyncGrpo is true (it is the off-policy age)",
            )
        return
    if job.generation_nodes == 0:
        raise ConfigError(
            "asyncGrpo",
            True,
            "false with colocated generation (generationNodes = 0): generation and training share the GPUs, so "
            "nothing overlaps (NeMo RL's async_grpo_train refuses it); give generation its own nodes "
            "(generationNodes 1 or more) to use it",
        )
    for item in job.extra_overrides:
        key, value = _key_and_value(item)
        value = value.lower()
        if key in ASYNC_REQUIRED and value != ASYNC_REQUIRED[key].split(" ", 1)[0]:
            raise ConfigError("extraOverrides", item, f"with asyncGrpo, {key} must stay {ASYNC_REQUIRED[key]}")
        if key in ASYNC_REFUSED_FEATURES and value == "true":
            raise ConfigError(
                "extraOverrides", item, f"NeMo RL refuses {ASYNC_REFUSED_FEATURES[key]} with async GRPO (asyncGrpo)"
            )
        if key == "policy.generation.vllm_cfg.kv_cache_dtype" and value.startswith("fp8"):
            raise ConfigError("extraOverrides", item, "NeMo RL refuses an FP8 KV cache with async rollouts (asyncGrpo)")


def check_model(job: JobSettings, infra: InfraOutputs) -> None:
    """What the trained model needs: a DTensor checkpoint to convert, room on Lustre, and GPUs to evaluate on."""
    if job.convert_to_hf and job.training_backend == performance.MEGATRON:
        raise ConfigError(
            "convertToHf",
            True,
            f"false with {job.recipe}: it trains with Megatron (policy.megatron_cfg.enabled), and the conversion step "
            "converts DTensor checkpoints only (NeMo RL's examples/converters/convert_dcp_to_hf.py); evalFinal needs "
            "the conversion, so set it false too",
        )
    # Lustre holds the checkpoints the run keeps, the weights and the converted model (launcher/checkpoints.py).
    trained = checkpoints.model_of(job.model, job.recipe, infra.nemo_rl_release.tag)
    need = checkpoints.lustre_need(trained, job.max_num_steps, list(job.extra_overrides), job.convert_to_hf)
    space = checkpoints.lustre_space_problem(need, infra.lustre_capacity_gib) if need else None
    if space:
        raise ConfigError("model" if job.model else "recipe", job.model or job.recipe, space)
    too_big = checkpoints.eval_fit_problem(trained, infra.gpu_type, infra.gpus_per_node)
    for key, on in (("evalBase", job.eval_base), ("evalFinal", job.eval_final)):
        if on and too_big:
            raise ConfigError(key, on, too_big)
