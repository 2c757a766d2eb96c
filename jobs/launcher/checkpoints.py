"""Whether Managed Lustre holds what a run writes: the checkpoints NeMo RL keeps, the weights and the converted
model; and how long one checkpoint takes to write at the instance's throughput. Pure: build_job_settings calls
check_lustre_space before anything is registered.

A checkpoint holds the policy's weights and its optimizer state (NeMo RL's checkpoints are PyTorch DCP:
`step_N/policy/{weights,optimizer}`, ../shared/FACTS.md). Mixed-precision Adam keeps 2 bytes of bf16 weights and 12 of
fp32 master weights and the two Adam moments per parameter (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", 2020, section 3.1: 2 + 12 of its 16 bytes per parameter; the other 2 are
gradients, which are not saved): 14 bytes per parameter, an estimate (a DeepSeek V3 checkpoint: 671B x 14 = 9.4 TB).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from launcher import performance

GIB = 2**30
CHECKPOINT_BYTES_PER_PARAMETER = 14
CHECKPOINT_SOURCE = "estimate: 14 bytes per parameter, bf16 weights + fp32 Adam state (ZeRO paper, section 3.1)"
WEIGHT_BYTES_PER_PARAMETER = 2  # bf16 weights, in the Hugging Face cache and the converted model
# NeMo RL v0.5.0 examples/configs/grpo_math_1B.yaml (the base of the performance recipes): checkpointing.keep_top_k 3,
# save_period 10. NeMo RL writes the new checkpoint before it removes the one past keep_top_k (utils/checkpoint.py,
# finalize_checkpoint then remove_old_checkpoints), so keep_top_k + 1 are on Lustre at once.
DEFAULT_KEEP_TOP_K = 3
DEFAULT_SAVE_PERIOD = 10


@dataclass(frozen=True)
class ModelSize:
    billions: float
    source: str


# Total parameters of the models NeMo RL's recipes train (a mixture of experts saves and downloads every expert), each
# with its source. The one table of model sizes: the Lustre checks here and the first-step model (tools/first_step.py)
# read it.
_DEEPSEEK_V3 = ModelSize(671, "published: DeepSeek-V3 has 671B parameters in total, 37B activated (its model card)")
MODEL_SIZES: dict[str, ModelSize] = {
    "google/gemma-3-27b-it": ModelSize(27.4, "published: Gemma 3 27B has 27.4B parameters (../shared/FACTS.md)"),
    "Qwen/Qwen2.5-Math-1.5B-Instruct": ModelSize(
        1.54, "estimate: Qwen2.5 1.5B models have 1.54B parameters (Qwen2.5 model cards)"
    ),
    "meta-llama/Llama-3.1-8B-Instruct": ModelSize(
        8.03, "published: Llama 3.1 8B has 8.03B parameters (its Hugging Face model card)"
    ),
    "Qwen/Qwen3-32B": ModelSize(32.8, "published: Qwen3-32B has 32.8B parameters (its model card)"),
    "Qwen/Qwen3-30B-A3B": ModelSize(
        30.5, "published: Qwen3-30B-A3B has 30.5B parameters in total, 3.3B activated (its model card)"
    ),
    "Qwen/Qwen3-235B-A22B": ModelSize(
        235, "published: Qwen3-235B-A22B has 235B parameters in total, 22B activated (its model card)"
    ),
    "unsloth/DeepSeek-V3-0324-BF16": _DEEPSEEK_V3,
    "deepseek-ai/DeepSeek-V3": _DEEPSEEK_V3,
}
# policy.model_name of the shipped stacks' recipes outside the performance folder (the same at both releases; tests
# hold them to each release's loader). A performance recipe's model is its row in launcher/performance.py, release by
# release. Other recipes: unknown, not checked.
RECIPE_MODELS: dict[str, str] = {
    "examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-long.yaml": "google/gemma-3-27b-it",
    "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml": (
        "Qwen/Qwen2.5-Math-1.5B-Instruct"
    ),
}


def model_of(model: str, recipe: str, release: str) -> str:
    """The model the run trains: the job setting model, else the recipe's own at that NeMo RL release; "" when unknown
    or when the recipe names no hub model (v0.7.0's DeepSeek recipes point to a guide: the user's model is needed)."""
    if model:
        return model
    perf = performance.find_by_path(release, recipe)
    if perf is not None:
        return perf.model if perf.hub_model else ""
    return RECIPE_MODELS.get(recipe, "")


def override_int(extra: tuple[str, ...] | list[str], key: str, default: int) -> int:
    """The value extraOverrides gives `key` (the last one wins, as in Hydra), else the default."""
    value = default
    for item in extra:
        name, _, raw = item.partition("=")
        if name.lstrip("+") == key:
            with contextlib.suppress(ValueError):  # NeMo RL's loader refuses it; nothing to size here
                value = int(raw)
    return value


@dataclass(frozen=True)
class LustreNeed:
    model: str
    size: ModelSize
    checkpoint_bytes: int
    checkpoints_at_once: int
    weights_bytes: int  # the Hugging Face weights, plus the converted model when convertToHf
    total_bytes: int

    def checkpoint_minutes(self, capacity_gib: int, tier_mbps_per_tib: int) -> float:
        """One checkpoint's write at the instance's throughput (capacity x tier, MB/s per TiB), all nodes together:
        the nodes share the file system's throughput, so more nodes do not write a checkpoint faster."""
        mb_per_s = capacity_gib / 1024 * tier_mbps_per_tib
        return self.checkpoint_bytes / (mb_per_s * 10**6) / 60


def lustre_need(model: str, steps: int, extra: tuple[str, ...] | list[str], convert_to_hf: bool) -> LustreNeed | None:
    """What the run puts on Lustre at its peak; None for a model without a size here (unknown, not guessed)."""
    size = MODEL_SIZES.get(model)
    if size is None:
        return None
    parameters = size.billions * 1e9
    checkpoint = int(parameters * CHECKPOINT_BYTES_PER_PARAMETER)
    keep = override_int(extra, "checkpointing.keep_top_k", DEFAULT_KEEP_TOP_K)
    period = max(1, override_int(extra, "checkpointing.save_period", DEFAULT_SAVE_PERIOD))
    saved = max(1, math.ceil(steps / period))  # every save_period steps, and the last step
    at_once = min(saved, keep + 1)
    weights = int(parameters * WEIGHT_BYTES_PER_PARAMETER * (2 if convert_to_hf else 1))
    return LustreNeed(model, size, checkpoint, at_once, weights, checkpoint * at_once + weights)


def lustre_space_problem(need: LustreNeed, capacity_gib: int) -> str | None:
    """Why the instance cannot hold the run, or None."""
    need_gib = math.ceil(need.total_bytes / GIB)
    if need_gib <= capacity_gib:
        return None
    return (
        f"a run whose files fit Lustre ({capacity_gib} GiB, the infra's lustre.capacityGib): {need.model} "
        f"({need.size.billions:g}B parameters; {need.size.source}) needs about {need_gib} GiB: "
        f"{need.checkpoints_at_once} checkpoint(s) at once of {need.checkpoint_bytes / 1e12:.1f} TB each "
        f"({CHECKPOINT_SOURCE}; NeMo RL keeps checkpointing.keep_top_k + 1 while it writes) and "
        f"{need.weights_bytes / 1e12:.1f} TB of weights: raise lustre.capacityGib in the infra stack, or lower "
        "checkpointing.keep_top_k (extraOverrides), or run fewer steps"
    )


# A checkpoint that takes longer than this to write is worth a word in the plan: training waits for it every
# save_period steps. A threshold of ours, not a published figure.
SLOW_CHECKPOINT_MINUTES = 10.0


def checkpoint_write_note(need: LustreNeed | None, capacity_gib: int, tier_mbps_per_tib: int) -> str | None:
    """A warning when one checkpoint takes long to write at the instance's throughput, with what shortens it."""
    if need is None:
        return None
    minutes = need.checkpoint_minutes(capacity_gib, tier_mbps_per_tib)
    if minutes <= SLOW_CHECKPOINT_MINUTES:
        return None
    rate = capacity_gib / 1024 * tier_mbps_per_tib / 1000
    return (
        f"each checkpoint of {need.model} ({need.checkpoint_bytes / 1e12:.1f} TB, {CHECKPOINT_SOURCE}) takes about "
        f"{minutes:.0f} min to write at Lustre's {rate:.1f} GB/s ({capacity_gib} GiB x {tier_mbps_per_tib} MB/s per "
        "TiB; the nodes share it, so more nodes do not write faster): a larger lustre.capacityGib or a higher "
        "lustre.perUnitStorageThroughput (set at creation) shortens it, a longer checkpointing.save_period makes "
        "it rarer"
    )


# GPU memory per GPU, GB (10^9 bytes), by gpuType: H200 141 GB (the GKE accelerator name, nvidia-h200-141gb);
# B200 180 GB (Compute Engine's A4 machine: 8 B200, 1,440 GB of GPU memory).
GPU_MEMORY_GB = {"nvidia-h200-141gb": 141.0, "nvidia-b200": 180.0}
# vLLM's default gpu_memory_utilization, which the evaluations keep.
EVAL_GPU_MEMORY_FRACTION = 0.9


def eval_fit_problem(model: str, gpu_type: str, gpus_per_node: int) -> str | None:
    """Why the evaluations (one GPU node each, jobs/launcher/steps.py) cannot load the model's bf16 weights, or
    None; None too for a model or GPU without a figure here (unknown, not guessed)."""
    size, per_gpu = MODEL_SIZES.get(model), GPU_MEMORY_GB.get(gpu_type)
    if size is None or per_gpu is None:
        return None
    weights_gb = size.billions * WEIGHT_BYTES_PER_PARAMETER
    room_gb = per_gpu * gpus_per_node * EVAL_GPU_MEMORY_FRACTION
    if weights_gb <= room_gb:
        return None
    return (
        f"false for {model}: an evaluation runs on one GPU node, and its bf16 weights ({weights_gb:,.0f} GB, "
        f"{size.billions:g}B parameters; {size.source}) exceed what vLLM may use there ({gpus_per_node} x "
        f"{per_gpu:g} GB x {EVAL_GPU_MEMORY_FRACTION:g} = {room_gb:,.0f} GB)"
    )
