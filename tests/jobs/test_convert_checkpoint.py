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
