"""The pipeline on NeMo RL v0.7.0 (`nemoRlImage: nvcr.io/nvidia/nemo-rl:v0.7.0`): the train step's overrides for
every stack and variant resolved by v0.7.0's own loader (nemo_rl/utils/config.py from ../shared/reference, in
.venv-nemorl, strict as examples/run_grpo.py is), the same task as on v0.5.0, and the whole plan of both programs."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from conftest import ROOT, run_infra_stack
from launcher.pipeline import entrypoint_text, pipeline_steps
from launcher.settings import ConfigError, InfraOutputs, JobSettings, build_infra_outputs, build_job_settings
from script_loader import load_script
from upstream import NemoRlRefusedError, reference, resolve_with_nemo_rl

from tools.offline import load_stack_config
from tools.plan import run_plan

V070_IMAGE = "nvcr.io/nvidia/nemo-rl:v0.7.0"
STACKS = ("dev", "h200", "b200")
PREPARE = load_script("jobs/scripts/prepare_gsm8k.py", "prepare_gsm8k")


@pytest.fixture(scope="module")
def outputs() -> dict[str, dict[str, dict[str, Any]]]:
    """Each infra stack file's real outputs, as it is ("v0.5.0") and with the v0.7.0 image ("v0.7.0")."""
    return {
        "v0.5.0": {stack: run_infra_stack(stack).outputs for stack in STACKS},
        "v0.7.0": {stack: run_infra_stack(stack, {"nemoRlImage": V070_IMAGE}).outputs for stack in STACKS},
    }


def stack_values(stack: str, **changes: Any) -> dict[str, Any]:
    """A job stack file's config (with jobs/Pulumi.yaml's defaults), as build_job_settings reads it."""
    project, config = load_stack_config(ROOT / "jobs", stack)
    values = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{project}:")}
    return {**values, **changes}


def train_words(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """The train step's command as bash splits it on the Ray head."""
    train = next(step for step in pipeline_steps(job, infra) if step.name == "train")
    return shlex.split(entrypoint_text(train))


def resolve(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    """The config the release's entrypoint trains with, resolved by that release's loader."""
    words = train_words(job, infra)
    entrypoint = infra.nemo_rl_release.grpo_entrypoint
    return resolve_with_nemo_rl(reference(f"nemo-rl-{infra.nemo_rl_release.tag}"), words[words.index(entrypoint) + 1 :])


# Every stack file, plus the variants the overrides branch on: colocated generation on a two-node stack, and W&B.
CASES = [
    *[(stack, {}, ()) for stack in STACKS],
    ("h200", {"generationNodes": 0}, ()),
    ("b200", {}, ("HF_TOKEN", "WANDB_API_KEY")),
]


@pytest.mark.parametrize(("stack", "changes", "secret_keys"), CASES, ids=lambda v: str(v) if v else "-")
def test_train_step_resolves_with_v0_7_0s_loader(outputs, stack, changes, secret_keys) -> None:
    raw = outputs["v0.7.0"][stack]
    infra = build_infra_outputs({**raw, "secretKeys": list(secret_keys)} if secret_keys else raw)
    job = build_job_settings(stack_values(stack, **changes), infra)
    words = train_words(job, infra)
    assert words[:6] == ["cd", "/opt/nemo-rl", "&&", "uv", "run", "python"]
    assert words[6] == "examples/run_grpo.py" and "examples/run_grpo_math.py" not in words

    config = resolve(job, infra)
    assert config["cluster"]["num_nodes"] == job.num_nodes
    assert config["cluster"]["gpus_per_node"] == infra.gpus_per_node
    assert config["grpo"]["max_num_steps"] == job.max_num_steps
    assert config["grpo"]["num_prompts_per_step"] == job.num_prompts_per_step
    assert config["grpo"]["num_generations_per_prompt"] == job.num_generations_per_prompt
    generation = config["policy"]["generation"]
    assert generation["colocated"]["enabled"] == (job.generation_nodes == 0)
    if job.generation_nodes:
        assert generation["colocated"]["resources"] == {
            "num_nodes": job.generation_nodes,
            "gpus_per_node": infra.gpus_per_node,
        }
    assert generation["vllm_cfg"]["tensor_parallel_size"] == job.vllm_tensor_parallel_size
    assert config["policy"]["dtensor_cfg"]["tensor_parallel_size"] == job.dtensor_tensor_parallel_size
    assert config["checkpointing"]["checkpoint_dir"] == f"{infra.mount_path}/{job.run_name}"
    assert config["logger"]["wandb_enabled"] == bool(secret_keys)
    assert config["logger"]["tensorboard_enabled"] == (not secret_keys)
    if secret_keys:
        assert config["logger"]["wandb"]["name"] == job.run_name

    # Trains on the prepared train.jsonl and validates on GSM8K's test split only: no 5% carved out of training.
    data = config["data"]
    folder = f"{infra.mount_path}/datasets/gsm8k"
    assert data["train"]["dataset_name"] == data["validation"]["dataset_name"] == "ResponseDataset"
    assert data["train"]["data_path"] == f"{folder}/{PREPARE.TRAIN_FILE}"
    assert data["train"]["split_validation_size"] == 0
    assert data["validation"]["data_path"] == f"{folder}/{PREPARE.TEST_FILE}"
    assert (data["default"]["input_key"], data["default"]["output_key"]) == (PREPARE.INPUT_KEY, PREPARE.OUTPUT_KEY)


# The keys the pipeline sets outside `data`: equal on both releases.
OURS = {
    "grpo": ("max_num_steps", "num_prompts_per_step", "num_generations_per_prompt"),
    "cluster": ("num_nodes", "gpus_per_node"),
    "checkpointing": ("checkpoint_dir",),
}


@pytest.mark.parametrize("stack", STACKS)
def test_v0_7_0_runs_the_same_task_as_v0_5_0(outputs, stack) -> None:
    """Same files, keys, prompt, processor and reward environment on both releases: only the layout differs."""
    resolved = {}
    for release in ("v0.5.0", "v0.7.0"):
        infra = build_infra_outputs(outputs[release][stack])
        resolved[release] = resolve(build_job_settings(stack_values(stack), infra), infra)
    old, new = resolved["v0.5.0"]["data"], resolved["v0.7.0"]["data"]
    # Each ResponseDataset of v0.7.0 gets data.default's keys (setup_response_data fills them in).
    for split, path_key in (("train", "train_data_path"), ("validation", "val_data_path")):
        merged = {**new["default"], **new[split]}
        assert merged["data_path"] == old[path_key]
        for key in ("input_key", "output_key", "prompt_file", "system_prompt_file", "processor", "env_name"):
            assert merged[key] == old[key], key
    assert old["env_name"] == "math" and old["prompt_file"] == "examples/prompts/cot.txt"
    # What the pipeline sets elsewhere is the same too (the recipes themselves differ between the releases).
    for section, keys in OURS.items():
        for key in keys:
            assert resolved["v0.7.0"][section][key] == resolved["v0.5.0"][section][key], (section, key)


def test_the_flat_data_overrides_are_refused_by_v0_7_0(outputs) -> None:
    """Why the layout is part of the release row: v0.5.0's data overrides do not load on v0.7.0."""
    infra = build_infra_outputs(outputs["v0.5.0"]["dev"])
    words = train_words(build_job_settings(stack_values("dev"), infra), infra)
    with pytest.raises(NemoRlRefusedError, match=r"data\.dataset_name"):
        resolve_with_nemo_rl(reference("nemo-rl-v0.7.0"), words[words.index("examples/run_grpo_math.py") + 1 :])


def test_an_override_v0_7_0_does_not_know_is_refused(outputs) -> None:
    infra = build_infra_outputs(outputs["v0.7.0"]["dev"])
    job = build_job_settings(stack_values("dev", extraOverrides=["data.train_data_path=/x.jsonl"]), infra)
    with pytest.raises(NemoRlRefusedError, match=r"data\.train_data_path"):
        resolve(job, infra)


# --- the release as the job stack reads it -------------------------------------------------------------------------


def test_an_image_of_no_known_release_is_refused_by_the_job_stack(outputs) -> None:
    custom = run_infra_stack("dev", {"nemoRlImage": "nvcr.io/nvidia/nemo-rl:v0.6.0", "rayVersion": "2.54.0"}).outputs
    assert custom["nemoRlRelease"] is None
    with pytest.raises(ConfigError, match=r"nemoRlRelease.*nvcr\.io/nvidia/nemo-rl:v0\.6\.0.*NeMo RL versions"):
        build_infra_outputs(custom)


@pytest.mark.parametrize(
    ("release", "fragment"),
    [
        ({"tag": "v0.7.0", "grpoEntrypoint": "examples/run_grpo.py"}, "dataLayout"),
        ({"tag": "v0.7.0", "grpoEntrypoint": "examples/run_grpo.py", "dataLayout": "nested"}, "flat"),
        ({"tag": "v0.7.0", "grpoEntrypoint": "../run.py", "dataLayout": "per-split"}, "under examples/"),
        ("v0.7.0", "an object"),
    ],
)
def test_a_malformed_release_output_is_refused(outputs, release, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        build_infra_outputs({**outputs["v0.7.0"]["dev"], "nemoRlRelease": release})


# --- the whole plan ------------------------------------------------------------------------------------------------


def test_plan_of_a_stack_on_v0_7_0() -> None:
    plan = run_plan("h200", infra_overrides=[f"nemoRlImage={V070_IMAGE}"])
    values = plan.infra.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    assert values["head"]["rayVersion"] == plan.infra.outputs["rayVersion"] == "2.55.1"
    assert values["image"]["tag"] == "v0.7.0"
    # The submitter runs in the same image, so its `ray` CLI is the cluster's Ray.
    pod = plan.jobs.one("kubernetes:batch/v1:Job").inputs["spec"]["template"]["spec"]
    assert [container["image"] for container in pod["containers"]] == [V070_IMAGE]
    train = next(step for step in plan.jobs.outputs["pipeline"] if step["step"] == "train")
    assert train["entrypoint"].startswith("cd /opt/nemo-rl && uv run python examples/run_grpo.py --config=")
    assert "+data.train.data_path=/data/datasets/gsm8k/train.jsonl" in train["entrypoint"]
    assert "+data.validation.data_path=/data/datasets/gsm8k/test.jsonl" in train["entrypoint"]
    assert not any("run_grpo_math" in step["entrypoint"] for step in plan.jobs.outputs["pipeline"])
    script = plan.jobs.one("kubernetes:core/v1:ConfigMap").inputs["data"]["pipeline.sh"]
    assert "examples/run_grpo.py" in script and "run_grpo_math" not in script
