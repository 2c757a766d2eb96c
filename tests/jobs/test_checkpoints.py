"""Lustre at scale: the checkpoints a run keeps, its weights and its converted model must fit the infra's Managed
Lustre (a DeepSeek V3 checkpoint is over a terabyte), refused with the key and the sizes before anything is
registered; a checkpoint that takes long to write at the instance's throughput is said in the plan."""

from __future__ import annotations

import re
from typing import Any

import pytest
from config_rules import ConfigError
from conftest import shared_infra_run
from launcher import checkpoints, performance
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job_settings import build_job_settings
from upstream import reference, resolve_with_nemo_rl

DEEPSEEK = "examples/configs/recipes/llm/performance/grpo-deepseek-v3-32n8g.yaml"
QWEN = "examples/configs/recipes/llm/performance/grpo-qwen3-235b-32n8g-async-1off.yaml"


@pytest.fixture(scope="module")
def infra32() -> InfraOutputs:
    """The h200 infra's outputs with 32 GPU workers and its 18,000 GiB of Lustre at 500 MB/s per TiB."""
    outputs = dict(shared_infra_run("h200").outputs)
    outputs.update(rayWorkerReplicas=32, gpuNodes=32)
    return build_infra_outputs(outputs)


def settings(infra: InfraOutputs, **values: Any) -> Any:
    base = {
        "infraStack": "organization/nemo-rl-gke/h200",
        "numNodes": 32,
        "generationNodes": 16,
        "numPromptsPerStep": 32,
        "numGenerationsPerPrompt": 16,
        # The performance recipes train with Megatron, whose checkpoints the conversion step cannot convert (and
        # evalFinal evaluates the converted model).
        "convertToHf": False,
        "evalFinal": False,
    }
    return build_job_settings({**base, **values}, infra)


def test_a_deepseek_v3_checkpoint_is_over_a_terabyte():
    need = checkpoints.lustre_need("unsloth/DeepSeek-V3-0324-BF16", 500, [], convert_to_hf=True)
    assert need is not None
    assert need.checkpoint_bytes == 671e9 * 14  # 9.4 TB
    assert need.checkpoints_at_once == checkpoints.DEFAULT_KEEP_TOP_K + 1  # 50 saves, keep_top_k 3, one being written
    assert need.weights_bytes == 671e9 * 2 * 2  # HF weights and the converted model
    assert checkpoints.lustre_need("some/unknown-model", 500, [], True) is None  # unknown stays unknown


def test_checkpoints_kept_follow_steps_and_overrides():
    need = checkpoints.lustre_need("Qwen/Qwen3-235B-A22B", 10, [], convert_to_hf=False)
    assert need and need.checkpoints_at_once == 1  # one save in 10 steps
    need = checkpoints.lustre_need("Qwen/Qwen3-235B-A22B", 100, ["checkpointing.keep_top_k=1"], False)
    assert need and need.checkpoints_at_once == 2
    need = checkpoints.lustre_need("Qwen/Qwen3-235B-A22B", 100, ["checkpointing.save_period=50"], False)
    assert need and need.checkpoints_at_once == 2


def test_a_run_whose_checkpoints_overflow_lustre_is_refused(infra32: InfraOutputs):
    assert infra32.lustre_capacity_gib == 18_000
    with pytest.raises(ConfigError) as caught:
        settings(infra32, recipe=DEEPSEEK, maxNumSteps=500)
    error = caught.value
    assert error.key == "recipe" and error.value == DEEPSEEK
    message = str(error)
    for fragment in ("18000 GiB", "lustre.capacityGib", "671B parameters", "9.4 TB", "4 checkpoint(s)", "keep_top_k"):
        assert fragment in message, fragment
    # Ten steps keep one checkpoint: it fits (without the evaluations, which cannot load it on one node).
    no_eval = {"evalBase": False, "evalFinal": False}
    assert settings(infra32, recipe=DEEPSEEK, maxNumSteps=10, **no_eval).num_nodes == 32
    # Fewer kept checkpoints fit too.
    keep_none = ["checkpointing.keep_top_k=0"]
    settings(infra32, recipe=DEEPSEEK, maxNumSteps=500, convertToHf=False, extraOverrides=keep_none, **no_eval)


def test_a_slow_checkpoint_is_said_with_the_throughput(infra32: InfraOutputs):
    need = checkpoints.lustre_need("unsloth/DeepSeek-V3-0324-BF16", 10, [], True)
    note = checkpoints.checkpoint_write_note(need, 18_000, 500)
    assert note and "9.4 TB" in note and "8.8 GB/s" in note and "18 min" in note
    # The same checkpoint on twice the capacity writes twice as fast; a small model says nothing.
    assert need and need.checkpoint_minutes(36_000, 500) == pytest.approx(need.checkpoint_minutes(18_000, 500) / 2)
    small = checkpoints.lustre_need("google/gemma-3-27b-it", 10, [], True)
    assert checkpoints.checkpoint_write_note(small, 18_000, 500) is None


def test_recipe_models_are_what_the_recipes_train():
    """The shipped recipes' models against each release's own loader (the performance recipes' rows are held to it in
    test_performance_recipes.py); every model named has a size with its source."""
    for release in ("nemo-rl-v0.5.0", "nemo-rl-v0.7.0"):
        for recipe, model in checkpoints.RECIPE_MODELS.items():
            resolved = resolve_with_nemo_rl(reference(release), [f"--config={recipe}"])
            assert resolved["policy"]["model_name"] == model, (release, recipe)
            assert checkpoints.model_of("", recipe, release.removeprefix("nemo-rl-")) == model
    assert set(checkpoints.RECIPE_MODELS.values()) <= set(checkpoints.MODEL_SIZES)
    for size in checkpoints.MODEL_SIZES.values():
        assert re.match(r"(published|estimate): \S", size.source), size


def test_a_performance_recipes_model_is_its_releases_row():
    """The job setting model first; else the performance table's model for the image's release, none where that
    release's recipe names no hub model (v0.7.0's DeepSeek recipes point to NeMo RL's guide)."""
    deepseek = "examples/configs/recipes/llm/performance/grpo-deepseek-v3-32n8g.yaml"
    assert checkpoints.model_of("", deepseek, "v0.5.0") == "unsloth/DeepSeek-V3-0324-BF16"
    assert checkpoints.model_of("", deepseek, "v0.7.0") == ""
    assert checkpoints.model_of("my-org/my-model", deepseek, "v0.7.0") == "my-org/my-model"
    qwen = "examples/configs/recipes/llm/performance/grpo-qwen3-30ba3b-4n4g.yaml"
    assert checkpoints.model_of("", qwen, "v0.7.0") == "Qwen/Qwen3-30B-A3B" == performance.QWEN3_30B
    assert checkpoints.model_of("", "examples/configs/recipes/llm/some-other.yaml", "v0.5.0") == ""


def test_an_evaluation_that_cannot_load_the_model_on_one_node_is_refused(infra32: InfraOutputs):
    """Evaluations run on one GPU node: DeepSeek V3's 1.3 TB of bf16 weights do not fit eight H200s (1,015 GB at
    vLLM's 0.9), Qwen3-235B's 470 GB do."""
    problem = checkpoints.eval_fit_problem("unsloth/DeepSeek-V3-0324-BF16", "nvidia-h200-141gb", 8)
    assert problem and "1,342 GB" in problem and "1,015 GB" in problem
    assert checkpoints.eval_fit_problem("Qwen/Qwen3-235B-A22B", "nvidia-h200-141gb", 8) is None
    assert checkpoints.eval_fit_problem("unknown/model", "nvidia-h200-141gb", 8) is None
    with pytest.raises(ConfigError) as caught:
        settings(infra32, recipe=DEEPSEEK, maxNumSteps=10, evalBase=True, evalFinal=False)
    assert caught.value.key == "evalBase" and "one GPU node" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        settings(infra32, recipe=DEEPSEEK, maxNumSteps=10, evalBase=False, evalFinal=True)
    assert caught.value.key == "evalFinal"
    assert settings(infra32, recipe=DEEPSEEK, maxNumSteps=10, evalBase=False, evalFinal=False).recipe == DEEPSEEK


def test_the_run_estimate_counts_the_runs_32_nodes(infra32: InfraOutputs):
    from launcher.cost import run_estimate

    job = settings(infra32, recipe=QWEN, asyncGrpo=True, maxNumSteps=10, secondsPerStep="200")
    run = run_estimate(job, infra32)
    assert run["nodes"] == 32
    assert run["stepGpuHours"] == pytest.approx(32 * 8 * 10 * 200 / 3600, abs=0.01)
    assert run["evalGpuHours"] == pytest.approx(32 * 8 * run["evalMinutes"] / 60, abs=0.01)  # the others wait
