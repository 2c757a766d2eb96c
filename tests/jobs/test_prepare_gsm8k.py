"""Tests for jobs/scripts/prepare_gsm8k.py: answer extraction, the files it writes, skip/rebuild, errors, rewards."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import math_verify
import pytest
from math_verify.errors import TimeoutException
from math_verify.metric import math_metric
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
from script_loader import load_script
from upstream import reference

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "scripts" / "prepare_gsm8k.py"
SAMPLE = ROOT / "tests" / "data" / "gsm8k_sample.jsonl"

# The final answers of the shipped sample, in file order, written out by hand (not computed by the script).
SAMPLE_OUTPUTS = ["21", "1250", "-5", "7.5", "3550", "1200", "12", "109", "105", "79", "194", "30"]


prep = load_script("jobs/scripts/prepare_gsm8k.py", "prepare_gsm8k")


def _sample_rows() -> list[dict[str, str]]:
    return [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def no_datasets(tmp_path: Path) -> Path:
    """A PYTHONPATH entry whose `datasets` package fails on import: proves the local path never imports it."""
    pkg = tmp_path / "poison" / "datasets"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('datasets must not be imported with --source')\n")
    return pkg.parent


def run(*args: str | Path, pythonpath: Path | None = None, env: dict[str, str] | None = None):
    full_env = {**os.environ, **(env or {})}
    if pythonpath is not None:
        full_env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


# ---------------------------------------------------------------------------------------------------------------
# Module contract and extraction


def test_module_constants_are_the_contract() -> None:
    assert (prep.INPUT_KEY, prep.OUTPUT_KEY) == ("input", "output")
    assert (prep.TRAIN_FILE, prep.TEST_FILE) == ("train.jsonl", "test.jsonl")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Half of 50 is <<50/2=25>>25.\n#### 25", "25"),
        ("50 * 25 = 1250 pears.\n#### 1,250", "1250"),
        ("Big number.\n#### 1,234,567", "1234567"),
        ("Spaces around.\n####    42   \n", "42"),
        ("4 - 9 = -5\n#### -5", "-5"),
        ("3 * 2.50 = 7.5\n#### 7.5", "7.5"),
        ("Money.\n#### -12,000.25", "-12000.25"),
        ("Only the last marker counts: #### 3\n#### 4", "4"),
    ],
)
def test_extract_final_answer(answer: str, expected: str) -> None:
    assert prep.extract_final_answer(answer) == expected


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("The answer is 25.", "no '####'"),
        ("Nothing follows.\n####   ", "nothing after"),
        ("Bad grouping.\n#### 1,25", "not a number"),
        ("Has words.\n#### 12 apples", "not a number"),
    ],
)
def test_extract_final_answer_rejects(answer: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        prep.extract_final_answer(answer)


def test_shipped_sample_covers_the_cases() -> None:
    rows = _sample_rows()
    assert len(rows) == len(SAMPLE_OUTPUTS) >= 12
    assert all(set(row) == {"question", "answer"} and "\n#### " in row["answer"] for row in rows)
    finals = [row["answer"].rsplit("####", 1)[1].strip() for row in rows]
    assert "1,250" in finals  # a thousands separator
    assert any(f.startswith("-") for f in finals) and any("." in f for f in finals)


# ---------------------------------------------------------------------------------------------------------------
# Writing, skipping, rebuilding


def test_writes_both_splits_from_local_source(tmp_path: Path, no_datasets: Path) -> None:
    out = tmp_path / "out"
    result = run("--output-dir", out, "--source", SAMPLE, pythonpath=no_datasets)
    assert result.returncode == 0, result.stderr

    questions = [row["question"] for row in _sample_rows()]
    for name in ("train.jsonl", "test.jsonl"):
        rows = _read_jsonl(out / name)
        assert all(set(row) == {"input", "output"} for row in rows)
        assert [row["input"] for row in rows] == questions
        assert [row["output"] for row in rows] == SAMPLE_OUTPUTS

    manifest = json.loads((out / "_COMPLETE.json").read_text())
    assert manifest["splits"]["train"]["rows"] == manifest["splits"]["test"]["rows"] == 12
    assert (
        manifest["source_sha256"]
        == hashlib.sha256(SAMPLE.read_bytes() + b"\0" + SAMPLE.read_bytes() + b"\0").hexdigest()
    )
    # No temporary files; the lock file stays (see exclusive_lock).
    assert sorted(p.name for p in out.iterdir()) == [".lock", "_COMPLETE.json", "test.jsonl", "train.jsonl"]
    assert "train=12, test=12" in result.stdout
    assert "'#### 1,250' -> output '1250'" in result.stdout


def test_separate_test_source(tmp_path: Path) -> None:
    test_src = _write_jsonl(
        tmp_path / "test_src.jsonl",
        [{"question": "What is 1,000 + 500?", "answer": "1000 + 500 = 1500\n#### 1,500"}],
    )
    out = tmp_path / "out"
    result = run("--output-dir", out, "--source", SAMPLE, "--source-test", test_src)
    assert result.returncode == 0, result.stderr
    assert len(_read_jsonl(out / "train.jsonl")) == 12
    assert _read_jsonl(out / "test.jsonl") == [{"input": "What is 1,000 + 500?", "output": "1500"}]


def test_second_run_skips_without_rewriting(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    names = ("train.jsonl", "test.jsonl", "_COMPLETE.json")
    before = {name: _stat(out / name) for name in names}

    result = run("--output-dir", out, "--source", SAMPLE)
    assert result.returncode == 0, result.stderr
    assert "skipping" in result.stdout
    # Every write is a rename of a new file, so an unchanged inode and mtime mean nothing was rewritten.
    assert {name: _stat(out / name) for name in names} == before


def test_force_rebuilds_a_complete_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    before = _stat(out / "train.jsonl")

    result = run("--output-dir", out, "--source", SAMPLE, "--force")
    assert result.returncode == 0, result.stderr
    assert "skipping" not in result.stdout and "wrote train=12, test=12" in result.stdout
    assert _stat(out / "train.jsonl") != before


def test_rebuilds_when_manifest_missing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    (out / "_COMPLETE.json").unlink()
    train = out / "train.jsonl"
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:3]))  # a partial file

    result = run("--output-dir", out, "--source", SAMPLE)
    assert result.returncode == 0, result.stderr
    assert "skipping" not in result.stdout and "rebuilding" in result.stdout
    assert [row["output"] for row in _read_jsonl(train)] == SAMPLE_OUTPUTS
    assert json.loads((out / "_COMPLETE.json").read_text())["splits"]["train"]["rows"] == 12


def test_rebuilds_when_counts_disagree(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    test_file = out / "test.jsonl"
    with test_file.open("a") as handle:
        handle.write(json.dumps({"input": "stray", "output": "0"}) + "\n")
    before = _stat(test_file)

    result = run("--output-dir", out, "--source", SAMPLE)
    assert result.returncode == 0, result.stderr
    assert "test.jsonl has 13 rows, the manifest says 12" in result.stdout
    assert _stat(test_file) != before
    assert [row["output"] for row in _read_jsonl(test_file)] == SAMPLE_OUTPUTS


def test_rebuilds_when_source_changes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    other = _write_jsonl(tmp_path / "other.jsonl", _sample_rows()[:2])

    result = run("--output-dir", out, "--source", other)
    assert result.returncode == 0, result.stderr
    assert "source differs" in result.stdout
    assert [row["output"] for row in _read_jsonl(out / "train.jsonl")] == SAMPLE_OUTPUTS[:2]


# ---------------------------------------------------------------------------------------------------------------
# Errors


def test_bad_row_exits_1_naming_the_row(tmp_path: Path) -> None:
    rows = _sample_rows()[:3]
    rows[1] = {"question": "A row whose answer lost its marker?", "answer": "It is 8 in the end."}
    bad = _write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "out"

    result = run("--output-dir", out, "--source", bad)
    assert result.returncode == 1
    assert f"{bad} line 2: no '####' final answer" in result.stderr
    assert "A row whose answer lost its marker" in result.stderr
    assert "line 1" not in result.stderr and "line 3" not in result.stderr
    assert not (out / "train.jsonl").exists() and not (out / "_COMPLETE.json").exists()


def test_bad_source_leaves_previous_output_intact(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    before = {name: _stat(out / name) for name in ("train.jsonl", "test.jsonl", "_COMPLETE.json")}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 3"}\nnot json\n')

    result = run("--output-dir", out, "--source", bad)
    assert result.returncode == 1
    assert f"{bad} line 2: not valid JSON" in result.stderr
    assert {name: _stat(out / name) for name in before} == before


@pytest.mark.parametrize(
    "args",
    [
        [],  # no --output-dir
        ["--output-dir", "OUT", "--source", "does-not-exist.jsonl"],
        ["--output-dir", "OUT", "--source-test", str(SAMPLE)],  # --source-test without --source
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    result = run(*[str(tmp_path / "out") if a == "OUT" else a for a in args])
    assert result.returncode == 2
    assert "usage:" in result.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# The hub path, with a stand-in `datasets` module (the real one lives in the NeMo RL image only)

FAKE_DATASETS = """
import json, os, time

def load_dataset(path, name=None, **kwargs):
    with open(os.environ["FAKE_DATASETS_LOG"], "a") as log:
        log.write(json.dumps([path, name, sorted(kwargs)]) + "\\n")
    time.sleep(float(os.environ.get("FAKE_DATASETS_SLEEP", "0")))  # a download that takes a while
    with open(os.environ["FAKE_DATASETS_ROWS"]) as handle:
        return json.load(handle)
"""


@pytest.fixture
def fake_hub(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    pkg = tmp_path / "fake" / "datasets"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_DATASETS)
    rows = _sample_rows()
    (tmp_path / "hub_rows.json").write_text(json.dumps({"train": rows[:9], "test": rows[9:]}))
    env = {"FAKE_DATASETS_LOG": str(tmp_path / "calls.log"), "FAKE_DATASETS_ROWS": str(tmp_path / "hub_rows.json")}
    return pkg.parent, env


def test_hub_path_loads_gsm8k_main_once(tmp_path: Path, fake_hub: tuple[Path, dict[str, str]]) -> None:
    pythonpath, env = fake_hub
    out = tmp_path / "out"
    result = run("--output-dir", out, pythonpath=pythonpath, env=env)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in Path(env["FAKE_DATASETS_LOG"]).read_text().splitlines()] == [
        ["openai/gsm8k", "main", []]
    ]
    assert [row["output"] for row in _read_jsonl(out / "train.jsonl")] == SAMPLE_OUTPUTS[:9]
    assert [row["output"] for row in _read_jsonl(out / "test.jsonl")] == SAMPLE_OUTPUTS[9:]
    assert "train=9, test=3" in result.stdout

    again = run("--output-dir", out, pythonpath=pythonpath, env=env)
    assert again.returncode == 0 and "skipping" in again.stdout
    assert len(Path(env["FAKE_DATASETS_LOG"]).read_text().splitlines()) == 1  # the skip loaded nothing


def test_two_concurrent_runs_on_one_dir_build_once_and_both_succeed(
    tmp_path: Path, fake_hub: tuple[Path, dict[str, str]]
) -> None:
    """Two pipelines preparing the same shared dir at once: the second waits for the first's lock, finds the output
    complete and skips; neither fails, and the data is loaded once."""
    pythonpath, env = fake_hub
    out = tmp_path / "out"
    full_env = {**os.environ, **env, "PYTHONPATH": str(pythonpath), "FAKE_DATASETS_SLEEP": "2"}
    command = [sys.executable, str(SCRIPT), "--output-dir", str(out)]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], results
    stdouts = [stdout for stdout, _ in results]
    assert sorted("wrote train=9, test=3" in stdout for stdout in stdouts) == [False, True], stdouts
    assert sorted("skipping" in stdout for stdout in stdouts) == [False, True], stdouts
    assert len(Path(env["FAKE_DATASETS_LOG"]).read_text().splitlines()) == 1  # one build loaded the data
    assert [row["output"] for row in _read_jsonl(out / "train.jsonl")] == SAMPLE_OUTPUTS[:9]
    assert [row["output"] for row in _read_jsonl(out / "test.jsonl")] == SAMPLE_OUTPUTS[9:]
    assert json.loads((out / "_COMPLETE.json").read_text())["splits"]["train"]["rows"] == 9
    assert not list(out.glob(".*.tmp"))


def test_a_build_removes_only_stale_temporary_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    live = out / ".train.jsonl.live123.tmp"  # another writer's, seconds old: it may still rename it into place
    stale = out / ".test.jsonl.dead456.tmp"  # a crashed run's, a day old
    live.write_text("in flight")
    stale.write_text("left over")
    day_ago = time.time() - 24 * 3600
    os.utime(stale, (day_ago, day_ago))

    result = run("--output-dir", out, "--source", SAMPLE)
    assert result.returncode == 0, result.stderr
    assert live.read_text() == "in flight"
    assert not stale.exists()
    assert prep.STALE_TEMP_SECONDS < 24 * 3600


def test_hub_bad_row_is_named_by_split_and_index(tmp_path: Path, fake_hub: tuple[Path, dict[str, str]]) -> None:
    pythonpath, env = fake_hub
    rows_file = Path(env["FAKE_DATASETS_ROWS"])
    data = json.loads(rows_file.read_text())
    data["test"][2]["answer"] = "No marker here."
    rows_file.write_text(json.dumps(data))

    result = run("--output-dir", tmp_path / "out", pythonpath=pythonpath, env=env)
    assert result.returncode == 1
    assert "test split" in result.stderr and "openai/gsm8k test[2]: no '####'" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Rewards: the extracted answers are what NeMo RL's math reward can match; the raw GSM8K answers are not.


# NeMo RL's math reward (HFVerifyWorker.verify in nemo_rl/environments/math_environment.py, the hf_math_verify path
# the v0.5.0 math environment uses) extracts the gold with LaTeX extraction only and the response with expression
# extraction, then LaTeX. The gold config matters: math-verify's default parse() config also tries expression
# extraction, which would pick the trailing "21" out of a raw "...#### 21" and hide the bug tested below.
GOLD_EXTRACTION = (LatexExtractionConfig(),)
PRED_EXTRACTION = (ExprExtractionConfig(), LatexExtractionConfig())


def nemo_rl_math_reward(response: str, ground_truth: str) -> float:
    """Mirror of NeMo RL's reward for one response: math_metric with the extraction configs above, the ground truth
    wrapped as "\\boxed{...}", and any exception (math-verify's TimeoutException is a BaseException) scored 0.0."""
    verify_func = math_metric(gold_extraction_target=GOLD_EXTRACTION, pred_extraction_target=PRED_EXTRACTION)
    try:
        score, _ = verify_func(["\\boxed{" + ground_truth + "}"], [response])
        return float(score)
    except (Exception, TimeoutException):
        return 0.0


def boxed_matches(ground_truth: str, response: str) -> bool:
    """The same comparison through math-verify's public parse/verify (gold first, as verify expects)."""
    gold = math_verify.parse("\\boxed{" + ground_truth + "}", GOLD_EXTRACTION)
    return bool(math_verify.verify(gold, math_verify.parse(response, PRED_EXTRACTION)))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """(raw GSM8K answer, extracted output) for every sample row, as the script wrote them."""
    out = tmp_path_factory.mktemp("prepared")
    assert run("--output-dir", out, "--source", SAMPLE).returncode == 0
    outputs = [row["output"] for row in _read_jsonl(out / "train.jsonl")]
    raws = [row["answer"] for row in _sample_rows()]
    assert len(outputs) == len(raws) == 12
    return list(zip(raws, outputs, strict=True))


def _wrong(answer: str) -> str:
    return str(int(answer) + 1) if "." not in answer else str(float(answer) + 1)


def test_extracted_answer_rewards_a_correct_boxed_response(prepared: list[tuple[str, str]]) -> None:
    for _raw, answer in prepared:
        response = "Working it out step by step. The answer is \\boxed{" + answer + "}"
        assert boxed_matches(answer, "The answer is \\boxed{" + answer + "}"), answer
        assert nemo_rl_math_reward(response, answer) == 1.0, answer


def test_extracted_answer_rejects_a_wrong_boxed_response(prepared: list[tuple[str, str]]) -> None:
    for _raw, answer in prepared:
        wrong = _wrong(answer)
        assert not boxed_matches(answer, "The answer is \\boxed{" + wrong + "}"), (answer, wrong)
        assert nemo_rl_math_reward("The answer is \\boxed{" + wrong + "}", answer) == 0.0, (answer, wrong)


def test_raw_gsm8k_answer_as_ground_truth_never_rewards(prepared: list[tuple[str, str]]) -> None:
    # The bug the script fixes: with "reasoning...\n#### N" as the ground truth, even the correct \boxed{N} scores 0.
    for raw, answer in prepared:
        response = "The answer is \\boxed{" + answer + "}"
        assert not boxed_matches(raw, response), raw
        assert nemo_rl_math_reward(response, raw) == 0.0, raw


def test_v0_7_0_built_in_gsm8k_ground_truth_also_rewards_a_correct_answer(prepared: list[tuple[str, str]]) -> None:
    """Evidence for the choice of data on v0.7.0 (docs/configuration.md, NeMo RL versions): its built-in `gsm8k`
    dataset keeps the text after '####' with its thousands separators, and the math reward still scores a correct
    answer 1 against it, so the prepared files were kept for other reasons. The extraction is v0.7.0's own function,
    run on our rows."""
    source_path = reference("nemo-rl-v0.7.0") / "nemo_rl" / "data" / "datasets" / "response_datasets" / "gsm8k.py"
    source = source_path.read_text()
    function = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == "_extract_hash_answer"
    )
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(source_path), "exec"), namespace)
    built_in_truth = namespace["_extract_hash_answer"]
    with_separators = 0
    for raw, answer in prepared:
        truth = built_in_truth(raw)
        with_separators += "," in truth
        assert nemo_rl_math_reward("The answer is \\boxed{" + answer + "}", truth) == 1.0, (truth, answer)
        assert nemo_rl_math_reward("The answer is \\boxed{" + _wrong(answer) + "}", truth) == 0.0, truth
    assert with_separators  # the sample has a '#### 1,250': the case where the two ground truths differ
