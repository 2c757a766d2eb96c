"""The train step's overrides as NeMo RL itself takes them, for every supported release: each stack's recipe is
loaded with that release's own loader (nemo_rl/utils/config.py from ../shared/reference/nemo-rl-<tag>, in
.venv-nemorl) and every override the pipeline generates for that release is applied the way its GRPO entrypoint
applies them (strict: an unknown key is an error), then the resolved config is checked: what the run will really
train with."""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

import pytest
import upstream
from config_rules import ConfigError
from conftest import ROOT, shared_infra_run
from launcher.infra_outputs import FLAT_DATA, InfraOutputs, build_infra_outputs
from launcher.job_settings import JobSettings, build_job_settings
from launcher.overrides import recipe_notes
from launcher.steps import entrypoint_text, pipeline_steps
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
        net = net.model_copy(update={"secret_keys": secret_keys})
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


QWEN3_32B = "examples/configs/recipes/llm/performance/grpo-qwen3-32b-4n8g.yaml"
LLAMA_8B = "examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml"
MEGATRON_RUN = {"convertToHf": False, "evalFinal": False, "numPromptsPerStep": 64, "numGenerationsPerPrompt": 32}
# (recipe, job config changes, the Megatron TP x PP x CP the run trains with): NeMo RL's performance recipes as a
# training run's recipe, their own sizes or sizes an extraOverride changes.
MEGATRON_CASES = [
    (QWEN3_32B, {"numNodes": 4, "generationNodes": 0, "vllmTensorParallelSize": 4}, (4, 4, 1)),
    (QWEN3_32B, {"numNodes": 4, "generationNodes": 2, "vllmTensorParallelSize": 4}, (4, 4, 1)),
    (
        QWEN3_32B,
        {"numNodes": 4, "generationNodes": 0, "vllmTensorParallelSize": 4,
         "extraOverrides": ["policy.megatron_cfg.tensor_model_parallel_size=8"]},
        (8, 4, 1),
    ),
    (LLAMA_8B, {"numNodes": 2, "generationNodes": 0, "vllmTensorParallelSize": 1}, (1, 2, 1)),
]  # fmt: skip


def megatron_data_parallel_size(config: dict[str, Any]) -> int:
    """Megatron's data-parallel size from the resolved config: the training GPUs over TP x PP x CP."""
    policy, cluster = config["policy"], config["cluster"]
    megatron = policy["megatron_cfg"]
    colocated = policy["generation"]["colocated"]
    nodes = cluster["num_nodes"] - (0 if colocated["enabled"] else colocated["resources"]["num_nodes"])
    sizes = (
        megatron["tensor_model_parallel_size"]
        * megatron["pipeline_model_parallel_size"]
        * megatron["context_parallel_size"]
    )
    assert (nodes * cluster["gpus_per_node"]) % sizes == 0
    return nodes * cluster["gpus_per_node"] // sizes


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("recipe", "changes", "sizes"), MEGATRON_CASES)
def test_a_megatron_recipe_trains_with_its_megatron_sizes(infra, release, recipe, changes, sizes):
    """The performance recipes train with Megatron: the run keeps their backend and sizes (no DTensor override),
    and the batch check uses Megatron's data-parallel size, the one NeMo RL shards the batch over."""
    net = infra[release]["h200"].model_copy(update={"ray_worker_replicas": 4})
    job = build_job_settings(stack_values("h200", recipe=recipe, **MEGATRON_RUN, **changes), net)
    assert (job.training_backend, job.training_parallel) == ("megatron", sizes)
    words = entry_args(job, net)
    assert not any(word.startswith("policy.dtensor_cfg.") for word in words)
    config = resolve(job, net)
    policy = config["policy"]
    assert policy["megatron_cfg"]["enabled"] is True and policy["dtensor_cfg"]["enabled"] is False
    megatron = policy["megatron_cfg"]
    assert (
        megatron["tensor_model_parallel_size"],
        megatron["pipeline_model_parallel_size"],
        megatron["context_parallel_size"],
    ) == sizes
    samples = job.train_global_batch_size
    assert policy["train_global_batch_size"] == samples
    assert samples % megatron_data_parallel_size(config) == 0
    assert (config["cluster"]["num_nodes"], config["cluster"]["gpus_per_node"]) == (job.num_nodes, 8)


def test_megatron_recipe_settings_that_would_be_ignored_or_cannot_train_are_refused(infra):
    net = infra[RELEASES[0]]["h200"].model_copy(update={"ray_worker_replicas": 4})
    run = {"recipe": QWEN3_32B, **MEGATRON_RUN, "numNodes": 4, "generationNodes": 0, "vllmTensorParallelSize": 4}
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size \(4 in the recipe\)") as error:
        build_job_settings(stack_values("h200", **{**run, "dtensorTensorParallelSize": 4}), net)
    assert error.value.key == "dtensorTensorParallelSize"
    with pytest.raises(ConfigError, match=r"Megatron TP x PP x CP \(4 x 4 x 1 = 16") as error:
        build_job_settings(stack_values("h200", **{**run, "numNodes": 3}), net)
    assert error.value.key == "numNodes"
    with pytest.raises(ConfigError, match=r"2 data-parallel ranks \(32 training GPUs / the recipe's Megatron"):
        build_job_settings(stack_values("h200", **{**run, "numPromptsPerStep": 1, "numGenerationsPerPrompt": 1}), net)
    with pytest.raises(ConfigError, match="converts DTensor checkpoints only") as error:
        build_job_settings(stack_values("h200", **{**run, "convertToHf": True, "evalFinal": True}), net)
    assert error.value.key == "convertToHf"
    # NVIDIA's Qwen3 recipes save no checkpoints: the plan says a retry would start again, and how to resume.
    job = build_job_settings(stack_values("h200", **run), net)
    (note,) = recipe_notes(job, net)
    assert "checkpointing.enabled false" in note and "checkpointing.enabled=true" in note
    on = build_job_settings(stack_values("h200", **run, extraOverrides=["checkpointing.enabled=true"]), net)
    assert recipe_notes(on, net) == [] and resolve(on, net)["checkpointing"]["enabled"] is True
    # Any other recipe is DTensor's, as before.
    job = build_job_settings(stack_values("h200"), infra[RELEASES[0]]["h200"])
    assert (job.training_backend, job.training_parallel) == ("dtensor", (8, 1, 1))


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
