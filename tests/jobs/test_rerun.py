"""The job setting `rerun`: a finished, failed or stopped step runs again under a new submission id and outcome
record, once, and the docs' recipe (`pulumi config set --path 'rerun["STEP"]' N && pulumi up`) does it.

The settings and the pipeline are pure; the recipe is also run for real: the submitter command the launcher builds
for a step, pointed at the session's fake Jobs API (tests/fake_ray_jobs.py) with a stand-in entrypoint, before and
after the rerun."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from config_rules import ConfigError
from conftest import ROOT, shared_infra_run
from fake_tools import fake_env, fake_tools
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job_settings import build_job_settings
from launcher.script import SUBMITTER, outcome_record, pipeline_script, submit_command
from launcher.steps import pipeline_steps, rerun_warnings
from ray_head import place_held
from submitter import errors
from submitter.records import rerun_hint

from tools.offline import load_stack_config, run_program

JOBS = ROOT / "jobs"
OPERATIONS = ROOT / "docs" / "operations.md"


@pytest.fixture(scope="module")
def infra() -> InfraOutputs:
    return build_infra_outputs(shared_infra_run("h200").outputs)


def job_with(infra: InfraOutputs, **values: Any) -> Any:
    return build_job_settings({"infraStack": "organization/nemo-rl-gke/h200", "runName": "exp", **values}, infra)


def by_name(steps: list[Any]) -> dict[str, Any]:
    return {step.name: step for step in steps}


# --- settings and pipeline, pure ----------------------------------------------------------------------------------


def test_a_rerun_gives_the_step_a_new_id_and_record_and_leaves_the_others(infra: InfraOutputs) -> None:
    plain = by_name(pipeline_steps(job_with(infra), infra))
    job = job_with(infra, rerun={"eval-final": 2, "convert-hf": "1", "train": 0})
    steps = by_name(pipeline_steps(job, infra))
    assert steps["eval-final"].submission_id == "exp-eval-final-rerun2"
    assert steps["convert-hf"].submission_id == "exp-convert-hf-rerun1"
    assert outcome_record(steps["eval-final"], job, infra) == "/data/exp/step-outcomes/eval-final.rerun2.json"
    assert outcome_record(plain["eval-final"], job, infra) == "/data/exp/step-outcomes/eval-final.json"
    # 0 is no rerun; every step not named is exactly what it was, command included.
    for name in set(plain) - {"eval-final", "convert-hf"}:
        assert steps[name] == plain[name], name
    assert steps["eval-final"].entrypoint == plain["eval-final"].entrypoint
    words = submit_command(steps["eval-final"], job, infra)
    assert "--submission-id=exp-eval-final-rerun2" in words
    assert "--record=/data/exp/step-outcomes/eval-final.rerun2.json" in words


def test_a_train_rerun_keeps_its_retry_budget_under_the_new_id(infra: InfraOutputs) -> None:
    from launcher.steps import attempt_ids

    job = job_with(infra, rerun={"train": 1}, maxRestarts=2)
    train = by_name(pipeline_steps(job, infra))["train"]
    assert attempt_ids(train) == ["exp-train-rerun1", "exp-train-rerun1-r1", "exp-train-rerun1-r2"]
    assert "--max-retries=2" in submit_command(train, job, infra)


@pytest.mark.parametrize(
    ("rerun", "key", "fragment"),
    [
        ({"evalfinal": 1}, "rerun.evalfinal", "a step of this run: preflight-nccl, preflight-lustre, prepare-data"),
        ({"train-sync": 1}, "rerun.train-sync", "eval-final"),  # a benchmark step: not one of this run
        ({"train": -1}, "rerun.train", "a whole number 0..999"),
        ({"train": 1000}, "rerun.train", "0..999"),
        ({"train": True}, "rerun.train", "raise it by one"),
        ({"train": "once"}, "rerun.train", "a whole number 0..999: raise it by one to run the step again"),
        (["train"], "rerun", "a map of step name to rerun number"),
    ],
)
def test_a_bad_rerun_names_the_key_the_value_and_what_is_allowed(
    infra: InfraOutputs, rerun: Any, key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        pipeline_steps(job_with(infra, rerun=rerun), infra)
    assert caught.value.key == key and fragment in str(caught.value)


def test_a_rerun_that_is_no_number_is_refused_with_the_rerun_rule(infra: InfraOutputs) -> None:
    """A flag or a word reads as the rerun's own rule, not a bare type error; text digits are a number."""
    for given, shown in ((True, "True"), ("once", "'once'")):
        with pytest.raises(ConfigError) as caught:
            pipeline_steps(job_with(infra, rerun={"train": given}), infra)
        assert str(caught.value) == (
            f"config 'rerun.train' = {shown} is not allowed: a whole number 0..999: raise it by one to run the step "
            "again"
        )
    assert job_with(infra, rerun={"train": "2"}).rerun == {"train": 2}


def test_pulumi_up_warns_when_a_reader_of_a_rerun_step_is_not_rerun(infra: InfraOutputs) -> None:
    assert rerun_warnings(pipeline_steps(job_with(infra), infra)) == []
    warnings = rerun_warnings(pipeline_steps(job_with(infra, rerun={"train": 1}), infra))
    assert len(warnings) == 1 and warnings[0].startswith("rerun: convert-hf reads what train writes but is not rerun")
    steps = pipeline_steps(job_with(infra, rerun={"train": 1, "convert-hf": 1}), infra)
    assert [w.split(" reads")[0] for w in rerun_warnings(steps)] == ["rerun: export-gcs", "rerun: eval-final"]
    everything = {"train": 1, "convert-hf": 1, "export-gcs": 1, "eval-final": 1}
    assert rerun_warnings(pipeline_steps(job_with(infra, rerun=everything), infra)) == []


def test_the_submitters_advice_names_the_next_rerun_number() -> None:
    assert "`pulumi config set --path 'rerun[\"train\"]' 1`" in rerun_hint("/data/r/step-outcomes/train.json")
    assert "'rerun[\"eval-final\"]' 3`" in rerun_hint("/data/r/step-outcomes/eval-final.rerun2.json")
    assert rerun_hint(None) == ""


def test_the_pipeline_reruns_only_the_named_step_and_waits_for_the_gpus_first(
    infra_outputs_h200: dict[str, Any], tmp_path: Path
) -> None:
    """The generated pipeline with a stand-in submitter: every step recorded, one named in rerun. The pod waits for
    the GPU workers (the rerun has no record yet) and submits that step alone, under its new id."""
    infra = build_infra_outputs({**infra_outputs_h200, "lustreMountPath": str(tmp_path / "data")})
    plain = pipeline_steps(job_with(infra), infra)
    job = job_with(infra, rerun={"eval-final": 1})
    steps = pipeline_steps(job, infra)
    outcomes = tmp_path / "data" / "exp" / "step-outcomes"
    outcomes.mkdir(parents=True)
    for step in plain:
        (outcomes / f"{step.name}.json").write_text("{}")
    log = tmp_path / "calls.log"
    fake_bin = fake_tools(
        tmp_path,
        'id="$(basename "$1")"\nfor a in "$@"; do case "$a" in --submission-id=*) id="${a#*=}";; esac; done\n'
        f'echo "$id" >> {log}\n',
    )
    script = pipeline_script(job, infra, steps)
    done = subprocess.run(["bash", "-c", script], env=fake_env(fake_bin), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    ids = [step.submission_id for step in steps]
    calls = [call for call in log.read_text().split() if call in ids or call == "wait_for_workers.py"]
    # Recorded steps go to the submitter too (it reports their record) without a wait; eval-final, the last step,
    # has no record under its new id.
    assert ids[-1] == "exp-eval-final-rerun1"
    assert calls == [*ids[:-1], "wait_for_workers.py", ids[-1]]


@pytest.fixture(scope="module")
def infra_outputs_h200() -> dict[str, Any]:
    return dict(shared_infra_run("h200").outputs)


def test_the_job_program_applies_rerun_and_refuses_an_unknown_step(
    infra_outputs_h200: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    project, config = load_stack_config(JOBS, "h200")
    reference = config[f"{project}:infraStack"]

    def run(rerun: Any) -> Any:
        return run_program(
            JOBS, {**config, f"{project}:rerun": rerun}, stack="h200", stack_outputs={reference: infra_outputs_h200}
        )

    pipeline = run({"eval-final": 1}).outputs["pipeline"]
    assert [p["submissionId"] for p in pipeline if p["step"] == "eval-final"] == ["gemma3-27b-gsm8k-eval-final-rerun1"]
    assert [p["submissionId"] for p in pipeline if p["step"] == "train"] == ["gemma3-27b-gsm8k-train"]
    assert "rerun: convert-hf reads what train writes" not in caplog.text
    run({"train": 1})  # pulumi.log.warn, which `pulumi up` shows as a warning
    assert "rerun: convert-hf reads what train writes but is not rerun" in caplog.text
    with pytest.raises(ConfigError, match=r"config 'rerun.eval_final' = 1 is not allowed: a step of this run"):
        run({"eval_final": 1})


# --- the docs' recipe, on a real Ray head ------------------------------------------------------------------------


def _submitter(words: list[str], address: str, entrypoint: list[str]) -> list[str]:
    """The launcher's submitter command with the real script, the test head, and a stand-in for the step's work."""
    own = words[: words.index("--")]
    own = [sys.executable if w == "python" else str(JOBS / "ray_submit.py") if w == SUBMITTER else w for w in own]
    own = [f"--address={address}" if w.startswith("--address=") else w for w in own]
    return [*own, "--", *entrypoint]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=180, check=False)


def test_the_docs_rerun_recipe_runs_a_finished_step_again_once(
    jobs_address: str, infra_outputs_h200: dict[str, Any], tmp_path: Path
) -> None:
    lines = OPERATIONS.read_text().splitlines()
    recipe = next(line.strip() for line in lines if line.strip().startswith("pulumi config set --path 'rerun["))
    assert recipe == "pulumi config set --path 'rerun[\"eval-final\"]' 1 && pulumi up"
    rerun = {"eval-final": 1}  # what that command puts in the stack (--path stores an integer as a number)
    infra = build_infra_outputs({**infra_outputs_h200, "lustreMountPath": str(tmp_path / "data")})
    run_name = f"t-rerun-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "runs.txt"
    work = ["sh", "-c", f"echo run >> {marker}; echo evaluated-$((6*7))"]

    def submit(job: Any) -> subprocess.CompletedProcess[str]:
        step = by_name(pipeline_steps(job, infra))["eval-final"]
        return _run(_submitter(submit_command(step, job, infra), jobs_address, work))

    with place_held(jobs_address, run_name):  # as the pipeline holds the run's place around its steps
        first_job = job_with(infra, runName=run_name, stopOnDelete=False)
        first = submit(first_job)
        assert first.returncode == errors.EXIT_SUCCEEDED, first.stdout
        skipped = submit(first_job)  # a new pod of the same Job: the record says done
        assert "nothing was run again" in skipped.stdout and marker.read_text().splitlines() == ["run"]

        rerun_job = job_with(infra, runName=run_name, stopOnDelete=False, rerun=rerun)
        again = submit(rerun_job)
        assert again.returncode == errors.EXIT_SUCCEEDED, again.stdout
        assert again.stdout.splitlines()[-1] == f"ray_submit: job {run_name}-eval-final-rerun1 SUCCEEDED"
        assert marker.read_text().splitlines() == ["run", "run"]
        outcomes = tmp_path / "data" / run_name / "step-outcomes"
        assert json.loads((outcomes / "eval-final.rerun1.json").read_text())["job"] == f"{run_name}-eval-final-rerun1"
        assert json.loads((outcomes / "eval-final.json").read_text())["job"] == f"{run_name}-eval-final"  # kept
        once_more = submit(rerun_job)  # an evicted pod of the rerun's Job: not a third run
        assert once_more.returncode == errors.EXIT_SUCCEEDED and marker.read_text().splitlines() == ["run", "run"]


def test_a_changed_step_is_refused_with_the_rerun_command(jobs_address: str, tmp_path: Path) -> None:
    """The way out the submitter prints for a changed command under a used id is the rerun, with the next number."""
    sid = f"t-changed-{uuid.uuid4().hex[:6]}"
    record = tmp_path / "run" / "step-outcomes" / "convert-hf.rerun1.json"
    base = [sys.executable, str(JOBS / "ray_submit.py"), f"--address={jobs_address}", f"--submission-id={sid}",
            f"--record={record}", "--"]  # fmt: skip
    assert _run([*base, "true"]).returncode == errors.EXIT_SUCCEEDED
    changed = _run([*base, "echo", "changed"])
    assert changed.returncode == errors.EXIT_USAGE, changed.stdout
    hint = "in jobs/: `pulumi config set --path 'rerun[\"convert-hf\"]' 2`, then `pulumi up`"
    assert hint in changed.stdout, changed.stdout
    assert shlex.join(["echo", "changed"]) not in changed.stdout.splitlines()[-1]
