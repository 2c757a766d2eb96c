"""jobs/scripts/prefetch_weights.py: which models a run reads (NeMo RL's own loader on the train step's arguments),
complete-or-nothing downloads with a marker written last, skips when complete; all with a fake download, never
the network."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, run_infra_stack
from launcher.infra_outputs import build_infra_outputs
from launcher.job_settings import build_job_settings
from launcher.steps import entrypoint_text, pipeline_steps
from script_loader import load_script
from upstream import nemo_rl_python, reference, resolve_with_nemo_rl

from infra.nemo_rl_releases import NEMO_RL_RELEASES
from tools.offline import load_stack_config

prefetch = load_script("jobs/scripts/prefetch_weights.py", "prefetch_weights")
SCRIPT = ROOT / "jobs" / "scripts" / "prefetch_weights.py"
TOKEN = "hf_PREFETCHTEST_never_printed_7d1e"


class FakeHub:
    """snapshot_download's shape: writes a snapshot under HF_HOME/hub the way huggingface_hub lays it out, file by
    file; `fail_after` files, it raises (a connection lost halfway)."""

    def __init__(self, hf_home: Path, files: dict[str, bytes], fail_after: int | None = None) -> None:
        self.hf_home, self.files, self.fail_after = hf_home, files, fail_after
        self.calls: list[str] = []

    def __call__(self, repo_id: str, **options: object) -> str:
        self.calls.append(repo_id)
        patterns = options.get("ignore_patterns")
        assert isinstance(patterns, list) and "original/*" in patterns
        snapshot = self.hf_home / "hub" / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "abc123"
        snapshot.mkdir(parents=True, exist_ok=True)
        for count, (name, data) in enumerate(self.files.items()):
            if self.fail_after is not None and count >= self.fail_after:
                raise ConnectionError("connection reset by peer")
            if not (snapshot / name).exists():  # huggingface_hub keeps the files it completed
                (snapshot / name).write_bytes(data)
        return str(snapshot)


FILES = {"config.json": b"{}", "model-00001-of-00002.safetensors": b"x" * 64, "model-00002-of-00002.safetensors": b"y"}


def test_a_complete_model_is_skipped_without_a_download(tmp_path: Path):
    hub = FakeHub(tmp_path, FILES)
    said: list[str] = []
    assert prefetch.prefetch("google/gemma-3-27b-it", tmp_path, hub, said.append) == "downloaded"
    marker = prefetch.marker_path(tmp_path, "google/gemma-3-27b-it")
    record = json.loads(marker.read_text())
    assert record["files"] == {name: len(data) for name, data in FILES.items()}
    assert prefetch.prefetch("google/gemma-3-27b-it", tmp_path, hub, said.append) == "skipped"
    assert hub.calls == ["google/gemma-3-27b-it"]  # the second run downloaded nothing
    assert "skipped" in said[-1]


def test_a_download_that_stops_halfway_is_never_taken_as_complete(tmp_path: Path):
    broken = FakeHub(tmp_path, FILES, fail_after=2)
    with pytest.raises(ConnectionError):
        prefetch.prefetch("org/model", tmp_path, broken, print)
    marker = prefetch.marker_path(tmp_path, "org/model")
    assert not marker.exists()  # two of three files are there, and no marker
    assert not prefetch.is_complete(marker)
    # The next run downloads again (huggingface_hub finishes what is missing) and only then marks it complete.
    fixed = FakeHub(tmp_path, FILES)
    assert prefetch.prefetch("org/model", tmp_path, fixed, print) == "downloaded"
    assert fixed.calls == ["org/model"] and prefetch.is_complete(marker)


def test_a_marker_whose_files_are_gone_or_changed_means_redo(tmp_path: Path):
    hub = FakeHub(tmp_path, FILES)
    prefetch.prefetch("org/model", tmp_path, hub, print)
    marker = prefetch.marker_path(tmp_path, "org/model")
    snapshot = Path(json.loads(marker.read_text())["snapshot"])
    (snapshot / "model-00002-of-00002.safetensors").write_bytes(b"")  # truncated
    assert not prefetch.is_complete(marker)
    assert prefetch.prefetch("org/model", tmp_path, hub, print) == "downloaded"
    assert len(hub.calls) == 2
    # A failure after a stale marker leaves no marker behind.
    (snapshot / "config.json").unlink()
    with pytest.raises(ConnectionError):
        prefetch.prefetch("org/model", tmp_path, FakeHub(tmp_path, FILES, fail_after=0), print)
    assert not marker.exists()
    for bad in ("", "not json", json.dumps({"snapshot": str(snapshot), "files": {}})):
        marker.write_text(bad)
        assert not prefetch.is_complete(marker)


def test_run_reports_every_failed_model_and_exits_1(tmp_path: Path):
    said: list[str] = []
    hub = FakeHub(tmp_path, FILES, fail_after=1)
    assert prefetch.run(["a/one", "b/two"], tmp_path, hub, said.append) == 1
    assert hub.calls == ["a/one", "b/two"]  # one failure does not stop the others
    assert "a rerun finishes them" in said[-1]


def test_models_in_reads_model_and_tokenizer_names_and_leaves_paths_alone():
    config = {
        "policy": {"model_name": "google/gemma-3-27b-it", "tokenizer": {"name": "google/gemma-3-27b-it"}},
        "env": {"judge": {"model_name": "Qwen/Qwen2.5-7B-Instruct", "tokenizer": {"name": "/data/local-tokenizer"}}},
        "reward_model": {"model_name": None},
        "logger": {"wandb": {"name": "run-name"}},  # a `name` outside a tokenizer is not a model
    }
    assert prefetch.models_in(config) == ["google/gemma-3-27b-it", "Qwen/Qwen2.5-7B-Instruct"]
    for not_hub in ("/data/x", "./x", "${policy.model_name}", "https://host/x", "a/b/c", ""):
        assert not prefetch.is_hub_id(not_hub), not_hub


def test_high_performance_mode_is_asked_for_and_reported_as_the_image_has_it():
    env: dict[str, str] = {}
    assert prefetch.enable_high_performance(env) and env[prefetch.HIGH_PERFORMANCE] == "1"
    user: dict[str, str] = {prefetch.HIGH_PERFORMANCE: "0"}
    assert not prefetch.enable_high_performance(user) and user[prefetch.HIGH_PERFORMANCE] == "0"
    knows = SimpleNamespace(HF_XET_HIGH_PERFORMANCE=True)
    assert prefetch.high_performance_status(knows, "1.1.2").startswith("on")
    assert prefetch.high_performance_status(SimpleNamespace(), "1.0.0").startswith("off: the image's huggingface_hub")
    assert prefetch.high_performance_status(knows, None).startswith("off: the image has no hf_xet")


# --- the step as the pipeline runs it, with NeMo RL's own loader ---------------------------------------------------


def prefetch_args(stack: str, release: str) -> tuple[list[str], str]:
    """The words after `--` in the prefetch step, and the train step's model as NeMo RL resolves it."""
    infra = build_infra_outputs(run_infra_stack(stack, {"nemoRlImage": f"nvcr.io/nvidia/nemo-rl:{release}"}).outputs)
    project, config = load_stack_config(ROOT / "jobs", stack)
    values = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{project}:")}
    job = build_job_settings(values, infra)
    steps = {step.name: step for step in pipeline_steps(job, infra)}
    words = shlex.split(entrypoint_text(steps["prefetch-weights"]))
    args = words[words.index("--") + 1 :]
    train_words = shlex.split(entrypoint_text(steps["train"]))
    train_args = train_words[train_words.index(infra.nemo_rl_release.grpo_entrypoint) + 1 :]
    assert args == train_args  # the same run, as the train step gets it
    resolved = resolve_with_nemo_rl(reference(f"nemo-rl-{release}"), train_args)
    return args, resolved["policy"]["model_name"]


FAKE_HUB = textwrap.dedent(
    """
    import json, os
    from pathlib import Path
    from . import constants  # noqa: F401

    def snapshot_download(repo_id, **options):
        home = Path(os.environ["HF_HOME"])
        with open(home / "calls.log", "a") as log:
            log.write(json.dumps({"repo": repo_id, "xet_high_performance": os.environ.get("HF_XET_HIGH_PERFORMANCE"),
                                  "token_seen": os.environ.get("HF_TOKEN", "")[:3]}) + "\\n")
        snapshot = home / "hub" / ("models--" + repo_id.replace("/", "--")) / "snapshots" / "abc"
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text("{}")
        return str(snapshot)
    """
)


@pytest.mark.parametrize("release", list(NEMO_RL_RELEASES))
@pytest.mark.parametrize("stack", ["dev", "h200"])
def test_the_step_fetches_the_runs_model_once_with_the_images_loader(tmp_path: Path, stack: str, release: str):
    """The script as the step runs it (NeMo RL's loader from the reference tree, in .venv-nemorl), with a fake
    huggingface_hub: it fetches exactly the model the train step trains, then skips it on a second run."""
    args, model = prefetch_args(stack, release)
    fake = tmp_path / "fake"
    (fake / "huggingface_hub").mkdir(parents=True)
    (fake / "huggingface_hub" / "__init__.py").write_text(FAKE_HUB)
    (fake / "huggingface_hub" / "constants.py").write_text(
        "import os\nHF_XET_HIGH_PERFORMANCE = os.environ.get('HF_XET_HIGH_PERFORMANCE') == '1'\n"
    )
    # An hf_xet distribution beside it, as the image has one (importlib.metadata finds it on the path).
    (fake / "hf_xet-1.1.2.dist-info").mkdir()
    (fake / "hf_xet-1.1.2.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: hf_xet\nVersion: 1.1.2\n")
    hf_home = tmp_path / "hf-cache"
    hf_home.mkdir()
    env = {"PATH": os.environ["PATH"], "HF_HOME": str(hf_home), "HF_TOKEN": TOKEN, "PYTHONPATH": str(fake)}
    command = [str(nemo_rl_python()), str(SCRIPT), f"--nemo-rl-dir={reference(f'nemo-rl-{release}')}", "--", *args]

    def once() -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)

    first = once()
    assert first.returncode == 0, first.stdout + first.stderr
    calls = [json.loads(line) for line in (hf_home / "calls.log").read_text().splitlines()]
    assert [c["repo"] for c in calls] == [model]
    assert calls[0]["xet_high_performance"] == "1" and calls[0]["token_seen"] == "hf_"
    assert "Xet high-performance mode: on (hf_xet 1.1.2)" in first.stdout
    second = once()
    assert second.returncode == 0, second.stdout + second.stderr
    assert len((hf_home / "calls.log").read_text().splitlines()) == 1  # skipped: nothing downloaded again
    assert f"{model}: complete in the cache, skipped" in second.stdout
    for result in (first, second):
        assert TOKEN not in result.stdout + result.stderr


def test_without_hf_home_or_arguments_it_says_what_is_missing(tmp_path: Path):
    env = {"PATH": os.environ["PATH"]}
    result = subprocess.run(
        [str(nemo_rl_python()), str(SCRIPT), "--", "--config=x.yaml"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2 and "HF_HOME" in result.stdout
    result = subprocess.run([str(nemo_rl_python()), str(SCRIPT)], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "after '--'" in result.stdout


def _run_config(model: str, vllm_tp: int) -> dict:
    return {"policy": {"model_name": model, "generation": {"vllm_cfg": {"tensor_parallel_size": vllm_tp}}}}


def test_vllms_tensor_parallel_size_must_divide_the_models_attention_heads():
    """vLLM refuses, at engine start, a tensor-parallel size that does not divide the attention heads ("Total number of
    attention heads (28) must be divisible by tensor parallel size (3)"); the model's config.json tells it first."""
    gemma = {"text_config": {"num_attention_heads": 32}}  # a multimodal config keeps its text model's heads apart
    assert prefetch.fit_problems(_run_config("google/gemma-3-27b-it", 8), gemma) == []
    qwen = {"num_attention_heads": 12}
    [problem] = prefetch.fit_problems(_run_config("Qwen/Qwen2.5-Math-1.5B-Instruct", 8), qwen)
    assert problem == (
        "Qwen/Qwen2.5-Math-1.5B-Instruct has 12 attention heads, which vLLM's tensor parallel size 8 does not divide: "
        "set the job setting vllmTensorParallelSize to one of 1, 2, 3, 4, 6"
    )
    assert prefetch.fit_problems(_run_config("Qwen/Qwen2.5-Math-1.5B-Instruct", 4), qwen) == []
    assert prefetch.fit_problems(_run_config("x/y", 8), {}) == []  # no heads in the config: nothing to say


def test_the_step_fails_on_a_misfit_after_the_download(tmp_path: Path):
    hf_home = tmp_path / "hf"
    hub = FakeHub(hf_home, {**FILES, "config.json": json.dumps({"num_attention_heads": 12}).encode()})
    said: list[str] = []
    assert prefetch.run(["Qwen/Qwen2.5-Math-1.5B-Instruct"], hf_home, hub, said.append) == 0
    assert prefetch.check_fit(_run_config("Qwen/Qwen2.5-Math-1.5B-Instruct", 8), hf_home, said.append) == 1
    assert said[-1].startswith("does not fit: Qwen/Qwen2.5-Math-1.5B-Instruct has 12 attention heads")
    assert prefetch.check_fit(_run_config("Qwen/Qwen2.5-Math-1.5B-Instruct", 2), hf_home, said.append) == 0
    # A model never fetched (or without a config.json): said, not refused.
    assert prefetch.check_fit(_run_config("other/model", 8), hf_home, said.append) == 0
    assert said[-1] == "other/model: no config.json in its snapshot; its fit to the run's sizes is not checked here"
