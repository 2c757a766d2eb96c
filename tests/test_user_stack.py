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
from plan_forks import PlanForks

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


def _env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in _OUTER_MAKE}


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False, env=_env())


# One plan server per copy (tests/plan_forks.py): each plan_of is a forked `tools/plan.py`, not a fresh interpreter.
_PLAN_FORKS: dict[Path, PlanForks] = {}


@pytest.fixture(scope="module", autouse=True)
def _plan_forks_closed():
    yield
    while _PLAN_FORKS:
        _PLAN_FORKS.popitem()[1].close()


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
    """`python tools/plan.py --stack STACK --out OUT --quiet *extra` in the copy."""
    if clone not in _PLAN_FORKS:
        _PLAN_FORKS[clone] = PlanForks(clone, _env())
    return _PLAN_FORKS[clone].plan(["--stack", stack, "--out", str(out), "--quiet", *extra])


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


# The recipe and every override, against the image's release's index (tools/nemo_rl_index.json): no NeMo RL sources,
# no .venv-nemorl (the clone has neither).
V070 = "nemoRlImage=nvcr.io/nvidia/nemo-rl:v0.7.0"
DEFAULT_RECIPE = "examples/configs/recipes/llm/grpo-gemma3-27b-it-8n4g-fsdp2tp4-actckpt-long.yaml"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["-j", "recipe=examples/configs/recipes/llm/grpo-nonexistent-1n8g.yaml"],
            "plan: config 'nemo-rl-jobs:recipe' = 'examples/configs/recipes/llm/grpo-nonexistent-1n8g.yaml' is not a "
            "recipe of NeMo RL v0.5.0 (the image's release; tools/nemo_rl_index.json): nearest: ",
        ),
        (
            ["-j", 'extraOverrides=["grpo.max_num_step=20"]'],
            "plan: config 'nemo-rl-jobs:extraOverrides' item 'grpo.max_num_step=20': grpo.max_num_step is not a key "
            f"of {DEFAULT_RECIPE} in NeMo RL v0.5.0, and its loader refuses it at train: did you mean "
            "grpo.max_num_steps or grpo.max_num_epochs?",
        ),
        (
            ["-j", 'extraOverrides=["grpo.max_num_steps=twenty"]'],
            "plan: config 'nemo-rl-jobs:extraOverrides' item 'grpo.max_num_steps=twenty': grpo.max_num_steps takes an "
            f"integer in {DEFAULT_RECIPE} (NeMo RL v0.5.0: the type of the recipe's value), and 'twenty' is a string",
        ),
        (
            ["-j", 'extraOverrides=["~grpo.max_num_step"]'],
            "plan: config 'nemo-rl-jobs:extraOverrides' item '~grpo.max_num_step': grpo.max_num_step is not a key of "
            f"{DEFAULT_RECIPE} in NeMo RL v0.5.0, and its loader refuses it at train: did you mean grpo.max_num_steps",
        ),
        (
            ["-j", 'extraOverrides=["+grpo.seed=1"]'],
            "plan: config 'nemo-rl-jobs:extraOverrides' item '+grpo.seed=1': grpo.seed is already a key of "
            f"{DEFAULT_RECIPE} in NeMo RL v0.5.0 (Hydra refuses to append it): drop the '+' (grpo.seed=1)",
        ),
        (  # a release switch: v0.7.0 moved the data keys under data.default, data.train and data.validation
            ["-c", V070, "-j", 'extraOverrides=["data.prompt_file=examples/prompts/cot.txt"]'],
            "plan: config 'nemo-rl-jobs:extraOverrides' item 'data.prompt_file=examples/prompts/cot.txt': "
            f"data.prompt_file is not a key of {DEFAULT_RECIPE} in NeMo RL v0.7.0 (it is one in NeMo RL v0.5.0), and "
            "its loader refuses it at train: did you mean data.default.prompt_file?",
        ),
    ],
)
def test_plan_refuses_what_the_releases_loader_would(clone: Path, tmp_path: Path, args: list[str], line: str):
    assert not (clone / ".venv-nemorl").exists()
    assert refusal(plan_of(clone, "mine", tmp_path, "--nemo-rl-sources", str(tmp_path / "none"), *args)).startswith(
        line
    )


def test_the_list_command_a_refusal_prints_lists_the_releases_recipes(clone: Path, tmp_path: Path):
    line = refusal(plan_of(clone, "mine", tmp_path, "-j", "recipe=examples/configs/recipes/llm/grpo-nonexistent.yaml"))
    command = line.split("list them: ", 1)[1].split(" (", 1)[0]
    assert command == "python3 tools/nemo_rl_index.py --list v0.5.0 grpo"
    listed = run(command.split(), clone)
    assert listed.returncode == 0 and DEFAULT_RECIPE in listed.stdout.splitlines()
    assert all(path.startswith("examples/configs/") and "grpo" in path for path in listed.stdout.splitlines())


def test_an_added_key_is_accepted_and_the_values_it_left_unchanged_are_shown(clone: Path, tmp_path: Path):
    """A + of a new key is Hydra's to add (no refusal); a typo in it leaves the value it meant unchanged, and the plan
    shows which value came from where."""
    extra = 'extraOverrides=["+grpo.max_num_step=20", "policy.max_total_sequence_length=8192"]'
    result = plan_of(clone, "mine", tmp_path, "--nemo-rl-sources", str(tmp_path / "none"), "-j", extra)
    assert result.returncode == 0, result.stderr[-3000:]
    out = " ".join(result.stdout.split())
    assert "recipe and override keys checked against NeMo RL v0.5.0's index (tools/nemo_rl_index.json): train" in out
    assert (
        "train: steps 10 (stack), prompts/step 16 (stack), generations/prompt 32 (stack), sequence length 8192 "
        "(override), model google/gemma-3-27b-it (recipe), checkpoint every 10 steps (recipe)"
    ) in out


@pytest.mark.parametrize("stack", ["dev", "h200", "b200", "h200-4node", "h200-benchmark", "smoke"])
@pytest.mark.parametrize("image", ["v0.5.0", "v0.7.0"])
def test_the_shipped_stacks_pass_the_index(clone: Path, tmp_path: Path, stack: str, image: str):
    """Every key the job stack itself overrides (model, dataset, sizes, paths) is one of its recipe in both releases:
    a release that dropped one would fail here, in the plan, not on the cluster."""
    args = ["-c", f"nemoRlImage=nvcr.io/nvidia/nemo-rl:{image}"]
    result = plan_of(clone, stack, tmp_path, "--nemo-rl-sources", str(tmp_path / "none"), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"recipe and override keys checked against NeMo RL {image}'s index" in result.stdout


@pytest.fixture(scope="module")
def own_recipe_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's NeMo RL tree: the release's sources plus a recipe of their own the index cannot know."""
    root = tmp_path_factory.mktemp("sources")
    shutil.copytree(upstream.reference("nemo-rl-v0.5.0"), root / "nemo-rl-v0.5.0")
    (root / "nemo-rl-v0.5.0" / OWN_RECIPE).write_text(
        f"defaults: {Path(DEFAULT_RECIPE).name}\ngrpo:\n  max_num_steps: 7\n"
    )
    return root


OWN_RECIPE = "examples/configs/recipes/llm/grpo-gemma3-27b-acme.yaml"


@pytest.fixture(scope="module")
def nemo_rl_clone(clone: Path) -> Path:
    """The clone with NeMo RL's loader at hand (.venv-nemorl), for a recipe the index cannot know."""
    python = upstream.nemo_rl_python()
    clone_with = clone.parent / "clone-with-loader"
    if not clone_with.exists():
        shutil.copytree(clone, clone_with, symlinks=True)
        (clone_with / ".venv-nemorl").symlink_to(python.parent.parent)
    return clone_with


def test_a_recipe_of_your_own_is_checked_with_the_releases_loader(
    nemo_rl_clone: Path, own_recipe_sources: Path, tmp_path: Path
):
    sources = ["--nemo-rl-sources", str(own_recipe_sources), "-j", f"recipe={OWN_RECIPE}"]
    result = plan_of(nemo_rl_clone, "mine", tmp_path, *sources, "-j", 'extraOverrides=["grpo.seed=7"]')
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"NeMo RL v0.5.0's own loader accepted the recipe and overrides of: train ({own_recipe_sources})" in (
        " ".join(result.stdout.split())
    )
    line = refusal(plan_of(nemo_rl_clone, "mine", tmp_path, *sources, "-j", 'extraOverrides=["grpo.max_num_step=2"]'))
    assert line.startswith(
        f"plan: config 'nemo-rl-jobs:extraOverrides' item 'grpo.max_num_step=2': grpo.max_num_step is not a key of "
        f"{OWN_RECIPE} in NeMo RL v0.5.0"
    )
    # Without the sources that hold it, it is not a recipe of the release.
    line = refusal(plan_of(nemo_rl_clone, "mine", tmp_path, "-j", f"recipe={OWN_RECIPE}"))
    assert line.startswith(f"plan: config 'nemo-rl-jobs:recipe' = {OWN_RECIPE!r} is not a recipe of NeMo RL v0.5.0")
    assert f"make plan NEMO_RL_SOURCES=DIR with DIR/nemo-rl-v0.5.0/{OWN_RECIPE}" in line
