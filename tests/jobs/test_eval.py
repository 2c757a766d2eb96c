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
from config_rules import ConfigError
from conftest import ROOT, shared_infra_run
from launcher.infra_outputs import InfraOutputs, build_infra_outputs
from launcher.job_settings import JobSettings, build_job_settings
from launcher.overrides import TRAINING_PROMPT_FILE
from launcher.script import eval_summary_show_command, pipeline_script
from launcher.steps import EVAL_CONFIG, EVAL_ENTRYPOINT, Step, entrypoint_text, pipeline_steps
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
                shared_infra_run(stack, {"nemoRlImage": f"nvcr.io/nvidia/nemo-rl:{release}"}).outputs
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


OWN_MODEL = "Qwen/Qwen2.5-Math-7B-Instruct"
OWN_DATASET = {"source": "/data/datasets/mine/rows.jsonl", "problemField": "problem", "answerField": "answer"}
# Each stack as it is, and with the job settings model and dataset (another model, the user's prepared rows).
OWN = {"model": OWN_MODEL, "dataset": OWN_DATASET}


@pytest.mark.parametrize("own", [False, True], ids=["recipe-gsm8k", "model-dataset"])
@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("stack", STACKS)
def test_both_evals_resolve_with_nemo_rls_run_eval_loader(infra, release, stack, own):
    net = infra[release][stack]
    job = job_of(stack, net, **(OWN if own else {}))
    nemo_rl = reference(f"nemo-rl-{release}")
    eval_yaml = yaml.safe_load((nemo_rl / EVAL_CONFIG).read_text())
    readable = flat_keys(eval_yaml) | {f"data.{key}" for key in local_math_keys(nemo_rl)}
    training = resolve_with_nemo_rl(nemo_rl, [f"--config={job.recipe}"])  # the model the recipe starts from
    expected_model = {
        "eval-base": OWN_MODEL if own else training["policy"]["model_name"],
        "eval-final": f"{net.mount_path}/{job.run_name}/hf",
    }
    assert training["policy"]["model_name"] in ("Qwen/Qwen2.5-Math-1.5B-Instruct", "google/gemma-3-27b-it")
    folder = f"{net.mount_path}/datasets/" + (job.dataset.folder if job.dataset else "gsm8k")
    assert folder.rsplit("/", 1)[1].startswith("jsonl-" if own else "gsm8k")
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
        assert data["dataset_name"] == f"{folder}/test.jsonl"
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


def test_an_extra_override_of_the_prompt_and_the_model_setting_are_followed(infra):
    net = infra["v0.7.0"]["h200"]
    job = job_of("h200", net, extraOverrides=["data.default.prompt_file=examples/prompts/math.txt"], model="org/m")
    own, run_eval = eval_model_words(step(job, net, "eval-base"), net)
    assert own[0] == "--model=org/m"
    assert "data.prompt_file=examples/prompts/math.txt" in run_eval
    final_own, _ = eval_model_words(step(job, net, "eval-final"), net)
    assert final_own == [f"--model={net.mount_path}/{job.run_name}/hf"]
    # The model has one way in: an extraOverride of policy.model_name is refused, naming the setting to use.
    with pytest.raises(ConfigError, match=r"config 'extraOverrides' = 'policy.model_name=org/m'.*derived from model"):
        job_of("h200", net, extraOverrides=["policy.model_name=org/m"])


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


def test_the_accuracy_line_names_the_dataset_the_pipeline_evaluated(infra, summary, tmp_path: Path, capsys):
    net = infra["v0.5.0"]["dev"]
    job = job_of("dev", net, dataset={**OWN_DATASET, "name": "MyMath"})
    command = pipeline_script(job, net, pipeline_steps(job, net)).strip().splitlines()[-1]
    words = shlex.split(command)
    assert f"--dataset={net.mount_path}/datasets/{job.dataset.folder}/test.jsonl" in words  # type: ignore[union-attr]
    assert "--dataset-name=MyMath" in words
    assert "--dataset-name" not in pipeline_script(job_of("dev", net), net, pipeline_steps(job_of("dev", net), net))
    dataset = gsm8k_test_file(tmp_path / "test.jsonl", problems=4)
    save_like_nemo_rl("v0.5.0", tmp_path / "base", [1.0, 0.0, 0.0, 1.0], "m")
    out = f"--output={tmp_path}/summary.json"
    assert summary.main([f"--dataset={dataset}", "--dataset-name=MyMath", f"--base={tmp_path}/base", out]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "MyMath test accuracy (pass@1, greedy, n=4): base 0.500"
    assert json.loads((tmp_path / "summary.json").read_text())["datasetName"] == "MyMath"
    # Named after the source file when the setting gives no name.
    assert job_of("dev", net, dataset=OWN_DATASET).dataset.label == "rows"  # type: ignore[union-attr]


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


# --- eval-base's result reused across runs ---------------------------------------------------------------------------

FAKE_RUN_EVAL = '''
"""A stand-in for run_eval.py: writes its output with the release's own _save_evaluation_data_to_json, after
logging its arguments; FAKE_RUN_EVAL=fail exits 1 after a partial write, killed dies of SIGKILL after writing,
slow waits after writing (to be stopped)."""
import ast, json, os, signal, sys, time
from types import SimpleNamespace

words = dict(w.split("=", 1) for w in sys.argv[1:] if "=" in w and not w.startswith("--"))
with open(os.environ["FAKE_RUN_EVAL_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
source = open(EVAL_PY).read()
function = next(n for n in ast.parse(source).body if getattr(n, "name", "") == "_save_evaluation_data_to_json")
namespace = {"json": json, "os": os}
exec(compile(ast.Module(body=[function], type_ignores=[]), "eval.py", "exec"), namespace)
problems = [json.loads(line) for line in open(words["data.dataset_name"]) if line.strip()]
sections = {
    "generation": {"model_name": words["generation.model_name"], "temperature": float(words["generation.temperature"]),
                   "top_p": 1.0, "top_k": -1},
    "data": {"dataset_name": words["data.dataset_name"]},
    "eval": {"metric": words["eval.metric"], "k_value": int(words["eval.k_value"]),
             "num_tests_per_prompt": int(words["eval.num_tests_per_prompt"])},
}
config = sections if RELEASE == "v0.5.0" else SimpleNamespace(**sections)
samples = [
    {"prompt": p["input"], "response": "\\\\boxed{1}", "reward": float(i % 2 == 0), "message_log": [],
     "extra_env_info": {"ground_truth": p["output"]}, "sample_index": i}
    for i, p in enumerate(problems)
]
behaviour = os.environ.get("FAKE_RUN_EVAL", "ok")
if behaviour == "fail":
    os.makedirs(words["eval.save_path"], exist_ok=True)
    open(os.path.join(words["eval.save_path"], "config.json"), "w").write("{}")
    sys.exit(1)
namespace["_save_evaluation_data_to_json"](samples, config, words["eval.save_path"])
if behaviour == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
if behaviour == "slow":
    time.sleep(60)
'''


@pytest.fixture
def eval_model() -> ModuleType:
    return load_script("jobs/scripts/eval_model.py", "eval_model")


class EvalBase:
    """eval_model.py with the cache, as eval-base runs it, on a fake run_eval.py; each call a new run's save path."""

    def __init__(self, root: Path, monkeypatch, release: str = "v0.7.0") -> None:
        self.root = root
        self.run_eval = root / "run_eval.py"
        eval_py = reference(f"nemo-rl-{release}") / "nemo_rl" / "evals" / "eval.py"
        self.run_eval.write_text(f"EVAL_PY = {str(eval_py)!r}\nRELEASE = {release!r}\n{FAKE_RUN_EVAL}")
        self.dataset = gsm8k_test_file(root / "test.jsonl", problems=8)
        self.cache = root / "eval-cache" / "base"
        self.log = root / "run_eval.log"
        monkeypatch.setenv("FAKE_RUN_EVAL_LOG", str(self.log))
        monkeypatch.setenv("HF_HOME", str(root / "hf"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("FAKE_RUN_EVAL", raising=False)

    def words(self, run: str, model: str = "--model=org/base", image: str = "nvcr.io/nvidia/nemo-rl:v0.7.0",
              extra: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
        return [
            model, f"--cache-dir={self.cache}", f"--image={image}", "--",
            str(self.run_eval), "eval.metric=pass@k", "eval.k_value=1", "eval.num_tests_per_prompt=1",
            f"eval.save_path={self.save_path(run)}", "generation.temperature=0.0",
            f"data.dataset_name={self.dataset}", *extra,
        ]  # fmt: skip

    def save_path(self, run: str) -> Path:
        return self.root / run / "eval" / "base"

    def runs(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def entries(self) -> list[Path]:
        return sorted(self.cache.iterdir()) if self.cache.exists() else []


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("release", RELEASES)
def test_a_base_evaluation_is_stored_then_reused_without_starting_run_eval(
    eval_model, summary, tmp_path: Path, monkeypatch, capsys, release
):
    fake = EvalBase(tmp_path, monkeypatch, release)
    assert eval_model.main(fake.words("run1")) == 0
    assert fake.runs() == 1
    [entry] = fake.entries()
    assert (entry / "complete.json").is_file() and tree(entry / "result") == tree(fake.save_path("run1"))
    assert "result stored for later runs" in capsys.readouterr().out
    # A new run (a new runName, so a new save path) on the same model, arguments and image: copied, not run.
    assert eval_model.main(fake.words("run2")) == 0
    assert fake.runs() == 1
    log = capsys.readouterr().out
    assert f"result reused from {entry} (vLLM not started)" in log and "evaluating" not in log
    assert tree(fake.save_path("run2")) == tree(fake.save_path("run1"))
    # What eval_summary.py reads is there, whole, in the new run's folder.
    result = summary.accuracy(fake.save_path("run2"), problems=8)
    assert (result["correct"], result["model"]) == (4, "org/base")
    # The copy replaces whatever a stopped earlier attempt of that run left in its save path.
    (fake.save_path("run2") / "stale.json").write_text("{}")
    assert eval_model.main(fake.words("run2")) == 0
    assert tree(fake.save_path("run2")) == tree(fake.save_path("run1")) and fake.runs() == 1


@pytest.mark.parametrize("behaviour, code", [("fail", 1), ("killed", 128 + 9)])
def test_a_failed_or_killed_evaluation_leaves_no_entry(eval_model, tmp_path: Path, monkeypatch, behaviour, code):
    fake = EvalBase(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_RUN_EVAL", behaviour)
    assert eval_model.main(fake.words("run1")) == code
    assert fake.runs() == 1 and fake.entries() == []
    monkeypatch.setenv("FAKE_RUN_EVAL", "ok")  # the next run evaluates, and stores
    assert eval_model.main(fake.words("run2")) == 0
    assert fake.runs() == 2 and len(fake.entries()) == 1


def test_a_stopped_evaluation_stops_run_eval_and_leaves_no_entry(tmp_path: Path, monkeypatch):
    """A stopped Ray job signals eval_model.py, which now runs run_eval.py as a child: the signal reaches it."""
    fake = EvalBase(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_RUN_EVAL", "slow")
    process = subprocess.Popen([sys.executable, str(EVAL_MODEL), *fake.words("run1")])
    written = fake.save_path("run1") / "evaluation_data.json"
    for _ in range(300):
        if written.exists() or process.poll() is not None:
            break
        __import__("time").sleep(0.1)
    assert written.exists(), "the fake run_eval.py did not start"
    process.send_signal(__import__("signal").SIGTERM)
    assert process.wait(timeout=30) == 128 + 15  # run_eval.py got the signal and died of it, not of a timeout
    assert fake.entries() == []


def test_an_interrupted_store_or_a_damaged_entry_is_not_taken_as_complete(eval_model, tmp_path: Path, monkeypatch):
    fake = EvalBase(tmp_path, monkeypatch)

    def interrupted(folder: Path, key: dict[str, Any]) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(eval_model, "write_marker", interrupted)
        with pytest.raises(KeyboardInterrupt):
            eval_model.main(fake.words("run1"))
    assert fake.entries() == []  # neither an entry nor the temporary folder it was being written in
    assert eval_model.main(fake.words("run2")) == 0 and fake.runs() == 2
    [entry] = fake.entries()
    samples = entry / "result" / "evaluation_data.json"
    samples.write_text(samples.read_text()[:100])  # cut short on Lustre: no longer what the marker lists
    assert eval_model.main(fake.words("run3")) == 0 and fake.runs() == 3
    assert fake.entries() == [entry] and eval_model.is_complete(entry)
    assert tree(fake.save_path("run3")) == tree(fake.save_path("run2"))


@pytest.mark.parametrize(
    "change",
    ["argument", "added argument", "model", "image", "dataset content", "model revision", "save path only"],
)
def test_what_decides_the_result_is_in_the_key(eval_model, tmp_path: Path, monkeypatch, change):
    fake = EvalBase(tmp_path, monkeypatch)
    assert eval_model.main(fake.words("run1")) == 0
    words = fake.words("run2")
    if change == "argument":
        words = [w.replace("generation.temperature=0.0", "generation.temperature=0.5") for w in words]
    elif change == "added argument":
        words = fake.words("run2", extra=("data.prompt_file=examples/prompts/math.txt",))
    elif change == "model":
        words = fake.words("run2", model="--model=org/other")
    elif change == "image":
        words = fake.words("run2", image="nvcr.io/nvidia/nemo-rl:v0.5.0")
    elif change == "dataset content":
        gsm8k_test_file(fake.dataset, problems=6)
    elif change == "model revision":  # the hub's main moved and the Hugging Face cache on Lustre followed it
        ref = tmp_path / "hf" / "hub" / "models--org--base" / "refs" / "main"
        ref.parent.mkdir(parents=True)
        ref.write_text("0123abcd")
    assert eval_model.main(words) == 0
    assert fake.runs() == (1 if change == "save path only" else 2)
    assert len(fake.entries()) == fake.runs()


def test_the_recipes_model_is_keyed_as_resolved(eval_model, tmp_path: Path, monkeypatch):
    """With --model-of-recipe the key holds the model the recipe resolves to, so a recipe (or a `defaults:` file it
    reads) that now names another model misses."""
    fake = EvalBase(tmp_path, monkeypatch)
    recipe = "--model-of-recipe=examples/configs/recipes/llm/r.yaml"
    resolved = iter(["org/base", "org/base", "org/newer"])
    monkeypatch.setattr(eval_model, "recipe_model", lambda nemo_rl_dir, name: next(resolved))
    assert eval_model.main(fake.words("run1", model=recipe)) == 0
    assert eval_model.main(fake.words("run2", model=recipe)) == 0
    assert fake.runs() == 1
    assert eval_model.main(fake.words("run3", model=recipe)) == 0
    assert fake.runs() == 2 and len(fake.entries()) == 2


def test_a_local_model_directory_and_a_cache_without_its_key_are_not_cached(eval_model, tmp_path: Path, monkeypatch):
    fake = EvalBase(tmp_path, monkeypatch)
    local = tmp_path / "model"
    local.mkdir()
    for run in ("run1", "run2"):
        assert eval_model.main(fake.words(run, model=f"--model={local}")) == 0
    assert fake.runs() == 2 and fake.entries() == []
    no_image = [w for w in fake.words("run3") if not w.startswith("--image=")]
    assert eval_model.main(no_image) == 2


def test_only_eval_base_uses_the_cache_keyed_on_the_image(infra):
    net = infra["v0.7.0"]["h200"]
    job = job_of("h200", net)
    base_own, _ = eval_model_words(step(job, net, "eval-base"), net)
    assert base_own[1:] == [f"--cache-dir={net.mount_path}/eval-cache/base", f"--image={net.image}"]
    assert net.image == "nvcr.io/nvidia/nemo-rl:v0.7.0"
    final_own, _ = eval_model_words(step(job, net, "eval-final"), net)
    assert not [w for w in final_own if w.startswith(("--cache-dir", "--image"))]
