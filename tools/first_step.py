"""From `pulumi up` to the end of the first GRPO step: a modeled start-up, cold and warm, with and without the cuts.

tools/timeline.py ends where `pulumi up` of the job stack returns; a user waits for the first training step. This
model goes on from there: GPU nodes boot, each node pulls the NeMo RL image, the Ray pods start, the pipeline runs
its steps in order, and the train step sets up vLLM and the policy and runs its first step.

Pure and data-driven:
- FIGURES is the one table of phase durations and rates, each with its source or marked as an estimate;
  size-dependent phases are computed from sizes and rates (image GB / pull rate, model GB / download rate, Lustre
  throughput from tier x capacity);
- STEP_PHASES says what each pipeline step costs (a step added to the pipeline adds a row there);
- the provisioning milestones (cluster, pools, the pre-pull DaemonSet, the Ray release, the Job) come from the
  provisioning timeline of the same plan, so the model follows the dependencies the programs register;
- which start-up cuts a plan has is read from what it registers (Cuts.of_plan), never assumed.
"Cold" is a first `pulumi up` of both stacks; "without the cuts" is the same phases arranged as before them (GPU
nodes and the pull wait for the Ray cluster, which waits for Lustre; the weights download inside the train step),
so the two differ only in what runs in parallel. "Warm" is the job stack run again on a kept infra stack: weights
and compile caches on Lustre, nodes kept (reservation) or scaled to zero (autoscaled).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.checkpoints import MODEL_SIZES, model_of

from tools import timeline as provisioning
from tools.timeline import INFRA_DONE, RUN_STEP_DURATIONS, ResourceLike, Timeline


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    # Where it comes from: "https://..." (and the figure it gives), "published: <document>" (a named document the
    # project's ../shared/FACTS.md records), "derived: <how>", "fact: <why>", or "estimate: <what was assumed>".
    source: str


_SAMPLE = (
    "published: GKE NeMo RL sample gemma3-27b-it/README.md, NeMo RL v0.5.0 on A4, non-colocated (as recorded in "
    "../shared/FACTS.md, Start-up figures)"
)
FIGURES: Mapping[str, Figure] = {
    "gpuNodeBoot": Figure(10.0, "min", "estimate: 8-12 min from a node request to a Ready GPU node (VM, GPU driver)"),
    "imageGb": Figure(
        18.0,
        "GB",
        "estimate: v0.5.0/v0.7.0 sizes are not published; NeMo Gym docs (nemotron-3-nano.mdx) give ~15 GB as "
        "squashfs for v0.4.0; 15-20 GB compressed assumed",
    ),
    "imagePullRate": Figure(
        2.0,
        "GB/min",
        "derived: NeMo Gym docs (nemotron-3-nano.mdx) say the ~15 GB v0.4.0 image 'adds ~5-10 min' on first use: "
        "15 GB / 7.5 min",
    ),
    "imageFromCacheDisk": Figure(
        0.5,
        "min",
        "estimate: GKE docs (how-to/data-container-image-preloading): the secondary boot disk is provisioned in "
        "parallel with the node and containers start from the preloaded image without a pull",
    ),
    "podStart": Figure(0.5, "min", "estimate: container start and `ray start` joining the head"),
    "submitterStart": Figure(0.2, "min", "estimate: the submitter pod starts on the CPU node, image in place"),
    "rayJobOverhead": Figure(
        0.3, "min", "estimate: one Ray job submission plus `uv run` checking NeMo RL's environment"
    ),
    "preflightNccl": Figure(1.5, "min", "estimate: NCCL start-up over RDMA and an all-reduce sweep"),
    "prepareData": Figure(1.0, "min", "estimate: GSM8K (~8.8k rows, a few MB) from the hub, written as JSONL"),
    "hubDownloadRate": Figure(
        0.5,
        "GB/s",
        "https://github.com/huggingface/hf_transfer README ('to go beyond ~500MB/s ... where Python cannot cap "
        "out the available bandwidth'); Xet downloads measure 0.65 GB/s with default buffers and 1.74 GB/s with "
        "HF_XET_HIGH_PERFORMANCE (https://github.com/unslothai/unsloth/pull/7815, "
        "https://github.com/unslothai/unsloth-zoo/pull/972): the slower figure is used, with or without the prefetch",
    ),
    "bytesPerParameter": Figure(2.0, "bytes", "fact: bf16 weights take 2 bytes per parameter"),
    "vllmInit": Figure(291 / 60, "min", f"{_SAMPLE}: vLLM init 291 s, compilation included"),
    "vllmCompile": Figure(
        1.5, "min", "estimate: the torch.compile and CUDA-graph share of vLLM init (not broken out in the sample)"
    ),
    "compileCacheLoad": Figure(
        0.3,
        "min",
        "https://docs.baseten.co/development/model/torch-compile-cache (loading cached torch.compile artifacts: "
        "'around 5-20 seconds, depending on the model')",
    ),
    "policyInit": Figure(23 / 60, "min", f"{_SAMPLE}: policy set-up 23 s"),
    "setupOther": Figure(9 / 60, "min", f"{_SAMPLE}: the rest of NeMo RL's 300 s set-up (300 - 291 s)"),
}

# Parameter counts of the models the recipes train, from the job stack's one table (jobs/launcher/checkpoints.py, with
# their sources). Other models fall back to UNKNOWN_MODEL.
MODELS: Mapping[str, Figure] = {
    model: Figure(size.billions, "B parameters", size.source) for model, size in MODEL_SIZES.items()
}
UNKNOWN_MODEL = Figure(8.0, "B parameters", "estimate: a recipe without a figure here; an 8B model assumed")

# What would shorten the dominant phase next, by phase (or resource type of the provisioning timeline).
NEXT_CUTS: Mapping[str, str] = {
    "gcp:lustre/instance:Instance": (
        "create Managed Lustre once and keep it (protectData keeps it through `pulumi destroy`; a later stack could "
        "import it), or start the Lustre creation ahead of the rest: nothing else waits as long"
    ),
    "image pull": "imageCacheDisk: the image preloaded on a secondary boot disk, no registry pull on a new node",
    "GPU node boot": "keep GPU nodes between runs (a reservation bills them anyway), or a longer rayIdleTimeoutSeconds",
    "vLLM set-up": "a warm compile cache (already on Lustre after the first run) and fewer CUDA-graph sizes",
    "first GRPO step": "fewer prompts or generations in the first step, or more generation nodes",
}


def minutes(name: str) -> float:
    return FIGURES[name].value


def _figure(name: str) -> tuple[float, str]:
    """A figure's value and its source, as a phase takes them."""
    return FIGURES[name].value, FIGURES[name].source


# ---------------------------------------------------------------------------------------------------------------
# What a plan holds


@dataclass(frozen=True)
class Cuts:
    prepull: bool = False  # a DaemonSet holding the Ray pods' image on every node, independent of Lustre
    nodes_with_pool: bool = False  # the GPU pool is created with its nodes
    image_cache_disk: bool = False  # GPU nodes get the image from a secondary boot disk
    prefetch: bool = False  # a pipeline step downloads the weights before train
    compile_cache: bool = False  # vLLM's and Inductor's caches on Lustre
    eval_cache: bool = False  # eval-base reuses an earlier run's result for the same model, arguments and image

    def names(self) -> list[str]:
        return [name for name, on in self.__dict__.items() if on]


@dataclass(frozen=True)
class StartupInputs:
    milestones: Mapping[str, float]  # minutes after `pulumi up`: cluster, cpuPool, gpuPool, prepull, ray, job, ...
    job_stack_minutes: float  # `pulumi up` of the job stack alone
    steps: tuple[str, ...]  # the pipeline's steps, in order
    image_gb: float
    model: str
    model_parameters_b: float
    lustre_gb_per_s: float
    train_nodes: int
    preflight_lustre_gb: float  # written then read by preflight-lustre, all nodes together
    seconds_per_step: float | None  # the first step's seconds (estimatedRun.firstStepSeconds); None: unknown
    ray_autoscaling: bool
    cuts: Cuts
    # The same milestones with Managed Lustre's worst-case creation time for its tier (the cold range's end).
    worst_milestones: Mapping[str, float] = field(default_factory=dict)
    lustre_tier: int = 0
    model_source: str = ""
    provisioning_path: tuple[tuple[str, str, float, float], ...] = ()  # (label, type, start, end) on the critical path

    @property
    def model_gb(self) -> float:
        return self.model_parameters_b * minutes("bytesPerParameter")


def _resource(resources: Sequence[ResourceLike], type_token: str, name: str) -> ResourceLike | None:
    return next((r for r in resources if r.type == type_token and r.name == name), None)


def _env_names(values: Mapping[str, Any]) -> dict[str, str]:
    env = ((values.get("common") or {}).get("containerEnv")) or []
    return {str(e.get("name")): str(e.get("value", "")) for e in env if isinstance(e, Mapping)}


def cuts_of(
    infra: Sequence[ResourceLike],
    steps: Sequence[str],
    image: str,
    mount: str,
    entrypoints: Mapping[str, str],
) -> Cuts:
    """The cuts the registered resources and the pipeline's entrypoints actually have."""
    prepull = False
    for r in infra:
        if r.type == "kubernetes:apps/v1:DaemonSet":
            containers = r.inputs.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
            prepull = prepull or any(c.get("image") == image for c in containers)
    pool = _resource(infra, "gcp:container/nodePool:NodePool", "gpu")
    pool_inputs = pool.inputs if pool else {}
    release = _resource(infra, "kubernetes:helm.sh/v3:Release", "ray")
    env = _env_names(release.inputs.get("values") or {}) if release else {}
    caches = [env.get("VLLM_CACHE_ROOT", ""), env.get("TORCHINDUCTOR_CACHE_DIR", "")]
    return Cuts(
        prepull=prepull,
        nodes_with_pool=int(pool_inputs.get("initialNodeCount") or 0) > 0,
        image_cache_disk=bool((pool_inputs.get("nodeConfig") or {}).get("secondaryBootDisks")),
        prefetch="prefetch-weights" in steps,
        compile_cache=all(path.startswith(f"{mount}/") for path in caches),
        eval_cache=(_argument(entrypoints.get("eval-base", ""), "--cache-dir") or "").startswith(f"{mount}/"),
    )


_MILESTONES = {
    "cluster": "Cluster/gke",
    "cpuPool": "NodePool/gke-cpu",
    "gpuPool": "NodePool/gpu",
    "prepull": "DaemonSet/image-prepull",
    "ray": "Release/ray",
    "job": "Job/pipeline",
}


def _argument(entrypoint: str, flag: str) -> str | None:
    match = re.search(rf"(?:^|\s){re.escape(flag)}=(\S+)", entrypoint)
    return match.group(1).strip("'\"") if match else None


def inputs_from_plan(plan: Any) -> StartupInputs:
    """Everything the model reads, from a tools.plan_run.Plan (its registered resources, outputs and timeline)."""
    timeline: Timeline = plan.timeline
    infra_out, job_out = plan.infra.outputs, plan.jobs.outputs
    pipeline = job_out.get("pipeline") or []
    steps = tuple(str(s["step"]) for s in pipeline)
    entry = {str(s["step"]): str(s["entrypoint"]) for s in pipeline}
    milestones = {key: timeline.steps[label].end for key, label in _MILESTONES.items() if label in timeline.steps}
    worst = provisioning.build([plan.infra.resources, plan.jobs.resources], worst=True)
    worst_milestones = {key: worst.steps[label].end for key, label in _MILESTONES.items() if label in worst.steps}
    infra_done = timeline.steps[INFRA_DONE].end
    first_train = next((step for step in steps if step == "train" or step.startswith("train-")), "")
    recipe = _argument(entry.get(first_train, ""), "--config") or ""
    release = (infra_out.get("nemoRlRelease") or {}).get("tag", "")
    model = model_of("", recipe, str(release))
    figure = MODELS.get(model, UNKNOWN_MODEL)
    capacity, tier = int(infra_out["lustreCapacityGib"]), int(infra_out["lustreThroughputMbpsPerTib"])
    lustre_io = entry.get("preflight-lustre", "")
    gib_per_node = float(_argument(lustre_io, "--gib-per-node") or 0)
    io_nodes = int(_argument(lustre_io, "--nodes") or 0)
    run = job_out.get("estimatedRun") or {}
    image = str(infra_out.get("nemoRlImage", ""))
    mount = str(job_out.get("checkpointDir", "/data")).rsplit("/", 1)[0] or "/data"
    path = tuple((s.label, s.type, s.start, s.end) for s in timeline.critical_path if s.end <= infra_done + 1e-9)
    return StartupInputs(
        milestones=milestones,
        job_stack_minutes=timeline.total - infra_done,
        steps=steps,
        image_gb=minutes("imageGb"),
        model=model or f"(the model of {recipe or 'the recipe'})",
        model_parameters_b=figure.value,
        model_source=figure.source,
        lustre_gb_per_s=capacity / 1024 * tier / 1000,
        train_nodes=int(run.get("nodes") or 1),
        preflight_lustre_gb=2 * gib_per_node * io_nodes * 2**30 / 1e9,
        # The first step's own time: with asyncGrpo nothing overlaps yet (estimatedRun.firstStepSeconds).
        seconds_per_step=None if run.get("firstStepSeconds") is None else float(run["firstStepSeconds"]),
        worst_milestones=worst_milestones,
        lustre_tier=tier,
        ray_autoscaling=infra_out.get("rayAutoscaling") is True,
        cuts=cuts_of(plan.infra.resources, steps, image, mount, entry),
        provisioning_path=path,
    )


# ---------------------------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Phase:
    name: str
    minutes: float
    source: str
    after: tuple[str, ...] = ()  # phases (or milestones) it waits for
    at: float | None = None  # a milestone: ends at this time, from the provisioning timeline


@dataclass
class Schedule:
    phases: dict[str, Phase]
    end: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.phases:
            self._end(name, ())

    def _end(self, name: str, seen: tuple[str, ...]) -> float:
        if name not in self.end:
            if name in seen:
                raise ValueError(f"start-up phases wait in a circle through {name}")
            phase = self.phases[name]
            if phase.at is not None:
                self.end[name] = phase.at
            else:
                self.end[name] = self.start(name, (*seen, name)) + phase.minutes
        return self.end[name]

    def start(self, name: str, seen: tuple[str, ...] = ()) -> float:
        phase = self.phases[name]
        if phase.at is not None:
            return phase.at - phase.minutes
        return max([0.0, *(self._end(dep, seen) for dep in phase.after)])

    def chain(self, last: str) -> list[str]:
        """The phases that set `last`'s end, first to last: each one's latest predecessor."""
        path = [last]
        while self.phases[path[-1]].after:
            phase = self.phases[path[-1]]
            path.append(max(phase.after, key=lambda dep: (self.end[dep], dep)))
        return list(reversed(path))


FIRST_STEP = "first GRPO step"


def _pipeline_phases(inputs: StartupInputs, cuts: Cuts, warm: bool, start: str) -> list[Phase]:
    """The pipeline's steps in order, up to the end of the first GRPO step."""
    phases: list[Phase] = []
    previous = start
    for step in inputs.steps:
        if step == "prefetch-weights" and not cuts.prefetch:
            continue  # without the cuts, the train step downloads the weights itself
        cost = step_cost(step)
        unknown = [(f"{step} (no figure)", 1.0, "estimate: a step without a row in STEP_PHASES")]
        for name, duration, source in cost(inputs, cuts, warm) if cost else unknown:
            phases.append(Phase(name, duration, source, (previous,)))
            previous = name
        if cost is _train:  # the first training step ends the model
            break
    return phases


def build(inputs: StartupInputs, cuts: Cuts, warm: bool = False) -> Schedule:
    """The start-up as a schedule of phases. `cuts` says which cuts to apply (Cuts() for none)."""
    m = inputs.milestones
    pull = inputs.image_gb / minutes("imagePullRate")
    pull_source = f"{inputs.image_gb:g} GB / {minutes('imagePullRate'):g} GB/min (imageGb, imagePullRate)"
    p: list[Phase] = []
    if warm:
        # The infra is there, the image on the CPU node; only the job stack's `pulumi up` runs.
        p.append(Phase("job stack `pulumi up` (Job created)", inputs.job_stack_minutes, "provisioning timeline"))
        job, head_ready, cpu_image = p[-1].name, p[-1].name, p[-1].name
    else:
        for key, value in m.items():
            p.append(Phase(f"{key} ready (provisioning)", 0.0, "provisioning timeline", at=value))
        job = "job ready (provisioning)"
        ray = "ray ready (provisioning)"
        cpu_trigger = "prepull ready (provisioning)" if cuts.prepull and "prepull" in m else ray
        p.append(Phase("image pull, CPU node", pull, pull_source, ("cpuPool ready (provisioning)", cpu_trigger)))
        cpu_image = "image pull, CPU node"
        p.append(Phase("Ray head start", *_figure("podStart"), (cpu_image, ray)))
        head_ready = "Ray head start"
    p.append(Phase("submitter start", *_figure("submitterStart"), (job, cpu_image)))

    # GPU nodes: when they are asked for, their boot, the image, the Ray worker pods.
    kept = warm and not inputs.ray_autoscaling
    if kept:
        workers_ready = head_ready
    else:
        if warm or inputs.ray_autoscaling:
            request: tuple[str, ...] = ("submitter start", head_ready)  # wait_for_workers asks the autoscaler
        elif cuts.nodes_with_pool:
            request = ("gpuPool ready (provisioning)",)
        else:
            request = ("ray ready (provisioning)",)  # the Ray worker pods ask the cluster autoscaler
        p.append(Phase("GPU node boot", *_figure("gpuNodeBoot"), request))
        pods = () if warm else ("ray ready (provisioning)",)
        if cuts.image_cache_disk:
            p.append(Phase("image from the cache disk", *_figure("imageFromCacheDisk"), ("GPU node boot",)))
            gpu_image = "image from the cache disk"
        else:
            trigger = ("prepull ready (provisioning)",) if cuts.prepull and not warm and "prepull" in m else pods
            p.append(Phase("image pull", pull, pull_source, ("GPU node boot", *trigger)))
            gpu_image = "image pull"
        p.append(Phase("Ray workers start", *_figure("podStart"), (gpu_image, *pods)))
        workers_ready = "Ray workers start"
    p.append(Phase("pipeline starts (workers up)", 0.0, "", ("submitter start", head_ready, workers_ready)))
    p += _pipeline_phases(inputs, cuts, warm, "pipeline starts (workers up)")
    names = [phase.name for phase in p]
    if len(set(names)) != len(names):
        raise ValueError(f"start-up phase names are not unique: {sorted({n for n in names if names.count(n) > 1})}")
    return Schedule({phase.name: phase for phase in p})


# What each pipeline step costs: step name -> (inputs, cuts, warm) -> [(phase, minutes, source)].
StepCost = Callable[[StartupInputs, Cuts, bool], list[tuple[str, float, str]]]


def _overhead(step: str) -> tuple[str, float, str]:
    return (f"{step}: Ray job", *_figure("rayJobOverhead"))


def _download(inputs: StartupInputs) -> tuple[str, float, str]:
    rate = min(minutes("hubDownloadRate"), inputs.lustre_gb_per_s)
    return (
        f"weights download ({inputs.model})",
        inputs.model_gb / rate / 60,
        f"{inputs.model_gb:.1f} GB ({inputs.model_parameters_b:g}B x 2 bytes; {inputs.model_source}) at "
        f"{rate:g} GB/s (hubDownloadRate, Lustre {inputs.lustre_gb_per_s:.1f} GB/s)",
    )


def _preflight_nccl(inputs: StartupInputs, cuts: Cuts, warm: bool) -> list[tuple[str, float, str]]:
    return [_overhead("preflight-nccl"), ("NCCL all-reduce", *_figure("preflightNccl"))]


def _preflight_lustre(inputs: StartupInputs, cuts: Cuts, warm: bool) -> list[tuple[str, float, str]]:
    io = inputs.preflight_lustre_gb / inputs.lustre_gb_per_s / 60
    source = f"{inputs.preflight_lustre_gb:.1f} GB written and read at {inputs.lustre_gb_per_s:.1f} GB/s (Lustre)"
    return [_overhead("preflight-lustre"), ("Lustre write/read test", io, source)]


def _prepare_data(inputs: StartupInputs, cuts: Cuts, warm: bool) -> list[tuple[str, float, str]]:
    if warm:  # prepare_gsm8k.py skips when its manifest matches
        return [_overhead("prepare-data (skips: data complete)")]
    return [_overhead("prepare-data"), ("GSM8K download", *_figure("prepareData"))]


def _prefetch(inputs: StartupInputs, cuts: Cuts, warm: bool) -> list[tuple[str, float, str]]:
    if warm:
        return [_overhead("prefetch-weights (skips: marker complete)")]
    return [_overhead("prefetch-weights"), _download(inputs)]


def _eval_base(inputs: StartupInputs, cuts: Cuts, warm: bool) -> list[tuple[str, float, str]]:
    if warm and cuts.eval_cache:  # eval_model.py copies the earlier run's result: same model, arguments and image
        return [_overhead("eval-base (reuses the cached result)")]
    # The weights are counted once, where the uncut model downloads them (train), so this phase holds vLLM start-up
    # and the 1,319 problems only.
    evaluation = RUN_STEP_DURATIONS["eval-base"]
    return [_overhead("eval-base"), ("GSM8K evaluation of the base model", evaluation.minutes, evaluation.source)]


def _train(inputs: StartupInputs, cuts: Cuts, warm: bool) -> list[tuple[str, float, str]]:
    phases = [_overhead("train")]
    if not cuts.prefetch and not warm:
        # The policy and vLLM download the weights themselves while they start; both wait for them.
        phases.append(_download(inputs))
    vllm, source = _figure("vllmInit")
    if warm and cuts.compile_cache:
        vllm = vllm - minutes("vllmCompile") + minutes("compileCacheLoad")
        source += "; compilation from the cache on Lustre (vllmCompile -> compileCacheLoad)"
    setup = max(vllm, minutes("policyInit")) + minutes("setupOther")
    phases.append(("vLLM set-up", setup, f"vLLM and the policy in parallel, then the rest: {source}"))
    if inputs.seconds_per_step is None:
        phases.append((FIRST_STEP, 0.0, "unknown: no step time for the recipe (estimatedRun); set secondsPerStep"))
    else:
        phases.append(
            (FIRST_STEP, inputs.seconds_per_step / 60, "estimatedRun.firstStepSeconds (its source in cost.txt)")
        )
    return phases


STEP_PHASES: Mapping[str, StepCost] = {
    "preflight-nccl": _preflight_nccl,
    "preflight-lustre": _preflight_lustre,
    "prepare-data": _prepare_data,
    "prefetch-weights": _prefetch,
    "eval-base": _eval_base,
    "train": _train,
}


def step_cost(step: str) -> StepCost | None:
    """The step's row; a benchmark's train-<recipe> steps cost what train does."""
    return STEP_PHASES.get(step) or (_train if step.startswith("train-") else None)


# ---------------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Result:
    cold: Schedule  # with the plan's cuts
    uncut: Schedule  # the same phases without them
    warm: Schedule
    inputs: StartupInputs
    cold_worst: Schedule | None = None  # with the cuts, Managed Lustre at its tier's worst-case creation time

    @property
    def step_known(self) -> bool:
        return self.inputs.seconds_per_step is not None

    @property
    def cold_worst_minutes(self) -> float:
        return (self.cold_worst or self.cold).end[FIRST_STEP]

    @property
    def cold_minutes(self) -> float:
        return self.cold.end[FIRST_STEP]

    @property
    def uncut_minutes(self) -> float:
        return self.uncut.end[FIRST_STEP]

    @property
    def warm_minutes(self) -> float:
        return self.warm.end[FIRST_STEP]

    @property
    def warm_reaches_step(self) -> float:
        return self.warm.start(FIRST_STEP)

    def dominant(self) -> tuple[str, str, float]:
        """(name, kind, minutes) of the longest single phase on the cold path with the cuts: a start-up phase, or a
        provisioning resource on the path to the milestone it starts from."""
        chain = self.cold.chain(FIRST_STEP)
        candidates = [(name, name, self.cold.phases[name].minutes) for name in chain]
        first = self.cold.phases[chain[0]]
        if first.at is not None:
            candidates += [
                (label, kind, end - start)
                for label, kind, start, end in self.inputs.provisioning_path
                if end <= first.at + 1e-9
            ]
        return max(candidates, key=lambda c: c[2])


def model(inputs: StartupInputs) -> Result:
    worst = dataclasses.replace(inputs, milestones=inputs.worst_milestones) if inputs.worst_milestones else inputs
    return Result(
        cold=build(inputs, inputs.cuts),
        uncut=build(inputs, Cuts()),
        warm=build(inputs, inputs.cuts, warm=True),
        inputs=inputs,
        cold_worst=build(worst, inputs.cuts),
    )


UNKNOWN_STEP = "seconds per step unknown: set secondsPerStep"


def _lustre_range(inputs: StartupInputs) -> str:
    if inputs.lustre_tier not in provisioning.LUSTRE_CREATION:
        return ""
    creation = provisioning.LUSTRE_CREATION[inputs.lustre_tier]
    return (
        f"Managed Lustre {creation.typical.minutes:g}-{creation.worst.minutes:g} min at {inputs.lustre_tier} MB/s/TiB; "
    )


def summary_lines(result: Result) -> list[str]:
    """The two lines `make plan` prints and timeline.txt holds: the cold range runs from Managed Lustre's typical to
    its worst-case creation time. Without a step time, when the first step starts, and that its end is unknown."""
    lustre = _lustre_range(result.inputs)
    if result.step_known:
        return [
            f"first GRPO step, cold: {result.cold_minutes:.1f}-{result.cold_worst_minutes:.1f} min "
            f"({lustre}without the start-up cuts: {result.uncut_minutes:.1f} min)",
            f"first GRPO step, warm: {result.warm_minutes:.1f} min",
        ]
    return [
        f"first GRPO step, cold: unknown (it starts at {result.cold_minutes:.1f}-{result.cold_worst_minutes:.1f} "
        f"min; {lustre}without the start-up cuts at {result.uncut_minutes:.1f} min); {UNKNOWN_STEP}",
        f"first GRPO step, warm: unknown (it starts at {result.warm_minutes:.1f} min); {UNKNOWN_STEP}",
    ]


def table_row(stack: str, result: Result) -> str:
    """docs/design.md's Faster start-up row for a stack: cold with the cuts, cold without them, warm."""
    if result.step_known:
        cells = [
            f"{result.cold_minutes:.1f}-{result.cold_worst_minutes:.1f} min",
            f"{result.uncut_minutes:.1f} min",
            f"{result.warm_minutes:.1f} min",
        ]
    else:
        cells = [
            f"unknown (starts at {result.cold_minutes:.1f}-{result.cold_worst_minutes:.1f} min)",
            f"unknown (starts at {result.uncut_minutes:.1f} min)",
            f"unknown (starts at {result.warm_minutes:.1f} min)",
        ]
    return f"| `{stack}` | " + " | ".join(cells) + " |"


def _schedule_lines(schedule: Schedule) -> list[str]:
    lines = []
    for name in schedule.chain(FIRST_STEP):
        phase = schedule.phases[name]
        if phase.minutes <= 0 and phase.at is None:
            continue
        lines.append(f"  {schedule.start(name):6.2f} -> {schedule.end[name]:6.2f}  {name}")
    return lines


def render(result: Result) -> str:
    inputs = result.inputs
    name, kind, length = result.dominant()
    known = inputs.seconds_per_step is not None
    step = f"first step {inputs.seconds_per_step:g} s (estimatedRun)" if known else "first step: seconds unknown"
    lines = [
        "From `pulumi up` to the end of the first GRPO step (modeled minutes; figures from one table, not measured)",
        "",
        *summary_lines(result),
        f"warm re-run reaches its first GRPO step at {result.warm_reaches_step:.1f} min",
        "",
        f"Start-up cuts in this plan: {', '.join(inputs.cuts.names()) or 'none'}",
        f"Dominant phase with the cuts: {name} ({length:.1f} min of {result.cold_minutes:.1f}); next cut: "
        f"{NEXT_CUTS.get(kind, NEXT_CUTS.get(name, 'see docs/design.md, Faster start-up'))}",
        "",
        "Cold, with the cuts (the phases that set the end, start -> end):",
        *_schedule_lines(result.cold),
        "",
        "Cold, without the start-up cuts:",
        *_schedule_lines(result.uncut),
        "",
        "Warm (the job stack run again on the kept infra stack):",
        *_schedule_lines(result.warm),
        "",
        f"Sizes: image {inputs.image_gb:g} GB; {inputs.model} {inputs.model_gb:.1f} GB; Lustre "
        f"{inputs.lustre_gb_per_s:.1f} GB/s (capacity x tier); {inputs.train_nodes} training node(s); {step}",
        "Figures used:",
        *(f"  {key}: {f.value:g} {f.unit}: {f.source}" for key, f in FIGURES.items()),
    ]
    return "\n".join(lines) + "\n"
