"""GSM8K accuracy before and after training: the eval steps' words go through eval_model.py and then NeMo RL's own
config loader the way examples/run_eval.py reads them, at every supported release; the keys they set are keys NeMo
RL reads (eval.yaml, or the local math dataset's loader); the summary is computed from output written by the
release's own _save_evaluation_data_to_json."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml
from conftest import ROOT, run_infra_stack
from launcher.pipeline import (
    EVAL_CONFIG,
    EVAL_ENTRYPOINT,
    TRAINING_PROMPT_FILE,
    Step,
    entrypoint_text,
    eval_summary_show_command,
    pipeline_script,
    pipeline_steps,
)
from launcher.settings import ConfigError, InfraOutputs, JobSettings, build_infra_outputs, build_job_settings
from script_loader import load_script
from upstream import nemo_rl_python, reference, resolve_with_nemo_rl

from infra.nemo_rl_releases import NEMO_RL_RELEASES
from tools.offline import load_stack_config

STACKS = ("dev", "h200", "b200")
RELEASES = tuple(NEMO_RL_RELEASES)
EVAL_MODEL = ROOT / "jobs" / "scripts" / "eval_model.py"
GSM8K_TEST_PROBLEMS = 1319


@pytest.fixture(scope="module")
def infra() -> dict[str, dict[str, InfraOutputs]]:
    return {
        release: {
            stack: build_infra_outputs(
                run_infra_stack(stack, {"nemoRlImage": f"nvcr.io/nvidia/nemo-rl:{release}"}).outputs
            )
            for stack in STACKS
        }
        for release in RELEASES
    }


def job_of(stack: str, net: InfraOutputs, **changes: Any) -> JobSettings:
    project, config = load_stack_config(ROOT / "jobs", stack)
    values = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{project}:")}
    return build_job_settings({**values, **changes}, net)


def step(job: JobSettings, net: InfraOutputs, name: str) -> Step:
    return next(s for s in pipeline_steps(job, net) if s.name == name)


def eval_model_words(eval_step: Step, net: InfraOutputs) -> tuple[list[str], list[str]]:
    """(eval_model.py's own words, run_eval.py and its words), as bash splits the entrypoint on the Ray head."""
    words = shlex.split(entrypoint_text(eval_step))
    assert words[:6] == ["cd", "/opt/nemo-rl", "&&", "uv", "run", "python"]
    assert words[6] == f"{net.mount_path}/{eval_step.submission_id.rsplit('-eval-', 1)[0]}/scripts/eval_model.py"
    cut = words.index("--")
    return words[7:cut], words[cut + 1 :]


def through_eval_model(nemo_rl_dir: Path, own: list[str], run_eval: list[str]) -> list[str]:
    """The run_eval.py command eval_model.py would exec, run for real in .venv-nemorl from the NeMo RL tree."""
    result = subprocess.run(
        [str(nemo_rl_python()), str(EVAL_MODEL), *own, "--dry-run", "--", *run_eval],
        cwd=nemo_rl_dir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    command: list[str] = json.loads(result.stdout)
    return command


def local_math_keys(nemo_rl_dir: Path) -> set[str]:
    """The data_config keys load_eval_dataset reads in its fallback to LocalMathDataset (the `else` branch)."""
    source = (nemo_rl_dir / "nemo_rl" / "data" / "datasets" / "eval_datasets" / "__init__.py").read_text()
    fallback = source[source.index("# fall back to local dataset") :]
    return set(re.findall(r'data_config\["(\w+)"\]', fallback)) | {"dataset_name"}


def flat_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys.add(f"{prefix}{key}")
        if isinstance(value, dict):
            keys |= flat_keys(value, f"{prefix}{key}.")
    return keys


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("stack", STACKS)
def test_both_evals_resolve_with_nemo_rls_run_eval_loader(infra, release, stack):
    net = infra[release][stack]
    job = job_of(stack, net)
    nemo_rl = reference(f"nemo-rl-{release}")
    eval_yaml = yaml.safe_load((nemo_rl / EVAL_CONFIG).read_text())
    readable = flat_keys(eval_yaml) | {f"data.{key}" for key in local_math_keys(nemo_rl)}
    training = resolve_with_nemo_rl(nemo_rl, [f"--config={job.recipe}"])  # the model the train step starts from
    expected_model = {
        "eval-base": training["policy"]["model_name"],
        "eval-final": f"{net.mount_path}/{job.run_name}/hf",
    }
    assert expected_model["eval-base"] in ("Qwen/Qwen2.5-Math-1.5B-Instruct", "google/gemma-3-27b-it")
    for name in ("eval-base", "eval-final"):
        own, run_eval = eval_model_words(step(job, net, name), net)
        assert run_eval[:2] == [EVAL_ENTRYPOINT, f"--config={EVAL_CONFIG}"]
        # run_eval.py merges with OmegaConf, not Hydra: a '+' would become part of the key, and a misspelt key
        # would be added silently, so every key must be one NeMo RL reads.
        for word in run_eval[2:]:
            key = word.split("=", 1)[0]
            assert key in readable, f"{key} is neither in eval.yaml nor read by the local math dataset"
        command = through_eval_model(nemo_rl, own, run_eval)
        assert command[1:-1] == run_eval and command[-1].startswith("generation.model_name=")
        config = resolve_with_nemo_rl(nemo_rl, command[2:], entrypoint="run_eval")

        assert config["generation"]["model_name"] == config["tokenizer"]["name"] == expected_model[name]
        # Greedy, one sample per problem, pass@1.
        assert config["eval"]["metric"] == "pass@k"
        assert (config["eval"]["k_value"], config["eval"]["num_tests_per_prompt"]) == (1, 1)
        assert config["generation"]["temperature"] == 0.0
        assert config["eval"]["save_path"] == f"{net.mount_path}/{job.run_name}/eval/{name.removeprefix('eval-')}"
        # GSM8K's test split through the local math dataset, asked in the training prompt.
        data = config["data"]
        assert data["dataset_name"] == f"{net.mount_path}/datasets/gsm8k/test.jsonl"
        assert (data["problem_key"], data["solution_key"]) == ("input", "output")  # prepare_gsm8k.py's fields
        assert (data["file_format"], data["split"]) == ("json", "train")
        assert data["prompt_file"] == TRAINING_PROMPT_FILE and (nemo_rl / TRAINING_PROMPT_FILE).is_file()
        # vLLM on one node with the run's generation parallelism, its GPUs evenly shared.
        assert (config["cluster"]["num_nodes"], config["cluster"]["gpus_per_node"]) == (1, net.gpus_per_node)
        tp = config["generation"]["vllm_cfg"]["tensor_parallel_size"]
        assert tp == job.vllm_tensor_parallel_size and net.gpus_per_node % tp == 0
        assert config["generation"]["backend"] == "vllm"


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("stack", STACKS)
def test_the_eval_prompt_is_the_one_the_recipe_trains_with(infra, release, stack):
    """The pipeline writes TRAINING_PROMPT_FILE; each shipped recipe, resolved by the release's loader, trains with
    exactly that file (and no system prompt, which eval.yaml does not set either)."""
    net = infra[release][stack]
    job = job_of(stack, net)
    config = resolve_with_nemo_rl(reference(f"nemo-rl-{release}"), [f"--config={job.recipe}"])
    data = config["data"]
    prompts = data if "prompt_file" in data else data["default"]
    assert (prompts["prompt_file"], prompts["system_prompt_file"]) == (TRAINING_PROMPT_FILE, None)


def test_an_extra_override_of_the_prompt_or_the_model_is_followed(infra):
    net = infra["v0.7.0"]["h200"]
    job = job_of(
        "h200", net, extraOverrides=["data.default.prompt_file=examples/prompts/math.txt", "policy.model_name=org/m"]
    )
    own, run_eval = eval_model_words(step(job, net, "eval-base"), net)
    assert own == ["--model=org/m"]
    assert "data.prompt_file=examples/prompts/math.txt" in run_eval
    final_own, _ = eval_model_words(step(job, net, "eval-final"), net)
    assert final_own == [f"--model={net.mount_path}/{job.run_name}/hf"]


def test_eval_steps_order_and_keys(infra):
    net = infra["v0.5.0"]["h200"]  # with an export bucket
    names = [s.name for s in pipeline_steps(job_of("h200", net), net)]
    assert names.index("prepare-data") < names.index("eval-base") < names.index("train")
    assert names[-3:] == ["convert-hf", "export-gcs", "eval-final"]
    assert "eval-base" not in [s.name for s in pipeline_steps(job_of("h200", net, evalBase=False), net)]
    assert "eval-final" not in [s.name for s in pipeline_steps(job_of("h200", net, evalFinal=False), net)]
    with pytest.raises(ConfigError, match=r"evalFinal.*convertToHf"):
        job_of("h200", net, convertToHf=False)
    off = job_of("h200", net, convertToHf=False, evalFinal=False, evalBase=False)
    assert not [s for s in pipeline_steps(off, net) if s.name.startswith("eval")]
    assert "eval_summary.py" not in pipeline_script(off, net, pipeline_steps(off, net))
    assert eval_summary_show_command(off, net) == ""


# --- the summary, from output in the release's own format ----------------------------------------------------------


def save_like_nemo_rl(release: str, save_path: Path, rewards: list[float], model: str, temperature: float = 0.0):
    """Write an evaluation's output with the release's own _save_evaluation_data_to_json (taken from
    nemo_rl/evals/eval.py by its syntax tree: the module itself needs torch and Ray)."""
    source = (reference(f"nemo-rl-{release}") / "nemo_rl" / "evals" / "eval.py").read_text()
    function = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "_save_evaluation_data_to_json"
    )
    namespace: dict[str, Any] = {"json": json, "os": __import__("os")}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "eval.py", "exec"), namespace)
    sections = {
        "generation": {"model_name": model, "temperature": temperature, "top_p": 1.0, "top_k": -1},
        "data": {"dataset_name": "/data/datasets/gsm8k/test.jsonl"},
        "eval": {"metric": "pass@k", "k_value": 1, "num_tests_per_prompt": 1},
    }
    # v0.5.0 indexes a dict (master_config["eval"]); v0.7.0 reads attributes of a pydantic model.
    master_config: Any = sections if release == "v0.5.0" else SimpleNamespace(**sections)
    samples = [
        {
            "prompt": f"problem {i}",
            "response": "\\boxed{1}",
            "reward": reward,
            "message_log": [{"role": "user", "content": f"problem {i}"}],
            "extra_env_info": {"ground_truth": "1"},
            "sample_index": i,
        }
        for i, reward in enumerate(rewards)
    ]
    namespace["_save_evaluation_data_to_json"](samples, master_config, str(save_path))


@pytest.fixture(scope="module")
def summary() -> ModuleType:
    return load_script("jobs/scripts/eval_summary.py", "eval_summary")


def gsm8k_test_file(path: Path, problems: int = GSM8K_TEST_PROBLEMS) -> Path:
    path.write_text("".join(json.dumps({"input": f"q{i}", "output": "1"}) + "\n" for i in range(problems)))
    return path


@pytest.mark.parametrize("release", RELEASES)
def test_the_job_log_ends_with_the_accuracy_line(summary, tmp_path: Path, release, capsys):
    dataset = gsm8k_test_file(tmp_path / "test.jsonl")
    base_rewards = [1.0] * 600 + [0.0] * (GSM8K_TEST_PROBLEMS - 600)  # 0.4549
    trained_rewards = [1.0] * 1000 + [0.0] * (GSM8K_TEST_PROBLEMS - 1000)  # 0.7582
    save_like_nemo_rl(release, tmp_path / "eval" / "base", base_rewards, "google/gemma-3-27b-it")
    save_like_nemo_rl(release, tmp_path / "eval" / "final", trained_rewards, "/data/run/hf")
    output = tmp_path / "eval" / "summary.json"
    args = [f"--dataset={dataset}", f"--base={tmp_path}/eval/base", f"--trained={tmp_path}/eval/final"]
    assert summary.main([*args, f"--output={output}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "GSM8K test accuracy (pass@1, greedy, n=1319): base 0.455 -> trained 0.758"
    written = json.loads(output.read_text())
    assert written["base"]["correct"] == 600 and written["trained"]["correct"] == 1000
    assert written["base"]["model"] == "google/gemma-3-27b-it" and written["problems"] == GSM8K_TEST_PROBLEMS
    assert written["change"] == pytest.approx(400 / GSM8K_TEST_PROBLEMS)


def test_the_summary_refuses_what_the_line_would_misstate(summary, tmp_path: Path, capsys):
    dataset = gsm8k_test_file(tmp_path / "test.jsonl", problems=4)
    out = f"--output={tmp_path}/summary.json"
    save_like_nemo_rl("v0.5.0", tmp_path / "sampled", [1.0, 0.0, 0.0, 1.0], "m", temperature=1.0)
    assert summary.main([f"--dataset={dataset}", f"--base={tmp_path}/sampled", out]) == 1
    assert "not a greedy pass@1" in capsys.readouterr().err
    save_like_nemo_rl("v0.5.0", tmp_path / "short", [1.0, 0.0, 1.0], "m")
    assert summary.main([f"--dataset={dataset}", f"--base={tmp_path}/short", out]) == 1
    assert "3 samples for 4 problems" in capsys.readouterr().err
    assert summary.main([f"--dataset={dataset}", f"--trained={tmp_path}/missing", out]) == 1
    assert not (tmp_path / "summary.json").exists()
    save_like_nemo_rl("v0.5.0", tmp_path / "ok", [1.0, 0.0, 0.0, 1.0], "m")
    assert summary.main([f"--dataset={dataset}", f"--trained={tmp_path}/ok", out]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "GSM8K test accuracy (pass@1, greedy, n=4): trained 0.500"


def test_the_pipeline_runs_the_summary_last_on_the_eval_dirs(infra, summary, tmp_path: Path):
    net = infra["v0.5.0"]["dev"]
    job = job_of("dev", net)
    script = pipeline_script(job, net, pipeline_steps(job, net))
    last = shlex.split(script.strip().splitlines()[-1])
    run_dir = f"{net.mount_path}/{job.run_name}"
    assert last == [
        "python",
        "/opt/launcher/eval_summary.py",
        f"--dataset={net.mount_path}/datasets/gsm8k/test.jsonl",
        f"--base={run_dir}/eval/base",
        f"--trained={run_dir}/eval/final",
        f"--output={run_dir}/eval/summary.json",
    ]
    assert eval_summary_show_command(job, net) == (
        f"kubectl --namespace {net.namespace} exec service/nemo-rl-dev-ray-head-svc -c ray-head -- "
        f"cat {run_dir}/eval/summary.json"
    )


def test_kuberay_names_the_head_container_as_the_summary_command_does():
    template = reference("kuberay-v1.5.1") / "helm-chart" / "ray-cluster" / "templates" / "raycluster-cluster.yaml"
    assert "- name: ray-head" in template.read_text()


# --- the converted model gets the processor files vLLM needs ---------------------------------------------------------


def test_the_conversion_gets_the_base_models_processor_files(tmp_path: Path, monkeypatch):
    convert = load_script("jobs/scripts/convert_checkpoint.py", "convert_checkpoint")
    base = tmp_path / "gemma"  # a model directory with a processor, as google/gemma-3-27b-it has
    base.mkdir()
    (base / "preprocessor_config.json").write_text('{"image_processor_type": "Gemma3ImageProcessor"}')
    step_dir = tmp_path / "run" / "step_3"
    (step_dir / "policy" / "weights").mkdir(parents=True)
    (step_dir / "config.yaml").write_text(yaml.safe_dump({"policy": {"model_name": str(base)}}))
    assert convert.base_model(step_dir) == str(base)

    class Done:
        returncode = 0

    def fake_converter(command: list[str], check: bool) -> Done:
        out = Path(command[-1].split("=", 1)[1])
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # what the converter writes: config, weights, tokenizer
        return Done()

    monkeypatch.setattr(convert.subprocess, "run", fake_converter)
    hf = tmp_path / "run" / "hf"
    args = ["--checkpoint-dir", str(tmp_path / "run"), "--output-dir", str(hf)]
    assert convert.main(args) == 0
    assert (hf / "preprocessor_config.json").read_text() == (base / "preprocessor_config.json").read_text()
    assert not (hf / "processor_config.json").exists()  # the base model has none: nothing invented
    # A conversion made before (marked, without the file) gets it on the next run, without converting again.
    (hf / "preprocessor_config.json").unlink()
    monkeypatch.setattr(convert.subprocess, "run", lambda *a, **k: pytest.fail("converted again"))
    assert convert.main(args) == 0
    assert (hf / "preprocessor_config.json").is_file()


def test_eval_model_refuses_a_model_in_the_words_it_adds_the_model_to():
    module = load_script("jobs/scripts/eval_model.py", "eval_model")
    assert module.main(["--model=m", "--", "examples/run_eval.py", "generation.model_name=x"]) == 2
    assert module.main(["--model=m"]) == 2
    assert module.run_eval_command(["examples/run_eval.py", "a=1"], "m") == [
        sys.executable, "examples/run_eval.py", "a=1", "generation.model_name=m",
    ]  # fmt: skip
