"""The train step's overrides as NeMo RL itself takes them, for every supported release: each stack's recipe is
loaded with that release's own loader (nemo_rl/utils/config.py from ../shared/reference/nemo-rl-<tag>, in
.venv-nemorl) and every override the pipeline generates for that release is applied the way its GRPO entrypoint
applies them (strict: an unknown key is an error), then the resolved config is checked: what the run will really
train with."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import replace
from typing import Any

import pytest
import upstream
from conftest import ROOT, shared_infra_run
from launcher.pipeline import entrypoint_text, pipeline_steps
from launcher.settings import FLAT_DATA, InfraOutputs, JobSettings, build_infra_outputs, build_job_settings
from script_loader import load_script
from upstream import NemoRlRefusedError, reference, resolve_with_nemo_rl

from infra.nemo_rl_releases import NEMO_RL_RELEASES
from tools.offline import load_stack_config

STACKS = ("dev", "h200", "b200")
RELEASES = tuple(NEMO_RL_RELEASES)


@pytest.fixture(scope="module")
def infra() -> dict[str, dict[str, InfraOutputs]]:
    """Each infra stack file's real outputs, per release: the stack file's own image (v0.5.0), or the release's."""
    return {
        release: {
            stack: build_infra_outputs(
                shared_infra_run(stack, {"nemoRlImage": f"nvcr.io/nvidia/nemo-rl:{release}"}).outputs
            )
            for stack in STACKS
        }
        for release in RELEASES
    }


def stack_values(stack: str, **changes: Any) -> dict[str, Any]:
    """A job stack file's config (with jobs/Pulumi.yaml's defaults), as build_job_settings reads it."""
    project, config = load_stack_config(ROOT / "jobs", stack)
    values = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{project}:")}
    return {**values, **changes}


def entry_args(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """The words the train step passes to NeMo RL's entrypoint, as bash will split them on the Ray head."""
    train = next(step for step in pipeline_steps(job, infra) if step.name == "train")
    words = shlex.split(entrypoint_text(train))
    return words[words.index(infra.nemo_rl_release.grpo_entrypoint) + 1 :]


def resolve(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    """The config the release's GRPO entrypoint trains with, resolved by that release's loader."""
    return resolve_with_nemo_rl(reference(f"nemo-rl-{infra.nemo_rl_release.tag}"), entry_args(job, infra))


WITH_WANDB = ("HF_TOKEN", "WANDB_API_KEY")
OWN_DATASET = {"source": "gs://my-bucket/math/rows.jsonl", "problemField": "question", "answerField": "final"}

# (stack, job config changes, infra secret keys or None for the stack's own): each stack's default run, then
# variants that move what the pipeline derives (batch size, colocation, parallelism, logging).
Case = tuple[str, dict[str, Any], tuple[str, ...] | None]
CASES: list[Case] = [
    ("dev", {}, None),
    ("h200", {}, None),
    ("b200", {}, None),
    ("h200", {}, WITH_WANDB),
    ("h200", {"numPromptsPerStep": 4, "numGenerationsPerPrompt": 8}, None),
    ("h200", {"numPromptsPerStep": 64, "numGenerationsPerPrompt": 16}, WITH_WANDB),
    ("h200", {"generationNodes": 0}, None),
    ("h200", {"generationNodes": 0, "vllmGpuMemoryUtilization": "0.5"}, None),
    ("h200", {"dtensorTensorParallelSize": 4, "vllmTensorParallelSize": 4}, None),
    ("dev", {"dtensorTensorParallelSize": 2, "numPromptsPerStep": 16, "numGenerationsPerPrompt": 4}, None),
    ("dev", {"vllmTensorParallelSize": 8, "dtensorTensorParallelSize": 8}, WITH_WANDB),
    # The job settings model and dataset: another model (and its tokenizer) and the user's prepared rows.
    ("dev", {"model": "Qwen/Qwen2.5-Math-7B-Instruct"}, None),
    ("h200", {"model": "google/gemma-3-12b-it", "dataset": OWN_DATASET}, None),
]


def training_data_parallel_size(config: dict[str, Any]) -> int:
    """The data-parallel size NeMo RL trains with, from the resolved config: the training GPUs (all of them when
    generation is colocated, else those left after the generation nodes; algorithms/grpo.py setup) over TP x CP of
    the DTensor policy (models/policy/lm_policy.py; the same computation in v0.5.0 and v0.7.0)."""
    policy, cluster = config["policy"], config["cluster"]
    assert policy["dtensor_cfg"]["enabled"] and not policy.get("megatron_cfg", {}).get("enabled", False)
    colocated = policy["generation"]["colocated"]
    nodes = cluster["num_nodes"]
    if not colocated["enabled"]:
        nodes -= colocated["resources"]["num_nodes"]
    model_parallel = policy["dtensor_cfg"]["tensor_parallel_size"] * policy["dtensor_cfg"]["context_parallel_size"]
    assert (nodes * cluster["gpus_per_node"]) % model_parallel == 0
    return nodes * cluster["gpus_per_node"] // model_parallel


def case_id(case: Case) -> str:
    stack, changes, secret_keys = case
    shown = [f"{k}={v}" if k != "dataset" else "dataset" for k, v in changes.items()]
    return "-".join([stack, *shown, "wandb" if secret_keys else "tensorboard"])


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("stack", "changes", "secret_keys"), CASES, ids=[case_id(c) for c in CASES])
def test_the_train_step_resolves_with_nemo_rls_loader(infra, release, stack, changes, secret_keys):
    net = infra[release][stack]
    if secret_keys is not None:
        net = replace(net, secret_keys=secret_keys)
    job = build_job_settings(stack_values(stack, **changes), net)
    config = resolve(job, net)

    assert (config["cluster"]["num_nodes"], config["cluster"]["gpus_per_node"]) == (job.num_nodes, net.gpus_per_node)
    grpo, policy = config["grpo"], config["policy"]
    assert grpo["num_prompts_per_step"] == job.num_prompts_per_step
    assert grpo["num_generations_per_prompt"] == job.num_generations_per_prompt
    assert grpo["max_num_steps"] == job.max_num_steps

    # One optimizer step per GRPO step, over every sample, shared evenly by the data-parallel ranks (and, without
    # dynamic batching or sequence packing, cut into whole micro batches on each rank).
    samples = job.num_prompts_per_step * job.num_generations_per_prompt
    assert policy["train_global_batch_size"] == samples
    data_parallel = training_data_parallel_size(config)
    assert samples % data_parallel == 0
    if not policy["dynamic_batching"]["enabled"] and not policy["sequence_packing"]["enabled"]:
        assert (samples // data_parallel) % policy["train_micro_batch_size"] == 0

    generation = policy["generation"]
    assert generation["colocated"]["enabled"] == (job.generation_nodes == 0)
    if job.generation_nodes:
        assert generation["colocated"]["resources"] == {"num_nodes": job.generation_nodes, "gpus_per_node": 8}
    assert generation["vllm_cfg"]["tensor_parallel_size"] == job.vllm_tensor_parallel_size
    assert policy["dtensor_cfg"]["tensor_parallel_size"] == job.dtensor_tensor_parallel_size
    # v0.7.0's policy refuses to start with TP >= 4 unless the logprob batch equals the micro batch
    # (models/policy/lm_policy.py at v0.7.0); the release row carries the threshold.
    check_from_tp = net.nemo_rl_release.logprob_batch_check_from_tp
    if check_from_tp is not None and job.dtensor_tensor_parallel_size >= check_from_tp:
        assert policy["logprob_batch_size"] == policy["train_micro_batch_size"]
    expected_share = changes.get("vllmGpuMemoryUtilization") or (0.9 if job.generation_nodes else 0.6)
    assert generation["vllm_cfg"]["gpu_memory_utilization"] == float(expected_share)

    # Checkpoints, logs and TensorBoard event files live with the run on Lustre, not on the head pod's disk.
    run_dir = f"{net.mount_path}/{job.run_name}"
    assert run_dir.startswith("/data/")
    assert config["checkpointing"]["checkpoint_dir"] == run_dir
    assert config["logger"]["log_dir"] == f"{run_dir}/logs"
    with_wandb = "WANDB_API_KEY" in net.secret_keys
    assert config["logger"]["wandb_enabled"] is with_wandb
    assert config["logger"]["tensorboard_enabled"] is True  # always: the infra's TensorBoard serves the event files
    if with_wandb:
        assert config["logger"]["wandb"]["name"] == job.run_name

    # The model the job setting names (and its tokenizer), else the recipe's own.
    recipe_only = resolve_with_nemo_rl(reference(f"nemo-rl-{net.nemo_rl_release.tag}"), [f"--config={job.recipe}"])
    model = changes.get("model") or recipe_only["policy"]["model_name"]
    assert policy["model_name"] == policy["tokenizer"]["name"] == model
    if "model" in changes:
        assert recipe_only["policy"]["model_name"] != model  # the override changed something

    # Trains on the prepared train.jsonl, validates on its test.jsonl (GSM8K's test split, or the rows held out of the
    # job setting dataset) and nothing else.
    folder = f"{net.mount_path}/datasets/" + (job.dataset.folder if job.dataset else "gsm8k")
    assert (job.dataset is not None) == ("dataset" in changes)
    data = config["data"]
    if net.nemo_rl_release.data_layout == FLAT_DATA:
        assert (data["train_data_path"], data["val_data_path"]) == (f"{folder}/train.jsonl", f"{folder}/test.jsonl")
        assert (data["input_key"], data["output_key"]) == ("input", "output")
    else:
        assert data["train"]["data_path"] == f"{folder}/train.jsonl"
        assert data["train"]["split_validation_size"] == 0  # else 5% of train.jsonl is validated on too
        assert data["validation"]["data_path"] == f"{folder}/test.jsonl"
        assert data["train"]["dataset_name"] == data["validation"]["dataset_name"] == "ResponseDataset"
        assert (data["default"]["input_key"], data["default"]["output_key"]) == ("input", "output")


@pytest.mark.parametrize("release", RELEASES)
def test_prefetch_reads_the_model_the_job_setting_names(infra, release):
    """prefetch-weights takes the train step's own arguments: resolved by the release's loader they name the job
    setting's model, and only it, as model and tokenizer; so it downloads the new model, not the recipe's."""
    prefetch_weights = load_script("jobs/scripts/prefetch_weights.py", "prefetch_weights")
    net = infra[release]["dev"]
    job = build_job_settings(stack_values("dev", model="Qwen/Qwen2.5-Math-7B-Instruct"), net)
    prefetch = next(step for step in pipeline_steps(job, net) if step.name == "prefetch-weights")
    words = shlex.split(entrypoint_text(prefetch))
    assert words[words.index("--") + 1 :] == entry_args(job, net)
    assert prefetch_weights.models_in(resolve(job, net)) == ["Qwen/Qwen2.5-Math-7B-Instruct"]


@pytest.mark.parametrize("release", RELEASES)
def test_an_override_nemo_rl_does_not_know_is_refused(infra, release):
    """The check is strict, as the entrypoint is: a misspelt key fails here, not on the cluster."""
    net = infra[release]["dev"]
    job = build_job_settings(stack_values("dev", extraOverrides=["grpo.max_num_stepz=3"]), net)
    with pytest.raises(NemoRlRefusedError, match=r"grpo\.max_num_stepz"):
        resolve(job, net)


def test_a_missing_reference_skips_with_how_to_get_it_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no upstream reference nemo-rl-v9\.9\.9 .*shared/reference"):
        upstream.reference("nemo-rl-v9.9.9")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run these tests"):
        upstream.reference("nemo-rl-v9.9.9")
    monkeypatch.setattr(upstream, "NEMORL_PYTHON", upstream.ROOT / ".venv-missing" / "bin" / "python")
    with pytest.raises(pytest.fail.Exception, match=r"make \.venv-nemorl/\.installed"):
        upstream.nemo_rl_python()


def test_the_loader_server_answers_each_call_as_the_command_would():
    """resolve_with_nemo_rl asks one tools/nemorl_config.py --serve per test process: for calls of both releases in
    turn (v0.7.0 first: its loader module and resolvers must not stay behind for v0.5.0), a refused override and a
    usage error, each answer is the exit code and output of the same words run as a command of their own."""
    v050, v070 = reference("nemo-rl-v0.5.0"), reference("nemo-rl-v0.7.0")
    calls = [
        ["--nemo-rl", str(v070), "--entrypoint", "run_eval", "--", "generation.temperature=0.5"],
        ["--nemo-rl", str(v050), "--", "--config=examples/configs/grpo_math_1B.yaml", "grpo.num_prompts_per_step=7"],
        ["--nemo-rl", str(v050), "--", "--config=examples/configs/grpo_math_1B.yaml", "grpo.max_num_stepz=3"],
        ["--nemo-rl", str(v070), "--", "--config=examples/configs/grpo_math_1B.yaml", "grpo.num_prompts_per_step=7"],
        ["--nemo-rl", str(v050)],
    ]
    for words in calls:
        served = upstream._LOADER.call(words)
        alone = subprocess.run(
            [str(upstream.nemo_rl_python()), str(upstream.NEMORL_CONFIG), *words],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert [upstream._LOADER.call(words).returncode for words in calls] == [0, 0, 1, 0, 2]
