"""The job stack: settings, overrides and pipeline as pure data, and the whole program under mocks fed with the
outputs the infra program really exports (so the contract between the two stacks is tested from both sides)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_infra_stack
from launcher.pipeline import entrypoint_text, grpo_overrides, pipeline_script, pipeline_steps
from launcher.settings import ConfigError, InfraOutputs, build_infra_outputs, build_job_settings
from script_loader import load_script

from tools.offline import ProgramRun, load_stack_config, plaintext_paths, run_program

JOBS = ROOT / "jobs"


INFRA_SECRET_OUTPUTS: dict[str, set[str]] = {}


@pytest.fixture(scope="module")
def infra_outputs() -> dict[str, dict[str, Any]]:
    """What each infra stack file really exports (and, in INFRA_SECRET_OUTPUTS, which of it is secret)."""
    outputs = {}
    for stack in ("dev", "h200", "b200"):
        run = run_infra_stack(stack)
        outputs[stack] = run.outputs
        INFRA_SECRET_OUTPUTS[stack] = run.secret_outputs
    return outputs


def run_jobs(stack: str, infra_outputs: dict, overrides: dict[str, Any] | None = None) -> ProgramRun:
    project, config = load_stack_config(JOBS, stack)
    for key, value in (overrides or {}).items():
        config[f"{project}:{key}"] = value
    reference = config[f"{project}:infraStack"]
    return run_program(
        JOBS,
        config,
        stack=stack,
        stack_outputs={reference: infra_outputs[stack]},
        stack_secret_outputs={reference: INFRA_SECRET_OUTPUTS[stack]},
    )


def infra_of(outputs: dict[str, Any]) -> InfraOutputs:
    return build_infra_outputs(outputs)


def job_with(infra: InfraOutputs, **values: Any):
    return build_job_settings({"infraStack": "organization/nemo-rl-gke/h200", **values}, infra)


# --- the overrides builder -----------------------------------------------------------------------------------


def test_defaults_are_the_tutorial_run(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    overrides = grpo_overrides(job_with(infra), infra)
    assert overrides[:6] == [
        "cluster.num_nodes=2",
        "cluster.gpus_per_node=8",
        "grpo.max_num_steps=10",
        "grpo.num_prompts_per_step=16",
        "grpo.num_generations_per_prompt=32",
        "policy.train_global_batch_size=512",
    ]
    for expected in (
        "policy.generation.colocated.enabled=False",
        "policy.generation.colocated.resources.num_nodes=1",
        "policy.generation.colocated.resources.gpus_per_node=8",
        "policy.generation.vllm_cfg.tensor_parallel_size=8",
        "policy.generation.vllm_cfg.gpu_memory_utilization=0.9",
        "policy.dtensor_cfg.tensor_parallel_size=8",
        "checkpointing.checkpoint_dir=/data/grpo-gsm8k",
        "logger.log_dir=/data/grpo-gsm8k/logs",
        "data.dataset_name=ResponseDataset",
        "+data.train_data_path=/data/datasets/gsm8k/train.jsonl",
        "+data.val_data_path=/data/datasets/gsm8k/test.jsonl",
        "+data.input_key=input",
        "+data.output_key=output",
    ):
        assert expected in overrides, expected


def test_input_and_output_keys_match_what_prepare_writes(infra_outputs):
    prepare = load_script("jobs/scripts/prepare_gsm8k.py", "prepare_gsm8k")
    infra = infra_of(infra_outputs["h200"])
    overrides = grpo_overrides(job_with(infra), infra)
    assert f"+data.input_key={prepare.INPUT_KEY}" in overrides
    assert f"+data.output_key={prepare.OUTPUT_KEY}" in overrides
    assert f"+data.train_data_path=/data/datasets/gsm8k/{prepare.TRAIN_FILE}" in overrides
    assert f"+data.val_data_path=/data/datasets/gsm8k/{prepare.TEST_FILE}" in overrides


def test_wandb_when_the_key_exists_else_tensorboard(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    no_key = grpo_overrides(job_with(infra, runName="r1"), infra)
    assert "logger.tensorboard_enabled=True" in no_key
    assert "logger.log_dir=/data/r1/logs" in no_key
    assert "logger.wandb_enabled=False" in no_key
    with_key = infra_of({**infra_outputs["h200"], "secretKeys": ["HF_TOKEN", "WANDB_API_KEY"]})
    overrides = grpo_overrides(job_with(with_key, runName="r1"), with_key)
    assert "logger.wandb_enabled=True" in overrides
    assert "logger.wandb.name=r1" in overrides
    assert "logger.tensorboard_enabled=False" in overrides
    assert "logger.log_dir=/data/r1/logs" in overrides  # logs on Lustre either way


def test_the_training_batch_is_every_sample_of_a_step(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    overrides = grpo_overrides(job_with(infra, numPromptsPerStep=4, numGenerationsPerPrompt=6), infra)
    assert "policy.train_global_batch_size=24" in overrides


def test_colocated_generation(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    overrides = grpo_overrides(job_with(infra, generationNodes=0), infra)
    assert "policy.generation.colocated.enabled=True" in overrides
    assert not any(o.startswith("policy.generation.colocated.resources") for o in overrides)
    # Sharing the GPUs with training, vLLM keeps the recipe's share unless told otherwise.
    assert not any(o.startswith("policy.generation.vllm_cfg.gpu_memory_utilization") for o in overrides)
    told = grpo_overrides(job_with(infra, generationNodes=0, vllmGpuMemoryUtilization="0.5"), infra)
    assert "policy.generation.vllm_cfg.gpu_memory_utilization=0.5" in told


def test_extra_overrides_come_last(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    extra = ["grpo.max_num_steps=99", "+policy.foo=1"]
    overrides = grpo_overrides(job_with(infra, extraOverrides=extra), infra)
    assert overrides[-2:] == extra


# --- validation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "key", "fragment"),
    [
        ({"numNodes": 3}, "numNodes", "rayWorkerReplicas = 2"),
        ({"numNodes": 2, "generationNodes": 2}, "generationNodes", "below numNodes"),
        ({"generationNodes": -1}, "generationNodes", "0 (generation colocated"),
        ({"vllmTensorParallelSize": 3}, "vllmTensorParallelSize", "divisor of the 8 generation GPUs"),
        ({"vllmTensorParallelSize": 16, "generationNodes": 0}, "vllmTensorParallelSize", "at most 8"),
        ({"dtensorTensorParallelSize": 5}, "dtensorTensorParallelSize", "divisor of the 8 training GPUs"),
        ({"maxNumSteps": 0}, "maxNumSteps", "1 or more"),
        ({"numPromptsPerStep": -4}, "numPromptsPerStep", "1 or more"),
        ({"numGenerationsPerPrompt": 0}, "numGenerationsPerPrompt", "1 or more"),
        ({"runName": "Bad_Name"}, "runName", "Kubernetes name"),
        ({"runName": "a" * 41}, "runName", "1-40 characters"),
        ({"vllmGpuMemoryUtilization": 1.5}, "vllmGpuMemoryUtilization", "(0, 1]"),
        ({"extraOverrides": ["no-equals-sign"]}, "extraOverrides", "key=value"),
        ({"recipe": "/etc/passwd"}, "recipe", "examples/configs/"),
        ({"infraStack": ""}, "infraStack", "organization/nemo-rl-gke/h200"),
        ({"preflightLustreMinFraction": 2}, "preflightLustreMinFraction", "(0, 1]"),
        # 8 training GPUs at TP 1 are 8 data-parallel ranks: 3 x 5 = 15 samples cannot be shared among them.
        (
            {"dtensorTensorParallelSize": 1, "numPromptsPerStep": 3, "numGenerationsPerPrompt": 5},
            "numPromptsPerStep",
            "(3 x 5 = 15) is the training batch (policy.train_global_batch_size) and must be a multiple of the 8",
        ),
        ({"extraOverrides": ["policy.train_global_batch_size=64"]}, "extraOverrides", "derived from numPromptsPerStep"),
        ({"extraOverrides": ["++cluster.num_nodes=4"]}, "extraOverrides", "derived from numNodes"),
    ],
)
def test_bad_job_config_names_key_and_value(infra_outputs, values, key, fragment):
    infra = infra_of(infra_outputs["h200"])
    with pytest.raises(ConfigError) as caught:
        job_with(infra, **values)
    assert caught.value.key == key
    assert f"'{key}'" in str(caught.value)
    assert fragment in str(caught.value)


def test_training_gpus_divide_dtensor_tp_with_more_nodes(infra_outputs):
    infra = infra_of({**infra_outputs["h200"], "rayWorkerReplicas": 4})
    job = job_with(infra, numNodes=4, generationNodes=1, dtensorTensorParallelSize=8, numPromptsPerStep=12)
    assert job.num_nodes == 4  # 24 training GPUs, TP 8 divides them: 3 data-parallel ranks share 12 x 32 samples
    with pytest.raises(ConfigError, match="divisor of the 24 training GPUs"):
        job_with(infra, numNodes=4, generationNodes=1, dtensorTensorParallelSize=16)
    with pytest.raises(ConfigError, match="multiple of the 3 data-parallel ranks"):
        job_with(infra, numNodes=4, generationNodes=1, dtensorTensorParallelSize=8)


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"rayAddress": None}, "rayAddress"),
        ({"gpusPerNode": "eight"}, "gpusPerNode"),
        ({"submitterPodLabel": {}}, "submitterPodLabel"),
    ],
)
def test_missing_or_malformed_infra_output(infra_outputs, change, name):
    outputs = {**infra_outputs["h200"], **change}
    with pytest.raises(ConfigError) as caught:
        build_infra_outputs(outputs, stack="org/nemo-rl-gke/h200")
    assert name in caught.value.key


# --- pipeline --------------------------------------------------------------------------------------------------


def test_pipeline_order_and_idempotent_ids(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    steps = pipeline_steps(job_with(infra, runName="exp1"), infra)
    assert [s.name for s in steps] == ["preflight-nccl", "preflight-lustre", "prepare-data", "train", "convert-hf"]
    assert [s.submission_id for s in steps] == [f"exp1-{s.name}" for s in steps]
    # Same config, same ids: a restarted pod finds the jobs it already submitted.
    again = pipeline_steps(job_with(infra, runName="exp1"), infra)
    assert [s.submission_id for s in again] == [s.submission_id for s in steps]
    skipped = pipeline_steps(job_with(infra, runName="exp1", preflight=False, convertToHf=False), infra)
    assert [s.name for s in skipped] == ["prepare-data", "train"]


def test_entrypoints_pin_nothing_at_run_time(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    steps = pipeline_steps(job_with(infra), infra)
    train = next(s for s in steps if s.name == "train")
    text = entrypoint_text(train)
    assert text.startswith("cd /opt/nemo-rl && uv run python examples/run_grpo_math.py --config=examples/configs/")
    for step in steps:
        assert not re.search(r"\b(git|pip|sed|apt-get)\b", entrypoint_text(step)), step.name
    nccl = next(s for s in steps if s.name == "preflight-nccl")
    assert "--nodes=2" in nccl.entrypoint and "--gpus-per-node=8" in nccl.entrypoint
    lustre = next(s for s in steps if s.name == "preflight-lustre")
    assert "--capacity-gib=18000" in lustre.entrypoint and "--tier-mbps-per-tib=500" in lustre.entrypoint


def test_pipeline_script_runs_each_step_through_the_submitter_and_stops_on_failure(infra_outputs, tmp_path: Path):
    """Run the generated script with a fake submitter: steps in order, stop at the first failure, exit code kept."""
    import subprocess

    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra, runName="exp2")
    steps = pipeline_steps(job, infra)
    script = pipeline_script(job, infra, steps)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    log = tmp_path / "calls.log"
    # `python SUBMITTER ... --submission-id=ID ...`: record the id; fail with 3 on the train step.
    (fake_bin / "python").write_text(
        "#!/bin/bash\n"
        'id="$(basename "$1")"\n'  # the script run; for the submitter, its submission id
        f'for a in "$@"; do case "$a" in --submission-id=*) id="${{a#*=}}";; esac; done\n'
        f'echo "$id" >> {log}\n'
        'case "$id" in *-train) exit 3;; esac\n'
    )
    (fake_bin / "python").chmod(0o755)
    for tool in ("mkdir", "cp"):
        (fake_bin / tool).write_text("#!/bin/bash\nexit 0\n")
        (fake_bin / tool).chmod(0o755)
    result = subprocess.run(
        ["bash", "-c", script], env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, capture_output=True, text=True, check=False
    )
    assert result.returncode == 3
    assert log.read_text().split() == [
        "wait_for_workers.py",
        "exp2-preflight-nccl",
        "exp2-preflight-lustre",
        "exp2-prepare-data",
        "exp2-train",
    ]
    assert "step train did not succeed (exit 3)" in result.stderr


def test_no_step_sets_a_job_runtime_env(infra_outputs):
    """NeMo RL's init_ray() forwards the driver's whole environment as its runtime env; Ray refuses to merge it
    with a job-level env that names any of the same variables (tests/jobs/test_runtime_env_on_ray.py shows it)."""
    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra)
    script = pipeline_script(job, infra, pipeline_steps(job, infra))
    assert "--runtime-env" not in script and "env_vars" not in script


def test_submitter_gets_the_entrypoint_as_one_bash_command(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra)
    steps = pipeline_steps(job, infra)
    script = pipeline_script(job, infra, steps)
    line = next(line for line in script.splitlines() if "--submission-id=grpo-gsm8k-train" in line)
    words = shlex.split(line.removesuffix(" || {"))
    after = words[words.index("--") + 1 :]
    assert after[:2] == ["bash", "-c"] and after[2] == entrypoint_text(steps[3])
    assert f"--address={infra.ray_address}" in words


# --- the program under mocks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["dev", "h200", "b200"])
def test_job_program_against_real_infra_outputs(infra_outputs, stack):
    run = run_jobs(stack, infra_outputs)
    infra = infra_outputs[stack]
    job = run.one("kubernetes:batch/v1:Job").inputs
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    label_key, label_value = next(iter(infra["submitterPodLabel"].items()))
    # The infra NetworkPolicy admits pods with this label to the Ray head.
    assert job["spec"]["template"]["metadata"]["labels"][label_key] == label_value
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    assert job["metadata"]["namespace"] == infra["namespace"]
    assert spec["backoffLimit"] >= 1 and spec["ttlSecondsAfterFinished"] > 0
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["image"] == infra["nemoRlImage"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": infra["cpuNodePool"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == infra["lustrePvcName"]
    config_map = run.one("kubernetes:core/v1:ConfigMap").inputs
    assert volumes["launcher"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert set(config_map["data"]) == {
        "ray_submit.py", "wait_for_workers.py", "prepare_gsm8k.py", "convert_checkpoint.py", "nccl_allreduce.py",
        "lustre_io.py", "pipeline.sh",
    }  # fmt: skip
    assert config_map["data"]["ray_submit.py"] == (JOBS / "ray_submit.py").read_text()
    # The Job's address and ids come from the infra outputs.
    assert f"--address={infra['rayAddress']}" in config_map["data"]["pipeline.sh"]
    provider = run.one("pulumi:providers:kubernetes")
    assert all(
        r.provider.startswith(provider.urn) for r in run.resources if r.type.startswith("kubernetes:") and r.custom
    )
    assert run.outputs["followLogs"] == f"kubectl --namespace {infra['namespace']} logs -f job/{run.outputs['jobName']}"
    assert run.outputs["dashboardPortForward"] == infra["dashboardPortForward"]


def test_job_program_pipeline_output_lists_every_step(infra_outputs):
    run = run_jobs("dev", infra_outputs)
    pipeline = run.outputs["pipeline"]
    assert [p["submissionId"] for p in pipeline] == [
        "smoke-qwen-1p5b-preflight-nccl",
        "smoke-qwen-1p5b-preflight-lustre",
        "smoke-qwen-1p5b-prepare-data",
        "smoke-qwen-1p5b-train",
        "smoke-qwen-1p5b-convert-hf",
    ]
    train = pipeline[3]["entrypoint"]
    assert "cluster.num_nodes=1" in train and "policy.generation.colocated.enabled=True" in train


def test_job_program_rejects_more_nodes_than_the_infra_has(infra_outputs):
    with pytest.raises(ConfigError, match="numNodes"):
        run_jobs("dev", infra_outputs, {"numNodes": 2})


def test_the_kubeconfig_stays_secret_in_the_job_stack(infra_outputs):
    """The infra stack's kubeconfig is its one secret output: the job stack must keep it encrypted."""
    assert INFRA_SECRET_OUTPUTS["h200"] == {"kubeconfig"}
    kubeconfig = infra_outputs["h200"]["kubeconfig"]
    run = run_jobs("h200", infra_outputs)
    for resource in run.resources:
        if resource.type == "pulumi:pulumi:StackReference":
            continue  # what is read, not what is stored: the reference's own outputs carry the secret marking
        assert plaintext_paths(resource.raw_inputs, kubeconfig) == [], resource.type
    provider = run.one("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == kubeconfig  # it does reach the provider, encrypted
    assert kubeconfig not in json.dumps(run.outputs)


def test_job_stack_files_match_their_infra_stacks():
    for stack in ("dev", "h200", "b200"):
        _, config = load_stack_config(JOBS, stack)
        assert config["nemo-rl-jobs:infraStack"].endswith(f"/nemo-rl-gke/{stack}")


def test_destroying_the_job_stack_touches_no_data(infra_outputs):
    """`pulumi destroy` in jobs/ deletes what this program registered: the Job and its scripts, never a volume."""
    run = run_jobs("h200", infra_outputs)
    owned = sorted(r.type for r in run.resources if r.custom)
    assert owned == [
        "kubernetes:batch/v1:Job",
        "kubernetes:core/v1:ConfigMap",
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
        "pulumi:providers:kubernetes",
        "pulumi:pulumi:StackReference",
    ]


def test_job_program_stops_on_a_missing_infra_output(infra_outputs):
    """An infra stack from before the workloads were added (no rayAddress): a clear error, nothing created."""
    outputs = {k: v for k, v in infra_outputs["dev"].items() if k != "rayAddress"}
    with pytest.raises(ConfigError) as caught:
        run_jobs("dev", {"dev": outputs})
    assert "rayAddress" in str(caught.value) and "organization/nemo-rl-gke/dev" in str(caught.value)


def test_the_pipeline_waits_for_every_gpu_worker_first(infra_outputs):
    infra = infra_of({**infra_outputs["h200"], "rayWorkerReplicas": 2})
    job = job_with(infra, waitForWorkersMinutes=90)
    script = pipeline_script(job, infra, pipeline_steps(job, infra))
    lines = script.splitlines()
    wait_line = next(i for i, line in enumerate(lines) if "wait_for_workers.py" in line)
    first_submit = next(i for i, line in enumerate(lines) if "ray_submit.py" in line)
    assert wait_line < first_submit
    words = shlex.split(lines[wait_line])
    assert f"--address={infra.ray_address}" in words
    assert {"--nodes=2", "--gpus-per-node=8", "--timeout-s=5400"} <= set(words)
    with pytest.raises(ConfigError, match="waitForWorkersMinutes"):
        job_with(infra, waitForWorkersMinutes=0)


def test_nothing_may_connect_to_the_submitter(infra_outputs):
    run = run_jobs("h200", infra_outputs)
    policy = run.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs["spec"]
    pod_labels = run.one("kubernetes:batch/v1:Job").inputs["spec"]["template"]["metadata"]["labels"]
    selector = policy["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()  # it selects the submitter pods ...
    assert policy["policyTypes"] == ["Ingress"] and not policy.get("ingress")  # ... and admits nothing
