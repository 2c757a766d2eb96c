"""NeMo RL's performance recipes (examples/configs/recipes/llm/performance/ of each release), as the job stack needs
them: the cluster each is written for, its training backend and parallelism, its mode, its model and dataset. Pure
data and lookups; no Pulumi.

The job stack runs where the NeMo RL sources are not at hand (`pulumi up` on a workstation), so it cannot load a
recipe; this table holds what it reads from one instead. Every row is the recipe resolved by its release's own loader
(nemo_rl.utils.config, as the GRPO entrypoint resolves it): tests/jobs/test_performance_recipes.py loads each recipe of
both releases from ../shared/reference/nemo-rl-<tag> with tools/nemorl_config.py and holds every field against it, and
the table against the folder's file list (a recipe added or dropped upstream fails the test).

Every performance recipe trains with Megatron-core (policy.megatron_cfg.enabled, policy.dtensor_cfg.enabled false).
Its data-parallel size is the training GPUs over TP x PP x CP (Megatron carves expert parallelism out of the
data-parallel ranks; models/policy/lm_policy.py shards the batch over that size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PERFORMANCE_DIR = "examples/configs/recipes/llm/performance"
MEGATRON = "megatron"
DTENSOR = "dtensor"
OPEN_MATH = "OpenMathInstruct-2"  # data.dataset_name (v0.5.0) / data.train.dataset_name (v0.7.0)
DAPO_MATH = "DAPOMath17K"

V050, V070 = ("v0.5.0",), ("v0.7.0",)
BOTH = ("v0.5.0", "v0.7.0")

# policy.model_name as each recipe resolves (a hub id, or NVIDIA's placeholder for a checkpoint converted first).
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
QWEN3_32B = "Qwen/Qwen3-32B"
QWEN3_30B = "Qwen/Qwen3-30B-A3B"
QWEN3_235B = "Qwen/Qwen3-235B-A22B"
DSV3_BF16 = "unsloth/DeepSeek-V3-0324-BF16"
NEMOTRON3 = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"
DSV3_GUIDE = "Follow instructions in https://github.com/NVIDIA-NeMo/RL/blob/main/docs/guides/deepseek.md"
DSV3_PATH = "/path/to/dsv3-bf16-checkpoint"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class PerformanceRecipe:
    """One recipe of one or more releases, resolved."""

    name: str  # the file name without .yaml
    releases: tuple[str, ...]  # the NeMo RL tags whose performance folder holds it with exactly these values
    num_nodes: int  # cluster.num_nodes
    gpus_per_node: int  # cluster.gpus_per_node
    generation_nodes: int  # policy.generation.colocated.resources.num_nodes when not colocated; 0 colocated
    # policy.megatron_cfg tensor_model_parallel_size, pipeline_model_parallel_size, context_parallel_size
    parallel: tuple[int, int, int]
    max_trajectory_age_steps: int  # grpo.async_grpo.max_trajectory_age_steps when async is on; 0 synchronous
    fp8: bool  # policy.megatron_cfg.fp8_cfg.enabled (the recipes that set it also generate in FP8)
    samples: tuple[int, int]  # grpo.num_prompts_per_step, grpo.num_generations_per_prompt
    model: str  # policy.model_name
    dataset: str = OPEN_MATH
    checkpointing: bool = True  # checkpointing.enabled
    backend: str = MEGATRON

    @property
    def path(self) -> str:
        return f"{PERFORMANCE_DIR}/{self.name}.yaml"

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def async_grpo(self) -> bool:
        return self.max_trajectory_age_steps > 0

    @property
    def samples_per_step(self) -> int:
        return self.samples[0] * self.samples[1]

    @property
    def training_gpus(self) -> int:
        return (self.num_nodes - self.generation_nodes) * self.gpus_per_node

    @property
    def model_parallel(self) -> int:
        tp, pp, cp = self.parallel
        return tp * pp * cp

    @property
    def data_parallel(self) -> int:
        return self.training_gpus // self.model_parallel

    @property
    def hub_model(self) -> bool:
        """Whether policy.model_name is a hub id the run can download (else a checkpoint to convert first)."""
        return bool(_HUB_ID.match(self.model))

    @property
    def mode(self) -> str:
        """How NVIDIA's performance summary names the mode, with the precision."""
        policy = "on-policy" if not self.async_grpo else f"{self.max_trajectory_age_steps}-step off-policy"
        return f"{policy}, {'FP8' if self.fp8 else 'BF16'}"


def _recipe(
    name: str,
    releases: tuple[str, ...],
    nodes: int,
    gpus_per_node: int,
    generation_nodes: int,
    parallel: tuple[int, int, int],
    age: int,
    fp8: bool,
    samples: tuple[int, int],
    model: str,
    dataset: str = OPEN_MATH,
    ckpt: bool = True,
) -> PerformanceRecipe:
    return PerformanceRecipe(
        name, releases, nodes, gpus_per_node, generation_nodes, parallel, age, fp8, samples, model, dataset, ckpt
    )


PERFORMANCE_RECIPES: tuple[PerformanceRecipe, ...] = (
    _recipe("dapo-deepseek-v3-64n8g", V050, 64, 8, 0, (8, 8, 4), 0, False, (256, 16), DSV3_PATH, DAPO_MATH),
    _recipe("dapo-deepseek-v3-64n8g.v2", V070, 64, 8, 0, (8, 8, 4), 0, False, (256, 16), DSV3_GUIDE, DAPO_MATH),
    _recipe("grpo-deepseek-v3-32n4g", V070, 32, 4, 0, (1, 8, 1), 0, False, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-32n4g", V050, 32, 4, 0, (1, 8, 1), 0, False, (32, 16), DSV3_BF16),
    _recipe("grpo-deepseek-v3-32n8g", V070, 32, 8, 0, (1, 16, 1), 0, False, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-32n8g", V050, 32, 8, 0, (1, 16, 1), 0, False, (32, 16), DSV3_BF16),
    _recipe("grpo-deepseek-v3-64n4g", V070, 64, 4, 0, (1, 8, 1), 0, False, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-64n4g-async-1off", V070, 64, 4, 32, (1, 8, 1), 1, False, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-64n4g-async-1off", V050, 64, 4, 32, (1, 8, 1), 1, False, (32, 16), DSV3_BF16),
    _recipe("grpo-deepseek-v3-64n8g", V070, 64, 8, 0, (1, 16, 1), 0, False, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-64n8g-async-1off", V070, 64, 8, 32, (1, 16, 1), 1, False, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-64n8g-async-1off", V050, 64, 8, 32, (1, 16, 1), 1, False, (32, 16), DSV3_BF16),
    _recipe("grpo-deepseek-v3-64n8g-fp8-async-1off", V070, 64, 8, 32, (1, 16, 1), 1, True, (32, 16), DSV3_GUIDE),
    _recipe("grpo-deepseek-v3-64n8g-fp8-async-1off", V050, 64, 8, 32, (1, 16, 1), 1, True, (32, 16), DSV3_BF16),
    _recipe("grpo-llama3.1-8b-instruct-2n4g", BOTH, 2, 4, 0, (1, 1, 1), 0, False, (64, 32), LLAMA_8B),
    _recipe("grpo-llama3.1-8b-instruct-2n4g-async-1off", BOTH, 2, 4, 1, (1, 1, 1), 1, False, (64, 32), LLAMA_8B),
    _recipe("grpo-llama3.1-8b-instruct-2n8g", BOTH, 2, 8, 0, (1, 2, 1), 0, False, (64, 32), LLAMA_8B),
    _recipe("grpo-llama3.1-8b-instruct-2n8g-async-1off", BOTH, 2, 8, 1, (1, 1, 1), 1, False, (64, 32), LLAMA_8B),
    _recipe("grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off", BOTH, 2, 8, 1, (1, 1, 1), 1, True, (64, 32), LLAMA_8B),
    _recipe("grpo-nemotron3-super-120BA12B-32n4g", V070, 32, 4, 0, (2, 1, 1), 0, False, (32, 8), NEMOTRON3),
    _recipe("grpo-nemotron3-super-120BA12B-32n4g-async-1off", V070, 32, 4, 16, (2, 1, 1), 1, False, (32, 8), NEMOTRON3),
    _recipe("grpo-nemotron3-super-120BA12B-32n8g", V070, 32, 8, 0, (4, 1, 1), 0, False, (32, 8), NEMOTRON3),
    _recipe("grpo-nemotron3-super-120BA12B-32n8g-async-1off", V070, 32, 8, 24, (4, 1, 1), 1, False, (32, 8), NEMOTRON3),
    _recipe("grpo-qwen3-235b-16n4g", BOTH, 16, 4, 0, (2, 4, 2), 0, False, (16, 32), QWEN3_235B),
    _recipe("grpo-qwen3-235b-16n8g", BOTH, 16, 8, 0, (2, 8, 2), 0, False, (16, 32), QWEN3_235B),
    _recipe("grpo-qwen3-235b-32n4g", V070, 32, 4, 0, (2, 4, 2), 0, False, (16, 32), QWEN3_235B),
    _recipe("grpo-qwen3-235b-32n4g-async-1off", BOTH, 32, 4, 16, (4, 4, 1), 1, False, (16, 32), QWEN3_235B),
    _recipe("grpo-qwen3-235b-32n8g", V070, 32, 8, 0, (2, 8, 2), 0, False, (16, 32), QWEN3_235B),
    _recipe("grpo-qwen3-235b-32n8g-async-1off", BOTH, 32, 8, 16, (4, 8, 1), 1, False, (16, 32), QWEN3_235B),
    _recipe("grpo-qwen3-30ba3b-24n8g-async-8off", BOTH, 24, 8, 8, (1, 1, 1), 8, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-30ba3b-4n4g", BOTH, 4, 4, 0, (1, 1, 1), 0, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-30ba3b-4n4g-async-1off", V070, 4, 4, 2, (1, 1, 1), 1, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-30ba3b-4n8g", BOTH, 4, 8, 0, (1, 1, 1), 0, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-30ba3b-4n8g-40K", V070, 4, 8, 0, (4, 1, 8), 0, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-30ba3b-4n8g-async-1off", BOTH, 4, 8, 2, (1, 2, 1), 1, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-30ba3b-8n4g-async-1off", V050, 8, 4, 4, (1, 1, 1), 1, False, (64, 32), QWEN3_30B, ckpt=False),
    _recipe("grpo-qwen3-32b-4n4g", V050, 4, 4, 0, (2, 1, 1), 0, False, (64, 32), QWEN3_32B, ckpt=False),
    _recipe("grpo-qwen3-32b-4n4g", V070, 4, 4, 0, (2, 4, 1), 0, False, (64, 32), QWEN3_32B, ckpt=False),
    _recipe("grpo-qwen3-32b-4n8g", BOTH, 4, 8, 0, (4, 4, 1), 0, False, (64, 32), QWEN3_32B, ckpt=False),
    _recipe("grpo-qwen3-32b-8n4g-async-1off", BOTH, 8, 4, 4, (2, 1, 1), 1, False, (64, 32), QWEN3_32B, ckpt=False),
    _recipe("grpo-qwen3-32b-8n8g-async-1off", BOTH, 8, 8, 4, (4, 4, 1), 1, False, (64, 32), QWEN3_32B, ckpt=False),
)  # fmt: skip


def recipes_of(release: str) -> dict[str, PerformanceRecipe]:
    """The release's performance recipes by file name (no .yaml)."""
    return {r.name: r for r in PERFORMANCE_RECIPES if release in r.releases}


def recipe_name(given: str) -> str:
    """A recipe as a user may name it: the file name with or without .yaml, or its path under the NeMo RL sources."""
    name = given.strip().removeprefix(f"{PERFORMANCE_DIR}/")
    return name.removesuffix(".yaml")


def find(release: str, given: str) -> PerformanceRecipe | None:
    """The release's recipe of that name or path; None when the release has none."""
    if "/" in given.strip().removeprefix(f"{PERFORMANCE_DIR}/"):
        return None
    return recipes_of(release).get(recipe_name(given))


def find_by_path(release: str, path: str) -> PerformanceRecipe | None:
    """The performance recipe at this path (a job setting recipe), for the release; None for any other recipe."""
    if not path.startswith(f"{PERFORMANCE_DIR}/") or not path.endswith(".yaml"):
        return None
    return find(release, path)
