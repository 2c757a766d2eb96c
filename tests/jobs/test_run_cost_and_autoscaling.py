"""The job stack's side of cost and autoscaling, fed with what the infra program really exports: the run estimate
(estimatedRun) and the wait that asks the autoscaler for workers when the GPU group scales from zero."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from config_rules import ConfigError
from conftest import run_infra_stack, shared_infra_run
from launcher.cost import EVAL_MINUTES, run_estimate
from launcher.infra_outputs import build_infra_outputs
from launcher.job_settings import build_job_settings
from launcher.script import pipeline_script
from launcher.steps import pipeline_steps


@pytest.fixture(scope="module")
def exported() -> dict[str, dict[str, Any]]:
    return {stack: shared_infra_run(stack).outputs for stack in ("dev", "h200")}


def job_with(infra: Any, **values: Any) -> Any:
    return build_job_settings({"infraStack": "organization/nemo-rl-gke/h200", **values}, infra)


def wait_words(outputs: dict[str, Any]) -> list[str]:
    infra = build_infra_outputs(outputs)
    job = job_with(infra, numNodes=1, generationNodes=0)
    script = pipeline_script(job, infra, pipeline_steps(job, infra))
    return shlex.split(next(line for line in script.splitlines() if "wait_for_workers.py" in line))


def test_run_estimate_uses_the_infra_price(exported):
    infra = build_infra_outputs(exported["h200"])
    hourly = exported["h200"]["estimatedCost"]["gpuNodePerHour"]
    assert infra.gpu_node_hourly_usd == hourly and hourly > 0
    run = run_estimate(job_with(infra, numNodes=2, maxNumSteps=20, secondsPerStep=180), infra)
    # 2 nodes for 20 steps of 3 minutes and two evaluations of EVAL_MINUTES each (the run holds both nodes).
    node_hours = 2 * (20 * 180 + 2 * EVAL_MINUTES * 60) / 3600
    assert (run["evals"], run["evalMinutes"]) == (2, 2 * EVAL_MINUTES)
    assert run["gpuHours"] == round(node_hours * 8, 2)
    assert run["usd"] == pytest.approx(round(node_hours * hourly, 2))
    # h200 is a reservation: the infra prices its GPU nodes as a range, and the run carries the lower end too.
    low = exported["h200"]["estimatedCost"]["gpuNodePerHourLow"]
    assert infra.gpu_node_hourly_low_usd == low and 0 < low < hourly
    assert run["usdLow"] == pytest.approx(round(node_hours * low, 2)) and run["usdLow"] < run["usd"]
    # The steps and the evaluations are also counted apart (cost.txt prints them on lines of their own).
    assert run["stepGpuHours"] == round(2 * 20 * 180 / 3600 * 8, 2)
    assert run["evalGpuHours"] == round(2 * 2 * EVAL_MINUTES / 60 * 8, 2)
    assert run["stepUsd"] + run["evalUsd"] == pytest.approx(run["usd"], abs=0.02)
    assert run["secondsPerStepFrom"] == "secondsPerStep"  # the user's figure wins over the table's
    assert run["notes"] == [] and run["pricesReadOn"] == exported["h200"]["estimatedCost"]["pricesReadOn"]
    # An infra stack from before the range exports one rate: it is both ends.
    older = {**exported["h200"]["estimatedCost"]}
    del older["gpuNodePerHourLow"]
    assert build_infra_outputs({**exported["h200"], "estimatedCost": older}).gpu_node_hourly_low_usd == hourly


def test_run_estimate_at_the_users_gpu_rate_says_so():
    outputs = run_infra_stack("h200", overrides={"gpuNodeHourlyPrice": "61.5"}).outputs
    infra = build_infra_outputs(outputs)
    assert infra.gpu_node_hourly_usd == 61.5 and infra.gpu_node_price_from == "gpuNodeHourlyPrice"
    run = run_estimate(
        job_with(infra, numNodes=2, maxNumSteps=20, secondsPerStep=180, evalBase=False, evalFinal=False), infra
    )
    assert (
        run["usd"] == pytest.approx(round(2 * 20 * 180 / 3600 * 61.5, 2)) and run["priceFrom"] == "gpuNodeHourlyPrice"
    )
    assert run["usdLow"] == run["usd"]  # the user's rate is exact: no range
    assert run["notes"] == ["GPU node rate $61.50/h is your figure (the infra's gpuNodeHourlyPrice)"]


def test_run_estimate_without_a_price_says_so(exported):
    # An infra stack whose estimate has no GPU price (a region the table does not know, or an older stack).
    outputs = {**exported["dev"], "estimatedCost": {**exported["dev"]["estimatedCost"], "gpuNodePerHour": None}}
    infra = build_infra_outputs(outputs)
    assert infra.gpu_node_hourly_usd is None
    run = run_estimate(
        job_with(infra, numNodes=1, generationNodes=0, evalBase=False, evalFinal=False, secondsPerStep=120), infra
    )
    assert run["usd"] is None and run["stepUsd"] is None and run["secondsPerStep"] == 120
    assert run["gpuHours"] == round(1 * 10 * 120 / 3600 * 8, 2) and run["evals"] == 0
    assert run["notes"] == ["no price for the infra's GPU nodes: see the infra stack's estimatedCost"]


@pytest.mark.parametrize("bad", [0, -5, "slow", "nan", "inf"])
def test_seconds_per_step_is_validated(exported, bad):
    with pytest.raises(ConfigError, match="secondsPerStep"):
        job_with(build_infra_outputs(exported["h200"]), secondsPerStep=bad)


def test_flex_start_pipeline_asks_the_autoscaler_first(exported):
    dev = exported["dev"]
    assert dev["rayAutoscaling"] is True
    assert dev["rayClientAddress"] == f"ray://{dev['rayHeadService']}:10001"
    assert f"--request-address={dev['rayClientAddress']}" in wait_words(dev)


def test_reservation_pipeline_only_waits(exported):
    assert exported["h200"]["rayAutoscaling"] is False
    assert not any(word.startswith("--request-address") for word in wait_words(exported["h200"]))


def test_autoscaling_needs_a_client_address(exported):
    broken = {**exported["dev"], "rayClientAddress": "http://wrong:10001"}
    with pytest.raises(ConfigError, match="rayClientAddress"):
        build_infra_outputs(broken)


def _waits_and_preflight_nodes(outputs: dict[str, Any]) -> tuple[list[str], list[str], set[str]]:
    """The pod's first wait, the train attempt's own wait (before the checkpoint guard), and the pre-flight's
    --nodes, for a one-node run."""
    infra = build_infra_outputs(outputs)
    job = job_with(infra, numNodes=1, generationNodes=0, vllmTensorParallelSize=8, dtensorTensorParallelSize=8)
    steps = pipeline_steps(job, infra)
    first = wait_words(outputs)
    train = next(step for step in steps if step.name == "train").entrypoint
    train_wait = train[: train.index("&&")]
    preflight = {w for step in steps if step.name.startswith("preflight") for w in step.entrypoint if "--nodes=" in w}
    return first, train_wait, preflight


def test_with_the_autoscaler_only_the_runs_nodes_are_asked_for(exported):
    two_workers = {**exported["dev"], "rayWorkerReplicas": 2}  # the group may grow to 2; the run needs 1
    first, train_wait, preflight = _waits_and_preflight_nodes(two_workers)
    assert "--nodes=1" in first and "--nodes=1" in train_wait and preflight == {"--nodes=1"}
    # Every train attempt asks again: a retry follows a lost node, which the autoscaler must bring back.
    assert train_wait[1].endswith("/scripts/wait_for_workers.py")
    assert f"--request-address={two_workers['rayClientAddress']}" in train_wait


def test_without_the_autoscaler_only_the_runs_own_workers_are_waited_for_and_checked(exported):
    """The cluster holds 2 workers; the one-node run is admitted for one, and another run may hold the other: its
    waits ask for no more (beside the admitted runs' nodes, which the wait reads at run time), and its pre-flights
    leave the other run's GPUs alone."""
    first, train_wait, preflight = _waits_and_preflight_nodes(exported["h200"])
    assert "--nodes=1" in first and preflight == {"--nodes=1"}
    assert "--nodes=1" in train_wait and not any(w.startswith("--request-address") for w in train_wait)
    assert "--with-admitted-runs" in first and "--with-admitted-runs" in train_wait
