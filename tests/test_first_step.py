"""The modeled start-up to the end of the first GRPO step (tools/first_step.py): its table, its rules, and the goal
the cuts are held to on the shipped stacks."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import ROOT
from launcher import checkpoints

from tools import first_step
from tools.plan_run import Plan, run_plan
from tools.plan_stacks import EXAMPLE_STACKS
from tools.plan_summary import summary
from tools.render import render_files

LINES = (
    re.compile(
        r"^first GRPO step, cold: (?:(\d+\.\d)-(\d+\.\d) min \(Managed Lustre \d+-\d+ min at \d+ MB/s/TiB; without "
        r"the start-up cuts: (\d+\.\d) min\)|unknown \(it starts at (\d+\.\d)-(\d+\.\d) min; Managed Lustre \d+-\d+ "
        r"min at \d+ MB/s/TiB; without the start-up cuts at (\d+\.\d) min\); seconds per step unknown: set "
        r"secondsPerStep)$"
    ),
    re.compile(
        r"^first GRPO step, warm: (?:(\d+\.\d) min|unknown \(it starts at (\d+\.\d) min\); seconds per step "
        r"unknown: set secondsPerStep)$"
    ),
)


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {stack: run_plan(stack) for stack in EXAMPLE_STACKS}


def test_every_figure_has_a_source_or_says_it_is_an_estimate():
    for table in (first_step.FIGURES, first_step.MODELS):
        for name, figure in table.items():
            assert figure.value > 0, name
            assert re.match(r"(https://\S+|(estimate|derived|published|fact): \S)", figure.source), name
    # The ones the issue names are checked and cited.
    assert "magic-modules" not in first_step.FIGURES["gpuNodeBoot"].source
    assert "unsloth-zoo/pull/972" in first_step.FIGURES["hubDownloadRate"].source
    assert "hf_transfer" in first_step.FIGURES["hubDownloadRate"].source
    assert "nemotron-3-nano" in first_step.FIGURES["imageGb"].source
    assert "gemma3-27b-it" in first_step.FIGURES["vllmInit"].source


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_timeline_txt_and_the_summary_have_exactly_the_two_lines(plans: dict[str, Plan], stack: str, tmp_path):
    plan = plans[stack]
    text = render_files(plan)["timeline.txt"]
    for pattern in LINES:
        assert len([line for line in text.splitlines() if pattern.match(line)]) == 1, pattern.pattern
    printed: list[str] = []
    for line in summary(plan, tmp_path, {}).splitlines():  # a first-step line wrapped to the screen, joined again
        if line.startswith("      ") and printed:
            printed[-1] += " " + line.strip()
        else:
            printed.append(line)
    for pattern in LINES:
        assert any(pattern.match(line.strip()) for line in printed), pattern.pattern
    result = first_step.model(first_step.inputs_from_plan(plan))
    found = re.search(LINES[0].pattern, text, re.M)
    assert found is not None
    cold, worst, uncut = (float(x) for x in found.groups() if x is not None)
    assert (cold, worst, uncut) == tuple(
        round(x, 1) for x in (result.cold_minutes, result.cold_worst_minutes, result.uncut_minutes)
    )
    # The step's length is known exactly where estimatedRun has a first-step figure.
    assert result.step_known == (plan.jobs.outputs["estimatedRun"]["firstStepSeconds"] is not None)


def test_the_goal_on_h200(plans: dict[str, Plan]):
    """With the cuts, the cold first step of h200 comes at least 15 modeled minutes before the same model without
    them, and a warm re-run reaches its first step within 15 modeled minutes."""
    result = first_step.model(first_step.inputs_from_plan(plans["h200"]))
    assert result.uncut_minutes - result.cold_minutes >= 15, (result.cold_minutes, result.uncut_minutes)
    assert result.warm_reaches_step <= 15
    # The first step itself is the tutorial recipe's sourced figure (estimatedRun), hundreds of seconds.
    assert result.warm_minutes == pytest.approx(result.warm_reaches_step + 942.51 / 60)
    # Lustre then dominates at its tier's typical creation time, and the rendered model says so with what would cut
    # it next; the cold range ends at the tier's worst case.
    name, kind, length = result.dominant()
    assert (name, kind) == ("Instance/lustre", "gcp:lustre/instance:Instance") and length == 40
    assert result.cold_worst_minutes == pytest.approx(result.cold_minutes + 80 - 40)
    text = first_step.render(result)
    assert "Dominant phase with the cuts: Instance/lustre" in text
    assert first_step.NEXT_CUTS["gcp:lustre/instance:Instance"] in text


@pytest.mark.parametrize("stack", EXAMPLE_STACKS)
def test_cold_and_uncut_differ_only_in_what_runs_in_parallel(plans: dict[str, Plan], stack: str):
    inputs = first_step.inputs_from_plan(plans[stack])
    cold, uncut = first_step.build(inputs, inputs.cuts), first_step.build(inputs, first_step.Cuts())
    shared = set(cold.phases) & set(uncut.phases)
    assert {"GPU node boot", "vLLM set-up", first_step.FIRST_STEP} <= shared | {"GPU node boot"}
    for name in shared:
        assert cold.phases[name].minutes == pytest.approx(uncut.phases[name].minutes), name
    # The download is one phase in both: in the prefetch step with the cut, in the train step without it.
    downloads = [n for n in uncut.phases if n.startswith("weights download")]
    assert downloads == [n for n in cold.phases if n.startswith("weights download")]
    assert cold.end[first_step.FIRST_STEP] <= uncut.end[first_step.FIRST_STEP]


def test_the_cuts_are_read_from_what_the_plans_register(plans: dict[str, Plan]):
    h200 = first_step.inputs_from_plan(plans["h200"]).cuts
    assert h200 == first_step.Cuts(
        prepull=True, nodes_with_pool=True, image_cache_disk=False, prefetch=True, compile_cache=True, eval_cache=True
    )
    dev = first_step.inputs_from_plan(plans["dev"]).cuts
    assert dev.prepull and dev.prefetch and dev.compile_cache and not dev.nodes_with_pool  # flex-start: from zero
    cached = run_plan("dev", infra_overrides=["imageCacheDisk=nemo-cache"])
    with_disk = first_step.model(first_step.inputs_from_plan(cached))
    assert with_disk.inputs.cuts.image_cache_disk
    plain = first_step.model(first_step.inputs_from_plan(plans["dev"]))
    pull = first_step.FIGURES["imageGb"].value / first_step.FIGURES["imagePullRate"].value
    # Autoscaled nodes come and go: the cache disk replaces the pull on every arrival, warm runs included.
    assert plain.warm_minutes - with_disk.warm_minutes == pytest.approx(pull - first_step.minutes("imageFromCacheDisk"))
    assert with_disk.cold_minutes < plain.cold_minutes


def test_a_warm_run_reuses_the_base_evaluation_only_with_the_eval_cache(plans: dict[str, Plan]):
    inputs = first_step.inputs_from_plan(plans["h200"])
    assert "--cache-dir=/data/eval-cache/base" in next(
        s["entrypoint"] for s in plans["h200"].jobs.outputs["pipeline"] if s["step"] == "eval-base"
    )
    cached = first_step.build(inputs, inputs.cuts, warm=True)
    uncached = first_step.build(inputs, dataclasses.replace(inputs.cuts, eval_cache=False), warm=True)
    evaluation = first_step.RUN_STEP_DURATIONS["eval-base"].minutes
    assert "GSM8K evaluation of the base model" not in cached.phases
    assert uncached.end[first_step.FIRST_STEP] - cached.end[first_step.FIRST_STEP] == pytest.approx(evaluation)
    # A cold run has nothing to reuse: the evaluation runs, with the cut as without it.
    cold = first_step.build(inputs, inputs.cuts)
    assert cold.phases["GSM8K evaluation of the base model"].minutes == pytest.approx(evaluation)


def test_without_the_prepull_the_pull_waits_for_the_ray_cluster(plans: dict[str, Plan]):
    inputs = first_step.inputs_from_plan(plans["h200"])
    no_prepull = first_step.build(inputs, dataclasses.replace(inputs.cuts, prepull=False))
    with_prepull = first_step.build(inputs, inputs.cuts)
    ray = inputs.milestones["ray"]
    assert no_prepull.start("image pull") >= ray
    assert with_prepull.start("image pull") < ray - 5  # while Lustre is still being created
    assert with_prepull.end["image pull"] <= ray  # done before the Ray pods exist


def test_size_dependent_phases_follow_sizes_and_rates(plans: dict[str, Plan]):
    inputs = first_step.inputs_from_plan(plans["h200"])
    assert inputs.model == "google/gemma-3-27b-it" and inputs.model_gb == pytest.approx(54.8)
    assert inputs.lustre_gb_per_s == pytest.approx(18000 / 1024 * 500 / 1000)
    base = first_step.build(inputs, inputs.cuts)
    bigger = first_step.build(dataclasses.replace(inputs, image_gb=2 * inputs.image_gb), inputs.cuts)
    assert bigger.phases["image pull"].minutes == pytest.approx(2 * base.phases["image pull"].minutes)
    download = next(n for n in base.phases if n.startswith("weights download"))
    rate = first_step.minutes("hubDownloadRate")
    assert base.phases[download].minutes == pytest.approx(54.8 / rate / 60)
    slow_lustre = first_step.build(dataclasses.replace(inputs, lustre_gb_per_s=rate / 2), inputs.cuts)
    assert slow_lustre.phases[download].minutes == pytest.approx(2 * base.phases[download].minutes)


def test_every_step_before_train_has_a_row(plans: dict[str, Plan]):
    for plan in plans.values():
        steps = first_step.inputs_from_plan(plan).steps
        first_train = next(i for i, step in enumerate(steps) if step == "train" or step.startswith("train-"))
        for step in steps[: first_train + 1]:
            assert first_step.step_cost(step), f"add {step} to first_step.STEP_PHASES"
    # A step without a row is still counted, and says it has no figure.
    inputs = first_step.inputs_from_plan(plans["h200"])
    extra = dataclasses.replace(inputs, steps=("a-new-step", *inputs.steps))
    schedule = first_step.build(extra, inputs.cuts)
    assert schedule.phases["a-new-step (no figure)"].source.startswith("estimate:")
    assert schedule.end[first_step.FIRST_STEP] == pytest.approx(
        first_step.build(inputs, inputs.cuts).end[first_step.FIRST_STEP] + 1.0
    )


def test_the_model_sizes_are_the_job_stacks_table():
    """One table of model sizes (jobs/launcher/checkpoints.py, held to the releases' loaders in test_checkpoints.py):
    the first-step model reads it, sources included."""
    assert {model: (f.value, f.source) for model, f in first_step.MODELS.items()} == {
        model: (size.billions, size.source) for model, size in checkpoints.MODEL_SIZES.items()
    }


def test_a_cycle_or_a_duplicate_phase_is_an_error():
    loop = {"a": first_step.Phase("a", 1, "x", ("b",)), "b": first_step.Phase("b", 1, "x", ("a",))}
    with pytest.raises(ValueError, match="circle"):
        first_step.Schedule(loop)


def test_the_design_guide_quotes_the_golden_plans(plans: dict[str, Plan]):
    """docs/design.md's start-up table shows the shipped plans' numbers, as the golden timeline.txt has them."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## Faster start-up") : design.index("## What is verified")]
    for stack in EXAMPLE_STACKS:
        result = first_step.model(first_step.inputs_from_plan(plans[stack]))
        text = (ROOT / "tests" / "golden" / stack / "timeline.txt").read_text()
        assert all(line in text.splitlines() for line in first_step.summary_lines(result)), stack
        row = first_step.table_row(stack, result)
        assert row in section, f"docs/design.md's Faster start-up table: expected {row}"


def test_the_lustre_phase_follows_the_tier(plans: dict[str, Plan]):
    """Managed Lustre's creation time is its tier's: over an hour at 125 and 250 MB/s/TiB, under at 500 and 1000."""
    h200 = first_step.inputs_from_plan(plans["h200"])
    overrides = ["lustre.perUnitStorageThroughput=125", "lustre.capacityGib=72000"]
    slow = first_step.inputs_from_plan(run_plan("h200", infra_overrides=overrides))
    assert (h200.lustre_tier, slow.lustre_tier) == (500, 125)
    assert slow.milestones["ray"] - h200.milestones["ray"] == pytest.approx(60 - 40)
    assert slow.worst_milestones["ray"] == pytest.approx(h200.worst_milestones["ray"])  # both worst cases 80 min
    line = first_step.summary_lines(first_step.model(slow))[0]
    assert "Managed Lustre 60-80 min at 125 MB/s/TiB" in line
