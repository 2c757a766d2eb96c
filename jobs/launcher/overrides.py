"""NeMo RL's command-line overrides of each step (train, async GRPO, benchmark, eval) and notes on them. Pure."""

from __future__ import annotations

from config_rules import ConfigError

from launcher import paths, performance
from launcher.infra_outputs import FLAT_DATA, InfraOutputs
from launcher.job_settings import JobSettings

# The prompt every shipped recipe trains with (data.prompt_file up to v0.5.0, data.default.prompt_file from v0.6.0;
# tests resolve each recipe to it): the evaluations ask in the same words. eval.yaml's own default is no prompt.
TRAINING_PROMPT_FILE = "examples/prompts/cot.txt"


def data_overrides(infra: InfraOutputs, data: str, validation: str = "test.jsonl") -> list[str]:
    """The prepared files in `data` as the release's config names its data: train.jsonl to train on, test.jsonl
    (GSM8K's test split, or the rows held out of the user's dataset) to validate on, rows read as `input` (the
    problem) and `output` (only the final answer, so the math reward can match the model's boxed answer: raw GSM8K
    answers always score 0). The benchmark's folder has the same row format, with `validation` of its own."""
    if infra.nemo_rl_release.data_layout == FLAT_DATA:
        return [
            "data.dataset_name=ResponseDataset",
            f"+data.train_data_path={data}/train.jsonl",
            f"+data.val_data_path={data}/{validation}",
            "+data.input_key=input",
            "+data.output_key=output",
        ]
    # PER_SPLIT_DATA: the same files through the same ResponseDataset. The base config splits 5% of the training
    # data off as extra validation data unless split_validation_size is 0: validation stays GSM8K's test split.
    return [
        "data.train.dataset_name=ResponseDataset",
        f"+data.train.data_path={data}/train.jsonl",
        "data.train.split_validation_size=0",
        "+data.validation.dataset_name=ResponseDataset",
        f"+data.validation.data_path={data}/{validation}",
        "+data.default.input_key=input",
        "+data.default.output_key=output",
    ]


def grpo_overrides(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """Hydra-style overrides for the release's GRPO entrypoint, in a fixed order; extraOverrides come last so
    they win."""
    gpus = infra.gpus_per_node
    ckpt = paths.checkpoint_dir(job, infra)
    overrides = [*model_overrides(job)]
    overrides += [
        f"cluster.num_nodes={job.num_nodes}",
        f"cluster.gpus_per_node={gpus}",
        f"grpo.max_num_steps={job.max_num_steps}",
        f"grpo.num_prompts_per_step={job.num_prompts_per_step}",
        f"grpo.num_generations_per_prompt={job.num_generations_per_prompt}",
        # Every sample of a step in one optimizer step (validated against the data-parallel size in settings).
        f"policy.train_global_batch_size={job.train_global_batch_size}",
    ]
    if job.generation_nodes:
        overrides += [
            "policy.generation.colocated.enabled=False",
            f"policy.generation.colocated.resources.num_nodes={job.generation_nodes}",
            f"policy.generation.colocated.resources.gpus_per_node={gpus}",
        ]
    else:
        overrides.append("policy.generation.colocated.enabled=True")
    overrides.append(f"policy.generation.vllm_cfg.tensor_parallel_size={job.vllm_tensor_parallel_size}")
    if job.vllm_gpu_memory_utilization is not None:
        overrides.append(f"policy.generation.vllm_cfg.gpu_memory_utilization={job.vllm_gpu_memory_utilization:g}")
    dtensor = job.training_backend == performance.DTENSOR
    if dtensor:  # a Megatron recipe keeps its policy.megatron_cfg sizes (extraOverrides may change them)
        overrides.append(f"policy.dtensor_cfg.tensor_parallel_size={job.dtensor_tensor_parallel_size}")
    if job.async_grpo:
        overrides += async_grpo_overrides(job.max_trajectory_age_steps)
    check_from_tp = infra.nemo_rl_release.logprob_batch_check_from_tp
    if dtensor and check_from_tp is not None and job.dtensor_tensor_parallel_size >= check_from_tp:
        # NeMo RL refuses to start otherwise (the Gemma 3 27B recipes use micro batch 1, logprob batch 4); the
        # interpolation follows whatever micro batch the recipe sets.
        overrides.append("policy.logprob_batch_size=${policy.train_micro_batch_size}")
    overrides += [
        f"checkpointing.checkpoint_dir={ckpt}",
        f"logger.log_dir={paths.log_dir(job, infra)}",
        *data_overrides(infra, paths.dataset_dir(job, infra)),
    ]
    # TensorBoard event files under the log dir on every run, with or without W&B: the infra's TensorBoard serves
    # them from Lustre, so every run's metrics stay readable in the cluster.
    if "WANDB_API_KEY" in infra.secret_keys:
        overrides += ["logger.wandb_enabled=True", f"logger.wandb.name={job.run_name}"]
    else:
        overrides.append("logger.wandb_enabled=False")
    overrides.append("logger.tensorboard_enabled=True")
    refuse_second_appends(overrides, job.extra_overrides)
    return overrides + list(job.extra_overrides)


def refuse_second_appends(ours: list[str], extra: tuple[str, ...]) -> None:
    """An extraOverride `+key=...` for a key these overrides already set: Hydra refuses a key appended twice, or
    appended where the config has it, and NeMo RL's loader fails at train, after the GPUs are up."""
    ours_by_key = {item.split("=", 1)[0].lstrip("+~"): item for item in ours}
    for item in extra:
        name = item.split("=", 1)[0]
        key = name.lstrip("+~")
        if name.startswith("+") and not name.startswith("++") and key in ours_by_key:
            raise ConfigError(
                "extraOverrides",
                item,
                f"the pipeline already sets {key} ({ours_by_key[key]}) and Hydra refuses a second append: drop the "
                f"'+' to override its value ({key}={item.split('=', 1)[1]}), or remove the item",
            )


def model_overrides(job: JobSettings) -> list[str]:
    """The job setting model: the policy's model and tokenizer (every shipped recipe names its tokenizer itself, so
    setting only policy.model_name would train the new model with the old tokenizer). Nothing without it."""
    if not job.model:
        return []
    return [f"policy.model_name={job.model}", f"policy.tokenizer.name={job.model}"]


def model_notes(job: JobSettings) -> list[str]:
    """What the plan says about the job setting model: the launcher holds no figures (attention heads, memory) of any
    model, so whether it fits the run's GPUs and divides by its tensor-parallel sizes is not checked here."""
    if not job.model:
        return []
    if job.training_backend == performance.DTENSOR:
        training = f"dtensorTensorParallelSize ({job.dtensor_tensor_parallel_size})"
    else:
        tp, pp, cp = job.training_parallel
        training = f"the recipe's Megatron TP x PP x CP ({tp} x {pp} x {cp})"
    return [
        f"model {job.model}: fit unchecked here: the launcher knows no attention-head count or memory size for it. "
        f"The prefetch-weights step reads its config.json and fails before training when vllmTensorParallelSize "
        f"({job.vllm_tensor_parallel_size}) does not divide its attention heads; whether {training} suits it and "
        "its weights fit the GPUs is left to NeMo RL and vLLM when they start"
    ]


def recipe_notes(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """What the plan says about a performance recipe run as a training run: those that save no checkpoints
    (checkpointing.enabled false, NVIDIA's Qwen3 ones) leave a retried train attempt nothing to resume from."""
    shape = None if job.benchmark else performance.find_by_path(infra.nemo_rl_release.tag, job.recipe)
    if shape is None or shape.checkpointing or _override_value(job, "checkpointing.enabled") is not None:
        return []
    return [
        f"recipe {job.recipe}: it saves no checkpoints (checkpointing.enabled false), so a retried train attempt "
        "(maxRestarts) starts again from step 1: add extraOverrides checkpointing.enabled=true to resume instead"
    ]


def async_grpo_overrides(max_trajectory_age_steps: int) -> list[str]:
    """What NeMo RL's async path needs (examples/run_grpo*.py, algorithms/grpo.py async_grpo_train at v0.5.0 and
    v0.7.0): async GRPO itself, the importance-sampling correction it asserts, vLLM's async engine it asserts, and
    in-flight weight updates as NVIDIA's 1-step off-policy recipes set them (past one step NeMo RL warns that the
    extra age buys nothing without them)."""
    return [
        "grpo.async_grpo.enabled=True",
        f"grpo.async_grpo.max_trajectory_age_steps={max_trajectory_age_steps}",
        "grpo.async_grpo.in_flight_weight_updates=True",
        "loss_fn.use_importance_sampling_correction=True",
        "policy.generation.vllm_cfg.async_engine=True",
    ]


def benchmark_overrides(job: JobSettings, infra: InfraOutputs, mode: str) -> list[str]:
    """NVIDIA's recipe as it is, but for paths (checkpoints, logs, the prepared data) and the step count; W&B only
    with a key (the recipes turn it on), TensorBoard always (the summary reads its event files)."""
    with_wandb = "WANDB_API_KEY" in infra.secret_keys
    return [
        f"grpo.max_num_steps={job.max_num_steps}",
        f"checkpointing.checkpoint_dir={paths.checkpoint_dir(job, infra)}/{mode}",
        f"logger.log_dir={paths.benchmark_log_dir(job, infra, mode)}",
        *data_overrides(infra, paths.benchmark_dataset_dir(infra), "validation.jsonl"),
        f"logger.wandb_enabled={with_wandb}",
        "logger.tensorboard_enabled=True",
    ]


def _override_value(job: JobSettings, key: str) -> str | None:
    """The value an extraOverride gives `key` (the last one wins, as in NeMo RL), or None."""
    for item in reversed(job.extra_overrides):
        name, _, value = item.partition("=")
        if name.lstrip("+~") == key:
            return value
    return None


def training_prompt_file(job: JobSettings, infra: InfraOutputs) -> str:
    """The prompt file the run trains with: the recipe's, unless an extraOverride replaces it."""
    key = "data.prompt_file" if infra.nemo_rl_release.data_layout == FLAT_DATA else "data.default.prompt_file"
    return _override_value(job, key) or TRAINING_PROMPT_FILE


def eval_overrides(job: JobSettings, infra: InfraOutputs, save_path: str) -> list[str]:
    """Overrides for run_eval.py on eval.yaml: GSM8K's test split (the prepared test.jsonl, read by NeMo RL's local
    math dataset, its fallback for a name it has no built-in set for) in the training prompt, greedy, one sample per
    problem, pass@1, on one GPU node with the run's vLLM tensor parallelism (the size training generates with).

    run_eval.py merges its arguments with OmegaConf.from_cli, not Hydra: plain key=value, no `+` (new keys are simply
    added). The model is added by eval_model.py: the job setting model, else the recipe's policy.model_name (read on
    the cluster), or the converted model. The job setting dataset's held-out rows replace GSM8K's test split."""
    data = paths.dataset_dir(job, infra)
    return [
        "eval.metric=pass@k",
        "eval.k_value=1",
        "eval.num_tests_per_prompt=1",
        f"eval.save_path={save_path}",
        "generation.temperature=0.0",
        f"generation.vllm_cfg.tensor_parallel_size={job.vllm_tensor_parallel_size}",
        "cluster.num_nodes=1",
        f"cluster.gpus_per_node={infra.gpus_per_node}",
        f"data.dataset_name={data}/test.jsonl",
        "data.file_format=json",
        "data.split=train",  # the datasets library names the one split of a plain JSON file "train"
        "data.problem_key=input",
        "data.solution_key=output",
        f"data.prompt_file={training_prompt_file(job, infra)}",
    ]
