"""The performance-recipe table (jobs/launcher/performance.py) against the recipes themselves: every recipe of each
release's examples/configs/recipes/llm/performance/ folder, resolved by that release's own loader, has its row, and
every field of the row is what the loader resolves."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from launcher import performance, step_times
from test_step_times import summary_rows
from upstream import reference, resolve_with_nemo_rl

RELEASES = ("v0.5.0", "v0.7.0")


@functools.cache  # both tests read the same recipes
def resolved(release: str, name: str) -> dict[str, Any]:
    return resolve_with_nemo_rl(
        reference(f"nemo-rl-{release}"), [f"--config={performance.PERFORMANCE_DIR}/{name}.yaml"]
    )


def row_of(config: dict[str, Any], name: str, release: str) -> performance.PerformanceRecipe:
    """The table's row as the resolved config gives it."""
    policy, cluster, grpo = config["policy"], config["cluster"], config["grpo"]
    megatron = policy["megatron_cfg"]
    assert megatron["enabled"] and not policy["dtensor_cfg"]["enabled"], name  # every one trains with Megatron
    colocated = policy["generation"]["colocated"]
    age = grpo["async_grpo"]["max_trajectory_age_steps"] if grpo.get("async_grpo", {}).get("enabled") else 0
    data = config["data"]
    dataset = data.get("dataset_name") or data["train"]["dataset_name"]
    return performance.PerformanceRecipe(
        name=name,
        releases=(release,),
        num_nodes=cluster["num_nodes"],
        gpus_per_node=cluster["gpus_per_node"],
        generation_nodes=0 if colocated["enabled"] else colocated["resources"]["num_nodes"],
        parallel=(
            megatron["tensor_model_parallel_size"],
            megatron["pipeline_model_parallel_size"],
            megatron["context_parallel_size"],
        ),
        max_trajectory_age_steps=age,
        fp8=bool((megatron.get("fp8_cfg") or {}).get("enabled")),
        samples=(grpo["num_prompts_per_step"], grpo["num_generations_per_prompt"]),
        model=policy["model_name"],
        dataset=dataset,
        checkpointing=config["checkpointing"]["enabled"],
    )


@pytest.mark.parametrize("release", RELEASES)
def test_every_recipe_of_the_folder_has_its_row_with_the_loaders_values(release: str):
    folder = reference(f"nemo-rl-{release}") / performance.PERFORMANCE_DIR
    on_disk = sorted(path.name.removesuffix(".yaml") for path in folder.glob("*.yaml"))
    table = performance.recipes_of(release)
    assert sorted(table) == on_disk
    for name, row in table.items():
        theirs = row_of(resolved(release, name), name, release)
        assert row == theirs.__class__(**{**theirs.__dict__, "releases": row.releases}), name
        assert row.training_gpus % row.model_parallel == 0, name  # Megatron's data-parallel size is whole
    # A name is one row per release.
    names = [r.name for r in performance.PERFORMANCE_RECIPES if release in r.releases]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("release", RELEASES)
def test_each_published_rows_recipe_trains_the_tables_sequence_length(release: str):
    """The summary's T-Max Sequence Length is the recipe's policy.max_total_sequence_length: what tells apart two
    recipes of the same model, mode and GPUs (v0.7.0's grpo-qwen3-30ba3b-4n8g and its -40K variant)."""
    t_max = {(row[2], row[3], row[4], row[5], row[6], row[7]): row[10] for row in summary_rows(release)}
    for row in (r for r in step_times.PUBLISHED if r.release == release):
        config = resolved(release, row.recipe)
        key = (row.algorithm, row.model, row.mode, row.precision, row.gpus, row.system)
        assert config["policy"]["max_total_sequence_length"] == t_max[key], row.recipe


def test_lookups_take_a_name_a_file_name_or_the_path():
    qwen = performance.find("v0.5.0", "grpo-qwen3-32b-4n8g")
    assert qwen is not None and (qwen.num_nodes, qwen.gpus_per_node, qwen.generation_nodes) == (4, 8, 0)
    assert qwen.data_parallel == 2 and qwen.mode == "on-policy, BF16" and qwen.hub_model
    assert performance.find("v0.5.0", "grpo-qwen3-32b-4n8g.yaml") == qwen
    assert performance.find("v0.5.0", qwen.path) == performance.find_by_path("v0.5.0", qwen.path) == qwen
    assert performance.find("v0.5.0", "grpo-qwen3-30ba3b-4n8g-40K") is None  # v0.7.0's only
    assert performance.find("v0.5.0", "../grpo-qwen3-32b-4n8g") is None
    assert performance.find_by_path("v0.5.0", "examples/configs/recipes/llm/grpo-qwen3-32b-4n8g.yaml") is None
    deepseek = performance.find("v0.7.0", "grpo-deepseek-v3-32n8g")
    assert deepseek is not None and not deepseek.hub_model  # NVIDIA's guide converts a checkpoint first
