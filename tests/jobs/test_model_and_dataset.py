"""The job settings `model` and `dataset`: refused before any resource is registered when config can tell they
cannot work (with the key, the value and what is allowed), and wired into prepare-data, train, prefetch-weights and
both evaluations when they can. What NeMo RL's own loaders make of the overrides: test_nemo_rl_loader.py and
test_eval.py."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pulumi
import pytest
from config_rules import ConfigError
from conftest import ROOT, shared_infra_run
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job_settings import JobSettings, build_job_settings
from launcher.overrides import model_notes
from launcher.steps import entrypoint_text, pipeline_steps

from tools.offline import load_stack_config, run_program

JOBS = ROOT / "jobs"
DATASET = {"source": "gs://my-bucket/math/rows.jsonl", "problemField": "question", "answerField": "final"}


@pytest.fixture(scope="module")
def infra_outputs() -> dict[str, Any]:
    return shared_infra_run("dev").outputs


@pytest.fixture(scope="module")
def net(infra_outputs) -> InfraOutputs:
    return build_infra_outputs(infra_outputs)


def job(net: InfraOutputs, **values: Any) -> JobSettings:
    project, config = load_stack_config(JOBS, "dev")
    stack = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{project}:")}
    return build_job_settings({**stack, **values}, net)


def steps_of(job_settings: JobSettings, net: InfraOutputs) -> dict[str, list[str]]:
    return {s.name: shlex.split(entrypoint_text(s)) for s in pipeline_steps(job_settings, net)}


@pytest.mark.parametrize(
    ("values", "key", "shown", "allowed"),
    [
        ({"model": "not a model"}, "model", "'not a model'", "a Hugging Face model id, OWNER/NAME"),
        ({"model": "org/name/extra"}, "model", "'org/name/extra'", "OWNER/NAME"),
        ({"model": "org/-name"}, "model", "'org/-name'", "not starting or ending with '-' or '.'"),
        ({"model": "org/na--me"}, "model", "'org/na--me'", "no '--' or '..'"),
        ({"model": "o/" + "n" * 97}, "model", "'o/n", "at most 96 characters"),
        (
            {"model": "org/m", "extraOverrides": ["policy.model_name=org/other"]},
            "extraOverrides",
            "'policy.model_name=org/other'",
            "policy.model_name is derived from model: set that",
        ),
        ({"dataset": "gs://b/x.jsonl"}, "dataset", "'gs://b/x.jsonl'", "an object {source, problemField"),
        ({"dataset": {**DATASET, "problemFeild": "q"}}, "dataset.problemFeild", "'q'", "did you mean 'problemField'?"),
        ({"dataset": {**DATASET, "source": None}}, "dataset.source", None, "a JSONL file: gs://BUCKET/PATH.jsonl"),
        ({"dataset": {**DATASET, "source": "s3://b/x.jsonl"}}, "dataset.source", "'s3://b/x.jsonl'", "hf://datasets/"),
        ({"dataset": {**DATASET, "source": "gs://b/rows.csv"}}, "dataset.source", "'gs://b/rows.csv'", "PATH.jsonl"),
        (
            {"dataset": {**DATASET, "source": "/tmp/x.jsonl"}},
            "dataset.source",
            "'/tmp/x.jsonl'",
            "on Lustre under /data/",
        ),
        (
            {"dataset": {**DATASET, "source": "/data/../etc/x.jsonl"}},
            "dataset.source",
            "'/data/../etc/x.jsonl'",
            "under /data/",
        ),
        (
            {"dataset": {**DATASET, "source": "hf://datasets/org-only/x.jsonl"}},
            "dataset.source",
            "'hf://datasets/org-only/x.jsonl'",
            "hf://datasets/OWNER/NAME[@REVISION]/PATH.jsonl",
        ),
        ({"dataset": {**DATASET, "testSource": "gs://b/t.txt"}}, "dataset.testSource", "'gs://b/t.txt'", "PATH.jsonl"),
        (
            {"dataset": {**DATASET, "problemField": "the question"}},
            "dataset.problemField",
            "'the question'",
            "a letter",
        ),
        ({"dataset": {**DATASET, "answerField": ""}}, "dataset.answerField", "''", "top-level field"),
        ({"dataset": {**DATASET, "answerField": "question"}}, "dataset.answerField", "'question'", "other than"),
        ({"dataset": {**DATASET, "name": "x" * 41}}, "dataset.name", "'xxx", "1-40 letters"),
    ],
)
def test_what_cannot_work_is_refused_with_key_value_and_what_is_allowed(net, values, key, shown, allowed):
    with pytest.raises(ConfigError) as refused:
        job(net, **values)
    message = str(refused.value)
    assert refused.value.key == key
    assert message.startswith(f"config '{key}' " + ("is not set" if shown is None else f"= {shown}"))
    assert allowed in message


def test_an_unknown_dataset_field_is_refused_with_its_value_naming_the_fields_and_the_closest_one(net):
    """The line as the dataset's fields have always been refused: the key, its value, the fields there are."""
    with pytest.raises(ConfigError) as refused:
        job(net, dataset={**DATASET, "problemFeild": "q"})
    assert refused.value.key == "dataset.problemFeild"
    assert str(refused.value) == (
        "config 'dataset.problemFeild' = 'q' is not allowed: a field of dataset: source, problemField, answerField, "
        "testSource, name; did you mean 'problemField'?"
    )
    with pytest.raises(ConfigError) as refused:
        job(net, dataset={**DATASET, "colour": 3})
    assert str(refused.value) == (
        "config 'dataset.colour' = 3 is not allowed: a field of dataset: source, problemField, answerField, "
        "testSource, name"
    )


def test_a_model_with_surrounding_spaces_is_the_model_without_them(net):
    assert job(net, model="  Qwen/Qwen2.5-Math-7B-Instruct ").model == "Qwen/Qwen2.5-Math-7B-Instruct"
    assert job(net, model="   ").model == ""
    # A refusal shows the value as it was given.
    with pytest.raises(ConfigError, match=r"^config 'model' = ' not a model ' is not allowed: a Hugging Face model"):
        job(net, model=" not a model ")


def test_the_benchmark_refuses_a_model_or_a_dataset(infra_outputs):
    big = build_infra_outputs({**infra_outputs, "gpusPerNode": 8, "rayWorkerReplicas": 2})
    values = {"infraStack": "organization/nemo-rl-gke/dev", "benchmark": True}
    for extra in ({"model": "org/m"}, {"dataset": DATASET}):
        with pytest.raises(ConfigError, match=f"so {next(iter(extra))} would be ignored"):
            build_job_settings({**values, **extra}, big)


def test_model_trains_is_prefetched_and_evaluated_before_training(net):
    plain, own = steps_of(job(net), net), steps_of(job(net, model="Qwen/Qwen2.5-Math-7B-Instruct"), net)
    assert not [w for w in plain["train"] if w.startswith(("policy.model_name=", "policy.tokenizer.name="))]
    for name in ("train", "prefetch-weights"):
        assert "policy.model_name=Qwen/Qwen2.5-Math-7B-Instruct" in own[name]
        assert "policy.tokenizer.name=Qwen/Qwen2.5-Math-7B-Instruct" in own[name]
    assert "--model=Qwen/Qwen2.5-Math-7B-Instruct" in own["eval-base"]
    assert not [w for w in own["eval-base"] if w.startswith("--model-of-recipe")]
    assert [w for w in plain["eval-base"] if w.startswith("--model-of-recipe=")]
    assert f"--model={net.mount_path}/smoke-qwen-1p5b/hf" in own["eval-final"]  # the model trained from it


def test_the_plan_says_a_models_fit_is_unchecked(net, infra_outputs, monkeypatch):
    assert model_notes(job(net)) == []
    (note,) = model_notes(job(net, model="org/m"))
    assert note.startswith("model org/m: fit unchecked") and "vllmTensorParallelSize (1)" in note
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warned.append(message))
    project, config = load_stack_config(JOBS, "dev")
    reference = config[f"{project}:infraStack"]
    run_program(JOBS, {**config, f"{project}:model": "org/m"}, stack="dev", stack_outputs={reference: infra_outputs})
    assert note in warned


def test_the_dataset_is_prepared_then_trained_validated_and_evaluated_on(net):
    settings = job(net, dataset={**DATASET, "testSource": "/data/datasets/mine/test.jsonl"})
    assert settings.dataset is not None
    folder = f"{net.mount_path}/datasets/{settings.dataset.folder}"
    assert settings.dataset.folder.startswith("jsonl-") and folder != f"{net.mount_path}/datasets/gsm8k"
    steps = steps_of(settings, net)
    prepare = steps["prepare-data"]
    assert prepare[prepare.index("python") + 1].endswith("/scripts/prepare_jsonl.py")
    assert prepare[prepare.index("python") + 2 :] == [
        f"--output-dir={folder}",
        "--source=gs://my-bucket/math/rows.jsonl",
        "--test-source=/data/datasets/mine/test.jsonl",
        "--problem-field=question",
        "--answer-field=final",
    ]
    assert f"+data.train_data_path={folder}/train.jsonl" in steps["train"]
    assert f"+data.val_data_path={folder}/test.jsonl" in steps["train"]
    for name in ("eval-base", "eval-final"):
        assert f"data.dataset_name={folder}/test.jsonl" in steps[name]
    # Another source or other fields: another folder, so nothing prepared for one dataset is taken for another.
    assert job(net, dataset={**DATASET, "answerField": "answer"}).dataset.folder != settings.dataset.folder  # type: ignore[union-attr]
    # Without the key: GSM8K, as before.
    gsm8k = steps_of(job(net), net)["prepare-data"]
    assert gsm8k[gsm8k.index("python") + 1].endswith("/scripts/prepare_gsm8k.py")
    assert gsm8k[-1] == f"--output-dir={net.mount_path}/datasets/gsm8k"


def test_the_job_program_reads_the_dataset_object_and_ships_the_script(infra_outputs):
    project, config = load_stack_config(JOBS, "dev")
    reference = config[f"{project}:infraStack"]
    config = {**config, f"{project}:dataset": json.dumps(DATASET)}
    run = run_program(JOBS, config, stack="dev", stack_outputs={reference: infra_outputs})
    prepare = next(s for s in run.outputs["pipeline"] if s["step"] == "prepare-data")
    assert (
        "prepare_jsonl.py" in prepare["entrypoint"]
        and "--source=gs://my-bucket/math/rows.jsonl" in prepare["entrypoint"]
    )
    scripts = [r for r in run.resources if r.type == "kubernetes:core/v1:ConfigMap" and r.name.endswith("-scripts")]
    assert scripts and "prepare_jsonl.py" in scripts[0].inputs["data"]
