"""What one training run holds and costs: GPU-hours from its node count, steps and seconds per step, priced with
the infra stack's own estimate (estimatedCost.gpuNodePerHour). Pure; no Pulumi.

Seconds per step come from the job's secondsPerStep, else from the step-time table (launcher/step_times.py) for the
recipe, mode and GPU type; without either they are unknown, and so are the totals that depend on them: no number is
made up. The training steps and the GSM8K evaluations are counted apart."""

from __future__ import annotations

from typing import Any

from launcher import step_times
from launcher.settings import (
    BENCHMARK_GPUS_PER_NODE,
    BENCHMARK_NODES,
    EVAL_MINUTES,
    InfraOutputs,
    JobSettings,
)

USER_RATE = "gpuNodeHourlyPrice"  # infra/cost.py's name for a rate the user set


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _benchmark_steps(job: JobSettings, infra: InfraOutputs) -> tuple[list[step_times.StepEstimate], list[str]]:
    """The benchmark runs NVIDIA's two recipes unchanged, one after the other, on their own shape."""
    found = []
    for recipe, async_grpo in (
        (step_times.LLAMA_8B_SYNC_RECIPE, False),
        (step_times.LLAMA_8B_ASYNC_RECIPE, True),
    ):
        row = step_times.find(recipe, async_grpo, infra.gpu_type)
        samples = 0 if row is None else row.samples_per_step
        found.append(
            step_times.estimate(
                recipe=recipe,
                async_grpo=async_grpo,
                gpu_type=infra.gpu_type,
                num_nodes=BENCHMARK_NODES,
                generation_nodes=0 if row is None else row.generation_nodes,
                gpus_per_node=BENCHMARK_GPUS_PER_NODE,
                samples_per_step=samples,
                user_seconds=None,
            )
        )
    notes = list(dict.fromkeys(note for estimate in found for note in estimate.notes))
    if all(e.known for e in found):
        sync, off = (e.seconds for e in found)
        notes.insert(
            0, f"benchmark: {job.max_num_steps} steps synchronous at {sync:g} s and {job.max_num_steps} at {off:g} s"
        )
    return found, notes


def run_estimate(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    """The training steps and the GSM8K evaluations, each on its own (an evaluation uses one node, but the run's
    other nodes are held meanwhile); the wait for nodes, the pre-flight and the conversion come on top."""
    runs = 1
    if job.benchmark:
        estimates, notes = _benchmark_steps(job, infra)
        runs = len(estimates)
        known = all(e.known for e in estimates)
        seconds = sum(e.seconds or 0.0 for e in estimates) / runs if known else None
        first = estimates[0].first_step_seconds if known else None  # the synchronous recipe runs first
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
