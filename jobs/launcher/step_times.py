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

from launcher import performance

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
_H100_FOR_H200 = (
    "NVIDIA's DGX-H100 figure; used for H200 as it is (an assumption: the H200 is the same Hopper GPU with more and "
    "faster memory; no H200 figure is published)"
)
# When each release's summary was published with it (the release dates of the tags).
RELEASE_DATES = {"v0.5.0": "2026-01-30", "v0.7.0": "2026-07-29"}
DGX_H100, GB200_NVL72 = "DGX-H100", "GB200-NVL72"


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
    release: str = ""  # the NeMo RL release whose recipe was measured ("" when the source does not say)

    @property
    def training_gpus(self) -> int:
        return (self.nodes - self.generation_nodes) * 8 if self.generation_nodes else self.nodes * 8


@dataclass(frozen=True)
class Published:
    """One row of NVIDIA's performance summary (docs/about/performance-summary.md of a NeMo RL release): what NVIDIA
    measured for one performance recipe, averaged over 5 steps, exactly as the table gives it."""

    release: str  # the tag whose docs/about/performance-summary.md holds the row
    heading: str  # the summary's release heading and table, e.g. "Nemo RL v0.5 / H100 BF16 Benchmarks"
    recipe: str  # the file name (no .yaml) under examples/configs/recipes/llm/performance/ of that release
    algorithm: str  # GRPO or DAPO
    model: str  # as the table names it
    mode: str  # "sync" (On policy) or "async-Noff" (N-step Off)
    precision: str  # BF16 or FP8 (training and generation)
    gpus: int  # #-GPUs
    system: str  # as published: DGX-H100 or GB200-NVL72
    tokens_per_sec_per_gpu: float
    seconds_per_step: float  # Total Step time(s)

    @property
    def path(self) -> str:
        return f"{performance.PERFORMANCE_DIR}/{self.recipe}.yaml"

    @property
    def source(self) -> str:
        return (
            f"https://github.com/NVIDIA-NeMo/RL/blob/{self.release}/docs/about/performance-summary.md "
            f"({self.heading}; ../shared/reference/nemo-rl-{self.release}/docs/about/performance-summary.md)"
        )

    @property
    def async_grpo(self) -> bool:
        return self.mode != "sync"


def _rows(release: str, heading: str, system: str, precision: str, rows: str) -> tuple[Published, ...]:
    """One table of the summary, one row a line: recipe, algorithm, model, mode, GPUs, tokens/s/GPU, seconds."""
    found = []
    for line in rows.strip().splitlines():
        recipe, algorithm, model, mode, gpus, tokens, seconds = line.split()
        found.append(
            Published(
                release, heading, recipe, algorithm, model, mode, precision, int(gpus), system, float(tokens),
                float(seconds),
            )
        )  # fmt: skip
    return tuple(found)


# NVIDIA's performance summary of each release, every row that a performance recipe of that release reproduces
# (tests/jobs/test_step_times.py parses both files and holds every row, and every recipe, against them). Not here:
# v0.7.0's "SWE Nemotron-3-Nano-30B-A3B" row, whose recipe is not in the performance folder (NOT_IN_FOLDER).
PUBLISHED: tuple[Published, ...] = (
    *_rows(
        "v0.5.0",
        "Nemo RL v0.5 / H100 BF16 Benchmarks",
        DGX_H100,
        "BF16",
        """
        grpo-llama3.1-8b-instruct-2n8g            GRPO LLAMA3.1_8B sync       16  1581  92.8
        grpo-llama3.1-8b-instruct-2n8g-async-1off GRPO LLAMA3.1_8B async-1off 16  2478  64.8
        grpo-deepseek-v3-32n8g                    GRPO DeepSeek-V3 sync       256 12.7  134
        grpo-deepseek-v3-64n8g-async-1off         GRPO DeepSeek-V3 async-1off 512 13.1  64.9
        dapo-deepseek-v3-64n8g                    DAPO DeepSeek-V3 sync       512 2.45  974
        grpo-qwen3-235b-16n8g                     GRPO Qwen3-235B  sync       128 54.1  431
        grpo-qwen3-235b-32n8g-async-1off          GRPO Qwen3-235B  async-1off 256 58.7  203
        grpo-qwen3-30ba3b-4n8g                    GRPO Qwen3-30B3A sync       32  1066  198
        grpo-qwen3-30ba3b-4n8g-async-1off         GRPO Qwen3-30B3A async-1off 32  1391  154
        grpo-qwen3-32b-4n8g                       GRPO Qwen3-32B   sync       32  571   376
        grpo-qwen3-32b-8n8g-async-1off            GRPO Qwen3-32B   async-1off 64  538   200
    """,
    ),
    *_rows(
        "v0.5.0",
        "Nemo RL v0.5 / H100 FP8 Benchmarks",
        DGX_H100,
        "FP8",
        """
        grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off GRPO LLAMA3.1_8B async-1off 16  3052 53.0
        grpo-deepseek-v3-64n8g-fp8-async-1off         GRPO DeepSeek-V3 async-1off 512 14.1 67.6
    """,
    ),
    *_rows(
        "v0.5.0",
        "Nemo RL v0.5 / GB200 BF16 Benchmarks",
        GB200_NVL72,
        "BF16",
        """
        grpo-llama3.1-8b-instruct-2n4g            GRPO LLAMA3.1_8B sync       8   3359 91.0
        grpo-llama3.1-8b-instruct-2n4g-async-1off GRPO LLAMA3.1_8B async-1off 8   4463 71.1
        grpo-deepseek-v3-32n4g                    GRPO DeepSeek-V3 sync       128 34.3 128
        grpo-deepseek-v3-64n4g-async-1off         GRPO DeepSeek-V3 async-1off 256 31.7 64.5
        grpo-qwen3-235b-16n4g                     GRPO Qwen3-235B  sync       64  140  332
        grpo-qwen3-235b-32n4g-async-1off          GRPO Qwen3-235B  async-1off 128 87.9 268
        grpo-qwen3-30ba3b-4n4g                    GRPO Qwen3-30B3A sync       16  1822 232
        grpo-qwen3-30ba3b-8n4g-async-1off         GRPO Qwen3-30B3A async-1off 32  1558 136
        grpo-qwen3-32b-4n4g                       GRPO Qwen3-32B   sync       16  1127 381
        grpo-qwen3-32b-8n4g-async-1off            GRPO Qwen3-32B   async-1off 32  1025 210
    """,
    ),
    *_rows(
        "v0.7.0",
        "NeMo RL v0.6 / H100 BF16 Benchmarks",
        DGX_H100,
        "BF16",
        """
        grpo-deepseek-v3-32n8g             GRPO DeepSeek-V3 sync       256 12.1 134
        grpo-deepseek-v3-64n8g             GRPO DeepSeek-V3 sync       512 7.24 111
        grpo-deepseek-v3-64n8g-async-1off  GRPO DeepSeek-V3 async-1off 512 12.8 64.1
        grpo-qwen3-235b-16n8g              GRPO Qwen3-235B  sync       128 58.9 395
        grpo-qwen3-235b-32n8g              GRPO Qwen3-235B  sync       256 37.4 312
        grpo-qwen3-235b-32n8g-async-1off   GRPO Qwen3-235B  async-1off 256 58.7 231
        grpo-qwen3-30ba3b-4n8g             GRPO Qwen3-30B3A sync       32  1102 192
        grpo-qwen3-30ba3b-4n8g-async-1off  GRPO Qwen3-30B3A async-1off 32  1414 152
        grpo-qwen3-30ba3b-24n8g-async-8off GRPO Qwen3-30B3A async-8off 192 1025 34.5
    """,
    ),
    *_rows(
        "v0.7.0",
        "NeMo RL v0.6 / H100 FP8 Benchmarks",
        DGX_H100,
        "FP8",
        """
        grpo-deepseek-v3-64n8g-fp8-async-1off GRPO DeepSeek-V3 async-1off 512 14.1 59.2
    """,
    ),
    *_rows(
        "v0.7.0",
        "NeMo RL v0.6 / GB200 BF16 Benchmarks",
        GB200_NVL72,
        "BF16",
        """
        grpo-deepseek-v3-32n4g             GRPO DeepSeek-V3 sync       128 30.2 108
        grpo-deepseek-v3-64n4g             GRPO DeepSeek-V3 sync       256 16.4 98.7
        grpo-deepseek-v3-64n4g-async-1off  GRPO DeepSeek-V3 async-1off 256 26.7 61.7
        grpo-qwen3-235b-16n4g              GRPO Qwen3-235B  sync       64  163  286
        grpo-qwen3-235b-32n4g              GRPO Qwen3-235B  sync       128 67.4 345
        grpo-qwen3-235b-32n4g-async-1off   GRPO Qwen3-235B  async-1off 128 85.5 278
        grpo-qwen3-30ba3b-4n4g             GRPO Qwen3-30B3A sync       16  1910 221
        grpo-qwen3-30ba3b-4n4g-async-1off  GRPO Qwen3-30B3A async-1off 16  1406 301
    """,
    ),
)
# Rows of a summary that no recipe of the release's performance folder reproduces: (release, model as the table
# names it, mode, GPUs) -> why.
NOT_IN_FOLDER: dict[tuple[str, str, str, int], str] = {
    ("v0.7.0", "Nemotron-3-Nano-30B-A3B", "async-1off", 128): "an SWE run (Nemotron 3 Super's stage 2.2 guide); no "
    "recipe of examples/configs/recipes/llm/performance/ runs it",
}


def published(release: str, recipe: str) -> Published | None:
    """NVIDIA's figure for the release's recipe of that file name; None when its summary has none."""
    return next((row for row in PUBLISHED if row.release == release and row.recipe == recipe), None)


def published_for(release: str, recipe: str) -> Published | None:
    """The figure to compare a run of the release's recipe with: its own release's, else the newest other
    release's for a recipe of the same name (the caller says so: the recipe may differ); None when none has one."""
    own = published(release, recipe)
    if own is not None:
        return own
    others = [row for row in PUBLISHED if row.recipe == recipe]
    return max(others, key=lambda row: row.release) if others else None


def _first_step(row: Published) -> Published | None:
    """The on-policy row an async row's first step is taken from: the same release, model, precision, system and
    GPU count (the first async step cannot overlap: the trajectory buffer starts empty)."""
    return next(
        (
            other
            for other in PUBLISHED
            if not other.async_grpo
            and (other.release, other.model, other.precision, other.system, other.gpus)
            == (row.release, row.model, row.precision, row.system, row.gpus)
        ),
        None,
    )


def _from_published(row: Published) -> StepTime:
    """A DGX-H100 row as a step-time row for H200, shaped by its recipe (nodes, generation nodes, samples)."""
    recipe = performance.recipes_of(row.release)[row.recipe]
    layout = (
        "colocated"
        if not recipe.generation_nodes
        else f"{recipe.num_nodes - recipe.generation_nodes} training, {recipe.generation_nodes} vLLM generation"
    )
    first = _first_step(row) if row.async_grpo else None
    return StepTime(
        recipe=row.path,
        async_grpo=row.async_grpo,
        gpu_types=(H200,),
        measured_gpu_type=H100,
        measured_on=f"{row.gpus} H100 ({recipe.num_nodes} {row.system} nodes): {layout}, Megatron, {row.precision}",
        nodes=recipe.num_nodes,
        generation_nodes=recipe.generation_nodes,
        samples_per_step=recipe.samples_per_step,
        seconds=row.seconds_per_step,
        counts=f"total step time ({recipe.mode}: training, generation, log-probs, refit), NVIDIA's average of 5 "
        f"steps; {recipe.dataset}",
        source=row.source,
        date=f"NeMo RL {row.release}, released {RELEASE_DATES[row.release]}",
        gpu_note=_H100_FOR_H200,
        first_step_seconds=None if first is None else first.seconds_per_step,
        first_step_source=""
        if first is None
        else f"the on-policy recipe's {first.seconds_per_step:g} s ({first.recipe}, the same GPUs): the first step "
        "cannot overlap (the trajectory buffer starts empty)",
        release=row.release,
    )


_FIRST_HAND: tuple[StepTime, ...] = (
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
)
# The first-hand rows, then NVIDIA's DGX-H100 rows carried to H200 (GB200's 4-GPU recipes have no infra here).
STEP_TIMES: tuple[StepTime, ...] = (
    *_FIRST_HAND,
    *(_from_published(row) for row in PUBLISHED if row.system == DGX_H100),
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


def find(recipe: str, async_grpo: bool, gpu_type: str, release: str = "") -> StepTime | None:
    """The row for the recipe, mode and GPU type: the image's release's first, else the newest release's."""
    rows = [r for r in STEP_TIMES if r.recipe == recipe and r.async_grpo == async_grpo and gpu_type in r.gpu_types]
    own = [r for r in rows if r.release == release]
    ranked = own or sorted(rows, key=lambda r: r.release, reverse=True)
    return ranked[0] if ranked else None


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
    release: str = "",
) -> StepEstimate:
    """The seconds one step of this run takes: the user's secondsPerStep, else the table's row scaled to the run,
    else unknown (None) with the reason and the setting that supplies it."""
    if user_seconds is not None:
        mine: tuple[str, ...] = ()
        if async_grpo:
            mine = ("the first async step cannot overlap and takes longer than secondsPerStep; it is counted at it",)
        return StepEstimate(user_seconds, user_seconds, "secondsPerStep", "your figure", mine)
    row = find(recipe, async_grpo, gpu_type, release)
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
    if release and row.release and row.release != release:
        notes.append(
            f"the figure was published for NeMo RL {row.release}'s recipe of this name; the image runs {release}, "
            "whose recipe may differ (its summary has no row for it)"
        )
    if async_grpo:
        notes.append(
            f"first step: {row.first_step_source}" if first is not None else "first step: unknown (no on-policy row)"
        )
    return StepEstimate(seconds, first, row.source, row.counts, tuple(notes), row)
