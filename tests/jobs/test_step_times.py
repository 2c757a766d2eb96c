"""The step-time table (jobs/launcher/step_times.py): sourced figures by recipe, no number for a recipe without one,
secondsPerStep first, the scaling it states, and what the run estimate and cost.txt make of them."""

from __future__ import annotations

import re

import pytest
from launcher import step_times
from launcher.settings import PUBLISHED_H100
from launcher.step_times import B200, GEMMA3_27B_RECIPE, H200, QWEN_1P5B_RECIPE, estimate

from tools import plan


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
    # NVIDIA's Llama 3.1 8B rows are the figures the benchmark compares with.
    for mode, published in PUBLISHED_H100.items():
        found = step_times.find(published.recipe, mode != "sync", H200)
        assert found is not None and found.seconds == published.seconds_per_step
    fp8 = step_times.find(step_times.LLAMA_8B_FP8_ASYNC_RECIPE, True, H200)
    assert fp8 is not None and fp8.seconds == 53.0


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
    lines = plan.run_lines(run)
    assert lines[0] == "one run, training steps: 2 GPU node(s) x 10 steps x 942.51 s = 41.89 GPU-hours, $500.21"
    assert lines[1] == "one run, evaluations: 2 GPU node(s) x 2 evaluation(s), 16 min = 4.27 GPU-hours, $50.95"
    assert lines[2].startswith("one run, steps and evaluations: 46.16 GPU-hours, $551.16 (not counted: the wait")
    unknown = {**run, "secondsPerStep": None, "stepGpuHours": None, "stepUsd": None, "gpuHours": None, "usd": None,
               "notes": ["seconds per step unknown for X: set the job setting secondsPerStep"]}  # fmt: skip
    text = "\n".join(plan.run_lines(unknown))
    assert "x unknown s (set secondsPerStep) = unknown GPU-hours, unknown" in text
    assert "one run, steps and evaluations: unknown GPU-hours, unknown" in text
    assert "4.27 GPU-hours, $50.95" in text and "note: seconds per step unknown" in text
    assert "$" not in text.splitlines()[0] and "$" not in text.splitlines()[2]


@pytest.mark.parametrize("stack", ["h200", "b200"])
def test_the_shipped_gemma_plans_use_the_sourced_figure_everywhere(stack: str):
    from tools.plan import ROOT

    golden = ROOT / "tests" / "golden" / stack
    cost = (golden / "cost.txt").read_text()
    timeline = (golden / "timeline.txt").read_text()
    assert "x 10 steps x 942.51 s = 41.89 GPU-hours" in cost and "92.8" not in cost
    assert "one run, evaluations: 2 GPU node(s) x 2 evaluation(s), 16 min = 4.27 GPU-hours" in cost
    assert "first step 942.51 s (estimatedRun)" in timeline
