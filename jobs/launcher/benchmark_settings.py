"""The benchmark's recipes: NeMo RL's performance recipes of the image's release, chosen by the job setting
benchmarkRecipes and refused when the infra cannot hold or run them unchanged."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from config_rules import ConfigError

from launcher import performance
from launcher.infra_outputs import InfraOutputs
from launcher.performance import PerformanceRecipe
from launcher.step_times import Published, published_for


@dataclass(frozen=True)
class BenchmarkRecipe:
    """One performance recipe the benchmark runs, unchanged, on its own cluster shape, and NVIDIA's figure for it."""

    recipe: PerformanceRecipe
    # NVIDIA's figure for the recipe (the image's release's summary first, else the newest other release's for a
    # recipe of that name); None when no summary has one: the log then says the figure is unknown.
    published: Published | None

    @property
    def label(self) -> str:
        """The recipe's file name: its train step is train-<label>, its logs and checkpoints <label>/."""
        return self.recipe.name


# NeMo RL's Llama 3.1 8B performance recipes (2 nodes x 8 GPUs): on-policy, 1-step off-policy, and 1-step off-policy
# in FP8; the benchmark's recipes when the job setting benchmarkRecipes is unset.
DEFAULT_BENCHMARK_RECIPES = (
    "grpo-llama3.1-8b-instruct-2n8g",
    "grpo-llama3.1-8b-instruct-2n8g-async-1off",
    "grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off",
)
# The fewest steps that leave 5 measured steps between the first (start-up) and the last (which validates and saves
# a checkpoint: val_period and save_period are 10 in the recipes' base config).
BENCHMARK_MIN_STEPS, BENCHMARK_MEASURED_STEPS = 7, 5
# Job settings the benchmark has no use for (it runs NVIDIA's recipes as they are): at another value than their
# default they would be ignored (the CLI hands every default over, so only another value is refused).
BENCHMARK_IGNORES = (
    "recipe", "numNodes", "generationNodes", "numPromptsPerStep", "numGenerationsPerPrompt", "vllmTensorParallelSize",
    "vllmGpuMemoryUtilization", "dtensorTensorParallelSize", "asyncGrpo", "maxTrajectoryAgeSteps", "extraOverrides",
    "secondsPerStep", "model", "dataset",
)  # fmt: skip


def benchmark_recipes(given: Sequence[str], infra: InfraOutputs) -> tuple[BenchmarkRecipe, ...]:
    """NVIDIA's performance recipes of the image's release (benchmarkRecipes), as they are, each on its own cluster
    shape, which the infra must hold."""
    release = infra.nemo_rl_release.tag
    available = performance.recipes_of(release)

    def fits(recipe: PerformanceRecipe) -> bool:
        return recipe.gpus_per_node == infra.gpus_per_node and recipe.num_nodes <= infra.ray_worker_replicas

    runnable = [name for name, r in available.items() if fits(r) and r.hub_model and r.dataset == performance.OPEN_MATH]
    infra_shape = (
        f"this infra has {infra.ray_worker_replicas} GPU workers of {infra.gpus_per_node} GPUs (rayWorkerReplicas, "
        f"gpusPerNode); the recipes that fit it: {', '.join(runnable) or 'none'}"
    )
    chosen: list[BenchmarkRecipe] = []
    for name in map(performance.recipe_name, given):
        recipe = available.get(name)
        if recipe is None:
            match = difflib.get_close_matches(name, list(available), n=1)
            hint = f"did you mean '{match[0]}'? " if match else ""
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"{hint}a recipe of NeMo RL {release}'s {performance.PERFORMANCE_DIR}/ (the image's release); "
                f"{infra_shape}",
            )
        if not fits(recipe):
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"a recipe whose cluster the infra holds: it needs {recipe.num_nodes} nodes of {recipe.gpus_per_node} "
                f"GPUs (cluster.num_nodes x cluster.gpus_per_node = {recipe.gpus} GPUs); {infra_shape}",
            )
        if recipe.dataset != performance.OPEN_MATH:
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"a recipe that trains on {performance.OPEN_MATH} (the data the benchmark prepares on Lustre); this "
                f"one trains on {recipe.dataset}",
            )
        if not recipe.hub_model:
            raise ConfigError(
                "benchmarkRecipes",
                name,
                f"a recipe whose model is on the Hugging Face hub: its policy.model_name is NVIDIA's placeholder "
                f"({recipe.model!r}) for a checkpoint you convert first, so it cannot run unchanged",
            )
        if any(item.recipe.name == name for item in chosen):
            raise ConfigError("benchmarkRecipes", name, "each recipe once")
        chosen.append(BenchmarkRecipe(recipe, published_for(release, name)))
    return tuple(chosen)
