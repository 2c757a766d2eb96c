"""Seconds per GRPO step, by recipe: the published or first-hand figures the run estimate may use, each with what it
counts, where it comes from and how it is carried over to a run of another shape. Pure data and lookups; no Pulumi.

A run whose recipe, mode (synchronous or async GRPO), GPU type or layout (colocated or not) has no row gets no
number: its seconds per step are unknown until the job setting `secondsPerStep` gives them (a set `secondsPerStep`
always wins over the table).

Scaling (an assumption, stated wherever a scaled figure is shown): a row's seconds are carried over to the run's
samples per step (numPromptsPerStep x numGenerationsPerPrompt) and training GPUs linearly,

    seconds x (run samples / row samples) x (row training GPUs / run training GPUs)

because the phases that dominate a step (policy training and the log-prob pass: 97% of the Gemma 3 27B sample's
step 1) process every sample's tokens, spread over the training GPUs. It ignores the fixed per-step costs (weight
refit, a few seconds in the sample), generation's own scaling, and any change in parallelism the other GPU count
needs; it holds only while the response lengths stay those of the row's dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

H100 = "nvidia-h100-80gb"
H200 = "nvidia-h200-141gb"
B200 = "nvidia-b200"

GEMMA3_27B_RECIPE = "examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-long.yaml"
LLAMA_8B_SYNC_RECIPE = "examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml"
LLAMA_8B_ASYNC_RECIPE = "examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml"
LLAMA_8B_FP8_ASYNC_RECIPE = (
    "examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off.yaml"
)
QWEN_1P5B_RECIPE = "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml"

_GKE_SAMPLE = (
    "https://github.com/GoogleCloudPlatform/kubernetes-engine-samples/tree/main/ai-ml/nemo-rl-on-gke/nemoRL/"
    "gemma3-27b-it (README.md's step log; read at commit 4f6aa40 of its source, "
    "https://github.com/pmotgi/nemo-rl-on-gke/blob/4f6aa4072890baaf84dcbbfe43660c4828bd6404/gemma3-27b-it/README.md; "
    "run settings in gemma3-27b-gsm8k.sh there)"
)
_NEMO_RL_SUMMARY = (
    "https://github.com/NVIDIA-NeMo/RL/blob/v0.5.0/docs/about/performance-summary.md (Nemo RL v0.5, H100 "
    "tables; ../shared/reference/nemo-rl-v0.5.0/docs/about/performance-summary.md)"
)
_H100_FOR_H200 = (
    "measured on H100; used for H200 as it is (an assumption: the H200 is the same Hopper GPU with more and faster "
    "memory; no H200 figure is published)"
)


@dataclass(frozen=True)
class StepTime:
    """One measured or published step time and the run shape it was measured on."""

    recipe: str  # under examples/configs/ of the NeMo RL sources
    async_grpo: bool  # the mode it was measured in: asyncGrpo off (synchronous) or on (1-step off-policy)
    gpu_types: tuple[str, ...]  # the infra gpuType values the figure is used for
    measured_on: str  # the GPUs it was measured on, in words
    measured_gpu_type: str  # as an infra gpuType would name it
    nodes: int  # nodes of 8 GPUs in the measured run
    generation_nodes: int  # of them, nodes given to vLLM alone (0: colocated)
    samples_per_step: int  # prompts x generations per prompt
    seconds: float
    counts: str  # what the seconds count
    source: str  # a URL or a path in ../shared/reference
    date: str  # when the figure was published or read
    gpu_note: str = ""  # how the figure is carried to a GPU type it was not measured on
    first_step_seconds: float | None = None  # async rows: the on-policy first step (nothing overlaps yet)
    first_step_source: str = ""

    @property
    def training_gpus(self) -> int:
        return (self.nodes - self.generation_nodes) * 8 if self.generation_nodes else self.nodes * 8


STEP_TIMES: tuple[StepTime, ...] = (
    StepTime(
        recipe=GEMMA3_27B_RECIPE,
        async_grpo=False,
        gpu_types=(B200, H200),
        measured_gpu_type=B200,
        measured_on="3 A4 nodes (24 B200): 2 training, 1 vLLM generation (non-colocated), NeMo RL v0.5.0",
        nodes=3,
        generation_nodes=1,
        samples_per_step=16 * 64,
        seconds=942.51,
        counts="step 1 of 10, the only step logged: 731.16 s policy training, 177.98 s log-probs, 27.97 s "
        "generation (after a 300.1 s set-up, not counted); GSM8K",
        source=_GKE_SAMPLE,
        date="log lines dated 02-27, NeMo RL v0.5.0 (released 2026-01-30); read 2026-12-02",
        gpu_note="measured on B200; used for H200 as it is: no H200 figure exists for this recipe, and an H200 has "
        "less compute than a B200, so expect longer steps there",
    ),
    StepTime(
        recipe=LLAMA_8B_SYNC_RECIPE,
        async_grpo=False,
        gpu_types=(H200,),
        measured_gpu_type=H100,
        measured_on="16 H100 (2 DGX-H100 nodes), colocated, Megatron, BF16",
        nodes=2,
        generation_nodes=0,
        samples_per_step=64 * 32,
        seconds=92.8,
        counts="total step time (training, generation, log-probs, refit), NVIDIA's average of 5 steps; "
        "OpenMathInstruct-2",
        source=_NEMO_RL_SUMMARY,
        date="NeMo RL v0.5.0, released 2026-01-30",
        gpu_note=_H100_FOR_H200,
    ),
    StepTime(
        recipe=LLAMA_8B_ASYNC_RECIPE,
        async_grpo=True,
        gpu_types=(H200,),
        measured_gpu_type=H100,
        measured_on="16 H100 (2 DGX-H100 nodes): 1 training, 1 vLLM generation, Megatron, BF16",
        nodes=2,
        generation_nodes=1,
        samples_per_step=64 * 32,
        seconds=64.8,
        counts="total step time, 1-step off-policy (generation overlaps training), NVIDIA's average of 5 steps; "
        "OpenMathInstruct-2",
        source=_NEMO_RL_SUMMARY,
        date="NeMo RL v0.5.0, released 2026-01-30",
        gpu_note=_H100_FOR_H200,
        first_step_seconds=92.8,
        first_step_source="the on-policy recipe's 92.8 s: the first step cannot overlap (the trajectory buffer "
        "starts empty)",
    ),
    StepTime(
        recipe=LLAMA_8B_FP8_ASYNC_RECIPE,
        async_grpo=True,
        gpu_types=(H200,),
        measured_gpu_type=H100,
        measured_on="16 H100 (2 DGX-H100 nodes): 1 training, 1 vLLM generation, Megatron, FP8 training and generation",
        nodes=2,
        generation_nodes=1,
        samples_per_step=64 * 32,
        seconds=53.0,
        counts="total step time, 1-step off-policy, FP8, NVIDIA's average of 5 steps; OpenMathInstruct-2",
        source=_NEMO_RL_SUMMARY,
        date="NeMo RL v0.5.0, released 2026-01-30",
        gpu_note=_H100_FOR_H200,
    ),
)

# Recipes looked for and not found: said so where the plan shows "unknown", so nobody looks again without cause.
NOT_PUBLISHED: dict[str, str] = {
    QWEN_1P5B_RECIPE: "no published step time: NeMo RL's performance summary has no Qwen2.5-Math 1.5B row, and "
    "the GKE sample's qwen2-1.5b README logs another model's step (its FLOPs are an 8B model's)",
}


@dataclass(frozen=True)
class StepEstimate:
    """What the run estimate takes for one step: seconds (None: unknown), the first step's, and why."""

    seconds: float | None
    first_step_seconds: float | None
    source: str  # "secondsPerStep" (the user's figure), a row's source, or "" when unknown
    counts: str
    notes: tuple[str, ...]
    row: StepTime | None = None

    @property
    def known(self) -> bool:
        return self.seconds is not None


def find(recipe: str, async_grpo: bool, gpu_type: str) -> StepTime | None:
    return next(
        (r for r in STEP_TIMES if r.recipe == recipe and r.async_grpo == async_grpo and gpu_type in r.gpu_types),
        None,
    )


def scale(row: StepTime, samples_per_step: int, training_gpus: int) -> float:
    """The row's seconds carried linearly to another sample count and training GPU count (module docstring)."""
    return row.seconds * samples_per_step / row.samples_per_step * row.training_gpus / training_gpus


def unknown_reason(recipe: str, async_grpo: bool, gpu_type: str) -> str:
    mode = "async GRPO" if async_grpo else "synchronous GRPO"
    others = [r for r in STEP_TIMES if r.recipe == recipe]
    if recipe in NOT_PUBLISHED:
        why = NOT_PUBLISHED[recipe]
    elif not others:
        why = "the step-time table (jobs/launcher/step_times.py) has no row for this recipe"
    else:
        shapes = ", ".join(f"{'async' if r.async_grpo else 'synchronous'} on {'/'.join(r.gpu_types)}" for r in others)
        why = f"the table has this recipe only {shapes}"
    return f"seconds per step unknown for {recipe} ({mode}, {gpu_type or 'an unknown GPU type'}): {why}"


def estimate(
    *,
    recipe: str,
    async_grpo: bool,
    gpu_type: str,
    num_nodes: int,
    generation_nodes: int,
    gpus_per_node: int,
    samples_per_step: int,
    user_seconds: float | None,
) -> StepEstimate:
    """The seconds one step of this run takes: the user's secondsPerStep, else the table's row scaled to the run,
    else unknown (None) with the reason and the setting that supplies it."""
    if user_seconds is not None:
        mine: tuple[str, ...] = ()
        if async_grpo:
            mine = ("the first async step cannot overlap and takes longer than secondsPerStep; it is counted at it",)
        return StepEstimate(user_seconds, user_seconds, "secondsPerStep", "your figure", mine)
    row = find(recipe, async_grpo, gpu_type)
    ask = "set the job setting secondsPerStep from a run of yours"
    if row is None:
        return StepEstimate(None, None, "", "", (f"{unknown_reason(recipe, async_grpo, gpu_type)}; {ask}",))
    if (generation_nodes == 0) != (row.generation_nodes == 0):
        layout = "colocated" if row.generation_nodes == 0 else f"{row.generation_nodes} generation node(s)"
        return StepEstimate(
            None,
            None,
            "",
            "",
            (f"seconds per step unknown: the table's figure for {recipe} was measured {layout}, the run is not "
             f"laid out that way; {ask}",),
        )  # fmt: skip
    training_gpus = (num_nodes - generation_nodes) * gpus_per_node if generation_nodes else num_nodes * gpus_per_node
    seconds = scale(row, samples_per_step, training_gpus)
    if not row.async_grpo:
        first: float | None = seconds
    elif row.first_step_seconds is not None:
        first = seconds * row.first_step_seconds / row.seconds  # the on-policy step, scaled the same way
    else:
        first = None
    notes = [
        f"seconds per step: {row.seconds:g} s for {row.samples_per_step} samples on {row.measured_on} "
        f"({row.source}; {row.date})"
    ]
    if (samples_per_step, training_gpus) != (row.samples_per_step, row.training_gpus):
        notes.append(
            f"scaled linearly to {samples_per_step} samples on {training_gpus} training GPUs (an assumption: "
            f"x {samples_per_step}/{row.samples_per_step} samples x {row.training_gpus}/{training_gpus} GPUs = "
            f"{seconds:.1f} s); set secondsPerStep from a run of yours"
        )
    if gpu_type != row.measured_gpu_type and row.gpu_note:
        notes.append(row.gpu_note)
    if async_grpo:
        notes.append(
            f"first step: {row.first_step_source}" if first is not None else "first step: unknown (no on-policy row)"
        )
    return StepEstimate(seconds, first, row.source, row.counts, tuple(notes), row)
