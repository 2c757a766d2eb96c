"""The checkpoint guard against each release's own CheckpointManager (NeMo RL v0.5.0 and v0.7.0, the reference
copies): what a crash leaves behind, what resume would pick, and what the guard makes of it."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from script_loader import load_script
from upstream import reference

RELEASES = ("nemo-rl-v0.5.0", "nemo-rl-v0.7.0")

guard = load_script("jobs/scripts/checkpoint_guard.py", "checkpoint_guard")


@pytest.fixture(scope="module", params=RELEASES)
def nemo_checkpoint(request: pytest.FixtureRequest) -> Iterator[Any]:
    """NeMo RL's checkpoint module. It imports torch and numpy only for isinstance checks on metric values, so
    stand-ins are enough to run its directory logic unchanged."""
    source = reference(request.param) / "nemo_rl" / "utils" / "checkpoint.py"
    stand_ins = {"torch": types.ModuleType("torch"), "numpy": types.ModuleType("numpy")}
    stand_ins["torch"].Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    stand_ins["numpy"].ndarray = type("ndarray", (), {})  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(f"checkpoint_{request.param.replace('-', '_')}", source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def manager(module: Any, root: Path) -> Any:
    return module.CheckpointManager(
        {
            "checkpoint_dir": root,
            "metric_name": None,
            "higher_is_better": True,
            "keep_top_k": None,
            "save_optimizer": True,
        }
    )


def save(mgr: Any, step: int, finish: bool = True, shard: str = "__0_0.distcp") -> Path:
    """What grpo.py does for one save: tmp dir, policy files, dataloader state, finalize (unless it crashes)."""
    path = Path(mgr.init_tmp_checkpoint(step, {"step": step}, None))
    (path / "policy" / "weights").mkdir(parents=True, exist_ok=True)
    (path / "policy" / "weights" / shard).write_text("w")
    if finish:
        (path / "train_dataloader.pt").write_text("d")
        mgr.finalize_checkpoint(path)
    return path


def test_a_crash_mid_save_leaves_a_tmp_dir_the_next_save_would_reuse(nemo_checkpoint: Any, tmp_path: Path) -> None:
    mgr = manager(nemo_checkpoint, tmp_path)
    save(mgr, 1)
    save(mgr, 2, finish=False, shard="__7_0.distcp")  # rank 7's shard of a save that never finished
    assert mgr.get_latest_checkpoint_path() == str(tmp_path / "step_1")  # resume itself is safe ...
    changes = guard.guard(tmp_path, "T")
    assert changes == ["tmp_step_2 set aside as incomplete-T-tmp_step_2 (a save never finished)"]
    # ... and after the guard the next save of step 2 starts from an empty folder, not the crashed one's files.
    again = Path(mgr.init_tmp_checkpoint(2, {"step": 2}, None))
    assert not (again / "policy").exists()
    assert (tmp_path / "incomplete-T-tmp_step_2" / "policy" / "weights" / "__7_0.distcp").is_file()  # kept
    assert mgr.get_latest_checkpoint_path() == str(tmp_path / "step_1")


def test_without_the_guard_the_stale_shard_ends_up_in_the_new_checkpoint(nemo_checkpoint: Any, tmp_path: Path) -> None:
    mgr = manager(nemo_checkpoint, tmp_path)
    save(mgr, 2, finish=False, shard="__7_0.distcp")
    save(mgr, 2)  # the retried attempt saves step 2 again, with fewer ranks
    assert (tmp_path / "step_2" / "policy" / "weights" / "__7_0.distcp").is_file()  # the hazard the guard removes


def test_an_interrupted_finalize_is_put_back(nemo_checkpoint: Any, tmp_path: Path) -> None:
    mgr = manager(nemo_checkpoint, tmp_path)
    save(mgr, 2)
    save(mgr, 3)
    # A resumed run saves step 3 again and dies between finalize's two renames.
    tmp = save(mgr, 3, finish=False)
    (tmp / "train_dataloader.pt").write_text("d")
    (tmp_path / "step_3").rename(tmp_path / "old_step_3")
    assert mgr.get_latest_checkpoint_path() == str(tmp_path / "step_2")  # one step of training silently lost
    changes = guard.guard(tmp_path, "T")
    assert "old_step_3 restored as step_3 (a finalize was interrupted)" in changes
    assert mgr.get_latest_checkpoint_path() == str(tmp_path / "step_3")
    assert not (tmp_path / "tmp_step_3").exists()


def test_a_step_missing_what_resume_reads_is_set_aside(nemo_checkpoint: Any, tmp_path: Path) -> None:
    mgr = manager(nemo_checkpoint, tmp_path)
    save(mgr, 4)
    save(mgr, 5)
    (tmp_path / "step_5" / "train_dataloader.pt").unlink()  # grpo.py would fail loading it, on every attempt
    changes = guard.guard(tmp_path, "T")
    assert changes == ["step_5 set aside as incomplete-T-step_5 (missing files resume needs)"]
    assert mgr.get_latest_checkpoint_path() == str(tmp_path / "step_4")
    assert guard.guard(tmp_path, "U") == []  # a second run changes nothing


def test_main_on_a_fresh_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert guard.main(["--checkpoint-dir", str(tmp_path / "not-yet")]) == 0
    assert capsys.readouterr().out == "checkpoint_guard: no checkpoint yet\n"


@pytest.mark.parametrize("release", RELEASES)
def test_the_resume_files_are_what_grpo_reads(release: str) -> None:
    """A step_N the guard keeps has every file GRPO's resume opens (nemo_rl/algorithms/grpo.py of the release)."""
    grpo = (reference(release) / "nemo_rl" / "algorithms" / "grpo.py").read_text()
    read = {"training_info.json": "load_training_info(", "train_dataloader.pt": '"train_dataloader.pt"'}
    for name in guard.RESUME_FILES:
        assert read[name] in grpo, f"{release}'s grpo.py no longer reads {name}"
    assert [d.split("/") for d in guard.RESUME_DIRS] == [["policy", "weights"]]
    assert '"policy", "weights"' in grpo
