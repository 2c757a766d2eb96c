"""The run as data: the ordered Ray jobs, each with a stable submission id, and the job setting rerun. Pure."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from config_rules import ConfigError
from submitter.attempts import DEFAULT_MAX_RESUBMITS, attempt_id

from launcher import paths
from launcher.infra_outputs import InfraOutputs
from launcher.job_settings import JobSettings
from launcher.overrides import benchmark_overrides, eval_overrides, grpo_overrides

NEMO_RL_DIR = "/opt/nemo-rl"  # where the NeMo RL image keeps its sources and uv project
# NeMo RL's evaluation (the same script and base config at v0.5.0 and v0.7.0), relative to its sources.
EVAL_ENTRYPOINT = "examples/run_eval.py"
EVAL_CONFIG = "examples/configs/evals/eval.yaml"


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


def attempt_ids(step: Step) -> list[str]:
    """Every submission id a step may use, in order, as the submitter names them."""
    return [attempt_id(step.submission_id, k) for k in range(step.max_retries + 1)]


def pipeline_steps(job: JobSettings, infra: InfraOutputs) -> list[Step]:
    """The run's Ray jobs in order, with the job setting rerun applied (an unknown step name is a ConfigError)."""
    return with_reruns(_planned_steps(job, infra), job)


def _planned_steps(job: JobSettings, infra: InfraOutputs) -> list[Step]:
    # No step sets a job-level runtime env: NeMo RL's init_ray() passes the driver's whole environment as its own
    # runtime env, and Ray refuses to merge the two when they name the same variable. What the steps need (HF_HOME,
    # the tokens) is already in every Ray pod's environment.
    scripts = paths.scripts_dir(job, infra)
    ckpt = paths.checkpoint_dir(job, infra)
    steps: list[Step] = []
    if job.preflight_enabled:
        steps.append(
            Step(
                "preflight-nccl",
                f"{job.run_name}-preflight-nccl",
                _in_nemo_rl(
                    f"{scripts}/nccl_allreduce.py",
                    f"--nodes={gpu_nodes_to_check(job, infra)}",
                    f"--gpus-per-node={infra.gpus_per_node}",
                    f"--min-busbw-gbps={job.preflight_min_busbw_gbps:g}",
                    f"--json-out={paths.nccl_report_file(job, infra)}",
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
                    f"--gib-per-node={job.preflight_lustre_gib_per_node:g}",
                    f"--min-fraction={job.preflight_lustre_min_fraction:g}",
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
    steps.append(
        Step(
            "train",
            f"{job.run_name}-train",
            _train_entrypoint(job.num_nodes, ckpt, train_args, job, infra),
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
                [
                    "python",
                    f"{scripts}/export_gcs.py",
                    f"--source={ckpt}/hf",
                    f"--destination={paths.model_uri(job, infra)}",
                ],
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
                    f"--archive={paths.archive_uri(job, infra)}",
                    *(["--hf"] if job.convert_to_hf else []),
                ],
                on_failure="the objects the log names (a verification failure: run the step again, it copies what "
                "differs), and the Ray service account's object access on the export bucket",
            )
        )
    return steps


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


def benchmark_steps(job: JobSettings, infra: InfraOutputs) -> list[Step]:
    """Prepare the recipes' data, then each recipe in turn (benchmarkRecipes' order), each waiting for its own
    nodes; every model is fetched into HF_HOME on Lustre before the first recipe that trains it."""
    scripts = paths.scripts_dir(job, infra)
    steps = [
        Step(
            "prepare-data",
            f"{job.run_name}-prepare-data",
            _in_nemo_rl(
                f"{scripts}/prepare_openmathinstruct2.py", f"--output-dir={paths.benchmark_dataset_dir(infra)}"
            ),
            on_failure="access to the Hugging Face hub (HF_TOKEN) and the Lustre mount",
        )
    ]
    fetched: list[str] = []
    for item in job.benchmark_recipes:
        recipe, mode = item.recipe, item.label
        ckpt = f"{paths.checkpoint_dir(job, infra)}/{mode}"
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
        steps.append(
            Step(
                f"train-{mode}",
                f"{job.run_name}-train-{mode}",
                _train_entrypoint(recipe.num_nodes, ckpt, train_args, job, infra),
                on_failure=f"the driver log above (HF_TOKEN access to {recipe.model}, GPU memory)",
                max_retries=job.max_restarts,
            )
        )
    return steps


def _train_entrypoint(nodes: int, ckpt: str, train_args: list[str], job: JobSettings, infra: InfraOutputs) -> list[str]:
    """Every attempt first waits for its GPU nodes (a retry follows a lost node: a spot or flex-start replacement takes
    longer than NeMo RL's placement-group timeout, so without this wait the retries would be spent before it is back),
    then makes the checkpoint dir safe to resume from, then trains."""
    scripts = paths.scripts_dir(job, infra)
    return [
        *wait_for_workers(f"{scripts}/wait_for_workers.py", nodes, job, infra),
        *["&&", "python", f"{scripts}/checkpoint_guard.py", f"--checkpoint-dir={ckpt}", "&&"],
        *_in_nemo_rl(infra.nemo_rl_release.grpo_entrypoint, *train_args),
    ]


def eval_step(name: str, model: list[str], job: JobSettings, infra: InfraOutputs, cached: bool = False) -> Step:
    """eval-base or eval-final: eval_model.py picks the model, then runs NeMo RL's run_eval.py with eval.yaml. With
    `cached` (the base model: the same in every run of a recipe) a result stored by an earlier run with the same
    model, arguments and image is copied instead of evaluating again; the image is part of the key."""
    save_path = f"{paths.eval_dir(job, infra)}/{name.removeprefix('eval-')}"
    cache = [f"--cache-dir={paths.eval_cache_dir(infra)}", f"--image={infra.image}"] if cached else []
    return Step(
        name,
        f"{job.run_name}-{name}",
        _in_nemo_rl(
            f"{paths.scripts_dir(job, infra)}/eval_model.py",
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
            _in_nemo_rl(f"{scripts}/prepare_gsm8k.py", f"--output-dir={paths.dataset_dir(job, infra)}"),
            on_failure="access to the Hugging Face hub (HF_TOKEN) and the Lustre mount",
        )
    data = job.dataset
    test = [f"--test-source={data.test_source}"] if data.test_source else []
    return Step(
        "prepare-data",
        f"{job.run_name}-prepare-data",
        _in_nemo_rl(
            f"{scripts}/prepare_jsonl.py",
            f"--output-dir={paths.dataset_dir(job, infra)}",
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


def _in_nemo_rl(script: str, *args: str) -> list[str]:
    """Run a Python script with NeMo RL's own environment (torch, ray, datasets), from its directory."""
    return ["cd", NEMO_RL_DIR, "&&", "uv", "run", "python", script, *args]


def entrypoint_text(step: Step) -> str:
    """The shell command Ray runs; '&&' stays an operator, everything else is quoted."""
    return " ".join(part if part == "&&" else shlex.quote(part) for part in step.entrypoint)


def gpu_nodes_to_check(job: JobSettings, infra: InfraOutputs) -> int:
    """GPU nodes the pipeline is admitted for, waits for and the pre-flight checks: the run's own. Other runs of the
    cluster may hold the other workers (a check there would wait for their GPUs), and with the autoscaler asking for
    more would start, and bill, nodes the run never uses."""
    return job.num_nodes


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
