"""The step-time table (jobs/launcher/step_times.py): sourced figures by recipe, no number for a recipe without one,
secondsPerStep first, the scaling it states, and what the run estimate and cost.txt make of them."""

from __future__ import annotations

import re

import pytest
from launcher import performance, step_times
from launcher.step_times import B200, GEMMA3_27B_RECIPE, H200, PUBLISHED, QWEN_1P5B_RECIPE, estimate
from upstream import reference

from tools import render


def gemma(gpu_type: str = H200, **changes: object) -> step_times.StepEstimate:
    shape: dict[str, object] = {
        "recipe": GEMMA3_27B_RECIPE,
        "async_grpo": False,
        "gpu_type": gpu_type,
        "num_nodes": 2,
        "generation_nodes": 1,
        "gpus_per_node": 8,
        "samples_per_step": 16 * 32,
        "user_seconds": None,
    }
    shape.update(changes)
    return estimate(**shape)  # type: ignore[arg-type]


def test_every_row_says_what_it_counts_where_it_comes_from_and_when():
    for row in step_times.STEP_TIMES:
        assert row.seconds > 0 and row.samples_per_step > 0 and row.nodes > row.generation_nodes >= 0
        assert re.match(r"https://github\.com/\S+", row.source), row.recipe
        assert row.counts and row.date and row.measured_on and row.gpu_types
    # The tutorial's recipe: Google's GKE sample, 16 prompts x 64 generations on 3 A4 nodes (2 training, 1 vLLM).
    sample = step_times.find(GEMMA3_27B_RECIPE, False, B200)
    assert sample is not None and (sample.seconds, sample.samples_per_step, sample.nodes) == (942.51, 1024, 3)
    assert "kubernetes-engine-samples" in sample.source and "731.16 s policy training" in sample.counts
    # NVIDIA's DGX-H100 rows carried to H200, each with its recipe's shape; the Llama 3.1 8B trio the benchmark runs.
    for figure in PUBLISHED:
        found = step_times.find(figure.path, figure.async_grpo, H200, figure.release)
        assert (found is not None) == (figure.system == step_times.DGX_H100), figure
        if found is not None:
            assert found.seconds == figure.seconds_per_step and found.release == figure.release
            assert found.nodes * 8 == figure.gpus and "DGX-H100" in found.measured_on
    expected = {step_times.LLAMA_8B_SYNC_RECIPE: (False, 92.8), step_times.LLAMA_8B_ASYNC_RECIPE: (True, 64.8),
                step_times.LLAMA_8B_FP8_ASYNC_RECIPE: (True, 53.0)}  # fmt: skip
    for recipe, (mode, seconds) in expected.items():
        found = step_times.find(recipe, mode, H200, "v0.5.0")
        assert found is not None and found.seconds == seconds
    off = step_times.find(step_times.LLAMA_8B_ASYNC_RECIPE, True, H200)
    assert off is not None and off.first_step_seconds == 92.8  # the on-policy recipe on the same 16 GPUs
    fp8 = step_times.find(step_times.LLAMA_8B_FP8_ASYNC_RECIPE, True, H200)
    assert fp8 is not None and fp8.first_step_seconds is None  # no FP8 on-policy row


# --- NVIDIA's performance summaries, parsed -----------------------------------------------------------------------

SummaryRow = tuple[str, str, str, str, str, str, int, str, float, float, int]


def summary_rows(release: str) -> list[SummaryRow]:
    """Every benchmark row of the release's docs/about/performance-summary.md: (release, heading, algorithm, model,
    mode, precision, GPUs, system, tokens/s/GPU, seconds, T-max sequence length)."""
    text = (reference(f"nemo-rl-{release}") / "docs" / "about" / "performance-summary.md").read_text()
    rows: list[SummaryRow] = []
    version = table = system = precision = ""
    for line in text.splitlines():
        if line.startswith("## "):
            version = line[3:].strip()
        elif line.startswith("### "):
            table = line[4:].strip()
        elif line.startswith("* System:"):
            system = line.split(":", 1)[1].strip()
        elif line.startswith("* Precision:"):
            kinds = set(re.findall(r"(BF16|FP8)", line))
            assert len(kinds) == 1, line  # training and generation in the same precision
            precision = kinds.pop()
        elif re.match(r"^\|\s*(GRPO|DAPO|SWE)\s*\|", line):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            algorithm, model, policy, t_max, *_, tokens, seconds = cells
            gpus = int(cells[5])
            match = re.fullmatch(r"(\d+)-step Off", policy)
            mode = "sync" if policy == "On policy" else f"async-{match[1]}off" if match else policy
            rows.append((release, f"{version} / {table}", algorithm, model.replace(" ", "-"), mode, precision, gpus,
                         system, float(tokens.replace(",", "")), float(seconds.replace(",", "")),
                         int(t_max.replace(",", ""))))  # fmt: skip
    return rows


@pytest.mark.parametrize("release", ["v0.5.0", "v0.7.0"])
def test_every_published_row_is_the_summarys_own_and_names_a_recipe_of_its_release(release: str):
    parsed = summary_rows(release)
    assert len(parsed) > 10  # the parser read the tables
    ours = {
        (r.release, r.heading, r.algorithm, r.model, r.mode, r.precision, r.gpus, r.system, r.tokens_per_sec_per_gpu,
         r.seconds_per_step)
        for r in PUBLISHED if r.release == release
    }  # fmt: skip
    theirs = {row[:10] for row in parsed if (release, row[3], row[4], row[6]) not in step_times.NOT_IN_FOLDER}
    assert ours == theirs
    assert len(ours) == len([r for r in PUBLISHED if r.release == release])  # no row twice
    folder = reference(f"nemo-rl-{release}") / performance.PERFORMANCE_DIR
    names = [r.recipe for r in PUBLISHED if r.release == release]
    assert len(names) == len(set(names))  # one row per recipe
    for row in (r for r in PUBLISHED if r.release == release):
        assert (folder / f"{row.recipe}.yaml").is_file(), row.recipe
        recipe = performance.recipes_of(release)[row.recipe]
        # The recipe is the row's run: its GPUs, node size, mode, precision and dataset.
        assert recipe.gpus == row.gpus and recipe.gpus_per_node == (8 if row.system == "DGX-H100" else 4), row
        assert (recipe.async_grpo, recipe.fp8) == (row.async_grpo, row.precision == "FP8"), row
        if recipe.async_grpo:
            assert row.mode == f"async-{recipe.max_trajectory_age_steps}off"
        assert (recipe.dataset == performance.DAPO_MATH) == (row.algorithm == "DAPO")
        assert row.source.startswith(f"https://github.com/NVIDIA-NeMo/RL/blob/{release}/docs/about/")


def test_the_issues_figures_are_in_the_table():
    def seconds(release: str, recipe: str) -> float:
        row = step_times.published(release, recipe)
        assert row is not None, recipe
        return row.seconds_per_step

    assert (
        seconds("v0.5.0", "grpo-qwen3-32b-4n8g") == 376 and seconds("v0.5.0", "grpo-qwen3-32b-8n8g-async-1off") == 200
    )
    assert seconds("v0.5.0", "grpo-deepseek-v3-64n8g-async-1off") == 64.9
    fp8 = step_times.published("v0.5.0", "grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off")
    assert fp8 is not None and (fp8.tokens_per_sec_per_gpu, fp8.seconds_per_step, fp8.gpus) == (3052, 53.0, 16)
    # v0.7.0's summary (its v0.6 tables) has no Llama 3.1 8B row: the v0.5.0 figure is the one to compare with.
    assert step_times.published("v0.7.0", "grpo-llama3.1-8b-instruct-2n8g") is None
    found = step_times.published_for("v0.7.0", "grpo-llama3.1-8b-instruct-2n8g")
    assert found is not None and found.release == "v0.5.0"


@pytest.mark.parametrize("gpu_type", [H200, B200])
def test_h200_and_b200_get_the_tutorial_recipes_sourced_figure(gpu_type: str):
    found = gemma(gpu_type)
    # 512 samples on 8 training GPUs: half the sample's samples on half its training GPUs.
    assert found.seconds == pytest.approx(942.51) and found.first_step_seconds == pytest.approx(942.51)
    assert "kubernetes-engine-samples" in found.source
    assert any("scaled linearly" in note and "an assumption" in note for note in found.notes)
    assert any("used for H200" in note for note in found.notes) == (gpu_type == H200)


def test_the_scaling_is_linear_in_samples_and_inverse_in_training_gpus():
    assert gemma(samples_per_step=1024, num_nodes=3).seconds == pytest.approx(942.51)  # the sample's own shape
    assert not any("scaled" in note for note in gemma(samples_per_step=1024, num_nodes=3).notes)
    assert gemma(samples_per_step=2048, num_nodes=3).seconds == pytest.approx(2 * 942.51)
    assert gemma(num_nodes=5, generation_nodes=1).seconds == pytest.approx(942.51 / 4)


def test_a_recipe_or_shape_without_a_row_is_unknown_and_asks_for_seconds_per_step():
    cases = [
        estimate(recipe=QWEN_1P5B_RECIPE, async_grpo=False, gpu_type=H200, num_nodes=1, generation_nodes=0,
                 gpus_per_node=8, samples_per_step=64, user_seconds=None),
        estimate(recipe="examples/configs/recipes/llm/mine.yaml", async_grpo=False, gpu_type=H200, num_nodes=2,
                 generation_nodes=1, gpus_per_node=8, samples_per_step=64, user_seconds=None),
        gemma(async_grpo=True),  # measured synchronous only
        gemma(generation_nodes=0),  # measured non-colocated only
        gemma(gpu_type="nvidia-h100-80gb"),  # no H100 row for it
    ]  # fmt: skip
    for found in cases:
        assert found.seconds is None and found.first_step_seconds is None and not found.known
        assert len(found.notes) == 1 and "unknown" in found.notes[0] and "secondsPerStep" in found.notes[0]
    assert "Qwen2.5-Math 1.5B" in cases[0].notes[0]


def test_seconds_per_step_always_wins():
    for found in (gemma(user_seconds=300.0), gemma(user_seconds=300.0, async_grpo=True),
                  gemma(user_seconds=300.0, recipe=QWEN_1P5B_RECIPE)):  # fmt: skip
        assert found.seconds == found.first_step_seconds == 300.0 and found.source == "secondsPerStep"


def test_cost_txt_counts_steps_and_evaluations_on_separate_lines():
    run = {
        "nodes": 2, "steps": 10, "secondsPerStep": 942.51, "secondsPerStepFrom": "https://example.org/x",
        "stepGpuHours": 41.89, "stepUsd": 500.21, "evals": 2, "evalMinutes": 16, "evalGpuHours": 4.27,
        "evalUsd": 50.95, "gpuHours": 46.16, "usd": 551.16, "priceFrom": "table", "notes": [],
    }  # fmt: skip
    lines = render.run_lines(run)
    assert lines[0] == "one run, training steps: 2 GPU node(s) x 10 steps x 942.51 s = 41.89 GPU-hours, $500.21"
    assert lines[1] == "one run, evaluations: 2 GPU node(s) x 2 evaluation(s), 16 min = 4.27 GPU-hours, $50.95"
    assert lines[2].startswith("one run, steps and evaluations: 46.16 GPU-hours, $551.16 (not counted: the wait")
    unknown = {**run, "secondsPerStep": None, "stepGpuHours": None, "stepUsd": None, "gpuHours": None, "usd": None,
               "notes": ["seconds per step unknown for X: set the job setting secondsPerStep"]}  # fmt: skip
    text = "\n".join(render.run_lines(unknown))
    assert "x unknown s (set secondsPerStep) = unknown GPU-hours, unknown" in text
    assert "one run, steps and evaluations: unknown GPU-hours, unknown" in text
    assert "4.27 GPU-hours, $50.95" in text and "note: seconds per step unknown" in text
    assert "$" not in text.splitlines()[0] and "$" not in text.splitlines()[2]


@pytest.mark.parametrize("stack", ["h200", "b200"])
def test_the_shipped_gemma_plans_use_the_sourced_figure_everywhere(stack: str):
    from tools.plan_stacks import ROOT

    golden = ROOT / "tests" / "golden" / stack
    cost = (golden / "cost.txt").read_text()
    timeline = (golden / "timeline.txt").read_text()
    assert "x 10 steps x 942.51 s = 41.89 GPU-hours" in cost and "92.8" not in cost
    assert "one run, evaluations: 2 GPU node(s) x 2 evaluation(s), 16 min = 4.27 GPU-hours" in cost
    assert "first step 942.51 s (estimatedRun)" in timeline
