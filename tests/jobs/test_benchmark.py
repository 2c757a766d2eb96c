"""The benchmark job stack (jobs/Pulumi.h200-benchmark.yaml): NeMo RL's Llama 3.1 8B performance recipes, resolved
by each release's own loader, differ from the recipes only in paths, the step count and logging; the data they read
is prepared on Lustre; the summary line comes from TensorBoard event files written the way NeMo RL's logger writes
them, under the metric names grpo.py logs."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from config_rules import ConfigError
from conftest import ROOT
from launcher import performance
from launcher.benchmark_settings import DEFAULT_BENCHMARK_RECIPES
from launcher.cost import run_estimate
from launcher.infra_outputs import FLAT_DATA
from launcher.job_settings import build_job_settings
from launcher.paths import benchmark_dataset_dir
from launcher.script import benchmark_summary_command, measured_steps, pipeline_script
from launcher.steps import entrypoint_text, pipeline_steps
from test_nemo_rl_loader import RELEASES, infra, stack_values  # noqa: F401 (the module fixture)
from upstream import reference, resolve_with_nemo_rl

SCRIPTS = ROOT / "jobs" / "scripts"
if str(SCRIPTS) not in sys.path:  # as on the Ray head: the scripts run from their folder and import each other
    sys.path.insert(0, str(SCRIPTS))
STACK = "h200-benchmark"


def benchmark_values(**changes: Any) -> dict[str, Any]:
    return stack_values(STACK, **changes)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def train_args(step: Any, entrypoint: str) -> list[str]:
    words = shlex.split(entrypoint_text(step))
    return words[words.index(entrypoint) + 1 :]


@pytest.mark.parametrize("release", RELEASES)
def test_each_recipe_runs_unchanged_but_for_paths_steps_and_logging(infra, release):  # noqa: F811
    net = infra[release]["h200"]
    job = build_job_settings(benchmark_values(), net)
    steps = {step.name: step for step in pipeline_steps(job, net)}
    # The Llama 3.1 8B trio: on-policy, 1-step off-policy, and 1-step off-policy in FP8.
    assert [name for name in steps if name.startswith("train")] == [f"train-{n}" for n in DEFAULT_BENCHMARK_RECIPES]
    assert "convert-hf" not in steps and "train" not in steps
    tree = reference(f"nemo-rl-{release}")
    for item in job.benchmark_recipes:
        args = train_args(steps[f"train-{item.label}"], net.nemo_rl_release.grpo_entrypoint)
        assert args[0] == f"--config={item.recipe.path}"
        ours = flatten(resolve_with_nemo_rl(tree, args))
        theirs = flatten(resolve_with_nemo_rl(tree, args[:1]))
        changed = {key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key)}
        allowed = re.compile(
            r"^(grpo\.max_num_steps|checkpointing\.checkpoint_dir|logger\.(log_dir|wandb_enabled)|data\..*)$"
        )
        assert changed and all(allowed.match(key) for key in changed), sorted(changed)
        # Everything that makes the measurement is NVIDIA's: batch, cluster, parallelism, colocation, async.
        for key in ("grpo.num_prompts_per_step", "policy.train_global_batch_size", "cluster.num_nodes"):
            assert ours[key] == theirs[key]
        assert ours["grpo.async_grpo.enabled"] is item.recipe.async_grpo
        assert ours["policy.megatron_cfg.fp8_cfg.enabled"] is item.recipe.fp8
        assert ours["policy.megatron_cfg.enabled"] is True
        assert ours["grpo.max_num_steps"] == job.max_num_steps
        assert ours["logger.tensorboard_enabled"] is True  # the summary reads its event files
        # The recipe reads OpenMathInstruct-2 from the hub; the run reads the same data prepared on Lustre.
        folder = benchmark_dataset_dir(net)
        if net.nemo_rl_release.data_layout == FLAT_DATA:
            assert theirs["data.dataset_name"] == "OpenMathInstruct-2"
            assert (ours["data.train_data_path"], ours["data.val_data_path"]) == (
                f"{folder}/train.jsonl",
                f"{folder}/validation.jsonl",
            )
        else:
            assert theirs["data.train.dataset_name"] == "OpenMathInstruct-2"
            assert theirs["data.train.split_validation_size"] == 0.05
            assert ours["data.train.data_path"] == f"{folder}/train.jsonl"
            assert ours["data.validation.data_path"] == f"{folder}/validation.jsonl"
    prepare = steps["prepare-data"]
    assert "prepare_openmathinstruct2.py" in entrypoint_text(prepare) and folder in entrypoint_text(prepare)


def test_the_prepared_data_is_what_nemo_rl_loads_for_the_recipe():
    """NeMo RL's loader for `OpenMathInstruct-2` (v0.5.0's response_datasets): the hub name, split and hold-out the
    preparation reproduces."""
    import prepare_openmathinstruct2 as prepare

    source = reference("nemo-rl-v0.5.0") / "nemo_rl" / "data" / "datasets" / "response_datasets" / "__init__.py"
    assert re.search(
        r'dataset_name == "OpenMathInstruct-2":.*?OpenMathInstruct2Dataset\(seed=seed\)', source.read_text(), re.S
    )
    assert (prepare.HUB_DATASET, prepare.HUB_SPLIT, prepare.VALIDATION_SIZE, prepare.SEED) == (
        "nvidia/OpenMathInstruct-2",
        "train_1M",
        0.05,
        42,
    )


def test_prepare_writes_input_output_rows_skips_when_complete_and_rebuilds_a_partial_one(tmp_path):
    import prepare_openmathinstruct2 as prepare

    rows = [
        {"problem": f"What is {i}+{i}?", "expected_answer": str(2 * i), "generated_solution": "..."} for i in range(20)
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    out.mkdir()
    split = lambda loaded: (loaded[:19], loaded[19:])  # noqa: E731 - the split itself is the datasets library's
    assert prepare.prepare(out, source, split) == 0
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert train[3] == {"input": "What is 3+3?", "output": "6"} and len(train) == 19
    assert json.loads((out / "_COMPLETE.json").read_text())["splits"]["validation"]["rows"] == 1
    calls: list[int] = []

    def counted(loaded: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        calls.append(1)
        return split(loaded)

    assert prepare.prepare(out, source, counted) == 0
    assert calls == []  # complete: skipped without loading
    (out / "validation.jsonl").write_text("")  # a file that disagrees with the manifest: rebuilt
    assert prepare.prepare(out, source, counted) == 0
    assert calls == [1] and (out / "validation.jsonl").read_text().count("\n") == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "x"}) + "\n")
    assert prepare.prepare(tmp_path / "bad", bad, lambda loaded: (loaded, [])) == 1
    assert not (tmp_path / "bad" / "_COMPLETE.json").exists()


def test_benchmark_settings_are_refused_where_they_would_be_ignored_or_cannot_run(infra):  # noqa: F811
    h200, dev = infra[RELEASES[0]]["h200"], infra[RELEASES[0]]["dev"]
    with pytest.raises(ConfigError, match="numPromptsPerStep would be ignored") as error:
        build_job_settings(benchmark_values(numPromptsPerStep=64), h200)
    assert error.value.key == "benchmark"
    with pytest.raises(ConfigError, match="asyncGrpo"):
        build_job_settings(benchmark_values(asyncGrpo=True), h200)
    with pytest.raises(ConfigError, match="it needs 2 nodes of 8 GPUs") as error:
        build_job_settings(benchmark_values(infraStack="organization/nemo-rl-gke/dev"), dev)
    assert error.value.key == "benchmarkRecipes" and error.value.value == DEFAULT_BENCHMARK_RECIPES[0]
    with pytest.raises(ConfigError, match="maxNumSteps"):
        build_job_settings(benchmark_values(maxNumSteps=6), h200)
    with pytest.raises(ConfigError, match="convertToHf"):
        build_job_settings(benchmark_values(convertToHf=True), h200)


def test_the_summary_command_ends_the_job_log_and_the_estimate_counts_both_recipes(infra):  # noqa: F811
    net = infra[RELEASES[0]]["h200"]
    job = build_job_settings(benchmark_values(), net)
    assert measured_steps(job) == (5, 9)
    script = pipeline_script(job, net, pipeline_steps(job, net))
    assert script.rstrip().splitlines()[-1] == shlex.join(benchmark_summary_command(job, net))
    run = run_estimate(job, net)
    assert run["steps"] == 3 * job.max_num_steps and run["nodes"] == 2
    assert run["gpuHours"] == pytest.approx(2 * 8 * job.max_num_steps * (92.8 + 64.8 + 53.0) / 3600, abs=0.01)
    summary = benchmark_summary_command(job, net)
    assert "--mode=grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off:/data/benchmark-llama3-8b/logs/" in " ".join(summary)
    assert "--about=grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off:1-step off-policy, FP8, 16 GPUs" in summary
    assert benchmark_summary_command(build_job_settings(stack_values("h200"), net), net) == []


# --- the summary, on TensorBoard event files written as NeMo RL writes them ------------------------------------


def logged_metric_names(release: str) -> set[str]:
    """The scalar names both GRPO loops of grpo.py log for the summary: the step time under prefix timing/train and
    print_performance_metrics' dict under prefix performance (its tokens_per_sec_per_gpu key is in
    algorithms/utils.py, which the reference set does not hold)."""
    source = (reference(f"nemo-rl-{release}") / "nemo_rl" / "algorithms" / "grpo.py").read_text()
    assert source.count('timer.time("total_step_time")') == 2  # the sync and the async loop
    timing = re.findall(r'log_metrics\(\s*timing_metrics,[^)]*prefix="(timing/train)"', source)
    performance = re.findall(r'log_metrics\(\s*performance_metrics,[^)]*prefix="(performance)"', source)
    assert len(timing) == len(performance) == 2, (timing, performance)
    return {f"{timing[0]}/total_step_time", f"{performance[0]}/tokens_per_sec_per_gpu"}


def write_fake_run(log_dir: Path, attempt: int, steps: dict[int, tuple[float, float]]) -> None:
    """Event files as NeMo RL's TensorboardLogger writes them: torch's SummaryWriter in LOG_DIR/exp_NNN/tensorboard,
    add_scalar(f"{prefix}/{name}", value, step) for every metric of the step."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir / f"exp_{attempt:03d}" / "tensorboard"))
    for step, (seconds, tokens) in steps.items():
        for name, value in {"total_step_time": seconds, "generation": seconds / 2}.items():
            writer.add_scalar(f"timing/train/{name}", value, step)
        for name, value in {"tokens_per_sec_per_gpu": tokens, "tokens_per_sec": tokens * 16}.items():
            writer.add_scalar(f"performance/{name}", value, step)
        writer.add_scalar("train/loss", 0.1, step)
    writer.close()


def summarize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "benchmark_summary.py"), *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("release", RELEASES)
def test_the_summary_line_from_a_fake_run_in_nemo_rls_logging_format(tmp_path, release):
    import benchmark_summary

    assert logged_metric_names(release) == {benchmark_summary.STEP_TIME, benchmark_summary.TOKENS_PER_GPU}
    sync, off, new = tmp_path / "sync", tmp_path / "async-1off", tmp_path / "new"
    # Step 1 is slow (start-up) and step 10 validates: neither is averaged.
    write_fake_run(sync, 1, {1: (300.0, 400.0), **{s: (90.0 + s, 1600.0 - s) for s in range(2, 11)}})
    # The off-policy run failed after step 6 and resumed in exp_002: the retry's values win.
    write_fake_run(off, 1, {s: (500.0, 10.0) for s in range(1, 7)})
    write_fake_run(off, 2, {s: (60.0 + s, 2500.0) for s in range(5, 11)})
    write_fake_run(new, 1, {s: (40.0, 3000.0) for s in range(1, 11)})  # a recipe no summary has a figure for
    result = summarize(
        "--first-step=5",
        "--last-step=9",
        f"--mode=sync:{sync}:92.8:1581",
        "--about=sync:on-policy, BF16, 16 GPUs",
        "--published-by=sync:NVIDIA DGX-H100 (NeMo RL v0.5.0 performance summary)",
        f"--mode=async-1off:{off}:64.8:2478",
        f"--mode=new:{new}:unknown:unknown",
        "--published-by=new:unknown",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines == [
        "benchmark sync (on-policy, BF16, 16 GPUs): 97.0 s/step, 1,593 tokens/s/GPU (steps 5-9) vs NVIDIA DGX-H100 "
        "(NeMo RL v0.5.0 performance summary) 92.8 s, 1,581: 1.01x tokens/s/GPU, 1.05x step time",
        "benchmark async-1off: 67.0 s/step, 2,500 tokens/s/GPU (steps 5-9) vs NVIDIA 64.8 s, 2,478: "
        "1.01x tokens/s/GPU, 1.03x step time",
        "benchmark new: 40.0 s/step, 3,000 tokens/s/GPU (steps 5-9) vs unknown: no published figure for this recipe",
    ]


def test_the_summary_fails_naming_the_folder_when_steps_are_missing(tmp_path):
    write_fake_run(tmp_path / "sync", 1, {s: (90.0, 1500.0) for s in range(1, 7)})
    result = summarize("--first-step=5", "--last-step=9", f"--mode=sync:{tmp_path / 'sync'}:92.8:1581")
    assert result.returncode == 1
    assert "steps [7, 8, 9]" in result.stderr and str(tmp_path / "sync") in result.stderr


# --- any performance recipe of the image's release ------------------------------------------------------------------


def test_the_benchmark_takes_any_recipe_that_fits_and_sizes_the_run_from_it(infra):  # noqa: F811
    h200 = infra[RELEASES[0]]["h200"]
    four = h200.model_copy(update={"ray_worker_replicas": 4})
    # One name (as `pulumi config set benchmarkRecipes NAME` stores it), a file name, or a list.
    for given in (
        "grpo-qwen3-32b-4n8g",
        "grpo-qwen3-32b-4n8g.yaml",
        [f"{performance.PERFORMANCE_DIR}/grpo-qwen3-32b-4n8g.yaml"],
    ):
        job = build_job_settings(benchmark_values(benchmarkRecipes=given), four)
        assert [item.label for item in job.benchmark_recipes] == ["grpo-qwen3-32b-4n8g"]
        assert job.num_nodes == 4  # the recipe's cluster.num_nodes, not numNodes
    steps = pipeline_steps(job, four)
    train = next(step for step in steps if step.name == "train-grpo-qwen3-32b-4n8g")
    assert "--nodes=4" in entrypoint_text(train)  # each recipe waits for its own nodes
    assert "--nodes=4" in entrypoint_text(next(step for step in steps if step.name == "preflight-nccl"))
    run = run_estimate(job, four)
    assert (run["nodes"], run["secondsPerStep"]) == (4, 376.0)  # NVIDIA's DGX-H100 figure, carried to H200
    assert "DGX-H100" in " ".join(run["notes"]) and "performance-summary.md" in run["secondsPerStepFrom"]
    summary = benchmark_summary_command(job, four)
    assert any(arg.endswith(":376:571") for arg in summary)
    assert "--published-by=grpo-qwen3-32b-4n8g:NVIDIA DGX-H100 (NeMo RL v0.5.0 performance summary)" in summary
    # Two models: each fetched once, before the first recipe that trains it.
    mixed = build_job_settings(
        benchmark_values(benchmarkRecipes=["grpo-llama3.1-8b-instruct-2n8g", "grpo-qwen3-32b-4n8g"]), four
    )
    names = [step.name for step in pipeline_steps(mixed, four)]
    assert names[names.index("prepare-data") :] == [
        "prepare-data",
        "prefetch-weights",
        "train-grpo-llama3.1-8b-instruct-2n8g",
        "prefetch-weights-2",
        "train-grpo-qwen3-32b-4n8g",
    ]
    # The 2-node recipe holds 2 of the run's 4 nodes: counted as such.
    assert run_estimate(mixed, four)["stepGpuHours"] == pytest.approx(
        (2 * 92.8 + 4 * 376) * 8 * mixed.max_num_steps / 3600, abs=0.01
    )


def test_a_recipe_the_infra_cannot_hold_or_run_unchanged_is_refused_in_one_line(infra):  # noqa: F811
    h200 = infra[RELEASES[0]]["h200"]
    with pytest.raises(ConfigError) as error:
        build_job_settings(benchmark_values(benchmarkRecipes="grpo-qwen3-32b-4n8g"), h200)
    message = str(error.value)
    assert "\n" not in message and error.value.key == "benchmarkRecipes"
    assert "needs 4 nodes of 8 GPUs" in message and "this infra has 2 GPU workers of 8 GPUs" in message
    assert "grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off" in message  # what fits, named
    with pytest.raises(ConfigError, match="did you mean 'grpo-qwen3-32b-4n8g'"):
        build_job_settings(benchmark_values(benchmarkRecipes="grpo-qwen3-32b-4n8"), h200)
    with pytest.raises(ConfigError, match="needs 2 nodes of 4 GPUs"):  # GB200's 4-GPU recipe on 8-GPU nodes
        build_job_settings(benchmark_values(benchmarkRecipes="grpo-llama3.1-8b-instruct-2n4g"), h200)
    big = h200.model_copy(update={"ray_worker_replicas": 64})
    with pytest.raises(ConfigError, match="trains on DAPOMath17K"):
        build_job_settings(benchmark_values(benchmarkRecipes="dapo-deepseek-v3-64n8g"), big)
    v070 = infra["v0.7.0"]["h200"].model_copy(update={"ray_worker_replicas": 64})
    with pytest.raises(ConfigError, match="NVIDIA's placeholder"):
        build_job_settings(benchmark_values(benchmarkRecipes="grpo-deepseek-v3-32n8g"), v070)
    with pytest.raises(ConfigError, match=r"a recipe of NeMo RL v0\.5\.0"):  # v0.7.0's only
        build_job_settings(benchmark_values(benchmarkRecipes="grpo-qwen3-30ba3b-4n8g-40K"), big)
    with pytest.raises(ConfigError, match="each recipe once"):
        build_job_settings(benchmark_values(benchmarkRecipes=["grpo-qwen3-32b-4n8g"] * 2), big)
    with pytest.raises(ConfigError, match="unset unless benchmark is true"):
        build_job_settings(stack_values("h200", benchmarkRecipes="grpo-qwen3-32b-4n8g"), h200)


def test_a_figure_from_another_release_says_so_and_a_recipe_without_one_is_unknown(infra):  # noqa: F811
    v070 = infra["v0.7.0"]["h200"].model_copy(update={"ray_worker_replicas": 4})
    job = build_job_settings(benchmark_values(), v070)  # v0.7.0's summary has no Llama 3.1 8B row
    summary = benchmark_summary_command(job, v070)
    assert "for v0.5.0's recipe of this name" in " ".join(summary)
    assert any("the image runs v0.7.0" in note for note in run_estimate(job, v070)["notes"])
    forty = build_job_settings(benchmark_values(benchmarkRecipes="grpo-qwen3-30ba3b-4n8g-40K"), v070)
    assert any(arg.endswith(":unknown:unknown") for arg in benchmark_summary_command(forty, v070))
    assert run_estimate(forty, v070)["secondsPerStep"] is None
