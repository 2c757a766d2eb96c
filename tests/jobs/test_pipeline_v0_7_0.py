"""The pipeline on NeMo RL v0.7.0 (`nemoRlImage: nvcr.io/nvidia/nemo-rl:v0.7.0`): the same task as on v0.5.0 once
both releases' loaders have resolved it, v0.5.0's data overrides refused by v0.7.0, the release row as the job stack
reads it, and the whole plan of both programs. (Every stack and variant resolving strictly with v0.7.0's own loader
is in test_nemo_rl_loader.py, parametrized by release.)"""

from __future__ import annotations

from typing import Any

import pytest
from config_rules import ConfigError
from conftest import run_infra_stack, shared_infra_run
from launcher.infra_outputs import build_infra_outputs
from launcher.job_settings import build_job_settings
from test_nemo_rl_loader import entry_args, resolve, stack_values
from upstream import NemoRlRefusedError, reference, resolve_with_nemo_rl

from tools.plan_run import run_plan

V070_IMAGE = "nvcr.io/nvidia/nemo-rl:v0.7.0"
STACKS = ("dev", "h200", "b200")


@pytest.fixture(scope="module")
def outputs() -> dict[str, dict[str, dict[str, Any]]]:
    """Each infra stack file's real outputs, as it is ("v0.5.0") and with the v0.7.0 image ("v0.7.0")."""
    return {
        "v0.5.0": {stack: shared_infra_run(stack).outputs for stack in STACKS},
        "v0.7.0": {stack: shared_infra_run(stack, {"nemoRlImage": V070_IMAGE}).outputs for stack in STACKS},
    }


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
    v050_words = entry_args(build_job_settings(stack_values("dev"), infra), infra)
    with pytest.raises(NemoRlRefusedError, match=r"data\.dataset_name"):
        resolve_with_nemo_rl(reference("nemo-rl-v0.7.0"), v050_words)


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
        (
            {
                "tag": "v0.7.0",
                "grpoEntrypoint": "examples/run_grpo.py",
                "dataLayout": "per-split",
                "logprobBatchCheckFromTp": "4",
            },
            "tensor-parallel size",
        ),
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
    # After the checkpoint guard (issue 12), the release's entrypoint.
    assert " && cd /opt/nemo-rl && uv run python examples/run_grpo.py --config=" in train["entrypoint"]
    assert "run_grpo_math.py" not in train["entrypoint"]
    assert "+data.train.data_path=/data/datasets/gsm8k/train.jsonl" in train["entrypoint"]
    assert "+data.validation.data_path=/data/datasets/gsm8k/test.jsonl" in train["entrypoint"]
    # h200 trains with DTensor TP 8: v0.7.0's policy needs the logprob batch equal to the micro batch.
    assert "'policy.logprob_batch_size=${policy.train_micro_batch_size}'" in train["entrypoint"]
    assert not any("run_grpo_math" in step["entrypoint"] for step in plan.jobs.outputs["pipeline"])
    script = plan.jobs.one("kubernetes:core/v1:ConfigMap", "pipeline-scripts").inputs["data"]["pipeline.sh"]
    assert "examples/run_grpo.py" in script and "run_grpo_math" not in script
