"""The convert step picks the newest complete checkpoint and skips a conversion already done."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_loader import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "scripts" / "convert_checkpoint.py"


@pytest.fixture(scope="module")
def convert() -> ModuleType:
    return load_script("jobs/scripts/convert_checkpoint.py", "convert_checkpoint")


def make_step(root: Path, n: int, complete: bool = True) -> Path:
    step = root / f"step_{n}"
    (step / "policy").mkdir(parents=True)
    if complete:
        (step / "config.yaml").write_text("policy: {}\n")
        (step / "policy" / "weights").mkdir()
    return step


def test_last_step_is_numeric_not_lexical(convert, tmp_path: Path):
    for n in (2, 9, 10):
        make_step(tmp_path, n)
    (tmp_path / "logs").mkdir()
    assert convert.last_step_dir(tmp_path) == tmp_path / "step_10"


def test_incomplete_newest_step_is_ignored(convert, tmp_path: Path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 6, complete=False)  # still being written, or interrupted
    assert convert.last_step_dir(tmp_path) == tmp_path / "step_5"


def test_no_checkpoint(convert, tmp_path: Path):
    assert convert.last_step_dir(tmp_path) is None
    assert convert.last_step_dir(tmp_path / "missing") is None
    assert convert.main(["--checkpoint-dir", str(tmp_path), "--output-dir", str(tmp_path / "hf")]) == 1


def test_converter_command(convert, tmp_path: Path):
    step = make_step(tmp_path, 3)
    command = convert.converter_command(step, tmp_path / "hf")
    assert command[1] == "examples/converters/convert_dcp_to_hf.py"
    assert command[2:] == [
        f"--config={step}/config.yaml",
        f"--dcp-ckpt-path={step}/policy/weights",
        f"--hf-ckpt-path={tmp_path}/hf",
    ]


def test_runs_once_then_skips(convert, tmp_path: Path, monkeypatch):
    make_step(tmp_path, 4)
    out = tmp_path / "hf"
    out.mkdir()
    calls: list[list[str]] = []

    class Done:
        returncode = 0

    def fake_run(command: list[str], check: bool) -> Done:
        calls.append(command)
        return Done()

    monkeypatch.setattr(convert.subprocess, "run", fake_run)
    args = ["--checkpoint-dir", str(tmp_path), "--output-dir", str(out)]
    assert convert.main(args) == 0
    assert convert.main(args) == 0
    assert len(calls) == 1
    make_step(tmp_path, 8)  # a newer checkpoint is converted again
    assert convert.main(args) == 0
    assert len(calls) == 2 and "step_8" in calls[1][2]


def test_converter_failure_is_reported(convert, tmp_path: Path, monkeypatch):
    make_step(tmp_path, 1)

    class Failed:
        returncode = 7

    monkeypatch.setattr(convert.subprocess, "run", lambda command, check: Failed())
    assert convert.main(["--checkpoint-dir", str(tmp_path), "--output-dir", str(tmp_path / "hf")]) == 1
    assert not (tmp_path / "hf" / convert.MARKER).exists()


# A stand-in for NeMo RL's converter that behaves like nemo_rl/utils/native_checkpoint.py (v0.5.0, lines 235-238):
# it refuses an output folder that exists, then creates it and writes into it. FAKE_CONVERTER_DIE kills it after
# the first file, as a pod eviction would.
FAKE_CONVERTER = """
import argparse, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--config")
parser.add_argument("--dcp-ckpt-path")
parser.add_argument("--hf-ckpt-path")
args = parser.parse_args()
with open(os.environ["FAKE_CONVERTER_LOG"], "a") as log:
    log.write(args.dcp_ckpt_path + "\\n")
if os.path.exists(args.hf_ckpt_path):
    raise FileExistsError(f"HF checkpoint already exists at {args.hf_ckpt_path}.")
os.makedirs(args.hf_ckpt_path)
with open(os.path.join(args.hf_ckpt_path, "pytorch_model.bin"), "w") as f:
    f.write(args.dcp_ckpt_path)
if os.environ.get("FAKE_CONVERTER_DIE"):
    os._exit(137)
with open(os.path.join(args.hf_ckpt_path, "config.json"), "w") as f:
    f.write("{}")
"""


def test_a_retry_converts_over_a_half_written_folder_and_a_done_one_is_kept(
    convert, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    nemo_rl = tmp_path / "nemo-rl"  # the step runs from NeMo RL's directory
    (nemo_rl / "examples" / "converters").mkdir(parents=True)
    (nemo_rl / convert.CONVERTER).write_text(FAKE_CONVERTER)
    monkeypatch.chdir(nemo_rl)
    log = tmp_path / "converter.log"
    monkeypatch.setenv("FAKE_CONVERTER_LOG", str(log))
    run = tmp_path / "run"
    make_step(run, 4)
    out = run / "hf"
    args = ["--checkpoint-dir", str(run), "--output-dir", str(out)]

    # A conversion killed halfway before: hf/ exists, without our marker.
    out.mkdir()
    (out / "pytorch_model.bin").write_text("partial")
    assert convert.main(args) == 0
    assert (out / "config.json").is_file() and (out / "pytorch_model.bin").read_text().endswith("step_4/policy/weights")
    assert "step_4" in (out / convert.MARKER).read_text()
    assert convert.main(args) == 0  # done and marked: not converted again
    assert len(log.read_text().splitlines()) == 1

    # A newer checkpoint whose conversion is killed: the finished step_4 conversion stays as it was ...
    make_step(run, 9)
    monkeypatch.setenv("FAKE_CONVERTER_DIE", "1")
    assert convert.main(args) == 1
    assert "step_4" in (out / convert.MARKER).read_text() and (out / "config.json").is_file()
    # ... and the retry converts step_9 although the killed run left its partial folder behind.
    monkeypatch.delenv("FAKE_CONVERTER_DIE")
    assert convert.main(args) == 0
    assert "step_9" in (out / convert.MARKER).read_text()
    assert (out / "pytorch_model.bin").read_text().endswith("step_9/policy/weights")
    assert (out / "config.json").is_file()
    assert sorted(p.name for p in run.iterdir()) == ["hf", "step_4", "step_9"]  # nothing left beside it
    assert len(log.read_text().splitlines()) == 3
