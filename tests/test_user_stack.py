"""A user's own stack, in a copy of the repository: real-looking values and an encrypted secret neither break the
tests that enumerate stack files nor stop `make plan STACK=mine`. Also: a broken stack file is one line, not a
traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from tools.offline import StackFileError, load_stack_config

# What `pulumi stack init mine` plus `pulumi config set` leave in a user's files (passphrase provider): real-looking
# names, an encryption salt and `secure:` ciphertexts the offline plan cannot decrypt.
USER_INFRA_STACK = """\
encryptionsalt: v1:Qm9ndXNTYWx0PT0=:v1:c2FsdHNhbHQ=:dGhpcyBpcyBub3QgcmVhbA==
config:
  gcp:project: acme-ml-prod-4821
  gcp:region: us-central1
  nemo-rl-gke:zone: us-central1-b
  nemo-rl-gke:gpuType: nvidia-b200
  nemo-rl-gke:reservation: acme-b200-block-1
  nemo-rl-gke:gpuNodes: 2
  nemo-rl-gke:clusterName: acme-grpo
  nemo-rl-gke:hfToken:
    secure: v1:8GSnC0aWqO5PTD2R:kMcVBa3oQ1ULbFqI+dZQ7sJY9C0FqUe1yGoAT7DkNk0cQ4Y=
  nemo-rl-gke:wandbApiKey:
    secure: v1:Xx9o2yHcKq7rQ1sT:QmFzZTY0IGNpcGhlcnRleHQgb2YgYSBrZXk=
  nemo-rl-gke:lustre:
    capacityGib: 36000
"""
USER_JOB_STACK = """\
config:
  nemo-rl-jobs:infraStack: organization/nemo-rl-gke/mine
  nemo-rl-jobs:runName: acme-gemma-grpo
"""
# The tests that read stack files: each must hold only the shipped examples.
STACK_FILE_TESTS = (
    "tests/test_plan.py::test_every_stack_has_a_golden_plan_and_every_golden_plan_a_stack",
    "tests/test_infra_program.py::test_stack_files_carry_no_secrets",
    "tests/test_infra_program.py::test_stack_values_have_the_declared_types",
    "tests/test_infra_program.py::test_h200_and_b200_stacks_differ_only_in_what_the_gpu_implies",
    "tests/jobs/test_job_program.py::test_job_stack_files_match_their_infra_stacks",
)


# What an outer `make test` (or `.ci/run`'s TORCH_INDEX=) puts in the environment would change what the inner make does.
_OUTER_MAKE = ("TORCH_INDEX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in _OUTER_MAKE}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False, env=env)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files as a fresh clone has them, plus a user's own `mine` stack."""
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], ROOT)
    assert listed.returncode == 0, listed.stderr
    copy = tmp_path_factory.mktemp("clone")
    for name in listed.stdout.splitlines():
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (copy / "Pulumi.mine.yaml").write_text(USER_INFRA_STACK)
    (copy / "jobs" / "Pulumi.mine.yaml").write_text(USER_JOB_STACK)
    return copy


def test_a_user_stack_does_not_break_the_tests(clone: Path):
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *STACK_FILE_TESTS], clone)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{len(STACK_FILE_TESTS) + 1} passed" in result.stdout  # the declared-types test runs per project
    # checkov and the golden refresh cover the shipped examples only (make -n prints, runs nothing).
    for target in ("checkov", "golden"):
        dry = run(["make", "-n", target], clone)
        assert dry.returncode == 0, dry.stderr
        assert "mine" not in dry.stdout and "h200" in dry.stdout, dry.stdout


def test_a_user_stack_renders_with_placeholders_for_its_secrets(clone: Path):
    result = run([sys.executable, "tools/plan.py", "--stack", "mine", "--out", str(clone / "build")], clone)
    assert result.returncode == 0, result.stderr[-3000:]
    for key in ("nemo-rl-gke:hfToken", "nemo-rl-gke:wandbApiKey"):
        assert f"{key}: encrypted in Pulumi.mine.yaml; planned with a placeholder" in result.stdout
    secret = next((clone / "build" / "mine" / "manifests").glob("*-secret-*.yaml")).read_text()
    assert "[secret]" in secret and "v1:" not in secret
    assert "acme-grpo" in (clone / "build" / "mine" / "outputs.json").read_text()


def test_a_broken_stack_file_is_one_line_with_file_and_position(clone: Path, tmp_path: Path):
    broken = clone / "Pulumi.typo.yaml"
    broken.write_text("config:\n  gcp:project: p\n  nemo-rl-gke:zone: [us-central1-b\n")
    (clone / "jobs" / "Pulumi.typo.yaml").write_text(USER_JOB_STACK)
    result = run([sys.executable, "tools/plan.py", "--stack", "typo", "--out", str(tmp_path)], clone)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("plan: Pulumi.typo.yaml:") and "not valid YAML" in line
    with pytest.raises(StackFileError, match=r"^Pulumi\.typo\.yaml:\d+:\d+: not valid YAML"):
        load_stack_config(clone, "typo")


def test_plan_installs_only_the_runtime_and_tests_take_torch_from_the_cpu_index(clone: Path):
    """A fresh clone: `make plan` builds .venv from requirements.txt alone; `make test` adds the dev set and torch,
    whose pin only PyTorch's CPU index (or a local CPU wheel) can satisfy: never the CUDA build from PyPI."""
    plan_commands = run(["make", "-n", "plan"], clone)
    assert plan_commands.returncode == 0, plan_commands.stderr
    assert "-r requirements.txt" in plan_commands.stdout
    assert "requirements-dev" not in plan_commands.stdout and "torch" not in plan_commands.stdout
    unit_commands = run(["make", "-n", "unit"], clone).stdout
    assert "--index-url https://download.pytorch.org/whl/cpu -r requirements-torch.txt" in unit_commands
    assert "--index-url" not in run(["make", "-n", "unit", "TORCH_INDEX="], clone).stdout
    pins = [line for line in (clone / "requirements-torch.txt").read_text().splitlines() if line.startswith("torch")]
    assert pins == ["torch==2.13.0+cpu"]
    for requirements in ("requirements.txt", "requirements-dev.txt"):
        assert "torch" not in "".join(line.split("#")[0] for line in (clone / requirements).read_text().splitlines()), (
            requirements
        )
