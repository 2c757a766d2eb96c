"""nemo-rl-jobs program: infra stack outputs + job settings -> the pipeline Job -> how to follow it."""

import pulumi
import pulumi_kubernetes as k8s
from config_rules import ConfigError, read_config
from launcher import checkpoints
from launcher.cost import run_estimate
from launcher.infra_outputs import read_infra_outputs
from launcher.job import PipelineJob, PipelineJobArgs
from launcher.job_settings import KEY_ALIASES, JobSettings, build_job_settings
from launcher.overrides import model_notes, recipe_notes
from launcher.paths import archive_uri, checkpoint_dir, model_uri
from launcher.script import (
    PORT_FORWARD_ADDRESS,
    admission_status_command,
    eval_summary_show_command,
    pipeline_script,
    ray_job_command,
)
from launcher.steps import attempt_ids, entrypoint_text, pipeline_steps, rerun_warnings

values = read_config(JobSettings, KEY_ALIASES, "see the job stack's table in docs/configuration.md")
if not values.get("infraStack"):
    raise ConfigError(
        "infraStack", None, "required: the infra stack, e.g. pulumi config set infraStack organization/nemo-rl-gke/h200"
    )
infra_ref = pulumi.StackReference(str(values["infraStack"]))


async def main() -> None:
    # Validated before anything is registered; the kubeconfig stays a secret Output.
    infra = await read_infra_outputs(infra_ref, str(values["infraStack"]))
    job = build_job_settings(values, infra)
    steps = pipeline_steps(job, infra)
    need = checkpoints.lustre_need(
        checkpoints.model_of(job.model, job.recipe, infra.nemo_rl_release.tag),
        job.max_num_steps,
        job.extra_overrides,
        job.convert_to_hf,
    )
    slow = checkpoints.checkpoint_write_note(need, infra.lustre_capacity_gib, infra.lustre_throughput_mbps_per_tib)
    for warning in [*model_notes(job), *recipe_notes(job, infra), *rerun_warnings(steps), *([slow] if slow else [])]:
        pulumi.log.warn(warning)

    # Replaced only when the infra's cluster is (the Job with it); a kubeconfig change is an update.
    provider = k8s.Provider(
        "cluster",
        kubeconfig=infra_ref.require_output("kubeconfig"),
        cluster_identifier=infra.cluster_id,
        enable_server_side_apply=True,
    )
    launcher = PipelineJob(
        "pipeline",
        PipelineJobArgs(job=job, infra=infra, script=pipeline_script(job, infra, steps)),
        opts=pulumi.ResourceOptions(provider=provider),
    )
    job_name = launcher.job.metadata.name
    pulumi.export("jobName", job_name)
    pulumi.export("followLogs", job_name.apply(lambda n: f"kubectl --namespace {infra.namespace} logs -f job/{n}"))
    pulumi.export("dashboardPortForward", infra.dashboard_port_forward)
    pulumi.export("checkpointDir", checkpoint_dir(job, infra))
    pulumi.export("estimatedRun", run_estimate(job, infra))
    pulumi.export("modelUri", model_uri(job, infra))
    pulumi.export("archiveUri", archive_uri(job, infra))
    pulumi.export("evalSummary", eval_summary_show_command(job, infra))
    # Which runs hold the cluster's GPU nodes and which queue for them (this one's Job log says it too).
    pulumi.export("admissionStatus", admission_status_command(job, infra))
    pulumi.export(
        "pipeline", [{"step": s.name, "submissionId": s.submission_id, "entrypoint": entrypoint_text(s)} for s in steps]
    )
    # The run's lifecycle from a workstation, through the dashboard port-forward.
    train = next(s for s in steps if s.name == "train" or s.name.startswith("train-"))  # the benchmark's first
    pulumi.export("maxRestarts", job.max_restarts)
    pulumi.export("trainAttempts", attempt_ids(train))
    pulumi.export("stopOnDelete", job.stop_on_delete)
    pulumi.export(
        "rayJobCommands",
        {
            "list": f"ray job list --address {PORT_FORWARD_ADDRESS}",
            **{verb: ray_job_command(train, verb) for verb in ("status", "logs", "stop")},
        },
    )


pulumi.run(main)
