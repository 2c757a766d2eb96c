"""What one training run holds and costs: GPU-hours from its node count, steps and seconds per step, priced with
the infra stack's own estimate (estimatedCost.gpuNodePerHour). Pure; no Pulumi.

Seconds per step come from the job's secondsPerStep, else from the step-time table (launcher/step_times.py) for the
recipe, mode and GPU type; without either they are unknown, and so are the totals that depend on them: no number is
made up. The training steps and the GSM8K evaluations are counted apart."""

from __future__ import annotations

from typing import Any

from launcher import step_times
from launcher.infra_outputs import InfraOutputs
from launcher.job_settings import JobSettings

# Minutes one GSM8K evaluation (eval-base, eval-final) holds the run's GPU nodes: 6-8 minutes for Gemma 3 27B on one
# 8-GPU node, most of it vLLM start-up (the GKE sample's logs). An estimate, taken at its upper end.
EVAL_MINUTES = 8.0

USER_RATE = "gpuNodeHourlyPrice"  # infra/cost.py's name for a rate the user set


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _benchmark_steps(job: JobSettings, infra: InfraOutputs) -> tuple[list[step_times.StepEstimate], list[str]]:
    """The benchmark runs NVIDIA's recipes unchanged, one after the other, each on its own shape."""
    found = [
        step_times.estimate(
            recipe=item.recipe.path,
            async_grpo=item.recipe.async_grpo,
            gpu_type=infra.gpu_type,
            num_nodes=item.recipe.num_nodes,
            generation_nodes=item.recipe.generation_nodes,
            gpus_per_node=item.recipe.gpus_per_node,
            samples_per_step=item.recipe.samples_per_step,
            user_seconds=None,
            release=infra.nemo_rl_release.tag,
        )
        for item in job.benchmark_recipes
    ]
    # Only the first recipe's first step is the run's (estimatedRun.firstStepSeconds): the others' are left out.
    notes = list(
        dict.fromkeys(
            note
            for index, estimate in enumerate(found)
            for note in estimate.notes
            if index == 0 or not note.startswith("first step:")
        )
    )
    if all(e.known for e in found):
        each = ", ".join(
            f"{item.label} ({item.recipe.num_nodes} nodes) at {e.seconds:g} s"
            for item, e in zip(job.benchmark_recipes, found, strict=True)
        )
        notes.insert(0, f"benchmark: {job.max_num_steps} steps each: {each}")
    return found, notes


def run_estimate(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    """The training steps and the GSM8K evaluations, each on its own (an evaluation uses one node, but the run's
    other nodes are held meanwhile); the wait for nodes, the pre-flight and the conversion come on top."""
    runs = 1
    if job.benchmark:
        estimates, notes = _benchmark_steps(job, infra)
        runs = len(estimates)
        known = all(e.known for e in estimates)
        # Weighted by each recipe's nodes over the run's (its largest recipe's), so that nodes x steps x seconds
        # is the node time of all of them: the plain mean when every recipe has the run's nodes.
        weighted = sum(
            (e.seconds or 0.0) * item.recipe.num_nodes / job.num_nodes
            for item, e in zip(job.benchmark_recipes, estimates, strict=True)
        )
        seconds = weighted / runs if known else None
        if known and any(item.recipe.num_nodes != job.num_nodes for item in job.benchmark_recipes):
            notes.append(
                f"secondsPerStep is the recipes' mean weighted by their nodes over the run's {job.num_nodes}: the "
                "recipes hold different node counts"
            )
        first = estimates[0].first_step_seconds if known else None  # the first recipe runs first
        source = "; ".join(dict.fromkeys(e.source for e in estimates)) if known else ""
        counts = "; ".join(dict.fromkeys(e.counts for e in estimates)) if known else ""
    else:
        step = step_times.estimate(
            recipe=job.recipe,
            async_grpo=job.async_grpo,
            gpu_type=infra.gpu_type,
            num_nodes=job.num_nodes,
            generation_nodes=job.generation_nodes,
            gpus_per_node=infra.gpus_per_node,
            samples_per_step=job.train_global_batch_size,
            user_seconds=job.seconds_per_step,
            release=infra.nemo_rl_release.tag,
        )
        seconds, first, source, counts = step.seconds, step.first_step_seconds, step.source, step.counts
        notes = list(step.notes)
    evals = int(job.eval_base) + int(job.eval_final)
    eval_minutes = evals * EVAL_MINUTES
    steps = runs * job.max_num_steps
    step_node_hours = None if seconds is None else job.num_nodes * steps * seconds / 3600
    eval_node_hours = job.num_nodes * eval_minutes / 60
    node_hours = None if step_node_hours is None else step_node_hours + eval_node_hours
    price, low = infra.gpu_node_hourly_usd, infra.gpu_node_hourly_low_usd
    if price is None:
        notes.append("no price for the infra's GPU nodes: see the infra stack's estimatedCost")
    if price is not None and infra.gpu_node_price_from == USER_RATE:
        notes.append(f"GPU node rate ${price:,.2f}/h is your figure (the infra's gpuNodeHourlyPrice)")

    def gpu_hours(hours: float | None) -> float | None:
        return None if hours is None else round(hours * infra.gpus_per_node, 2)

    def usd(hours: float | None, rate: float | None = price) -> float | None:
        return None if hours is None or rate is None or price is None else round(hours * rate, 2)

    return {
        "nodes": job.num_nodes,
        "steps": steps,
        # null: unknown (no secondsPerStep, no row in the step-time table); the notes say why and what to set.
        "secondsPerStep": _round(seconds),
        "secondsPerStepFrom": source,
        "secondsPerStepCounts": counts,  # what the figure counts, as its source measured it
        # What the first-step model takes for the first GRPO step (async: no overlap yet, so the on-policy time).
        "firstStepSeconds": _round(first),
        "asyncGrpo": job.async_grpo,
        "stepGpuHours": gpu_hours(step_node_hours),
        "stepUsd": usd(step_node_hours),
        "evals": evals,
        "evalMinutes": eval_minutes,
        "evalGpuHours": gpu_hours(eval_node_hours),
        "evalUsd": usd(eval_node_hours),
        # Steps and evaluations together; null when the steps are unknown.
        "gpuHours": gpu_hours(node_hours),
        "usd": usd(node_hours),
        # The lower ends when the infra prices its GPU nodes as a range (a reservation); else the same as the above.
        "stepUsdLow": usd(step_node_hours, low),
        "evalUsdLow": usd(eval_node_hours, low),
        "usdLow": usd(node_hours, low),
        "pricesReadOn": infra.prices_read_on,
        "priceFrom": infra.gpu_node_price_from,
        "notes": notes,
    }
