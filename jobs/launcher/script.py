"""The submitter pod's pipeline.sh, the commands it runs (submit, wait, admission), and workstation ones. Pure."""

from __future__ import annotations

import shlex

from submitter.attempts import DEFAULT_MAX_RESUBMITS

from launcher import paths
from launcher.benchmark_settings import BENCHMARK_MEASURED_STEPS, BenchmarkRecipe
from launcher.infra_outputs import InfraOutputs
from launcher.job_settings import JobSettings
from launcher.steps import Step, attempt_ids, entrypoint_text, gpu_nodes_to_check, wait_for_workers

SUBMITTER = f"{paths.SCRIPTS_MOUNT}/ray_submit.py"
WAIT_FOR_WORKERS = f"{paths.SCRIPTS_MOUNT}/wait_for_workers.py"
ADMISSION = f"{paths.SCRIPTS_MOUNT}/admission.py"
# Inside the submitter pod (a shell word, expanded there): written by the admission holder once Ray runs the run's
# place on the GPU nodes.
ADMITTED_FILE = '"${TMPDIR:-/tmp}/nemo-rl-admitted"'
BENCHMARK_SUMMARY = f"{paths.SCRIPTS_MOUNT}/benchmark_summary.py"
EVAL_SUMMARY = f"{paths.SCRIPTS_MOUNT}/eval_summary.py"
TOPOLOGY_REPORT = f"{paths.SCRIPTS_MOUNT}/topology_report.py"
# How long the submitter waits for a deleted run's Ray job to reach STOPPED; the pod's grace period covers it.
STOP_TIMEOUT_S = 30
# The Ray dashboard and Jobs API on a workstation, through the infra stack's dashboardPortForward command.
PORT_FORWARD_ADDRESS = "http://127.0.0.1:8265"
# The container of KubeRay's head pod (the ray-cluster chart's name for it).
RAY_HEAD_CONTAINER = "ray-head"


def pipeline_script(job: JobSettings, infra: InfraOutputs, steps: list[Step]) -> str:
    """The submitter pod's program: copy our scripts to Lustre, then run each step through ray_submit.py,
    stopping at the first failure with what to check. Re-running it skips steps that already succeeded (their
    outcome records on Lustre, else Ray's job table)."""
    scripts = paths.scripts_dir(job, infra)
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
        f"cp -RL {paths.SCRIPTS_MOUNT}/*.py {paths.SCRIPTS_MOUNT}/{paths.SUBMITTER_PACKAGE} {shlex.quote(scripts)}/",
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
    lines.append(f"echo 'all {len(steps)} steps succeeded; checkpoints in {paths.checkpoint_dir(job, infra)}'")
    summary = eval_summary_command(job, infra)
    if summary:  # last, so the accuracy line ends the Job's log
        lines.append(shlex.join(summary))
    benchmark = benchmark_summary_command(job, infra)
    if benchmark:  # last, so the comparison ends the Job's log
        lines.append(shlex.join(benchmark))
    return "\n".join(lines) + "\n"


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
            f"--k8s-job={paths.job_name(job)}",
            f"--k8s-run-marker={paths.run_marker_name(job)}",
            f"--k8s-namespace={infra.namespace}",
            f"--stop-timeout={STOP_TIMEOUT_S}",
        ]
    return [*command, "--", "bash", "-c", entrypoint_text(step)]


def outcome_record(step: Step, job: JobSettings, infra: InfraOutputs) -> str:
    """A rerun has its own record (and attempt ledger beside it): the first run's stay as they were."""
    suffix = f".rerun{step.rerun}" if step.rerun else ""
    return f"{paths.outcomes_dir(job, infra)}/{step.name}{suffix}.json"


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
            f"--k8s-job={paths.job_name(job)}",
            f"--k8s-run-marker={paths.run_marker_name(job)}",
            f"--k8s-namespace={infra.namespace}",
        ]
    return command


def topology_command(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """In the submitter, after preflight-nccl: the reservation blocks and sub-blocks of the run's nodes (informational,
    never fails the run)."""
    return ["python", TOPOLOGY_REPORT, f"--report={paths.nccl_report_file(job, infra)}"]


def eval_summary_command(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """The submitter's last command: accuracy from the evaluations' per-sample rewards, a JSON summary, and the
    log's last line. Empty without evaluations."""
    if not (job.eval_base or job.eval_final):
        return []
    folder = paths.eval_dir(job, infra)
    command = ["python", EVAL_SUMMARY, f"--dataset={paths.dataset_dir(job, infra)}/test.jsonl"]
    if job.dataset:  # the evaluated dataset as the accuracy line names it (eval_summary.py's default: GSM8K)
        command.append(f"--dataset-name={job.dataset.label}")
    if job.eval_base:
        command.append(f"--base={folder}/base")
    if job.eval_final:
        command.append(f"--trained={folder}/final")
    return [*command, f"--output={paths.eval_summary_file(job, infra)}"]


def measured_steps(job: JobSettings) -> tuple[int, int]:
    """The steps the benchmark averages (1-based, inclusive): the last BENCHMARK_MEASURED_STEPS before the final
    step, so neither the first (start-up, an empty off-policy buffer) nor the last (validation and a checkpoint at
    the recipes' val_period and save_period of 10) is counted. NVIDIA's figures are averages of 5 steps too."""
    last = job.max_num_steps - 1
    return last - BENCHMARK_MEASURED_STEPS + 1, last


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
        command.append(f"--mode={item.label}:{paths.benchmark_log_dir(job, infra, item.label)}:{seconds}:{tokens}")
        command.append(f"--about={item.label}:{item.recipe.mode}, {item.recipe.gpus} GPUs")
        command.append(f"--published-by={item.label}:{published_label(item, infra.nemo_rl_release.tag)}")
    return command


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


def head_exec(infra: InfraOutputs, command: list[str]) -> str:
    """A workstation command that runs `command` in the Ray head's container, which mounts the Lustre volume."""
    head_service = infra.ray_address.removeprefix("http://").split(".", 1)[0]
    return (
        f"kubectl --namespace {infra.namespace} exec service/{head_service} -c {RAY_HEAD_CONTAINER} -- "
        f"{shlex.join(command)}"
    )


def eval_summary_show_command(job: JobSettings, infra: InfraOutputs) -> str:
    """A workstation command that prints the run's accuracy summary (JSON on Lustre), read inside the Ray head, which
    mounts /data; "" when the run evaluates nothing."""
    if not (job.eval_base or job.eval_final):
        return ""
    return head_exec(infra, ["cat", paths.eval_summary_file(job, infra)])


def admission_status_command(job: JobSettings, infra: InfraOutputs) -> str:
    """Which runs hold the cluster's GPU nodes and which wait, from a workstation: Ray's job table, read in the head
    (the copy of our scripts the pipeline leaves on Lustre)."""
    script = f"{paths.scripts_dir(job, infra)}/admission.py"
    local = f"http://127.0.0.1:{infra.ray_address.rsplit(':', 1)[-1]}"
    return head_exec(
        infra, ["python", script, "status", f"--address={local}", f"--capacity={infra.ray_worker_replicas}"]
    )
