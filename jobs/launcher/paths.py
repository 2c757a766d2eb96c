"""Where a run's things live: its Lustre folders, the exported model and archive, its Kubernetes names. Pure."""

from __future__ import annotations

from launcher.infra_outputs import InfraOutputs
from launcher.job_settings import JobSettings

SCRIPTS_MOUNT = "/opt/launcher"  # the ConfigMap with our scripts, inside the submitter pod
# ray_submit.py's modules, in a folder beside it (in the ConfigMap volume and in the per-run copy on Lustre).
SUBMITTER_PACKAGE = "submitter"
# The data NeMo RL's performance recipes train on (data.dataset_name OpenMathInstruct-2: the hub dataset's train_1M
# split, 5% held out for validation with the recipe's seed), prepared on Lustre once like GSM8K.
BENCHMARK_DATASET = "openmathinstruct2-train_1M"


def dataset_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """The prepared train.jsonl and test.jsonl: GSM8K's, or the job setting dataset's (a folder per source and
    fields, so a changed dataset is prepared anew and another run's files are never overwritten)."""
    folder = job.dataset.folder if job.dataset else "gsm8k"
    return f"{infra.mount_path}/datasets/{folder}"


def checkpoint_dir(job: JobSettings, infra: InfraOutputs) -> str:
    return f"{infra.mount_path}/{job.run_name}"


def outcomes_dir(job: JobSettings, infra: InfraOutputs) -> str:
    """Each step's outcome record (ray_submit.py --record): on Lustre with the run, so a new submitter pod, a
    restarted Ray head (whose job table starts empty) or a replaced Job knows which steps already succeeded."""
    return f"{checkpoint_dir(job, infra)}/step-outcomes"


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


def benchmark_dataset_dir(infra: InfraOutputs) -> str:
    return f"{infra.mount_path}/datasets/{BENCHMARK_DATASET}"


def benchmark_log_dir(job: JobSettings, infra: InfraOutputs, mode: str) -> str:
    return f"{log_dir(job, infra)}/{mode}"


def nccl_report_file(job: JobSettings, infra: InfraOutputs) -> str:
    """The NCCL pre-flight's JSON report on Lustre: per rank, the Kubernetes node it ran on."""
    return f"{checkpoint_dir(job, infra)}/preflight-nccl.json"


def job_name(job: JobSettings) -> str:
    """The submitter's Kubernetes Job."""
    return f"{job.run_name}-pipeline"


def run_marker_name(job: JobSettings) -> str:
    """A ConfigMap that lives as long as the run: the job stack deletes it before the Job only when destroyed."""
    return f"{job.run_name}-run"
