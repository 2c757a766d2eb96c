"""What one training run holds and costs: GPU-hours from its node count, steps and seconds per step, priced with
the infra stack's own estimate (estimatedCost.gpuNodePerHour). Pure; no Pulumi."""

from __future__ import annotations

from typing import Any

from launcher.settings import EVAL_MINUTES, PUBLISHED_H100, InfraOutputs, JobSettings

USER_RATE = "gpuNodeHourlyPrice"  # infra/cost.py's name for a rate the user set


def run_estimate(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    """The training steps and the GSM8K evaluations are counted (an evaluation uses one node, but the run's other
    nodes are held meanwhile); the wait for nodes, the pre-flight and the conversion come on top."""
    seconds_per_step, first_step_seconds, runs = job.seconds_per_step, job.seconds_per_step, 1
    sync, off_policy = PUBLISHED_H100["sync"], PUBLISHED_H100["async-1off"]
    notes = []
    if job.benchmark:
        # Both recipes in turn: NVIDIA's two step times, each for maxNumSteps on the recipes' 2 nodes.
        seconds_per_step, runs = (sync.seconds_per_step + off_policy.seconds_per_step) / 2, 2
        first_step_seconds = sync.seconds_per_step  # the synchronous recipe runs first
        notes.append(
            f"benchmark: {job.max_num_steps} steps synchronous at {sync.seconds_per_step:g} s and "
            f"{job.max_num_steps} at {off_policy.seconds_per_step:g} s (NVIDIA's H100 figures)"
        )
    elif job.async_grpo:
        # The first step cannot overlap (the trajectory buffer starts empty): it takes as long as a synchronous one.
        first_step_seconds = seconds_per_step * sync.seconds_per_step / off_policy.seconds_per_step
        if not job.seconds_per_step_set:
            notes.append(
                f"asyncGrpo: {seconds_per_step:g} s per step is NeMo RL's published 1-step off-policy figure "
                f"(Llama 3.1 8B, 16 H100s; {sync.seconds_per_step:g} s on-policy); set secondsPerStep from your runs"
            )
    evals = int(job.eval_base) + int(job.eval_final)
    eval_minutes = evals * EVAL_MINUTES
    node_hours = job.num_nodes * (runs * job.max_num_steps * seconds_per_step / 3600 + eval_minutes / 60)
    price, low = infra.gpu_node_hourly_usd, infra.gpu_node_hourly_low_usd
    if price is None:
        notes.append("no price for the infra's GPU nodes: see the infra stack's estimatedCost")
    if price is not None and infra.gpu_node_price_from == USER_RATE:
        notes.append(f"GPU node rate ${price:,.2f}/h is your figure (the infra's gpuNodeHourlyPrice)")
    return {
        "nodes": job.num_nodes,
        "steps": runs * job.max_num_steps,
        "secondsPerStep": round(seconds_per_step, 2),
        # What the first-step model takes for the first GRPO step (async: no overlap yet, so the on-policy time).
        "firstStepSeconds": round(first_step_seconds, 2),
        "asyncGrpo": job.async_grpo,
        "evals": evals,
        "evalMinutes": eval_minutes,
        "gpuHours": round(node_hours * infra.gpus_per_node, 2),
        "usd": None if price is None else round(node_hours * price, 2),
        # The lower end when the infra prices its GPU nodes as a range (a reservation); else the same as usd.
        "usdLow": None if price is None or low is None else round(node_hours * low, 2),
        "pricesReadOn": infra.prices_read_on,
        "priceFrom": infra.gpu_node_price_from,
        "notes": notes,
    }
