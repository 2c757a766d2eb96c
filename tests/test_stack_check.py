"""The checks `make plan` makes of a user's stack (tools/stack_check.py), without Pulumi: each refusal is one line
naming the key, the value and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

from tools import plan, stack_check
from tools.offline import load_stack_config, read_yaml


def one_line(text: str | None) -> str:
    assert text is not None
    assert "\n" not in text
    return text


def test_every_placeholder_of_the_shipped_stack_files_is_known():
    found = {}
    for path in [*ROOT.glob("Pulumi.*.yaml"), *(ROOT / "jobs").glob("Pulumi.*.yaml")]:
        for key, value in ((read_yaml(path) or {}).get("config") or {}).items():
            if isinstance(value, str) and value.startswith("my-"):
                found[value] = key
    assert found, "the example stacks hold placeholders"
    assert {value: stack_check.PLACEHOLDERS[value][0] for value in found} == found


def test_placeholders_are_refused_with_the_command_that_sets_them():
    _, config = load_stack_config(ROOT, "h200")
    problems = stack_check.placeholder_problems("mine", config, "Pulumi.mine.yaml")
    assert [one_line(p) for p in problems] == [
        "config 'gcp:project' = 'my-gcp-project' in Pulumi.mine.yaml is the example's placeholder: set your own: "
        "pulumi config set --stack mine gcp:project YOUR_PROJECT_ID",
        "config 'nemo-rl-gke:reservation' = 'my-h200-reservation' in Pulumi.mine.yaml is the example's placeholder: "
        "set your own: pulumi config set --stack mine reservation YOUR_RESERVATION",
    ]
    config.update({"gcp:project": "acme-ml", "nemo-rl-gke:reservation": "acme-block-1"})
    assert stack_check.placeholder_problems("mine", config, "Pulumi.mine.yaml") == []


def test_a_missing_token_is_refused_with_the_command_that_stores_it():
    [problem] = stack_check.infra_secret_problems("mine", {"gcp:project": "p"}, "Pulumi.mine.yaml")
    assert one_line(problem) == (
        "config 'nemo-rl-gke:hfToken' is not set in Pulumi.mine.yaml: `pulumi up` needs your Hugging Face token, "
        "stored encrypted: pulumi config set --stack mine --secret hfToken hf_..."
    )


@pytest.mark.parametrize("key", ["hfToken", "wandbApiKey"])
def test_a_plain_text_secret_is_refused_without_printing_it(key: str):
    config = {"nemo-rl-gke:hfToken": {"secure": "v1:abc"}, f"nemo-rl-gke:{key}": "hf_abcdefghijklmnopqrstuvwxyz"}
    [problem] = stack_check.infra_secret_problems("mine", config, "Pulumi.mine.yaml")
    assert one_line(problem).startswith(f"config 'nemo-rl-gke:{key}' = hf_... is plain text in Pulumi.mine.yaml")
    assert f"pulumi config set --stack mine --secret {key} " in problem
    assert "abcdefghij" not in problem
    config[f"nemo-rl-gke:{key}"] = {"secure": "v1:xyz"}
    assert stack_check.infra_secret_problems("mine", config, "Pulumi.mine.yaml") == []


@pytest.mark.parametrize(
    ("named", "target"),
    [
        ("organization/nemo-rl-gke/h200", "would read the infra stack 'h200'"),
        ("organization/nemo-rl-gke/mnie", "would read the infra stack 'mnie'"),
        ("mine", "would read the job project's own stack 'mine' (organization/nemo-rl-jobs/mine)"),
        ("organization/mine", "stack 'mine' of the job project in organization 'organization'"),
        ("organization/nemo-rl/mine", "project 'nemo-rl', not the infra project 'nemo-rl-gke'"),
    ],
)
def test_infra_stack_must_name_the_infra_file_the_plan_used(named: str, target: str):
    problem = one_line(stack_check.infra_stack_problem("mine", "mine", named))
    assert problem.startswith(f"config 'nemo-rl-jobs:infraStack' = {named!r}: ")
    assert "the plan rendered jobs/Pulumi.mine.yaml against Pulumi.mine.yaml" in problem
    assert target in problem
    assert problem.endswith("pulumi config set --cwd jobs --stack mine infraStack organization/nemo-rl-gke/mine")
    assert stack_check.infra_stack_problem("mine", "mine", "organization/nemo-rl-gke/mine") is None
    assert stack_check.infra_stack_problem("mine", "mine", "acme/nemo-rl-gke/mine") is None


def test_missing_sources_say_the_one_command_that_fills_them(tmp_path: Path):
    problem = one_line(stack_check.sources_problem(tmp_path, "v0.5.0"))
    assert "NOT checked against NeMo RL v0.5.0" in problem
    command = stack_check.fill_command(tmp_path, "v0.5.0")
    assert command in problem
    assert command == (
        f"git clone --quiet --depth 1 --branch v0.5.0 https://github.com/NVIDIA-NeMo/RL.git {tmp_path}/nemo-rl-v0.5.0"
    )
    (tmp_path / "nemo-rl-v0.5.0" / "nemo_rl" / "utils").mkdir(parents=True)
    (tmp_path / "nemo-rl-v0.5.0" / "nemo_rl" / "utils" / "config.py").write_text("")
    (tmp_path / "nemo-rl-v0.5.0" / "examples" / "configs").mkdir(parents=True)
    assert stack_check.sources_problem(tmp_path, "v0.5.0") is None


def test_a_recipe_not_in_the_release_is_refused_with_the_closest(tmp_path: Path):
    configs = tmp_path / "examples" / "configs" / "recipes" / "llm"
    configs.mkdir(parents=True)
    (configs / "grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml").write_text("{}")
    assert stack_check.recipe_problem(tmp_path, "v0.5.0", f"{configs.relative_to(tmp_path)}/x.yaml") is not None
    typo = "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v2.yaml"
    problem = one_line(stack_check.recipe_problem(tmp_path, "v0.5.0", typo))
    assert problem.startswith(f"config 'nemo-rl-jobs:recipe' = {typo!r} is not a recipe of NeMo RL v0.5.0")
    assert "did you mean examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml?" in problem
    assert stack_check.recipe_problem(tmp_path, "v0.5.0", typo.replace("v2", "v3")) is None


RESOLVED = {"grpo": {"max_num_steps": 10, "seed": 42}, "logger": {"wandb": {"project": "p"}}}


def test_override_keys_are_held_against_the_resolved_recipe():
    extra = ["grpo.max_num_step=20", "+grpo.seed=1", "~policy.nope", "grpo.seed=7", "cluster.x=1", "+grpo.new_key=1"]
    problems = stack_check.override_key_problems(RESOLVED, extra, "R.yaml", "v0.5.0")
    assert [one_line(p) for p in problems] == [
        "config 'nemo-rl-jobs:extraOverrides' item 'grpo.max_num_step=20': grpo.max_num_step is not a key of R.yaml "
        "in NeMo RL v0.5.0, and its loader refuses it at train: did you mean grpo.max_num_steps?",
        "config 'nemo-rl-jobs:extraOverrides' item '+grpo.seed=1': grpo.seed is already a key of R.yaml in NeMo RL "
        "v0.5.0 (Hydra refuses to append it): drop the '+' (grpo.seed=1)",
        "config 'nemo-rl-jobs:extraOverrides' item '~policy.nope': policy.nope is not a key of R.yaml in NeMo RL "
        "v0.5.0, and its loader refuses it at train: there is nothing to remove: drop the item",
        "config 'nemo-rl-jobs:extraOverrides' item 'cluster.x=1': cluster.x is not a key of R.yaml in NeMo RL v0.5.0, "
        "and its loader refuses it at train: write +cluster.x=... to add a new key",
    ]


def test_the_commands_the_checks_print_are_pulumi_config_commands():
    _, config = load_stack_config(ROOT, "b200")
    lines = [
        *stack_check.placeholder_problems("mine", config, "Pulumi.mine.yaml"),
        *stack_check.infra_secret_problems("mine", config, "Pulumi.mine.yaml"),
        one_line(stack_check.infra_stack_problem("mine", "mine", "h200")),
    ]
    for line in lines:
        [command] = re.findall(r"pulumi config set [^()]*?(?= \(|$)", line)
        words = command.split()
        assert words[:3] == ["pulumi", "config", "set"] and "--stack" in words, line


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("region", "did you mean 'gcp:region' (the provider's key: pulumi config set gcp:region REGION)?"),
        ("project", "did you mean 'gcp:project' (the provider's key: pulumi config set gcp:project PROJECT_ID)?"),
        ("CONTROL_PLANE_REGION", "did you mean 'gcp:region'"),
        ("PROJECT_ID", "did you mean 'gcp:project'"),
        ("NODE_ZONE", "did you mean 'zone'?"),
        ("machineType", "did you mean 'gpuType': the GPU nodes' machine type follows it"),
        ("KSA_NAME", "did you mean 'kubernetesServiceAccount'?"),
        ("LUSTRE_NAME", "the Lustre instance is named CLUSTER-lustre"),
        ("REPLICA_COUNT", "did you mean 'rayWorkerReplicas'?"),
        ("HF_TOKEN", "pulumi config set --secret hfToken hf_..."),
        ("gpuNode", "did you mean 'gpuNodes'?"),
    ],
)
def test_did_you_mean_proposes_the_provider_keys_and_maps_the_tutorials_names(key: str, hint: str):
    from infra.settings import UnknownKeyError, check_keys

    with pytest.raises(UnknownKeyError) as caught:
        check_keys("nemo-rl-gke", [f"nemo-rl-gke:{key}"])
    message = str(caught.value)
    assert message.startswith(f"config 'nemo-rl-gke:{key}' is not a key this program reads: did you mean ")
    assert hint in message
    assert "rayVersion" not in str(caught.value) and "protectData" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("WORLD_SIZE", "did you mean 'numNodes'?"),
        ("REPLICA_COUNT", "did you mean 'numNodes'?"),
        ("HF_TOKEN", "the token is the infra stack's secret: pulumi config set --secret hfToken hf_..."),
        ("maxNumStep", "did you mean 'maxNumSteps'?"),
    ],
)
def test_job_did_you_mean_maps_the_tutorials_names(key: str, hint: str):
    from launcher.settings import UnknownKeyError, check_keys

    with pytest.raises(UnknownKeyError) as caught:
        check_keys("nemo-rl-jobs", [f"nemo-rl-jobs:{key}"])
    assert str(caught.value).startswith(f"config 'nemo-rl-jobs:{key}' is not a key this program reads: {hint}")


def test_a_megatron_recipe_outside_the_performance_table_is_refused():
    """The job stack knows the Megatron sizes of the performance recipes only: any other Megatron recipe would get a
    DTensor tensor-parallel override and a DTensor batch check; the plan, resolving it, says so."""
    megatron = {"policy": {"megatron_cfg": {"enabled": True}, "dtensor_cfg": {"enabled": False}}}
    words = ["--config=R.yaml", "policy.dtensor_cfg.tensor_parallel_size=8", "grpo.max_num_steps=10"]
    problem = stack_check.backend_problem(megatron, words, "R.yaml", "v0.5.0")
    assert problem is not None and one_line(problem) == problem
    assert problem.startswith("config 'nemo-rl-jobs:recipe' = 'R.yaml': it trains with Megatron")
    assert "jobs/launcher/performance.py" in problem
    # A performance recipe (no DTensor override written) or a DTensor recipe: nothing to say.
    assert stack_check.backend_problem(megatron, words[:1] + words[2:], "R.yaml", "v0.5.0") is None
    dtensor = {"policy": {"megatron_cfg": {"enabled": False}, "dtensor_cfg": {"enabled": True}}}
    assert stack_check.backend_problem(dtensor, words, "R.yaml", "v0.5.0") is None


def test_the_plan_refuses_a_megatron_recipe_it_would_run_as_dtensor():
    from upstream import REFERENCE, nemo_rl_python, reference

    reference("nemo-rl-v0.5.0")
    nemo_rl_python()
    recipe = "examples/configs/recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3.yaml"
    with pytest.raises(plan.PlanError, match=r"it trains with Megatron \(policy\.megatron_cfg\.enabled\) in NeMo RL"):
        plan.run_plan("h200", job_overrides=[f"recipe={recipe}"], nemo_rl_sources=REFERENCE)
