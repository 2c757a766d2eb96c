"""What one training run holds and costs: GPU-hours from its node count, steps and seconds per step, priced with
the infra stack's own estimate (estimatedCost.gpuNodePerHour). Pure; no Pulumi."""

from __future__ import annotations

from typing import Any

from launcher.settings import EVAL_MINUTES, InfraOutputs, JobSettings

USER_RATE = "gpuNodeHourlyPrice"  # infra/cost.py's name for a rate the user set


def run_estimate(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    """The training steps and the GSM8K evaluations are counted (an evaluation uses one node, but the run's other
    nodes are held meanwhile); the wait for nodes, the pre-flight and the conversion come on top."""
    evals = int(job.eval_base) + int(job.eval_final)
    eval_minutes = evals * EVAL_MINUTES
    node_hours = job.num_nodes * (job.max_num_steps * job.seconds_per_step / 3600 + eval_minutes / 60)
    price = infra.gpu_node_hourly_usd
    notes = [] if price is not None else ["no price for the infra's GPU nodes: see the infra stack's estimatedCost"]
    if price is not None and infra.gpu_node_price_from == USER_RATE:
        notes.append(f"GPU node rate ${price:,.2f}/h is your figure (the infra's gpuNodeHourlyPrice)")
    return {
        "nodes": job.num_nodes,
        "steps": job.max_num_steps,
        "secondsPerStep": job.seconds_per_step,
        "evals": evals,
        "evalMinutes": eval_minutes,
        "gpuHours": round(node_hours * infra.gpus_per_node, 2),
        "usd": None if price is None else round(node_hours * price, 2),
        "pricesReadOn": infra.prices_read_on,
        "priceFrom": infra.gpu_node_price_from,
        "notes": notes,
    }
