"""Make a run's checkpoint dir safe to resume from before each training attempt.

Runs as a Ray job step's first command, inside the NeMo RL image (standard library only, with the image's python),
before the release's GRPO entrypoint:
    python checkpoint_guard.py --checkpoint-dir /data/RUN

NeMo RL (nemo_rl/utils/checkpoint.py, the same in v0.5.0 and v0.7.0) writes a checkpoint into tmp_step_N, renames
it to step_N only when every file is written, and resumes from the highest step_N. So a crash mid-save leaves no
half step_N, but three things can still hurt the next attempt:
  * a leftover tmp_step_N is reused as is by the next save of step N (the folder is created with exist_ok), so
    files of the crashed write (other ranks' shards) would be mixed into the new checkpoint;
  * a crash inside the finalize of a step that already existed (a resumed run saving step N again) can leave
    old_step_N without step_N: the complete checkpoint sits under a name NeMo RL never looks at;
  * a step_N without the files resume reads (training_info.json, train_dataloader.pt, policy/weights), e.g. one
    copied or cleaned up by hand, makes every attempt fail the same way and spends the whole retry budget.
The guard moves aside tmp_step_N and incomplete step_N folders (renamed to incomplete-..., never deleted), and
puts old_step_N back as step_N when step_N is missing. It only runs while no attempt does: the submitter runs the
attempts one after another. Exit 0 (also when there is nothing to do), 2 usage.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_RE = re.compile(r"^tmp_step_(\d+)$")
_OLD_RE = re.compile(r"^old_step_(\d+)$")
# What NeMo RL's GRPO resume reads from the newest step_N (grpo.py: training_info.json, train_dataloader.pt;
# the policy loads its weights from policy/weights).
RESUME_FILES = ("training_info.json", "train_dataloader.pt")
RESUME_DIRS = ("policy/weights",)


def complete(step_dir: Path) -> bool:
    files = all((step_dir / name).is_file() for name in RESUME_FILES)
    return files and all((step_dir / name).is_dir() and any((step_dir / name).iterdir()) for name in RESUME_DIRS)


def set_aside(path: Path, stamp: str) -> Path:
    target = path.with_name(f"incomplete-{stamp}-{path.name}")
    path.rename(target)
    return target


def guard(checkpoint_dir: Path, stamp: str) -> list[str]:
    """Repair checkpoint_dir; return one line per change."""
    if not checkpoint_dir.is_dir():
        return []
    changes = []
    children = sorted(checkpoint_dir.iterdir())
    steps = {int(m.group(1)) for c in children if (m := _STEP_RE.match(c.name))}
    for child in children:
        old = _OLD_RE.match(child.name)
        if old and child.is_dir():
            step = int(old.group(1))
            if step not in steps and complete(child):
                child.rename(checkpoint_dir / f"step_{step}")
                steps.add(step)
                changes.append(f"{child.name} restored as step_{step} (a finalize was interrupted)")
            else:
                changes.append(f"{child.name} set aside as {set_aside(child, stamp).name} (left over)")
    for child in sorted(checkpoint_dir.iterdir()):
        if _TMP_RE.match(child.name) and child.is_dir():
            changes.append(f"{child.name} set aside as {set_aside(child, stamp).name} (a save never finished)")
        elif _STEP_RE.match(child.name) and child.is_dir() and not complete(child):
            changes.append(f"{child.name} set aside as {set_aside(child, stamp).name} (missing files resume needs)")
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    changes = guard(args.checkpoint_dir, time.strftime("%Y%m%dT%H%M%S"))
    for line in changes:
        print(f"checkpoint_guard: {line}")
    steps = sorted(int(m.group(1)) for c in args.checkpoint_dir.glob("step_*") if (m := _STEP_RE.match(c.name)))
    print(
        f"checkpoint_guard: training resumes from step_{steps[-1]}" if steps else "checkpoint_guard: no checkpoint yet"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
