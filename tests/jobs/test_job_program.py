"""The job stack: settings, overrides and pipeline as pure data, and the whole program under mocks fed with the
outputs the infra program really exports (so the contract between the two stacks is tested from both sides)."""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from config_rules import ConfigError
from conftest import ROOT, shared_infra_run
from fake_tools import fake_env, fake_tools
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job import SCRIPT_FILES
from launcher.job_settings import build_job_settings
from launcher.overrides import grpo_overrides
from launcher.paths import SCRIPTS_MOUNT, SUBMITTER_PACKAGE
from launcher.script import SUBMITTER, pipeline_script
from launcher.steps import entrypoint_text, pipeline_steps, rerun_warnings
from script_loader import load_script
from upstream import reference

from tools.offline import ProgramRun, load_stack_config, plaintext_paths, run_program

JOBS = ROOT / "jobs"


INFRA_SECRET_OUTPUTS: dict[str, set[str]] = {}


@pytest.fixture(scope="module")
def infra_outputs() -> dict[str, dict[str, Any]]:
    """What each infra stack file really exports (and, in INFRA_SECRET_OUTPUTS, which of it is secret)."""
    outputs = {}
    for stack in ("dev", "h200", "b200"):
        run = shared_infra_run(stack)
        outputs[stack] = run.outputs
        INFRA_SECRET_OUTPUTS[stack] = run.secret_outputs
    return outputs


def run_jobs(
    stack: str, infra_outputs: dict, overrides: dict[str, Any] | None = None, infra: str | None = None
) -> ProgramRun:
    """The job stack file `stack` under mocks, on the infra stack of the same name, or on `infra` (its infraStack
    then set to that stack, as `pulumi config set infraStack` would)."""
    project, config = load_stack_config(JOBS, stack)
    if infra:
        config[f"{project}:infraStack"] = f"organization/nemo-rl-gke/{infra}"
    for key, value in (overrides or {}).items():
        config[f"{project}:{key}"] = value
    reference = config[f"{project}:infraStack"]
    return run_program(
        JOBS,
        config,
        stack=stack,
        stack_outputs={reference: infra_outputs[infra or stack]},
        stack_secret_outputs={reference: INFRA_SECRET_OUTPUTS[infra or stack]},
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


def test_wandb_when_the_key_exists_and_tensorboard_always(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    no_key = grpo_overrides(job_with(infra, runName="r1"), infra)
    assert "logger.tensorboard_enabled=True" in no_key
    assert "logger.log_dir=/data/r1/logs" in no_key
    assert "logger.wandb_enabled=False" in no_key
    with_key = infra_of({**infra_outputs["h200"], "secretKeys": ["HF_TOKEN", "WANDB_API_KEY"]})
    overrides = grpo_overrides(job_with(with_key, runName="r1"), with_key)
    assert "logger.wandb_enabled=True" in overrides
    assert "logger.wandb.name=r1" in overrides
    assert "logger.tensorboard_enabled=True" in overrides and "logger.tensorboard_enabled=False" not in overrides
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
        ({"extraOverrides": ["~+grpo.seed"]}, "extraOverrides", "or ~key (Hydra syntax)"),
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


def test_every_hydra_override_form_passes_the_syntax_check(infra_outputs):
    """A deletion needs no value (`~key`, or `~key=value` to delete only that value); the plan checks the keys."""
    infra = infra_of(infra_outputs["h200"])
    forms = ["grpo.seed=1", "+grpo.new_key=1", "++grpo.seed=2", "~checkpointing.keep_top_k", "~grpo.seed=2"]
    assert job_with(infra, extraOverrides=forms).extra_overrides == tuple(forms)


def test_a_second_append_of_a_key_the_pipeline_sets_is_refused(infra_outputs):
    """Hydra refuses `+key=` for a key appended before (the pipeline appends the data paths at v0.5.0): one line,
    the item, the key and the fix."""
    infra = infra_of(infra_outputs["h200"])
    ours = grpo_overrides(job_with(infra), infra)
    appended = next(item for item in ours if item.startswith("+"))
    key = appended[1:].split("=", 1)[0]
    with pytest.raises(ConfigError) as caught:
        grpo_overrides(job_with(infra, extraOverrides=[f"+{key}=/data/mine.jsonl"]), infra)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"config 'extraOverrides' = '+{key}=/data/mine.jsonl' is not allowed: ")
    assert f"the pipeline already sets {key} ({appended})" in message
    assert f"drop the '+' to override its value ({key}=/data/mine.jsonl)" in message
    # Without the '+' it overrides the value, last wins; '++' is Hydra's add-or-override: both pass.
    for item in (f"{key}=/data/mine.jsonl", f"++{key}=/data/mine.jsonl"):
        assert grpo_overrides(job_with(infra, extraOverrides=[item]), infra)[-1] == item


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
        ({"rayAuthSecret": "Not A Name"}, "rayAuthSecret"),
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
    assert [s.name for s in steps] == [
        "preflight-nccl", "preflight-lustre", "prepare-data", "prefetch-weights", "eval-base", "train", "convert-hf",
        "export-gcs", "eval-final",
    ]  # fmt: skip
    assert [s.submission_id for s in steps] == [f"exp1-{s.name}" for s in steps]
    # Same config, same ids: a restarted pod finds the jobs it already submitted.
    again = pipeline_steps(job_with(infra, runName="exp1"), infra)
    assert [s.submission_id for s in again] == [s.submission_id for s in steps]
    skipped = pipeline_steps(
        job_with(infra, runName="exp1", preflight=False, convertToHf=False, evalBase=False, evalFinal=False), infra
    )
    assert [s.name for s in skipped] == ["prepare-data", "prefetch-weights", "train"]


def test_entrypoints_pin_nothing_at_run_time(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    steps = pipeline_steps(job_with(infra), infra)
    train = next(s for s in steps if s.name == "train")
    text = entrypoint_text(train)
    assert " && cd /opt/nemo-rl && uv run python examples/run_grpo_math.py --config=examples/configs/" in text
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
    log = tmp_path / "calls.log"
    # `python SUBMITTER ... --submission-id=ID ...`: record the id; fail with 3 on the train step.
    fake_bin = fake_tools(
        tmp_path,
        'id="$(basename "$1")"\n'  # the script run; for the submitter, its submission id
        f'for a in "$@"; do case "$a" in --submission-id=*) id="${{a#*=}}";; esac; done\n'
        f'echo "$id" >> {log}\n'
        'case "$id" in *-train) exit 3;; esac\n',
    )
    result = subprocess.run(["bash", "-c", script], env=fake_env(fake_bin), capture_output=True, text=True, check=False)
    assert result.returncode == 3
    assert log.read_text().split() == [
        "wait_for_workers.py",
        "exp2-preflight-nccl",
        "topology_report.py",  # the blocks and sub-blocks the run landed on, after the NCCL pre-flight
        "exp2-preflight-lustre",
        "exp2-prepare-data",
        "exp2-prefetch-weights",
        "exp2-eval-base",
        "exp2-train",
    ]
    assert "step train did not succeed (exit 3)" in result.stderr


def test_each_step_is_recorded_on_lustre_and_recorded_steps_wait_for_no_gpu(infra_outputs, tmp_path: Path):
    """Every step's submitter reads and writes its outcome record under /data/<runName>/step-outcomes; the worker
    wait runs once, before the first step without a record, so a pod that finds the whole run recorded (a
    replaced Job of a finished run) asks for no GPU node."""
    import subprocess

    infra = infra_of({**infra_outputs["h200"], "lustreMountPath": str(tmp_path / "data")})
    job = job_with(infra, runName="exp3")
    steps = pipeline_steps(job, infra)
    script = pipeline_script(job, infra, steps)
    outcomes = tmp_path / "data" / "exp3" / "step-outcomes"
    for step in steps:
        line = next(x for x in script.splitlines() if SUBMITTER in x and f"--submission-id={step.submission_id} " in x)
        words = shlex.split(line.removesuffix(" || {"))
        assert f"--record={outcomes}/{step.name}.json" in words
        # A head restart costs the train step an attempt (within maxRestarts); the others are submitted again.
        assert ("--max-resubmits=0" in words) == (step.name == "train"), step.name
    log = tmp_path / "calls.log"
    fake_bin = fake_tools(
        tmp_path,
        'id="$(basename "$1")"\n'
        'for a in "$@"; do case "$a" in --submission-id=*) id="${a#*=}";; esac; done\n'
        f'echo "$id" >> {log}\n',
    )

    def calls() -> list[str]:
        log.unlink(missing_ok=True)
        done = subprocess.run(["bash", "-c", script], env=fake_env(fake_bin), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        # The worker wait and the step submissions, in order (other helpers the script runs are not looked at).
        return [call for call in log.read_text().split() if call == "wait_for_workers.py" or call in ids]

    ids = [step.submission_id for step in steps]
    assert calls() == ["wait_for_workers.py", *ids]
    outcomes.mkdir(parents=True)
    for step in steps[:3]:  # the pre-flights and the data: the next pod waits for the workers before train
        (outcomes / f"{step.name}.json").write_text("{}")
    assert calls() == [*ids[:3], "wait_for_workers.py", *ids[3:]]
    for step in steps:
        (outcomes / f"{step.name}.json").write_text("{}")
    assert calls() == ids


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
    line = next(
        line for line in script.splitlines() if SUBMITTER in line and "--submission-id=grpo-gsm8k-train" in line
    )
    words = shlex.split(line.removesuffix(" || {"))
    after = words[words.index("--") + 1 :]
    train = next(s for s in steps if s.name == "train")
    assert after[:2] == ["bash", "-c"] and after[2] == entrypoint_text(train)
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
    assert job["metadata"]["annotations"] == {
        "pulumi.com/waitFor": "jsonpath={.metadata.uid}",
        # Its pod is deleted first: the Role the pod reads its Job with must outlive it.
        "pulumi.com/deletionPropagationPolicy": "foreground",
    }
    assert job["metadata"]["namespace"] == infra["namespace"]
    assert spec["backoffLimit"] >= 1 and spec["ttlSecondsAfterFinished"] > 0
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["image"] == infra["nemoRlImage"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": infra["cpuNodePool"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == infra["lustrePvcName"]
    config_map = run.one("kubernetes:core/v1:ConfigMap", "pipeline-scripts").inputs
    assert volumes["launcher"]["configMap"]["name"] == config_map["metadata"]["name"]
    package = {f"{SUBMITTER_PACKAGE}.{module.name}" for module in (JOBS / SUBMITTER_PACKAGE).glob("*.py")}
    assert {f"{SUBMITTER_PACKAGE}.{name}" for name in ("cli.py", "attempts.py", "stop_on_delete.py")} <= package
    assert set(config_map["data"]) == {
        "ray_submit.py", "wait_for_workers.py", "admission.py", "prepare_gsm8k.py", "prepare_jsonl.py",
        "convert_checkpoint.py", "nccl_allreduce.py", "lustre_io.py", "checkpoint_guard.py", "export_gcs.py",
        "archive_gcs.py", "eval_model.py", "eval_summary.py",
        "prefetch_weights.py", "prepare_openmathinstruct2.py", "benchmark_summary.py", "topology_report.py",
        "pipeline.sh", *package,
    }  # fmt: skip
    assert config_map["data"]["ray_submit.py"] == (JOBS / "ray_submit.py").read_text()
    assert config_map["data"]["submitter.attempts.py"] == (JOBS / "submitter" / "attempts.py").read_text()
    # The Job's address and ids come from the infra outputs.
    assert f"--address={infra['rayAddress']}" in config_map["data"]["pipeline.sh"]
    provider = run.one("pulumi:providers:kubernetes")
    assert all(
        r.provider.startswith(provider.urn) for r in run.resources if r.type.startswith("kubernetes:") and r.custom
    )
    # Replaced only with the infra's cluster, also one replaced under the same name (its DNS endpoint names the
    # cluster's uid): a kubeconfig change (endpoint, CA) is an update.
    assert provider.inputs["clusterIdentifier"] == infra["clusterInstance"]
    assert infra["clusterInstance"].startswith(infra["clusterId"] + "@gke-")
    assert run.outputs["followLogs"] == f"kubectl --namespace {infra['namespace']} logs -f job/{run.outputs['jobName']}"
    assert run.outputs["dashboardPortForward"] == infra["dashboardPortForward"]


def test_the_submitter_runs_from_its_volume_and_from_the_copy_on_lustre(infra_outputs, tmp_path: Path):
    """The launcher ConfigMap laid out as the kubelet mounts it (each item at its path), then copied as pipeline.sh
    copies it to Lustre: from both folders ray_submit.py imports every module of its package and runs, with nothing
    of the repository on the path (a recorded step: it reports the record and needs no Ray head)."""
    import subprocess

    run = run_jobs("h200", infra_outputs)
    data = run.one("kubernetes:core/v1:ConfigMap", "pipeline-scripts").inputs["data"]
    volumes = run.one("kubernetes:batch/v1:Job").inputs["spec"]["template"]["spec"]["volumes"]
    items = next(v for v in volumes if v["name"] == "launcher")["configMap"]["items"]
    assert sorted(item["key"] for item in items) == sorted(data)  # a volume with items projects only those listed
    mount = tmp_path / "opt-launcher"
    for item in items:
        (mount / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (mount / item["path"]).write_text(data[item["key"]])
    assert sorted(p.name for p in (mount / SUBMITTER_PACKAGE).iterdir()) == sorted(
        p.name for p in (JOBS / SUBMITTER_PACKAGE).glob("*.py")
    )
    copy = next(line for line in data["pipeline.sh"].splitlines() if line.startswith("cp "))
    lustre = tmp_path / "lustre-scripts"
    lustre.mkdir()
    sources, _destination = copy.rsplit(" ", 1)  # the run's scripts folder on Lustre: here, a local one
    subprocess.run(["bash", "-c", f"{sources.replace(SCRIPTS_MOUNT, str(mount))} {lustre}/"], check=True)
    record = tmp_path / "train.json"
    record.write_text(json.dumps({"submission_id": "s1", "job": "s1-r1", "status": "SUCCEEDED", "command": "true"}))
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    for folder in (mount, lustre):
        submitter = SUBMITTER.replace(SCRIPTS_MOUNT, str(folder))
        args = [sys.executable, submitter, "--address=http://127.0.0.1:9", "--submission-id=s1", f"--record={record}"]
        result = subprocess.run([*args, "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[-1] == "ray_submit: job s1-r1 SUCCEEDED", folder


def test_job_program_pipeline_output_lists_every_step(infra_outputs):
    run = run_jobs("dev", infra_outputs)
    pipeline = run.outputs["pipeline"]
    assert [p["submissionId"] for p in pipeline] == [
        "smoke-qwen-1p5b-preflight-nccl",
        "smoke-qwen-1p5b-preflight-lustre",
        "smoke-qwen-1p5b-prepare-data",
        "smoke-qwen-1p5b-prefetch-weights",
        "smoke-qwen-1p5b-eval-base",
        "smoke-qwen-1p5b-train",
        "smoke-qwen-1p5b-convert-hf",
        "smoke-qwen-1p5b-eval-final",
    ]
    train = next(step["entrypoint"] for step in pipeline if step["step"] == "train")
    assert run.outputs["evalSummary"].endswith("cat /data/smoke-qwen-1p5b/eval/summary.json")
    assert "cluster.num_nodes=1" in train and "policy.generation.colocated.enabled=True" in train


def test_job_program_rejects_more_nodes_than_the_infra_has(infra_outputs):
    with pytest.raises(ConfigError, match="numNodes"):
        run_jobs("dev", infra_outputs, {"numNodes": 2})


def test_job_program_refuses_unknown_keys_with_the_closest_one(infra_outputs):
    with pytest.raises(ConfigError, match=r"'nemo-rl-jobs:numNode'.*did you mean 'numNodes'"):
        run_jobs("dev", infra_outputs, {"numNode": 1})
    project, config = load_stack_config(JOBS, "dev")
    config["nemo-rl-job:runName"] = "x"  # a near miss of the project's namespace
    with pytest.raises(ConfigError, match=r"did you mean 'nemo-rl-jobs:runName'"):
        run_program(JOBS, config, stack="dev", stack_outputs={config[f"{project}:infraStack"]: infra_outputs["dev"]})


def test_a_missing_job_setting_reads_not_set(infra_outputs):
    outputs = {k: v for k, v in infra_outputs["dev"].items() if k != "rayAddress"}
    with pytest.raises(ConfigError) as caught:
        run_jobs("dev", {"dev": outputs})
    assert "is not set" in str(caught.value) and "None" not in str(caught.value)


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
    # The job stacks of their own name each run on the infra stack tools/plan_stacks.py pairs them with.
    from tools.plan_stacks import JOB_EXAMPLE_STACKS

    for stack, infra in JOB_EXAMPLE_STACKS.items():
        _, config = load_stack_config(JOBS, stack)
        assert config["nemo-rl-jobs:infraStack"] == f"organization/nemo-rl-gke/{infra}"


def test_destroying_the_job_stack_touches_no_data(infra_outputs):
    """`pulumi destroy` in jobs/ deletes what this program registered: the Job and its scripts, never a volume."""
    run = run_jobs("h200", infra_outputs)
    owned = sorted(r.type for r in run.resources if r.custom)
    assert owned == [
        "kubernetes:batch/v1:Job",
        "kubernetes:core/v1:ConfigMap",
        "kubernetes:core/v1:ConfigMap",
        "kubernetes:core/v1:ServiceAccount",
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",  # `get` nodes (the pre-flight's topology report)
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
        "kubernetes:rbac.authorization.k8s.io/v1:Role",
        "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
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


# --- run lifecycle: retries, stop on destroy ---------------------------------------------------------------------


def _submit_line(script: str, submission_id: str) -> list[str]:
    line = next(
        line for line in script.splitlines() if SUBMITTER in line and f"--submission-id={submission_id}" in line
    )
    return shlex.split(line.removeprefix("in_background ").removesuffix(" || {"))


def test_only_the_train_step_is_retried_and_each_attempt_guards_the_checkpoints(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra, runName="exp3")
    steps = pipeline_steps(job, infra)
    script = pipeline_script(job, infra, steps)
    assert "--max-retries=3" in _submit_line(script, "exp3-train")  # the default budget
    for step in steps:
        if step.name != "train":
            assert not any(w.startswith("--max-retries") for w in _submit_line(script, step.submission_id))
    train = next(s for s in steps if s.name == "train")
    # Each attempt waits for the run's GPU nodes first (a retry follows a lost node), then guards the checkpoints.
    wait, guard, run = entrypoint_text(train).split(" && ", 2)
    assert shlex.split(wait) == [
        "python",
        "/data/exp3/scripts/wait_for_workers.py",
        f"--address={infra.ray_address}",
        f"--nodes={job.num_nodes}",
        "--gpus-per-node=8",
        f"--timeout-s={job.wait_for_workers_minutes * 60}",
        # It waits for every admitted run's nodes, this one's included (submitter/admission.py).
        "--with-admitted-runs",
    ]
    assert guard == "python /data/exp3/scripts/checkpoint_guard.py --checkpoint-dir=/data/exp3"
    assert run.startswith("cd /opt/nemo-rl && uv run python examples/run_grpo_math.py")
    none = job_with(infra, runName="exp3", maxRestarts=0)
    assert not any(
        w.startswith("--max-retries")
        for w in _submit_line(pipeline_script(none, infra, pipeline_steps(none, infra)), "exp3-train")
    )
    with pytest.raises(ConfigError, match="maxRestarts"):
        job_with(infra, maxRestarts=-1)
    with pytest.raises(ConfigError, match="maxRestarts"):
        job_with(infra, maxRestarts=21)


def test_the_guard_and_the_submitter_agree_on_the_checkpoint_dir(infra_outputs):
    guard = load_script("jobs/scripts/checkpoint_guard.py", "checkpoint_guard")
    infra = infra_of(infra_outputs["h200"])
    train = next(s for s in pipeline_steps(job_with(infra, runName="exp4"), infra) if s.name == "train")
    assert "checkpointing.checkpoint_dir=/data/exp4" in train.entrypoint
    assert "--checkpoint-dir=/data/exp4" in train.entrypoint
    assert guard.RESUME_FILES == ("training_info.json", "train_dataloader.pt")


# Scripts that talk to the Ray cluster; every other script run with the image's plain python gets the stdlib only.
RAY_CLIENTS = {"ray_submit.py", "wait_for_workers.py"}
# Scripts that import the submitter's package, shipped beside them.
SUBMITTER_USERS = {"ray_submit.py", "wait_for_workers.py", "admission.py", "topology_report.py"}


def plain_python_scripts(words: list[str]) -> list[str]:
    """The scripts a command runs with `python` itself, not through `uv run python`."""
    return [Path(words[i + 1]).name for i, w in enumerate(words[:-1]) if w == "python" and words[i - 1 : i] != ["run"]]


@pytest.mark.parametrize("release", ["nemo-rl-v0.5.0", "nemo-rl-v0.7.0"])
def test_scripts_run_with_the_images_plain_python_import_only_what_it_has(infra_outputs, release):
    """The checkpoint guard, the export and the submitter run with `python` outside `uv run`. In the NeMo RL image
    that is NeMo RL's venv (its Dockerfile puts /opt/nemo_rl_venv/bin first on PATH), which has Ray but nothing of
    ours: those scripts may import the standard library, and Ray where they talk to the cluster."""
    dockerfile = (reference(release) / "docker" / "Dockerfile").read_text()
    assert 'ENV PATH="/opt/nemo_rl_venv/bin:$PATH"' in dockerfile
    assert "ENV UV_PROJECT_ENVIRONMENT=/opt/nemo_rl_venv" in dockerfile
    version = re.search(r"^ARG PYTHON_VERSION=(\d+)\.(\d+)", dockerfile, re.MULTILINE)
    assert version and (int(version[1]), int(version[2])) >= (3, 10)  # what ray_submit.py asks for
    assert re.search(r'"ray\[default\][=>]=', (reference(release) / "pyproject.toml").read_text())

    infra = infra_of(infra_outputs["h200"])  # with an export bucket: every step there is
    job = job_with(infra)
    steps = pipeline_steps(job, infra)
    used = {name for s in steps for name in plain_python_scripts(s.entrypoint)}
    used |= set(plain_python_scripts(shlex.split(pipeline_script(job, infra, steps))))
    assert used == {
        "checkpoint_guard.py", "export_gcs.py", "ray_submit.py", "wait_for_workers.py", "eval_summary.py",
        "admission.py", "topology_report.py",
    }  # fmt: skip
    files = [(Path(f).name, JOBS / f) for f in SCRIPT_FILES if Path(f).name in used]
    # The submitter's own package, shipped beside it: each module under the submitter's rules.
    files += [("ray_submit.py", module) for module in sorted((JOBS / SUBMITTER_PACKAGE).glob("*.py"))]
    for name, path in files:
        tree = ast.parse(path.read_text())
        assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)), path  # absolute only
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        own = [SUBMITTER_PACKAGE] if name in SUBMITTER_USERS else []
        allowed = {*sys.stdlib_module_names, "__future__", *(["ray"] if name in RAY_CLIENTS else []), *own}
        assert {m.split(".")[0] for m in imported} <= allowed, path


def test_lifecycle_outputs(infra_outputs):
    run = run_jobs("dev", infra_outputs, {"maxRestarts": 2})
    assert run.outputs["maxRestarts"] == 2
    assert run.outputs["trainAttempts"] == [
        "smoke-qwen-1p5b-train", "smoke-qwen-1p5b-train-r1", "smoke-qwen-1p5b-train-r2",
    ]  # fmt: skip
    address = "--address http://127.0.0.1:8265"
    assert run.outputs["rayJobCommands"]["stop"] == (
        "for id in smoke-qwen-1p5b-train-r2 smoke-qwen-1p5b-train-r1 smoke-qwen-1p5b-train; do "
        f'if ray job status {address} "$id" >/dev/null 2>&1; then ray job stop {address} "$id"; break; fi; done'
    )
    assert run.outputs["rayJobCommands"]["list"] == f"ray job list {address}"
    without_retries = run_jobs("dev", infra_outputs, {"maxRestarts": 0}).outputs["rayJobCommands"]
    assert without_retries["logs"] == f"ray job logs {address} smoke-qwen-1p5b-train"
    assert run.outputs["stopOnDelete"] is True


def test_the_submitter_may_read_only_its_own_job_and_the_run_marker(infra_outputs):
    run = run_jobs("h200", infra_outputs)
    job = run.one("kubernetes:batch/v1:Job")
    pod = job.inputs["spec"]["template"]["spec"]
    namespace = infra_outputs["h200"]["namespace"]
    account = run.one("kubernetes:core/v1:ServiceAccount").inputs
    role = run.one("kubernetes:rbac.authorization.k8s.io/v1:Role")
    binding = run.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    marker = run.one("kubernetes:core/v1:ConfigMap", "pipeline-run-marker")
    job_name, marker_name = job.inputs["metadata"]["name"], marker.inputs["metadata"]["name"]
    assert (job_name, marker_name) == ("gemma3-27b-gsm8k-pipeline", "gemma3-27b-gsm8k-run")
    assert role.inputs["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [job_name], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [marker_name], "verbs": ["get"]},
    ]
    assert binding.inputs["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.inputs["metadata"]["name"],
    }  # fmt: skip
    assert binding.inputs["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
    ]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False and account["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    sources = volumes["api"]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"] == {"path": "token", "expirationSeconds": 3600}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["api"] == {
        "name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True,
    }  # fmt: skip
    # Destroy order: the marker goes first, the Role and binding only after the Job.
    assert run.depends_on(marker, job)
    assert run.depends_on(job, role) and run.depends_on(job, binding)
    # The submitter is told exactly these names, and has the time to stop the Ray job.
    script = run.one("kubernetes:core/v1:ConfigMap", "pipeline-scripts").inputs["data"]["pipeline.sh"]
    words = _submit_line(script, "gemma3-27b-gsm8k-train")
    assert {f"--k8s-job={job_name}", f"--k8s-run-marker={marker_name}", f"--k8s-namespace={namespace}"} <= set(words)
    stop_timeout = float(next(w for w in words if w.startswith("--stop-timeout=")).split("=")[1])
    assert pod["terminationGracePeriodSeconds"] >= 2 * 5 + stop_timeout + 10


def test_stop_on_delete_off_gives_the_pod_no_token(infra_outputs):
    run = run_jobs("h200", infra_outputs, {"stopOnDelete": False})
    pod = run.one("kubernetes:batch/v1:Job").inputs["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod and "api" not in {v["name"] for v in pod["volumes"]}
    assert not run.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert [r.name for r in run.of_type("kubernetes:core/v1:ConfigMap")] == ["pipeline-scripts"]
    script = run.one("kubernetes:core/v1:ConfigMap").inputs["data"]["pipeline.sh"]
    assert "--k8s-job" not in script


def test_the_pipeline_passes_sigterm_on_to_the_submitter(infra_outputs, tmp_path: Path):
    """Kubernetes signals PID 1, the shell: the running submitter must get the SIGTERM to decide about Ray."""
    import signal
    import subprocess
    import time

    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra, runName="exp5", preflight=False)
    script = pipeline_script(job, infra, pipeline_steps(job, infra))
    log = tmp_path / "calls.log"
    # The fake submitter blocks on the train step and records the signal it receives.
    fake_bin = fake_tools(
        tmp_path,
        'case "$*" in *--submission-id=exp5-train*) ;; *) exit 0;; esac\n'
        f"trap 'echo got-TERM >> {log}; exit 143' TERM\n"
        f"echo started >> {log}\n"
        "while true; do sleep 0.1; done\n",
    )
    proc = subprocess.Popen(["bash", "-c", script], env=fake_env(fake_bin), text=True)
    try:
        deadline = time.monotonic() + 20
        while not (log.exists() and "started" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        proc.kill()
    assert log.read_text().split() == ["started", "got-TERM"]


# --- model export -------------------------------------------------------------------------------------------------


def test_the_model_is_copied_to_the_export_bucket_after_conversion(infra_outputs):
    assert infra_outputs["h200"]["exportBucket"] == "my-gcp-project-nemo-rl-h200-models"
    run = run_jobs("h200", infra_outputs)
    assert run.outputs["modelUri"] == "gs://my-gcp-project-nemo-rl-h200-models/gemma3-27b-gsm8k/"
    steps = run.outputs["pipeline"]
    assert [s["step"] for s in steps][-3:] == ["convert-hf", "export-gcs", "eval-final"]
    export_words = shlex.split(steps[-2]["entrypoint"])
    convert_words = shlex.split(steps[-3]["entrypoint"])
    assert "--output-dir=/data/gemma3-27b-gsm8k/hf" in convert_words
    assert "--source=/data/gemma3-27b-gsm8k/hf" in export_words  # what the conversion wrote
    assert "--destination=gs://my-gcp-project-nemo-rl-h200-models/gemma3-27b-gsm8k/" in export_words
    exporter = load_script("jobs/scripts/export_gcs.py", "export_gcs")
    assert exporter._GS_RE.match("gs://my-gcp-project-nemo-rl-h200-models/gemma3-27b-gsm8k/")


def test_no_export_without_a_bucket_or_a_conversion(infra_outputs):
    run = run_jobs("dev", infra_outputs)  # the dev infra has no export bucket
    assert "export-gcs" not in [s["step"] for s in run.outputs["pipeline"]]
    assert run.outputs["modelUri"] == "/data/smoke-qwen-1p5b/hf"
    off = run_jobs("h200", infra_outputs, {"convertToHf": False, "evalFinal": False})
    assert "export-gcs" not in [s["step"] for s in off.outputs["pipeline"]]
    assert off.outputs["modelUri"] == ""


@pytest.mark.parametrize("stack", ["dev", "h200"])
def test_the_project_files_defaults_are_the_programs(infra_outputs, stack):
    """The CLI hands jobs/Pulumi.yaml's defaults to the program, the mocks do not: both must give the same run."""
    import yaml
    from config_rules import keys_of
    from launcher.job_settings import MODEL

    project_file = (JOBS / "Pulumi.yaml").read_text()
    declared = yaml.safe_load(project_file)["config"]
    # Pulumi's schema has no object type: `rerun` and `dataset` are read but not declared, and the file's comment
    # says so.
    assert set(declared) == set(keys_of(MODEL)) - {"rerun", "dataset", "benchmarkRecipes"}
    assert "the object keys `rerun`" in project_file and "and `dataset`" in project_file
    assert "`benchmarkRecipes`" in project_file
    assert all(d.get("description") for d in declared.values())
    infra = infra_of(infra_outputs[stack])
    stack_file = yaml.safe_load((JOBS / f"Pulumi.{stack}.yaml").read_text())["config"]
    given = {key.split(":", 1)[1]: value for key, value in stack_file.items()}  # what the stack sets itself
    defaults = {key: d["default"] for key, d in declared.items() if "default" in d and key not in given}
    assert len(defaults) > 10
    assert build_job_settings({**given, **defaults}, infra) == build_job_settings(given, infra)


def test_the_job_is_replaced_when_its_immutable_failure_policy_changes(infra_outputs):
    """spec.podFailurePolicy is immutable in Kubernetes but not in the provider's replace list: its exit codes are in
    the pod template, which is (pulumi-kubernetes v4.32 diff.go: .spec.template), so a change replaces the Job, and
    the provider deletes first as the name stays. Deleting it waits for its pod (foreground), within a bounded time."""
    from launcher.job import FINAL_EXIT_CODES, GRACE_SECONDS

    job = run_jobs("dev", infra_outputs).one("kubernetes:batch/v1:Job")
    annotations = job.inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations["nemo-rl-gke/final-exit-codes"] == ",".join(map(str, FINAL_EXIT_CODES))
    codes = job.inputs["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
    assert [int(code) for code in codes] == FINAL_EXIT_CODES
    assert job.custom_timeouts is not None
    delete = job.custom_timeouts["delete"]
    assert delete.endswith("m") and int(delete[:-1]) * 60 > GRACE_SECONDS


def test_a_new_run_name_is_created_first_and_the_old_run_stopped_like_a_destroy(infra_outputs):
    """The provider deletes first only when the name stays (pulumi-kubernetes v4.32 provider.go Diff): a new runName
    names a new Job, created first; the old Job and its marker are deleted at the end of the update in reverse
    dependency order (pulumi v3.259 step_generator.go ScheduleDeletes), the marker first, so the old submitter
    stops its Ray job on SIGTERM as on `pulumi destroy` (jobs/submitter/stop_on_delete.py)."""
    run = run_jobs("dev", infra_outputs)
    job = run.one("kubernetes:batch/v1:Job")
    marker = next(r for r in run.of_type("kubernetes:core/v1:ConfigMap") if r.name.endswith("-run-marker"))
    assert not job.delete_before_replace and not job.replace_on_changes  # the provider decides, by the name
    assert job.urn in marker.dependencies  # deleted after the marker
    run_name = job.inputs["metadata"]["name"].removesuffix("-pipeline")
    assert marker.inputs["metadata"]["name"] == f"{run_name}-run"
    # Every object the old submitter reads on SIGTERM is named after the run: a new runName creates new ones, and
    # the old ones go after the old Job, which depends on them.
    for resource in run.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role"):
        assert resource.inputs["metadata"]["name"].startswith(run_name) and resource.urn in job.dependencies


def test_the_job_stack_needs_the_cluster_id(infra_outputs):
    # clusterInstance where the infra stack exports it, else (an older infra stack) clusterId: one of them is needed.
    outputs = {k: v for k, v in infra_outputs["dev"].items() if k not in ("clusterId", "clusterInstance")}
    with pytest.raises(ConfigError, match="clusterId"):
        build_infra_outputs(outputs)


def test_the_submitter_reads_rays_token_from_the_infra_secret(infra_outputs):
    """Where the infra's Ray has token auth (v0.7.0: rayAuthSecret set), the submitter gets RAY_AUTH_MODE and the
    token by reference to that Secret, never a value; with v0.5.0's Ray (rayAuthSecret null) it gets neither."""
    with_token = {**infra_outputs["h200"], "rayAuthSecret": "nemo-rl-h200-ray-auth"}
    assert infra_of(with_token).ray_auth_secret == "nemo-rl-h200-ray-auth"
    run = run_program(
        JOBS,
        load_stack_config(JOBS, "h200")[1],
        stack="h200",
        stack_outputs={"organization/nemo-rl-gke/h200": with_token},
        stack_secret_outputs={"organization/nemo-rl-gke/h200": INFRA_SECRET_OUTPUTS["h200"]},
    )
    env = {
        e["name"]: e
        for e in run.one("kubernetes:batch/v1:Job").inputs["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}
    assert env["RAY_AUTH_TOKEN"] == {
        "name": "RAY_AUTH_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "nemo-rl-h200-ray-auth", "key": "RAY_AUTH_TOKEN"}},
    }
    assert infra_outputs["h200"]["rayAuthSecret"] is None
    without = run_jobs("h200", infra_outputs).one("kubernetes:batch/v1:Job").inputs
    names = {e["name"] for e in without["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}


# --- archive: the newest checkpoint and the model, copied and verified -------------------------------------------


def test_archive_is_the_last_step_and_copies_the_run_beside_the_exported_model(infra_outputs):
    run = run_jobs("h200", infra_outputs, {"archive": True})
    steps = run.outputs["pipeline"]
    assert [s["step"] for s in steps][-4:] == ["convert-hf", "export-gcs", "eval-final", "archive"]
    assert steps[-1]["submissionId"] == "gemma3-27b-gsm8k-archive"
    words = shlex.split(steps[-1]["entrypoint"])
    assert words[:2] == ["python", "/data/gemma3-27b-gsm8k/scripts/archive_gcs.py"]
    uri = "gs://my-gcp-project-nemo-rl-h200-models/gemma3-27b-gsm8k.archive/"
    assert words[2:] == ["--run-dir=/data/gemma3-27b-gsm8k", f"--archive={uri}", "--hf"]
    assert run.outputs["archiveUri"] == uri
    # Beside the model, not under it: fetching modelUri recursively never pulls a checkpoint.
    assert not uri.startswith(run.outputs["modelUri"])
    exporter = load_script("jobs/scripts/export_gcs.py", "export_gcs")  # archive_gcs.py parses it with this
    assert exporter.split_uri(uri) == ("my-gcp-project-nemo-rl-h200-models", "gemma3-27b-gsm8k.archive/")
    # The scripts the step imports ship beside it, in the ConfigMap and the per-run copy on Lustre.
    data = run.one("kubernetes:core/v1:ConfigMap", "pipeline-scripts").inputs["data"]
    assert {"archive_gcs.py", "export_gcs.py", "convert_checkpoint.py"} <= set(data)
    off = run_jobs("h200", infra_outputs)
    assert "archive" not in [s["step"] for s in off.outputs["pipeline"]] and off.outputs["archiveUri"] == ""


def test_archive_without_a_conversion_keeps_the_checkpoint_only(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra, archive=True, convertToHf=False, evalFinal=False)
    archive = pipeline_steps(job, infra)[-1]
    assert archive.name == "archive" and "--hf" not in archive.entrypoint


def test_archive_needs_an_export_bucket_and_is_refused_before_anything_is_registered(infra_outputs):
    with pytest.raises(ConfigError) as caught:
        run_jobs("dev", infra_outputs, {"archive": True})  # the dev infra has no export bucket
    assert str(caught.value).startswith("config 'archive' = True is not allowed: false unless the infra stack")
    assert "exportBucket" in str(caught.value)
    with pytest.raises(ConfigError, match=r"'archive' = 'maybe'.*true or false"):
        job_with(infra_of(infra_outputs["h200"]), archive="maybe")
    with pytest.raises(ConfigError, match=r"'archive' = True.*false with benchmark"):
        job_with(infra_of(infra_outputs["h200"]), benchmark=True, convertToHf=False, evalBase=False,
                 evalFinal=False, archive=True)  # fmt: skip


def test_a_rerun_of_train_or_convert_warns_that_archive_keeps_the_old_copy(infra_outputs):
    infra = infra_of(infra_outputs["h200"])
    job = job_with(infra, archive=True, rerun={"convert-hf": 1, "export-gcs": 1, "eval-final": 1})
    assert [w.split(" reads")[0] for w in rerun_warnings(pipeline_steps(job, infra))] == ["rerun: archive"]


# --- the smoke stack: the small model, two steps, on whichever infra stack it names --------------------------------


@pytest.mark.parametrize("infra", ["h200", "b200"])
def test_the_smoke_stack_runs_the_small_model_for_two_steps_on_h200_and_b200(infra_outputs, infra):
    run = run_jobs("smoke", infra_outputs, infra=infra)
    steps = {s["step"]: s for s in run.outputs["pipeline"]}
    assert list(steps) == [
        "preflight-nccl", "preflight-lustre", "prepare-data", "prefetch-weights", "eval-base", "train",
        "convert-hf", "export-gcs", "eval-final",
    ]  # fmt: skip
    words = shlex.split(steps["train"]["entrypoint"])
    recipe = "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml"
    assert f"--config={recipe}" in words
    for override in (
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=8",
        "grpo.max_num_steps=2",
        "policy.train_global_batch_size=64",
        "policy.generation.colocated.enabled=True",
        "policy.generation.vllm_cfg.tensor_parallel_size=1",
        "policy.dtensor_cfg.tensor_parallel_size=1",
        "checkpointing.checkpoint_dir=/data/smoke-qwen-1p5b-2steps",
    ):
        assert override in words, override
    assert f"--address={infra_outputs[infra]['rayAddress']}" in words
    assert run.outputs["modelUri"] == f"gs://{infra_outputs[infra]['exportBucket']}/smoke-qwen-1p5b-2steps/"
    assert run.outputs["estimatedRun"]["nodes"] == 1 and run.outputs["estimatedRun"]["steps"] == 2
    # It fits the infra: one of its GPU nodes, every GPU of it trains (colocated), 64 samples over 8 ranks.
    project, config = load_stack_config(JOBS, "smoke")
    values = {key.removeprefix(f"{project}:"): value for key, value in config.items()}
    infra_settings = infra_of(infra_outputs[infra])
    job = build_job_settings({**values, "infraStack": f"organization/nemo-rl-gke/{infra}"}, infra_settings)
    assert job.num_nodes <= infra_settings.ray_worker_replicas and infra_settings.gpus_per_node == 8
    assert job.train_global_batch_size % (job.num_nodes * infra_settings.gpus_per_node) == 0
    # Built from the dev stack's run, one step shorter under its own run name (a run directory of its own).
    _, dev = load_stack_config(JOBS, "dev")
    same = {k: v for k, v in dev.items() if k.rpartition(":")[2] not in ("infraStack", "runName", "maxNumSteps")}
    assert {k: config[k] for k in same} == same
    assert config["nemo-rl-jobs:runName"] != dev["nemo-rl-jobs:runName"]


def test_the_smoke_recipe_exists_at_both_releases():
    _, config = load_stack_config(JOBS, "smoke")
    for release in ("nemo-rl-v0.5.0", "nemo-rl-v0.7.0"):
        assert (reference(release) / config["nemo-rl-jobs:recipe"]).is_file(), release
