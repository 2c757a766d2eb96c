"""The job settings, one field per config key of jobs/Pulumi.yaml, validated against the infra stack they run on
before any resource is registered. Pulumi.yaml's config block and docs/configuration.md's job table are written from
this model (tools/config_docs.py)."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import Annotated, Any

from config_rules import (
    Allowed,
    ConfigError,
    Flag,
    Number,
    Secret,
    Settings,
    Shown,
    Text,
    WholeNumber,
    keys_of,
    validated,
)
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from launcher import nemo_rl_rules, performance
from launcher.benchmark_settings import (
    BENCHMARK_IGNORES,
    BENCHMARK_MEASURED_STEPS,
    BENCHMARK_MIN_STEPS,
    DEFAULT_BENCHMARK_RECIPES,
    BenchmarkRecipe,
    benchmark_recipes,
)
from launcher.infra_outputs import InfraOutputs

# Each retry resumes from the newest checkpoint; past a handful, a run that keeps failing needs a person.
MAX_RESTARTS = 20
MAX_RERUN = 999  # keeps a rerun's submission id (<runName>-<step>-rerunN-rK) within Ray's and our limits
# A Hugging Face repository id as the hub accepts one: [owner/]name, each part 1-96 letters, digits, '-', '_' or
# '.', neither starting nor ending with '-' or '.', and no '--' or '..' anywhere.
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
# The job setting dataset: where the rows come from, and which of their fields hold the problem and the answer.
_GS_SOURCE_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,61}[a-z0-9])/(\S+\.jsonl)$")
_HF_SOURCE_RE = re.compile(rf"^hf://datasets/({_HF_PART}/{_HF_PART})(?:@([A-Za-z0-9._/-]{{1,100}}))?/(\S+\.jsonl)$")
# A row's field: a letter or '_', then letters, digits, '_' or '-', at most 64 characters.
_ROW_FIELD = Annotated[
    Text,
    Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"),
    Allowed(
        "the name of a top-level field of every row: a letter or '_', then letters, digits, '_' or '-', at most 64 "
        "characters"
    ),
]
# The GKE NeMo RL tutorial's variables (its `export NAME=...` lines), by their letters alone (case, '_' and '-'
# dropped), that a job stack sets under another name or not at all: the hint for each.
KEY_ALIASES = {
    "replicacount": "did you mean 'numNodes'? (the run's GPU nodes; the infra's rayWorkerReplicas is the most)",
    "worldsize": "did you mean 'numNodes'? (the run's GPUs are numNodes x the infra's gpusPerNode)",
    "hftoken": "the token is the infra stack's secret: pulumi config set --secret hfToken hf_... in the infra project",
    "wandbapikey": "the key is the infra stack's secret: pulumi config set --secret wandbApiKey KEY in the infra "
    "project",
}


def _rerun_number(value: Any) -> int:
    """0..MAX_RERUN, "1" as text too; any other value is refused with the rerun's rule (not a whole number's)."""
    number = int(value) if isinstance(value, str) and value.isdigit() else value
    if isinstance(number, int) and not isinstance(number, bool) and 0 <= number <= MAX_RERUN:
        return number
    raise PydanticCustomError("rerun_number", "a rerun number")


class DatasetSettings(Settings):
    """The user's own JSONL rows instead of GSM8K (the job setting dataset), prepared on Lustre by prepare_jsonl.py."""

    # gs://BUCKET/OBJECT.jsonl, a file under the Lustre mount, or hf://datasets/OWNER/NAME[@REV]/FILE.jsonl
    source: str = Field(None, validate_default=True)
    problem_field: _ROW_FIELD = Field(alias="problemField")
    answer_field: _ROW_FIELD = Field(alias="answerField")
    test_source: str = Field("", alias="testSource")  # "" holds a share of source out for validation and evaluation
    # In the accuracy line; "" names it after the source file.
    name: Annotated[
        Text,
        Field(pattern=r"^([A-Za-z0-9][A-Za-z0-9 ._-]{0,39})?$"),
        Allowed("1-40 letters, digits, spaces, '.', '_' or '-', starting with a letter or digit"),
    ] = ""

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, raw: Any) -> Any:
        """An unknown field is refused with its value, naming the fields (not as an unknown config key)."""
        fields = list(keys_of(cls))
        for field in raw if isinstance(raw, dict) else ():
            if field not in fields:
                match = difflib.get_close_matches(str(field), fields, n=1)
                hint = f"; did you mean '{match[0]}'?" if match else ""
                raise ConfigError(f"dataset.{field}", raw[field], f"a field of dataset: {', '.join(fields)}{hint}")
        return raw

    @field_validator("source", "test_source", mode="before")
    @classmethod
    def _jsonl_file(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name == "test_source" and value in (None, ""):
            return ""
        mount = f"{(info.context or {})['infra'].mount_path}/"
        if isinstance(value, str) and (
            value.endswith(".jsonl") and ".." not in value.split("/") and not re.search(r"\s", value)
            if value.startswith(mount)
            else _GS_SOURCE_RE.match(value) or _HF_SOURCE_RE.match(value)
        ):
            return value
        raise ConfigError(
            f"dataset.{'testSource' if info.field_name == 'test_source' else 'source'}",
            value,
            f"a JSONL file: gs://BUCKET/PATH.jsonl (read with the Ray service account), a file on Lustre under {mount} "
            f"(e.g. {mount}datasets/mine/rows.jsonl), or hf://datasets/OWNER/NAME[@REVISION]/PATH.jsonl on the "
            "Hugging Face hub (read with HF_TOKEN)",
        )

    @model_validator(mode="after")
    def _two_fields(self) -> DatasetSettings:
        if self.problem_field == self.answer_field:
            raise ConfigError("dataset.answerField", self.answer_field, "a field other than dataset.problemField")
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        hub = _HF_SOURCE_RE.match(self.source)
        if hub:
            return hub[1].split("/")[1]
        return self.source.rsplit("/", 1)[1].removesuffix(".jsonl")

    @property
    def folder(self) -> str:
        """The prepared files' folder under datasets/: one per source and fields, so a change prepares anew."""
        what = json.dumps([self.source, self.test_source, self.problem_field, self.answer_field])
        return f"jsonl-{hashlib.sha256(what.encode()).hexdigest()[:12]}"


class RunSettings(Settings):
    """The run: its name, the infra it runs on, and how its Kubernetes Job and Ray jobs behave (jobs/launcher/job.py,
    jobs/launcher/steps.py)."""

    infra_stack: Annotated[
        Text,
        Field(alias="infraStack", pattern=r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+){0,2}$"),
        Allowed("the infra stack, e.g. organization/nemo-rl-gke/h200"),
    ]
    """Fully qualified infra stack, e.g. `organization/nemo-rl-gke/h200`."""
    run_name: Annotated[
        Text,
        # A Kubernetes name that also suits a Ray submission id; suffixes of up to 16 characters are added to it.
        Field(alias="runName", pattern=r"^[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?$"),
        Allowed(
            "1-40 characters: a lowercase letter, then lowercase letters, digits or '-', ending in a letter or digit "
            "(a Kubernetes name and Ray submission id prefix)"
        ),
    ] = "grpo-gsm8k"
    """Prefix of the Job, the ConfigMap and the Ray submission ids, and the output directory `/data/<runName>`. 1–40
    characters: lowercase letter first, then lowercase letters, digits, hyphens. A new name starts a fresh run."""
    max_restarts: Annotated[
        WholeNumber,
        Field(alias="maxRestarts", ge=0, le=MAX_RESTARTS),
        Allowed(f"0..{MAX_RESTARTS}: retries of a failed training attempt (0 = none)"),
    ] = 3
    """Times a FAILED train attempt is submitted again (`<runName>-train-r1` …), 0..20; each attempt resumes from the
    newest complete checkpoint. STOPPED is never retried."""
    # A number, not a flag, so that a new pod of the same Job (an eviction, a retry) skips a rerun that already
    # succeeded, and raising it reruns the step once more; 0 is none. launcher.steps checks the step names.
    rerun: Annotated[
        dict[
            str,
            Annotated[
                int,
                BeforeValidator(_rerun_number),
                Allowed(f"a whole number 0..{MAX_RERUN}: raise it by one to run the step again"),
            ],
        ],
        AfterValidator(lambda numbers: {name: number for name, number in numbers.items() if number}),
        Allowed('a map of step name to rerun number, e.g. {"eval-final": 1}'),
        Shown("none"),
    ] = Field(default_factory=dict)
    """Steps to run again, each with a number: a map of step name to rerun number, e.g. `pulumi config set --path
    'rerun["eval-final"]' 1`. A named step runs under the id `<runName>-<step>-rerunN` with its own outcome record
    `<step>.rerunN.json`; raise the number to run it once more (see [Run a step
    again](operations.md#run-a-step-again)). A name that is not one of the run's steps, or a number outside 0..999,
    is refused."""
    stop_on_delete: Annotated[Flag, Field(alias="stopOnDelete")] = True
    """`pulumi destroy` of the job stack stops the run's Ray job (see [Run lifecycle](operations.md#run-lifecycle));
    gives the submitter a token that can only `get` its Job, the run marker and nodes (the run's blocks and
    sub-blocks after the NCCL pre-flight)."""
    wait_for_workers_minutes: Annotated[WholeNumber, Field(alias="waitForWorkersMinutes", ge=1)] = 60
    """How long one submitter pod waits for the GPU workers before it exits 4 and the Job retries it (up to
    `backoffLimit` 4 times)."""
    archive: Flag = False
    """A last step, `archive`: copies the newest complete checkpoint `/data/<runName>/step_N` and, with `convertToHf`,
    `/data/<runName>/hf` to `gs://<bucket>/<runName>.archive/` in the infra's export bucket, then checks every
    object's size and MD5 against the local file (see [Archiving a
    run](operations.md#archiving-a-run-then-deleting-lustre)). Refused without an infra `exportBucket`, and with
    `benchmark`."""
    seconds_per_step: Annotated[
        Number | None,
        Field(alias="secondsPerStep", gt=0, allow_inf_nan=False),
        Allowed("a positive number of seconds"),
        Shown("empty"),
    ] = None
    """Seconds one training step takes, for the run estimate (`estimatedRun`, `cost.txt`, the first-step model) only;
    when set it always wins. Empty: the step-time table's sourced figure for the recipe, mode and GPU type, scaled
    linearly to the run's samples per step and training GPUs (an assumption), e.g. 942.51 s for the tutorial's Gemma
    3 27B on H200/B200 ([cost.md](cost.md#what-a-step-takes)); a recipe without a row (the dev and smoke stacks'
    Qwen2.5-Math 1.5B) gets no number: the step time and the totals that depend on it are unknown until you set it."""


class PreflightSettings(Settings):
    """The NCCL and Lustre checks before training (jobs/launcher/steps.py, jobs/preflight/)."""

    preflight_enabled: Annotated[Flag, Field(alias="preflight")] = True
    """Run the NCCL and Lustre checks before training."""
    preflight_min_busbw_gbps: Annotated[
        Number, Field(alias="preflightMinBusbwGbps", gt=0), Allowed("a positive GB/s figure")
    ] = 100
    """NCCL pass mark: all-reduce bus bandwidth at the largest message, GB/s (the figure Cluster Toolkit's A3 Ultra
    health check uses)."""
    preflight_lustre_gib_per_node: Annotated[
        Number, Field(alias="preflightLustreGibPerNode", gt=0), Allowed("a positive size in GiB")
    ] = 16
    """GiB each GPU node writes and reads in the Lustre check."""
    preflight_lustre_min_fraction: Annotated[
        Number, Field(alias="preflightLustreMinFraction", gt=0, le=1), Allowed("a fraction in (0, 1]")
    ] = 0.5
    """Lustre pass mark: fraction of the throughput the nodes can expect from the instance, in (0, 1]."""


class RecipeSettings(Settings):
    """What trains: the NeMo RL recipe, the model and data, and the sizes the launcher overrides in it
    (jobs/launcher/overrides.py, checked by jobs/launcher/nemo_rl_rules.py)."""

    recipe: Annotated[
        Text,
        Field(pattern=r"^examples/configs/(?!.*\.\.).*\.yaml$"),
        Allowed("a NeMo RL recipe path under examples/configs/ ending in .yaml"),
    ] = "examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-long.yaml"
    """NeMo RL recipe, relative to the NeMo RL sources in the image; must lie under `examples/configs/` and end in
    `.yaml`."""
    model: Annotated[
        Text,
        # Surrounding spaces are dropped (after the rule, so that a refusal shows the value as given).
        Field(pattern=rf"^\s*(?!.*(--|\.\.))((?:{_HF_PART}/)?{_HF_PART})?\s*$"),
        AfterValidator(str.strip),
        Allowed(
            "a Hugging Face model id, OWNER/NAME (e.g. Qwen/Qwen2.5-Math-7B-Instruct): letters, digits, '-', '_', '.', "
            "each part at most 96 characters, not starting or ending with '-' or '.', no '--' or '..'; empty for the "
            "recipe's policy.model_name"
        ),
    ] = ""
    """Empty: the recipe's own `policy.model_name`. Otherwise a Hugging Face model id (`OWNER/NAME`, e.g.
    `Qwen/Qwen2.5-Math-7B-Instruct`; the hub's rules: letters, digits, `-`, `_`, `.`, no `--` or `..`, at most 96
    characters a part) that the run trains: it sets `policy.model_name` and `policy.tokenizer.name` (every shipped
    recipe names its tokenizer itself, so the model alone would keep the old tokenizer), `prefetch-weights` downloads
    it, and both evaluations follow it (`eval-base` evaluates it before training, `eval-final` the model trained from
    it). An `extraOverrides` entry setting `policy.model_name` is refused: this key is the one way to say it. Fit is
    not checked by the plan: the launcher holds no attention-head count or memory size of any model; `pulumi up` says
    so in a warning (`model ...: fit unchecked here`). The `prefetch-weights` step reads the model's own
    `config.json` once it is in the cache and fails, before training, when `vllmTensorParallelSize` does not divide
    its attention heads (vLLM's rule; the message lists the sizes that do); whether `dtensorTensorParallelSize` suits
    it and its weights fit the GPUs is left to NeMo RL and vLLM at start-up."""
    dataset: Annotated[
        DatasetSettings | None,
        Shown("none (GSM8K)"),
        Allowed("an object {source, problemField, answerField[, testSource, name]}, or unset for GSM8K"),
    ] = None
    """Object: your own JSONL rows instead of GSM8K (see [Your own dataset](#your-own-dataset)). Fields: `source`
    (required: `gs://BUCKET/PATH.jsonl`, a file on Lustre under `/data/` ending in `.jsonl`, or
    `hf://datasets/OWNER/NAME[@REVISION]/PATH.jsonl`), `problemField` and `answerField` (required: the top-level
    field of each row holding the problem and its final answer; a letter or `_`, then letters, digits, `_` or `-`, at
    most 64 characters; not the same field), `testSource` (optional, a source of the same kinds: the rows validated
    and evaluated on; without it 5% of `source` is held out), `name` (optional, 1-40 letters, digits, spaces, `.`,
    `_`, `-`: the dataset in the accuracy line; default the source's file name, or the hub dataset's name). A field
    not listed is refused, naming the closest one."""
    num_nodes: Annotated[WholeNumber, Field(alias="numNodes", ge=1)] = 2
    """GPU nodes the run uses (`cluster.num_nodes`); at most the infra's `rayWorkerReplicas`. Runs of one cluster are
    admitted by it: side by side while their `numNodes` fit in `rayWorkerReplicas`, else queued (see [Several runs on
    one cluster](operations.md#several-runs-on-one-cluster))."""
    generation_nodes: Annotated[WholeNumber, Field(alias="generationNodes")] = 1
    """Nodes given to vLLM generation, below `numNodes`; `0` colocates generation with training."""
    max_num_steps: Annotated[WholeNumber, Field(alias="maxNumSteps", ge=1)] = 10
    """`grpo.max_num_steps`."""
    num_prompts_per_step: Annotated[WholeNumber, Field(alias="numPromptsPerStep", ge=1)] = 16
    """`grpo.num_prompts_per_step`."""
    num_generations_per_prompt: Annotated[WholeNumber, Field(alias="numGenerationsPerPrompt", ge=1)] = 32
    """`grpo.num_generations_per_prompt` (the GRPO group size). Their product is the training batch,
    `policy.train_global_batch_size` (every sample of a step in one optimizer step; NeMo RL makes `samples //
    train_global_batch_size` optimizer steps, so with a recipe's fixed 512 fewer samples train nothing and more are
    split or refused). It must be a multiple of the data-parallel ranks: training GPUs / `dtensorTensorParallelSize`
    (training GPUs: all with colocated generation, else those of the nodes left after `generationNodes`); with a
    Megatron recipe (below), training GPUs / (TP × PP × CP) of its `policy.megatron_cfg`."""
    vllm_tensor_parallel_size: Annotated[WholeNumber, Field(alias="vllmTensorParallelSize", ge=1)] = 8
    """vLLM tensor parallelism; divides the generation GPUs, at most one node's GPUs."""
    vllm_gpu_memory_utilization: Annotated[
        Number | None,
        Field(alias="vllmGpuMemoryUtilization", gt=0, le=1),
        Allowed("a fraction in (0, 1]"),
        Shown("empty"),
    ] = None
    """Fraction of GPU memory vLLM may use, in (0, 1]. Empty: `0.9` (vLLM's own default) on dedicated generation nodes;
    with colocated generation (`generationNodes: 0`) the recipe's value, `0.6` in NeMo RL's base config, which leaves
    the rest to training."""
    dtensor_tensor_parallel_size: Annotated[WholeNumber, Field(alias="dtensorTensorParallelSize", ge=1)] = 8
    """`policy.dtensor_cfg.tensor_parallel_size`; divides the training GPUs. A recipe of `recipes/llm/performance/`
    trains with Megatron (`policy.megatron_cfg.enabled`; the table `jobs/launcher/performance.py` holds each one's
    sizes, checked against both releases with NeMo RL's own loader): the run then keeps the recipe's
    `tensor_model_parallel_size`, `pipeline_model_parallel_size` and `context_parallel_size` (change them with
    `extraOverrides`), the training GPUs must divide by their product, another value of this key is refused, and so
    is `convertToHf` (the conversion converts DTensor checkpoints only)."""
    convert_to_hf: Annotated[Flag, Field(alias="convertToHf")] = True
    """Convert the newest checkpoint to Hugging Face format in `/data/<runName>/hf`."""
    extra_overrides: Annotated[
        tuple[Text, ...], Field(alias="extraOverrides"), Allowed("a list of key=value NeMo RL overrides")
    ] = ()
    """Extra NeMo RL overrides (`key=value`, `+key=value`, `++key=value`, `~key`), applied last so they win; checked
    against the recipe's keys in the release (see [Recipe and override check](#recipe-and-override-check)). Keys the
    launcher derives and validates (`policy.train_global_batch_size`, `grpo.num_prompts_per_step`,
    `grpo.num_generations_per_prompt`, `cluster.num_nodes`, `cluster.gpus_per_node`,
    `policy.dtensor_cfg.tensor_parallel_size`), and `policy.model_name` (set `model`), are refused: set the job
    setting instead."""
    async_grpo: Annotated[Flag, Field(alias="asyncGrpo")] = False
    """1-step off-policy (async) GRPO: generation runs ahead on its own nodes while training works (see [Async
    GRPO](#async-grpo-1-step-off-policy)). Refused with `generationNodes: 0`. Sets `grpo.async_grpo.enabled`,
    `grpo.async_grpo.in_flight_weight_updates`, `loss_fn.use_importance_sampling_correction` and
    `policy.generation.vllm_cfg.async_engine` (all `true`); an `extraOverrides` entry that turns one of them off, or
    turns on dynamic sampling, reward scaling or shaping, multiple dataloaders or an FP8 KV cache (all refused by
    NeMo RL's async path), is refused."""
    max_trajectory_age_steps: Annotated[WholeNumber, Field(alias="maxTrajectoryAgeSteps", ge=1)] = 1
    """With `asyncGrpo`, how many steps old a trajectory may be when trained on
    (`grpo.async_grpo.max_trajectory_age_steps`); must stay 1 without it."""

    @property
    def train_global_batch_size(self) -> int:
        """Samples per GRPO step, all trained on in one optimizer step. NeMo RL's trainer makes
        samples // train_global_batch_size optimizer steps: with a larger batch none runs (an UnboundLocalError),
        with a smaller one the step is split, or refused when the batch does not divide the samples."""
        return self.num_prompts_per_step * self.num_generations_per_prompt


class EvaluationSettings(Settings):
    """The GSM8K evaluations before and after training (the steps eval-base and eval-final)."""

    eval_base: Annotated[Flag, Field(alias="evalBase")] = True
    """Before training, evaluate the recipe's model (or `model`) on GSM8K's test split (or `dataset`'s test rows) (step
    `eval-base`: NeMo RL's `run_eval.py`, greedy pass@1) into `/data/<runName>/eval/base`."""
    eval_final: Annotated[Flag, Field(alias="evalFinal")] = True
    """After conversion, evaluate the trained model the same way (step `eval-final`) into `/data/<runName>/eval/final`;
    needs `convertToHf` (with `convertToHf: false`, set it to `false` too). The Job's log ends with both accuracies."""


class BenchmarkSettings(Settings):
    """NeMo RL's performance recipes instead of the run."""

    benchmark: Flag = False
    """Run NeMo RL's performance recipes (`benchmarkRecipes`) instead of the run (see
    [Benchmark](#benchmark-does-this-cluster-perform)); each recipe's cluster must fit the infra, and it needs
    `convertToHf: false` (and `archive: false`), `maxNumSteps` of 7 or more, and refuses the run's own keys
    (`recipe`, sizes, `asyncGrpo`, `extraOverrides`, `secondsPerStep`) at other values than their defaults."""
    benchmark_recipe_names: Annotated[
        list[Text] | Text,
        Field(alias="benchmarkRecipes"),
        Allowed("a performance recipe's name (e.g. grpo-qwen3-32b-4n8g), or a list of them, run one after the other"),
        Shown("the Llama 3.1 8B trio"),
    ] = Field(default_factory=lambda: list(DEFAULT_BENCHMARK_RECIPES))
    """With `benchmark`: one recipe of the image's release's `examples/configs/recipes/llm/performance/` (its file name,
    e.g. `grpo-qwen3-32b-4n8g`: `pulumi config set benchmarkRecipes grpo-qwen3-32b-4n8g`) or a list of them (`pulumi
    config set --path 'benchmarkRecipes[0]' ...`), run one after the other. Unset: `grpo-llama3.1-8b-instruct-2n8g`,
    `...-2n8g-async-1off` and `...-2n8g-fp8-async-1off`. The run is sized from each recipe (`cluster.num_nodes` ×
    `cluster.gpus_per_node`); a recipe the infra cannot hold (fewer GPU workers, other GPUs per node), one on another
    dataset than OpenMathInstruct-2 (DAPO's) or one whose model is NVIDIA's placeholder for a converted checkpoint
    (DeepSeek V3 at v0.7.0) is refused in one line naming the recipes that fit."""


class JobSettings(BenchmarkSettings, EvaluationSettings, RecipeSettings, PreflightSettings, RunSettings):
    """All the parts at once, as the pipeline takes them; the rules here tie them to each other and to the infra."""

    # What the keys make of the infra they run on, set once by the model validator.
    _benchmark_recipes: tuple[BenchmarkRecipe, ...] = PrivateAttr(())
    _training: tuple[str, tuple[int, int, int]] = PrivateAttr((performance.DTENSOR, (1, 1, 1)))

    @model_validator(mode="after")
    def _cross_key_rules(self, info: ValidationInfo) -> JobSettings:
        infra: InfraOutputs = (info.context or {})["infra"]
        if self.benchmark:
            self._benchmark_recipes = self._chosen_benchmark(infra)
            # The benchmark runs its recipes on their own cluster shape: the run holds the largest of them.
            self.__dict__["num_nodes"] = max(item.recipe.num_nodes for item in self._benchmark_recipes)
        elif "benchmark_recipe_names" in self.model_fields_set:
            raise ConfigError("benchmarkRecipes", self.benchmark_recipe_names, "unset unless benchmark is true")
        self._training = nemo_rl_rules.check_cluster(self, infra)
        if self.vllm_gpu_memory_utilization is None and self.generation_nodes:
            self.__dict__["vllm_gpu_memory_utilization"] = nemo_rl_rules.DEDICATED_VLLM_GPU_MEMORY_UTILIZATION
        nemo_rl_rules.check_overrides(self)
        if self.benchmark and self.max_num_steps < BENCHMARK_MIN_STEPS:
            raise ConfigError(
                "maxNumSteps",
                self.max_num_steps,
                f"{BENCHMARK_MIN_STEPS} or more with benchmark: the summary averages {BENCHMARK_MEASURED_STEPS} steps "
                "after the first (start-up) and before the last (validation and checkpoint)",
            )
        if self.eval_final and not self.convert_to_hf:
            raise ConfigError(
                "evalFinal", True, "false when convertToHf is false: the trained model is evaluated in HF format"
            )
        if self.archive and not infra.export_bucket:
            raise ConfigError(
                "archive",
                True,
                "false unless the infra stack has an export bucket to copy the checkpoints to: set exportBucket there "
                "(create, or the name of a bucket you own) and run `pulumi up` in the infra project first",
            )
        nemo_rl_rules.check_model(self, infra)
        return self

    def _chosen_benchmark(self, infra: InfraOutputs) -> tuple[BenchmarkRecipe, ...]:
        """NeMo RL's performance recipes, as they are: the keys the benchmark would ignore are refused."""
        given = self.benchmark_recipe_names
        chosen = benchmark_recipes([given] if isinstance(given, str) else given, infra)
        fields, values = keys_of(JobSettings), self.model_dump(by_alias=True)
        ignored = [key for key in BENCHMARK_IGNORES if values[key] != fields[key].default]
        if ignored:
            raise ConfigError(
                "benchmark",
                True,
                f"runs NeMo RL's performance recipes unchanged (but for paths and maxNumSteps), so "
                f"{', '.join(ignored)} would be ignored: remove them from the benchmark's job stack",
            )
        for key in ("convertToHf", "archive", "evalBase", "evalFinal"):
            if values[key]:
                speed = key.startswith("eval")
                why = (
                    "it measures speed, on NVIDIA's data, not accuracy"
                    if speed
                    else "its checkpoints are not a model to keep"
                )
                raise ConfigError(key, True, f"false with benchmark: {why}")
        return chosen

    @property
    def benchmark_recipes(self) -> tuple[BenchmarkRecipe, ...]:
        """NeMo RL's performance recipes, unchanged, one after the other, instead of the run; () without benchmark."""
        return self._benchmark_recipes

    @property
    def training_backend(self) -> str:
        """Megatron for NeMo RL's performance recipes (policy.megatron_cfg.enabled), DTensor for any other."""
        return self._training[0]

    @property
    def training_parallel(self) -> tuple[int, int, int]:
        """TP, PP, CP: dtensorTensorParallelSize, 1, 1, or the Megatron recipe's (with extraOverrides applied)."""
        return self._training[1]


MODEL = JobSettings
SECRETS: dict[str, Secret] = {}  # the job stack's secrets are the infra stack's


def build_job_settings(values: dict[str, Any], infra: InfraOutputs) -> JobSettings:
    """Validate job config (camelCase keys, as in jobs/Pulumi.yaml) against the infra it runs on. Pure."""
    given = {key: value for key, value in values.items() if value not in (None, "", [], {})}  # unset: the default
    return validated(JobSettings, given, context={"infra": infra})
