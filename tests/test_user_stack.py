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
import upstream
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
    (clone / "jobs" / "Pulumi.typo.yaml").write_text(USER_JOB_STACK.replace("/mine", "/typo"))
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


# ---------------------------------------------------------------------------------------------------------------
# What `make plan STACK=<yours>` refuses, as `pulumi up` (or the cluster, later) would: one line, key, value, fix.


def plan_of(clone: Path, stack: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "tools/plan.py", "--stack", stack, "--out", str(out), "--quiet", *extra], clone)


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    return line


def add_stack(clone: Path, name: str, infra: str | None, job: str) -> None:
    if infra is not None:
        (clone / f"Pulumi.{name}.yaml").write_text(infra)
    (clone / "jobs" / f"Pulumi.{name}.yaml").write_text(job)


@pytest.mark.parametrize(
    ("named", "target"),
    [
        ("organization/nemo-rl-gke/h200", "the infra stack 'h200'"),
        ("organization/nemo-rl-gke/mnie", "the infra stack 'mnie'"),
        ("wrongref", "the job project's own stack 'wrongref'"),
    ],
)
def test_plan_refuses_an_infra_stack_other_than_the_file_it_renders(clone: Path, tmp_path: Path, named, target):
    add_stack(clone, "wrongref", USER_INFRA_STACK, f"config:\n  nemo-rl-jobs:infraStack: {named}\n")
    line = refusal(plan_of(clone, "wrongref", tmp_path))
    assert line.startswith(f"plan: config 'nemo-rl-jobs:infraStack' = {named!r}: the plan rendered ")
    assert "against Pulumi.wrongref.yaml" in line and target in line
    assert line.endswith("pulumi config set --cwd jobs --stack wrongref infraStack organization/nemo-rl-gke/wrongref")


def test_plan_refuses_an_infra_stack_that_names_no_file(clone: Path, tmp_path: Path):
    add_stack(clone, "nofile", None, "config:\n  nemo-rl-jobs:infraStack: organization/nemo-rl-gke/h2000\n")
    line = refusal(plan_of(clone, "nofile", tmp_path))
    assert line.startswith("plan: config 'nemo-rl-jobs:infraStack' = 'organization/nemo-rl-gke/h2000' in ")
    assert "neither Pulumi.nofile.yaml nor Pulumi.h2000.yaml exists" in line and "b200, dev, h200" in line


def test_plan_refuses_a_user_stack_without_a_token(clone: Path, tmp_path: Path):
    infra = "\n".join(line for line in USER_INFRA_STACK.splitlines() if "hfToken" not in line and "kMcV" not in line)
    add_stack(clone, "notoken", infra + "\n", USER_JOB_STACK.replace("/mine", "/notoken"))
    line = refusal(plan_of(clone, "notoken", tmp_path))
    assert line == (
        "plan: config 'nemo-rl-gke:hfToken' is not set in Pulumi.notoken.yaml: `pulumi up` needs your Hugging Face "
        "token, stored encrypted: pulumi config set --stack notoken --secret hfToken hf_..."
    )


def test_plan_refuses_a_plain_text_token(clone: Path, tmp_path: Path):
    infra = USER_INFRA_STACK.replace(
        "  nemo-rl-gke:hfToken:\n    secure: v1:8GSnC0aWqO5PTD2R:kMcVBa3oQ1ULbFqI+dZQ7sJY9C0FqUe1yGoAT7DkNk0cQ4Y=\n",
        "  nemo-rl-gke:hfToken: hf_plainTextTokenThatLeaks\n",
    )
    add_stack(clone, "plain", infra, USER_JOB_STACK.replace("/mine", "/plain"))
    line = refusal(plan_of(clone, "plain", tmp_path))
    assert line.startswith("plan: config 'nemo-rl-gke:hfToken' = hf_... is plain text in Pulumi.plain.yaml")
    assert "pulumi config set --stack plain --secret hfToken hf_..." in line and "TokenThatLeaks" not in line


def test_plan_refuses_the_examples_placeholders_in_a_user_stack(clone: Path, tmp_path: Path):
    infra = (clone / "Pulumi.h200.yaml").read_text() + "  nemo-rl-gke:hfToken:\n    secure: v1:abc:def\n"
    add_stack(clone, "copied", infra, USER_JOB_STACK.replace("/mine", "/copied"))
    result = plan_of(clone, "copied", tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [  # one line per mistake
        "plan: config 'gcp:project' = 'my-gcp-project' in Pulumi.copied.yaml is the example's placeholder: set your "
        "own: pulumi config set --stack copied gcp:project YOUR_PROJECT_ID",
        "plan: config 'nemo-rl-gke:reservation' = 'my-h200-reservation' in Pulumi.copied.yaml is the example's "
        "placeholder: set your own: pulumi config set --stack copied reservation YOUR_RESERVATION",
    ]
    # Set on the command line, as `pulumi config set` would, only the other placeholder is left.
    line = refusal(plan_of(clone, "copied", tmp_path, "-c", "gcp:project=acme-ml"))
    assert "'nemo-rl-gke:reservation' = 'my-h200-reservation'" in line


def test_a_user_stack_without_a_wandb_key_plans_without_wandb(clone: Path, tmp_path: Path):
    infra = "\n".join(
        line for line in USER_INFRA_STACK.splitlines() if "wandbApiKey" not in line and "Xx9o" not in line
    )
    add_stack(clone, "nowandb", infra + "\n", USER_JOB_STACK.replace("/mine", "/nowandb"))
    result = plan_of(clone, "nowandb", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pipeline = (tmp_path / "nowandb" / "pipeline.yaml").read_text()
    assert "logger.wandb_enabled=False" in pipeline and "logger.wandb_enabled=True" not in pipeline
    with_key = plan_of(clone, "mine", tmp_path)
    assert with_key.returncode == 0, with_key.stderr[-3000:]
    assert "logger.wandb_enabled=True" in (tmp_path / "mine" / "pipeline.yaml").read_text()


@pytest.fixture(scope="module")
def nemo_rl_clone(clone: Path) -> Path:
    """The clone with NeMo RL's loader at hand (.venv-nemorl) for the plan's recipe and override checks."""
    upstream.reference("nemo-rl-v0.5.0")
    python = upstream.nemo_rl_python()
    if not (clone / ".venv-nemorl").exists():
        (clone / ".venv-nemorl").symlink_to(python.parent.parent)
    return clone


@pytest.mark.parametrize(
    ("job_config", "start", "fix"),
    [
        (
            "recipe=examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-lnog.yaml",
            "plan: config 'nemo-rl-jobs:recipe' = 'examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-"
            "actckpt-lnog.yaml' is not a recipe of NeMo RL v0.5.0",
            "did you mean examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-long.yaml?",
        ),
        (
            'extraOverrides=["grpo.max_num_step=20"]',
            "plan: config 'nemo-rl-jobs:extraOverrides' item 'grpo.max_num_step=20': grpo.max_num_step is not a key",
            "did you mean grpo.max_num_steps?",
        ),
        (
            'extraOverrides=["+grpo.seed=1"]',
            "plan: config 'nemo-rl-jobs:extraOverrides' item '+grpo.seed=1': grpo.seed is already a key",
            "drop the '+' (grpo.seed=1)",
        ),
    ],
)
def test_plan_refuses_what_the_releases_loader_would(nemo_rl_clone: Path, tmp_path: Path, job_config, start, fix):
    sources = str(upstream.REFERENCE)
    line = refusal(plan_of(nemo_rl_clone, "mine", tmp_path, "--nemo-rl-sources", sources, "-j", job_config))
    assert line.startswith(start) and fix in line


def test_plan_checks_a_user_stack_with_the_releases_loader(nemo_rl_clone: Path, tmp_path: Path):
    sources = str(upstream.REFERENCE)
    result = plan_of(
        nemo_rl_clone, "mine", tmp_path, "--nemo-rl-sources", sources, "-j", 'extraOverrides=["grpo.seed=7"]'
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NeMo RL v0.5.0's own loader accepted the recipe and overrides of: train" in result.stdout


@pytest.mark.parametrize("stack", ["dev", "h200", "b200", "h200-benchmark", "smoke"])
def test_the_shipped_stacks_pass_the_releases_loader(nemo_rl_clone: Path, tmp_path: Path, stack: str):
    result = plan_of(nemo_rl_clone, stack, tmp_path, "--nemo-rl-sources", str(upstream.REFERENCE))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NeMo RL v0.5.0's own loader accepted the recipe and overrides of: train" in result.stdout


def test_without_the_sources_the_plan_says_how_to_fetch_them(clone: Path, tmp_path: Path):
    result = plan_of(clone, "mine", tmp_path, "--nemo-rl-sources", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"recipe and override keys NOT checked against NeMo RL v0.5.0: no sources of that release at "
        f"{tmp_path}/cache/nemo-rl-v0.5.0; fetch them once: git clone --quiet --depth 1 --branch v0.5.0 "
        f"https://github.com/NVIDIA-NeMo/RL.git {tmp_path}/cache/nemo-rl-v0.5.0"
    ) in " ".join(result.stdout.split())  # wrapped to the screen's width; a path or URL is never broken
