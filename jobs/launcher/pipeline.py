"""The run as data: NeMo RL overrides and the ordered Ray jobs, each with a stable submission id. Pure."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from submitter.attempts import DEFAULT_MAX_RESUBMITS, attempt_id

from launcher import performance
from launcher.settings import (
    BENCHMARK_MEASURED_STEPS,
    FLAT_DATA,
    BenchmarkRecipe,
    ConfigError,
    InfraOutputs,
    JobSettings,
)

NEMO_RL_DIR = "/opt/nemo-rl"  # where the NeMo RL image keeps its sources and uv project
SCRIPTS_MOUNT = "/opt/launcher"  # the ConfigMap with our scripts, inside the submitter pod
SUBMITTER = f"{SCRIPTS_MOUNT}/ray_submit.py"
# ray_submit.py's modules, in a folder beside it (in the ConfigMap volume and in the per-run copy on Lustre).
SUBMITTER_PACKAGE = "submitter"
WAIT_FOR_WORKERS = f"{SCRIPTS_MOUNT}/wait_for_workers.py"
ADMISSION = f"{SCRIPTS_MOUNT}/admission.py"
# Inside the submitter pod (a shell word, expanded there): written by the admission holder once Ray runs the run's
# place on the GPU nodes.
ADMITTED_FILE = '"${TMPDIR:-/tmp}/nemo-rl-admitted"'
BENCHMARK_SUMMARY = f"{SCRIPTS_MOUNT}/benchmark_summary.py"
# The data NeMo RL's performance recipes train on (data.dataset_name OpenMathInstruct-2: the hub dataset's train_1M
# split, 5% held out for validation with the recipe's seed), prepared on Lustre once like GSM8K.
BENCHMARK_DATASET = "openmathinstruct2-train_1M"
EVAL_SUMMARY = f"{SCRIPTS_MOUNT}/eval_summary.py"
# NeMo RL's evaluation (the same script and base config at v0.5.0 and v0.7.0), relative to its sources.
EVAL_ENTRYPOINT = "examples/run_eval.py"
EVAL_CONFIG = "examples/configs/evals/eval.yaml"
# The prompt every shipped recipe trains with (data.prompt_file up to v0.5.0, data.default.prompt_file from v0.6.0;
# tests resolve each recipe to it): the evaluations ask in the same words. eval.yaml's own default is no prompt.
TRAINING_PROMPT_FILE = "examples/prompts/cot.txt"
# How long the submitter waits for a deleted run's Ray job to reach STOPPED; the pod's grace period covers it.
STOP_TIMEOUT_S = 30


@dataclass(frozen=True)
class Step:
    name: str
    submission_id: str
    entrypoint: list[str]
    on_failure: str = ""  # what to check when this step fails
    max_retries: int = 0  # FAILED attempts submitted again as <id>-r1, -r2, ... (ray_submit.py --max-retries)
    # A job lost in a Ray head restart once no retry remains: submitted again under its own id this often.
    max_resubmits: int = DEFAULT_MAX_RESUBMITS
    rerun: int = 0  # the job setting rerun's number for this step: 0, its first run
    # A NeMo RL override whose larger value continues a finished or stopped run (ray_submit.py --extendable).
    extendable: str = ""


# Steps whose input is an earlier step's output (launcher steps only; NeMo RL's own reads are not listed): a rerun
# of the earlier step leaves them with results of the old output unless they are rerun too.
READS_OUTPUT_OF = {
    "convert-hf": ("train",),
    "export-gcs": ("convert-hf",),
    "eval-final": ("convert-hf",),
    "archive": ("train", "convert-hf"),
}


def dataset_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """The prepared train.jsonl and test.jsonl: GSM8K's, or the job setting dataset's (a folder per source and
    fields, so a changed dataset is prepared anew and another run's files are never overwritten)."""
    folder = job.dataset.folder if job.dataset else "gsm8k"
    return f"{infra.mount_path}/datasets/{folder}"


def dataset_label(job: JobSettings) -> str:
    """The evaluated dataset as the accuracy line names it."""
    return job.dataset.label if job.dataset else "GSM8K"


def job_name(job: JobSettings) -> str:
    """The submitter's Kubernetes Job."""
    return f"{job.run_name}-pipeline"


def run_marker_name(job: JobSettings) -> str:
    """A ConfigMap that lives as long as the run: the job stack deletes it before the Job only when destroyed."""
    return f"{job.run_name}-run"


def attempt_ids(step: Step) -> list[str]:
    """Every submission id a step may use, in order, as the submitter names them."""
    return [attempt_id(step.submission_id, k) for k in range(step.max_retries + 1)]


# The Ray dashboard and Jobs API on a workstation, through the infra stack's dashboardPortForward command.
PORT_FORWARD_ADDRESS = "http://127.0.0.1:8265"


def ray_job_command(step: Step, verb: str, address: str = PORT_FORWARD_ADDRESS) -> str:
    """`ray job VERB` (status, logs, stop) on the step's newest attempt that Ray knows: after a retry the running
    attempt is ID-rK, not ID. `ray job status` exits 1 for an id Ray does not know."""
    ids = attempt_ids(step)
    if len(ids) == 1:
        return f"ray job {verb} --address {address} {shlex.quote(ids[0])}"
    newest_first = " ".join(shlex.quote(aid) for aid in reversed(ids))
    return (
        f'for id in {newest_first}; do if ray job status --address {address} "$id" >/dev/null 2>&1; '
        f'then ray job {verb} --address {address} "$id"; break; fi; done'
    )


def checkpoint_dir(job: JobSettings, infra: InfraOutputs) -> str:
    return f"{infra.mount_path}/{job.run_name}"


def outcomes_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """Each step's outcome record (ray_submit.py --record): on Lustre with the run, so a new submitter pod, a
    restarted Ray head (whose job table starts empty) or a replaced Job knows which steps already succeeded."""
    return f"{checkpoint_dir(job, infra)}/step-outcomes"


def outcome_record(step: Step, job: JobSettings, infra: InfraOutputs) -> str:
    """A rerun has its own record (and attempt ledger beside it): the first run's stay as they were."""
    suffix = f".rerun{step.rerun}" if step.rerun else ""
    return f"{outcomes_dir(job, infra)}/{step.name}{suffix}.json"


def with_reruns(steps: list[Step], job: JobSettings) -> list[Step]:
    """The job setting rerun applied: each named step gets the submission id `<id>-rerunN` (Ray never runs an id
    twice, and the old one's SUCCEEDED stays in its table) and the record `<step>.rerunN.json`, so it runs again
    once, and a later pod of the same Job skips it like any recorded step."""
    names = [step.name for step in steps]
    numbers = dict(job.rerun)
    for name in numbers:
        if name not in names:
            raise ConfigError(f"rerun.{name}", numbers[name], f"a step of this run: {', '.join(names)}")
    return [
        replace(step, submission_id=f"{step.submission_id}-rerun{numbers[step.name]}", rerun=numbers[step.name])
        if step.name in numbers
        else step
        for step in steps
    ]


def rerun_warnings(steps: list[Step]) -> list[str]:
    """A rerun step whose readers are not rerun: they keep what they made from its earlier output."""
    rerun = {step.name for step in steps if step.rerun}
    warnings = []
    for step in steps:
        stale = [source for source in READS_OUTPUT_OF.get(step.name, ()) if source in rerun]
        if stale and not step.rerun:
            warnings.append(
                f"rerun: {step.name} reads what {' and '.join(stale)} writes but is not rerun, so it keeps the result "
                f'of the earlier output; add it to rerun too (rerun["{step.name}"]) to redo it'
            )
    return warnings


def log_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """NeMo RL's logs and TensorBoard event files: on Lustre with the run, so a head restart keeps them."""
    return f"{checkpoint_dir(job, infra)}/logs"


def model_uri(job: JobSettings, infra: InfraOutputs) -> str:
    """Where the final model ends: the export bucket when there is one, else Lustre; "" without conversion."""
    if not job.convert_to_hf:
        return ""
    if infra.export_bucket:
        return f"gs://{infra.export_bucket}/{job.run_name}/"
    return f"{checkpoint_dir(job, infra)}/hf"


def archive_uri(job: JobSettings, infra: InfraOutputs) -> str:
    """Where the archive step copies the run's newest checkpoint and its HF conversion; "" without it. Beside the
    exported model (gs://BUCKET/RUN/), not inside it, so fetching the model never pulls a checkpoint; a run name
    has no '.', so no other run's prefix can begin with this one."""
    if not job.archive:
        return ""
    return f"gs://{infra.export_bucket}/{job.run_name}.archive/"


def eval_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """Per-sample results of both evaluations (base/, final/) and the summary JSON."""
    return f"{checkpoint_dir(job, infra)}/eval"


def eval_cache_dir(infra: InfraOutputs) -> str:
    """eval-base's results, kept across runs by a digest of what decides them (eval_model.py --cache-dir)."""
    return f"{infra.mount_path}/eval-cache/base"


def eval_summary_file(job: JobSettings, infra: InfraOutputs) -> str:
    return f"{eval_dir(job, infra)}/summary.json"


def scripts_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """Our scripts, copied to Lustre per run so every Ray node sees the same files."""
    return f"{checkpoint_dir(job, infra)}/scripts"


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
    ckpt = checkpoint_dir(job, infra)
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
        f"logger.log_dir={log_dir(job, infra)}",
        *data_overrides(infra, dataset_dir(job, infra)),
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


def benchmark_dataset_dir(infra: InfraOutputs) -> str:
    return f"{infra.mount_path}/datasets/{BENCHMARK_DATASET}"


def benchmark_log_dir(job: JobSettings, infra: InfraOutputs, mode: str) -> str:
    return f"{log_dir(job, infra)}/{mode}"


def benchmark_overrides(job: JobSettings, infra: InfraOutputs, mode: str) -> list[str]:
    """NVIDIA's recipe as it is, but for paths (checkpoints, logs, the prepared data) and the step count; W&B only
    with a key (the recipes turn it on), TensorBoard always (the summary reads its event files)."""
    with_wandb = "WANDB_API_KEY" in infra.secret_keys
    return [
        f"grpo.max_num_steps={job.max_num_steps}",
        f"checkpointing.checkpoint_dir={checkpoint_dir(job, infra)}/{mode}",
        f"logger.log_dir={benchmark_log_dir(job, infra, mode)}",
        *data_overrides(infra, benchmark_dataset_dir(infra), "validation.jsonl"),
        f"logger.wandb_enabled={with_wandb}",
        "logger.tensorboard_enabled=True",
    ]


def measured_steps(job: JobSettings) -> tuple[int, int]:
    """The steps the benchmark averages (1-based, inclusive): the last BENCHMARK_MEASURED_STEPS before the final
    step, so neither the first (start-up, an empty off-policy buffer) nor the last (validation and a checkpoint at
    the recipes' val_period and save_period of 10) is counted. NVIDIA's figures are averages of 5 steps too."""
    last = job.max_num_steps - 1
    return last - BENCHMARK_MEASURED_STEPS + 1, last


def benchmark_steps(job: JobSettings, infra: InfraOutputs) -> list[Step]:
    """Prepare the recipes' data, then each recipe in turn (benchmarkRecipes' order), each waiting for its own
    nodes; every model is fetched into HF_HOME on Lustre before the first recipe that trains it."""
    scripts = scripts_dir(job, infra)
    steps = [
        Step(
            "prepare-data",
            f"{job.run_name}-prepare-data",
            _in_nemo_rl(f"{scripts}/prepare_openmathinstruct2.py", f"--output-dir={benchmark_dataset_dir(infra)}"),
            on_failure="access to the Hugging Face hub (HF_TOKEN) and the Lustre mount",
        )
    ]
    fetched: list[str] = []
    for item in job.benchmark_recipes:
        recipe, mode = item.recipe, item.label
        ckpt = f"{checkpoint_dir(job, infra)}/{mode}"
        train_args = [f"--config={recipe.path}", *benchmark_overrides(job, infra, mode)]
        if recipe.model not in fetched:
            fetched.append(recipe.model)
            prefetch = prefetch_step(job, scripts, train_args, f"the licence of {recipe.model} accepted")
            if len(fetched) > 1:  # one step per model, each its own name and submission id
                prefetch = replace(
                    prefetch,
                    name=f"{prefetch.name}-{len(fetched)}",
                    submission_id=f"{prefetch.submission_id}-{len(fetched)}",
                )
            steps.append(prefetch)
        train = _in_nemo_rl(infra.nemo_rl_release.grpo_entrypoint, *train_args)
        steps.append(
            Step(
                f"train-{mode}",
                f"{job.run_name}-train-{mode}",
                [
                    *wait_for_workers(f"{scripts}/wait_for_workers.py", recipe.num_nodes, job, infra),
                    "&&",
                    "python",
                    f"{scripts}/checkpoint_guard.py",
                    f"--checkpoint-dir={ckpt}",
                    "&&",
                    *train,
                ],
                on_failure=f"the driver log above (HF_TOKEN access to {recipe.model}, GPU memory)",
                max_retries=job.max_restarts,
            )
        )
    return steps


def published_label(item: BenchmarkRecipe, release: str) -> str:
    """Who published the figure and for which release, as the summary line names it."""
    figure = item.published
    if figure is None:
        return "unknown"
    other = "" if figure.release == release else f", for {figure.release}'s recipe of this name"
    return f"NVIDIA {figure.system} (NeMo RL {figure.release} performance summary{other})"


def benchmark_summary_command(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """The submitter's last command with benchmark: one line per recipe, from NeMo RL's own TensorBoard metrics,
    beside NVIDIA's published figure for it (or "unknown" where no summary has one). Empty without benchmark."""
    if not job.benchmark:
        return []
    first, last = measured_steps(job)
    command = ["python", BENCHMARK_SUMMARY, f"--first-step={first}", f"--last-step={last}"]
    for item in job.benchmark_recipes:
        figure = item.published
        seconds = "unknown" if figure is None else f"{figure.seconds_per_step:g}"
        tokens = "unknown" if figure is None else f"{figure.tokens_per_sec_per_gpu:g}"
        command.append(f"--mode={item.label}:{benchmark_log_dir(job, infra, item.label)}:{seconds}:{tokens}")
        command.append(f"--about={item.label}:{item.recipe.mode}, {item.recipe.gpus} GPUs")
        command.append(f"--published-by={item.label}:{published_label(item, infra.nemo_rl_release.tag)}")
    return command


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
    data = dataset_dir(job, infra)
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


def eval_step(name: str, model: list[str], job: JobSettings, infra: InfraOutputs, cached: bool = False) -> Step:
    """eval-base or eval-final: eval_model.py picks the model, then runs NeMo RL's run_eval.py with eval.yaml. With
    `cached` (the base model: the same in every run of a recipe) a result stored by an earlier run with the same
    model, arguments and image is copied instead of evaluating again; the image is part of the key."""
    save_path = f"{eval_dir(job, infra)}/{name.removeprefix('eval-')}"
    cache = [f"--cache-dir={eval_cache_dir(infra)}", f"--image={infra.image}"] if cached else []
    return Step(
        name,
        f"{job.run_name}-{name}",
        _in_nemo_rl(
            f"{scripts_dir(job, infra)}/eval_model.py",
            *model,
            *cache,
            "--",
            EVAL_ENTRYPOINT,
            f"--config={EVAL_CONFIG}",
            *eval_overrides(job, infra, save_path),
        ),
        on_failure="the driver log above (model access with HF_TOKEN, vLLM start-up and GPU memory)",
    )


def base_model_args(job: JobSettings) -> list[str]:
    """How eval-base names the model training starts from: the job setting model, else the recipe's (read on the
    cluster with NeMo RL's own loader). An extraOverride of policy.model_name is refused in settings."""
    return [f"--model={job.model}"] if job.model else [f"--model-of-recipe={job.recipe}"]


def prepare_step(job: JobSettings, infra: InfraOutputs, scripts: str) -> Step:
    """prepare-data: GSM8K from the hub, or the job setting dataset's rows (prepare_jsonl.py), into train.jsonl and
    test.jsonl on Lustre, complete-or-nothing, once."""
    if job.dataset is None:
        return Step(
            "prepare-data",
            f"{job.run_name}-prepare-data",
            _in_nemo_rl(f"{scripts}/prepare_gsm8k.py", f"--output-dir={dataset_dir(job, infra)}"),
            on_failure="access to the Hugging Face hub (HF_TOKEN) and the Lustre mount",
        )
    data = job.dataset
    test = [f"--test-source={data.test_source}"] if data.test_source else []
    return Step(
        "prepare-data",
        f"{job.run_name}-prepare-data",
        _in_nemo_rl(
            f"{scripts}/prepare_jsonl.py",
            f"--output-dir={dataset_dir(job, infra)}",
            f"--source={data.source}",
            *test,
            f"--problem-field={data.problem_field}",
            f"--answer-field={data.answer_field}",
        ),
        on_failure=(
            "the dataset source (gs://: object read access for the Ray service account; hf://: HF_TOKEN), "
            "dataset.problemField and dataset.answerField, and the Lustre mount"
        ),
    )


def prefetch_step(job: JobSettings, scripts: str, train_args: list[str], licence: str) -> Step:
    """prefetch-weights: every model the train step's own arguments name, into HF_HOME on Lustre (skipped when
    complete), resolved with the image's NeMo RL."""
    return Step(
        "prefetch-weights",
        f"{job.run_name}-prefetch-weights",
        _in_nemo_rl(f"{scripts}/prefetch_weights.py", "--", *train_args),
        on_failure=f"access to the Hugging Face hub (HF_TOKEN, {licence}) and Lustre",
    )


TOPOLOGY_REPORT = f"{SCRIPTS_MOUNT}/topology_report.py"


def nccl_report_file(job: JobSettings, infra: InfraOutputs) -> str:
    """The NCCL pre-flight's JSON report on Lustre: per rank, the Kubernetes node it ran on."""
    return f"{checkpoint_dir(job, infra)}/preflight-nccl.json"


def topology_command(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """In the submitter, after preflight-nccl: the reservation blocks and sub-blocks of the run's nodes (informational,
    never fails the run)."""
    return ["python", TOPOLOGY_REPORT, f"--report={nccl_report_file(job, infra)}"]


def _in_nemo_rl(script: str, *args: str) -> list[str]:
    """Run a Python script with NeMo RL's own environment (torch, ray, datasets), from its directory."""
    return ["cd", NEMO_RL_DIR, "&&", "uv", "run", "python", script, *args]


def pipeline_steps(job: JobSettings, infra: InfraOutputs) -> list[Step]:
    """The run's Ray jobs in order, with the job setting rerun applied (an unknown step name is a ConfigError)."""
    return with_reruns(_planned_steps(job, infra), job)


def _planned_steps(job: JobSettings, infra: InfraOutputs) -> list[Step]:
    # No step sets a job-level runtime env: NeMo RL's init_ray() passes the driver's whole environment as its own
    # runtime env, and Ray refuses to merge the two when they name the same variable. What the steps need (HF_HOME,
    # the tokens) is already in every Ray pod's environment.
    scripts = scripts_dir(job, infra)
    ckpt = checkpoint_dir(job, infra)
    steps: list[Step] = []
    if job.preflight.enabled:
        steps.append(
            Step(
                "preflight-nccl",
                f"{job.run_name}-preflight-nccl",
                _in_nemo_rl(
                    f"{scripts}/nccl_allreduce.py",
                    f"--nodes={gpu_nodes_to_check(job, infra)}",
                    f"--gpus-per-node={infra.gpus_per_node}",
                    f"--min-busbw-gbps={job.preflight.min_busbw_gbps:g}",
                    f"--json-out={nccl_report_file(job, infra)}",
                ),
                on_failure=(
                    "the GPU fabric: RDMA interfaces eth2-eth9 on the worker pods (networking.gke.io/interfaces), "
                    "the gIB plugin (nccl-rdma-installer in kube-system, 'NCCL WARN network gIB not found'), and "
                    "that the nodes come from one reservation block"
                ),
            )
        )
        steps.append(
            Step(
                "preflight-lustre",
                f"{job.run_name}-preflight-lustre",
                _in_nemo_rl(
                    f"{scripts}/lustre_io.py",
                    f"--path={ckpt}/preflight-io",
                    f"--nodes={gpu_nodes_to_check(job, infra)}",
                    f"--capacity-gib={infra.lustre_capacity_gib}",
                    f"--tier-mbps-per-tib={infra.lustre_throughput_mbps_per_tib}",
                    f"--gib-per-node={job.preflight.lustre_gib_per_node:g}",
                    f"--min-fraction={job.preflight.lustre_min_fraction:g}",
                ),
                on_failure="the Lustre mount on the workers (PVC bound, CSI driver, legacy port 6988, peering)",
            )
        )
    if job.benchmark:
        return steps + benchmark_steps(job, infra)
    steps.append(prepare_step(job, infra, scripts))
    train_args = [f"--config={job.recipe}", *grpo_overrides(job, infra)]
    # Every model the run reads, into HF_HOME on Lustre before the base evaluation and train: their vLLM and policy
    # workers then load from the cache instead of downloading while they start. It takes the train step's own
    # arguments, resolves them with the image's NeMo RL and skips models already complete.
    steps.append(prefetch_step(job, scripts, train_args, "the model licence accepted on the hub"))
    if job.eval_base:
        steps.append(eval_step("eval-base", base_model_args(job), job, infra, cached=True))
    train = _in_nemo_rl(infra.nemo_rl_release.grpo_entrypoint, *train_args)
    steps.append(
        Step(
            "train",
            f"{job.run_name}-train",
            # Every attempt first waits for its GPU nodes (a retry follows a lost node: a spot or flex-start
            # replacement takes longer than NeMo RL's placement-group timeout, so without this wait the retries would
            # be spent before it is back), then makes the checkpoint dir safe to resume from.
            [
                *wait_for_workers(f"{scripts}/wait_for_workers.py", job.num_nodes, job, infra),
                "&&",
                "python",
                f"{scripts}/checkpoint_guard.py",
                f"--checkpoint-dir={ckpt}",
                "&&",
                *train,
            ],
            on_failure="the driver log above (model access with HF_TOKEN, GPU memory, the recipe's overrides)",
            max_retries=job.max_restarts,
            # An attempt lost in a head restart counts against maxRestarts like a failed one (the next attempt
            # waits for the workers KubeRay recreates and resumes from the newest checkpoint); nothing beyond, so
            # a driver that keeps taking the head down (NeMo RL's driver runs on it) cannot loop forever.
            max_resubmits=0,
            # Raising maxNumSteps extends the run: NeMo RL resumes from the newest checkpoint at the next step.
            extendable="grpo.max_num_steps",
        )
    )
    if job.convert_to_hf:
        steps.append(
            Step(
                "convert-hf",
                f"{job.run_name}-convert-hf",
                _in_nemo_rl(f"{scripts}/convert_checkpoint.py", f"--checkpoint-dir={ckpt}", f"--output-dir={ckpt}/hf"),
                on_failure="that the training wrote step_N checkpoints under the checkpoint dir",
            )
        )
    if job.convert_to_hf and infra.export_bucket:
        steps.append(
            Step(
                "export-gcs",
                f"{job.run_name}-export-gcs",
                # Standard library only; runs on the head, whose pod has the Ray service account by Workload Identity.
                ["python", f"{scripts}/export_gcs.py", f"--source={ckpt}/hf", f"--destination={model_uri(job, infra)}"],
                on_failure="the Ray service account's object access on the export bucket (Workload Identity)",
            )
        )
    if job.eval_final:  # after the export: a failed evaluation does not hold the model back
        steps.append(eval_step("eval-final", [f"--model={ckpt}/hf"], job, infra))
    if job.archive:  # last: the evaluations read Lustre, and an archive of a finished run is what outlives it
        steps.append(
            Step(
                "archive",
                f"{job.run_name}-archive",
                # Standard library only, on the head, like export-gcs; it verifies every object it copied.
                [
                    "python",
                    f"{scripts}/archive_gcs.py",
                    f"--run-dir={ckpt}",
                    f"--archive={archive_uri(job, infra)}",
                    *(["--hf"] if job.convert_to_hf else []),
                ],
                on_failure="the objects the log names (a verification failure: run the step again, it copies what "
                "differs), and the Ray service account's object access on the export bucket",
            )
        )
    return steps


# The container of KubeRay's head pod (the ray-cluster chart's name for it).
RAY_HEAD_CONTAINER = "ray-head"


def eval_summary_show_command(job: JobSettings, infra: InfraOutputs) -> str:
    """A workstation command that prints the run's accuracy summary (JSON on Lustre), read inside the Ray head, which
    mounts /data; "" when the run evaluates nothing."""
    if not (job.eval_base or job.eval_final):
        return ""
    return head_exec(infra, ["cat", eval_summary_file(job, infra)])


def eval_summary_command(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """The submitter's last command: accuracy from the evaluations' per-sample rewards, a JSON summary, and the
    log's last line. Empty without evaluations."""
    if not (job.eval_base or job.eval_final):
        return []
    folder = eval_dir(job, infra)
    command = ["python", EVAL_SUMMARY, f"--dataset={dataset_dir(job, infra)}/test.jsonl"]
    if job.dataset:
        command.append(f"--dataset-name={dataset_label(job)}")
    if job.eval_base:
        command.append(f"--base={folder}/base")
    if job.eval_final:
        command.append(f"--trained={folder}/final")
    return [*command, f"--output={eval_summary_file(job, infra)}"]


def entrypoint_text(step: Step) -> str:
    """The shell command Ray runs; '&&' stays an operator, everything else is quoted."""
    return " ".join(part if part == "&&" else shlex.quote(part) for part in step.entrypoint)


def gpu_nodes_to_check(job: JobSettings, infra: InfraOutputs) -> int:
    """GPU nodes the pipeline is admitted for, waits for and the pre-flight checks: the run's own. Other runs of the
    cluster may hold the other workers (a check there would wait for their GPUs), and with the autoscaler asking for
    more would start, and bill, nodes the run never uses."""
    return job.num_nodes


def admission_command(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """admission.py hold: the run's place in Ray's queue for its GPU nodes, held while the pipeline runs (the
    pipeline adds --ready-file); with stopOnDelete it tells the run's deletion from an eviction as the steps do."""
    command = [
        "python",
        ADMISSION,
        "hold",
        f"--address={infra.ray_address}",
        f"--run={job.run_name}",
        f"--nodes={gpu_nodes_to_check(job, infra)}",
        f"--capacity={infra.ray_worker_replicas}",
    ]
    if job.stop_on_delete:
        command += [
            f"--k8s-job={job_name(job)}",
            f"--k8s-run-marker={run_marker_name(job)}",
            f"--k8s-namespace={infra.namespace}",
        ]
    return command


def head_exec(infra: InfraOutputs, command: list[str]) -> str:
    """A workstation command that runs `command` in the Ray head's container, which mounts the Lustre volume."""
    head_service = infra.ray_address.removeprefix("http://").split(".", 1)[0]
    return (
        f"kubectl --namespace {infra.namespace} exec service/{head_service} -c {RAY_HEAD_CONTAINER} -- "
        f"{shlex.join(command)}"
    )


def admission_status_command(job: JobSettings, infra: InfraOutputs) -> str:
    """Which runs hold the cluster's GPU nodes and which wait, from a workstation: Ray's job table, read in the head
    (the copy of our scripts the pipeline leaves on Lustre)."""
    script = f"{scripts_dir(job, infra)}/admission.py"
    local = f"http://127.0.0.1:{infra.ray_address.rsplit(':', 1)[-1]}"
    return head_exec(
        infra, ["python", script, "status", f"--address={local}", f"--capacity={infra.ray_worker_replicas}"]
    )


def wait_for_workers(script: str, nodes: int, job: JobSettings, infra: InfraOutputs) -> list[str]:
    """wait_for_workers.py for `nodes` GPU workers within waitForWorkersMinutes (exit 4 on timeout); with the
    autoscaler it first asks for them."""
    wait = [
        "python",
        script,
        f"--address={infra.ray_address}",
        f"--nodes={nodes}",
        f"--gpus-per-node={infra.gpus_per_node}",
        f"--timeout-s={job.wait_for_workers_minutes * 60}",
    ]
    if infra.ray_autoscaling and infra.ray_client_address:
        # The GPU group starts at zero: ask the autoscaler for the workers, then wait for them.
        wait.append(f"--request-address={infra.ray_client_address}")
    # Other admitted runs hold workers too (Ray's RUNNING places): wait until theirs and this run's are up.
    return [*wait, "--with-admitted-runs"]


def submit_command(step: Step, job: JobSettings, infra: InfraOutputs) -> list[str]:
    """How the submitter pod runs one step: ray_submit.py with the step's id, its retry budget and, with stopOnDelete,
    what it reads on SIGTERM to tell a deletion from an eviction; bash -c keeps '&&' an operator on the Ray side
    (ray_submit.py quotes every word it gets)."""
    command = ["python", SUBMITTER, f"--address={infra.ray_address}", f"--submission-id={step.submission_id}"]
    if step.max_retries:
        command.append(f"--max-retries={step.max_retries}")
    if step.max_resubmits != DEFAULT_MAX_RESUBMITS:
        command.append(f"--max-resubmits={step.max_resubmits}")
    command.append(f"--record={outcome_record(step, job, infra)}")
    command.append(f"--place-of={job.run_name}")
    if step.extendable:
        command.append(f"--extendable={step.extendable}")
    if job.stop_on_delete:
        command += [
            f"--k8s-job={job_name(job)}",
            f"--k8s-run-marker={run_marker_name(job)}",
            f"--k8s-namespace={infra.namespace}",
            f"--stop-timeout={STOP_TIMEOUT_S}",
        ]
    return [*command, "--", "bash", "-c", entrypoint_text(step)]


def pipeline_script(job: JobSettings, infra: InfraOutputs, steps: list[Step]) -> str:
    """The submitter pod's program: copy our scripts to Lustre, then run each step through ray_submit.py,
    stopping at the first failure with what to check. Re-running it skips steps that already succeeded (their
    outcome records on Lustre, else Ray's job table)."""
    scripts = scripts_dir(job, infra)
    wait = wait_for_workers(WAIT_FOR_WORKERS, gpu_nodes_to_check(job, infra), job, infra)
    lines = [
        "set -euo pipefail",
        # Kubernetes sends SIGTERM to PID 1, this shell: pass it on to the running submitter, which decides whether
        # the run is being deleted (and then stops its Ray job) before the pod goes.
        "child=",
        "terminating=",
        'trap \'terminating=1; if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child"; fi; exit 143\' '
        "TERM",
        'in_background() { "$@" & child=$!; wait "$child"; }',
        f"mkdir -p {shlex.quote(scripts)}",
        f"cp -RL {SCRIPTS_MOUNT}/*.py {SCRIPTS_MOUNT}/{SUBMITTER_PACKAGE} {shlex.quote(scripts)}/",
        # The run's place on the GPU nodes (admission.py): a Ray job that Ray's scheduler runs once the run's nodes
        # are free. The pipeline's end releases it (USR1); the pod's SIGTERM releases it only when the run is being
        # deleted, and leaves it to the Job's next pod otherwise (TERM).
        "admission=",
        # (`|| true`: errexit holds in traps, and the exit status must stay the step's.)
        'trap \'if [ -n "$admission" ]; then if [ -n "$terminating" ]; then sig=TERM; else sig=USR1; fi; '
        'kill -"$sig" "$admission" 2>/dev/null || true; wait "$admission" || true; fi\' EXIT',
        "admit() {",
        f"  rm -f {ADMITTED_FILE}",
        f"  {shlex.join(admission_command(job, infra))} --ready-file={ADMITTED_FILE} &",
        "  admission=$!",
        f"  until [ -e {ADMITTED_FILE} ]; do",
        '    if ! kill -0 "$admission" 2>/dev/null; then wait "$admission" || exit $?; exit 4; fi',
        "    sleep 1",
        "  done",
        "}",
        # GPU nodes come from zero: wait for them (a timeout exits 4 and the Job retries) rather than let a Ray job
        # fail for lack of workers, which would spend its submission id. Once, before the first step without an
        # outcome record: a pod that finds every step recorded (a replaced Job of a finished run) neither queues nor
        # starts a GPU node.
        "workers_ready=",
        "await_workers() {",
        '  if [ -n "$workers_ready" ]; then return 0; fi',
        "  admit",
        f"  in_background {shlex.join(wait)} || exit $?",
        "  workers_ready=1",
        "}",
    ]
    for number, step in enumerate(steps, start=1):
        hint = step.on_failure.replace("'", "")  # inside single quotes in the script
        lines += [
            f"echo '=== step {number}/{len(steps)}: {step.name} ({step.submission_id})'",
            f"if [ ! -e {shlex.quote(outcome_record(step, job, infra))} ]; then await_workers; fi",
            f"in_background {shlex.join(submit_command(step, job, infra))} || {{",
            "  rc=$?",
            f"  echo 'step {step.name} did not succeed (exit '$rc'). Check: {hint}' >&2",
            "  exit $rc",
            "}",
        ]
        if step.name == "preflight-nccl":
            lines.append(f"{shlex.join(topology_command(job, infra))} || true")
    lines.append(f"echo 'all {len(steps)} steps succeeded; checkpoints in {checkpoint_dir(job, infra)}'")
    summary = eval_summary_command(job, infra)
    if summary:  # last, so the accuracy line ends the Job's log
        lines.append(shlex.join(summary))
    benchmark = benchmark_summary_command(job, infra)
    if benchmark:  # last, so the comparison ends the Job's log
        lines.append(shlex.join(benchmark))
    return "\n".join(lines) + "\n"
