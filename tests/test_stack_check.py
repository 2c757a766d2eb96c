"""The checks `make plan` makes of a user's stack (tools/stack_check.py), without Pulumi: each refusal is one line
naming the key, the value and the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from tools import nemo_rl_index, plan_run, plan_stacks, stack_check
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


QWEN = "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml"


def test_a_recipe_not_in_the_release_is_refused_with_the_closest_and_the_list_command():
    typo = QWEN.replace("v3", "v2")
    problem = one_line(stack_check.recipe_problem("v0.5.0", typo))
    assert problem.startswith(f"config 'nemo-rl-jobs:recipe' = {typo!r} is not a recipe of NeMo RL v0.5.0")
    assert f"nearest: {QWEN}, " in problem
    assert "list them: python3 tools/nemo_rl_index.py --list v0.5.0 grpo " in problem
    listed = subprocess.run(
        [sys.executable, "tools/nemo_rl_index.py", "--list", "v0.5.0", "grpo"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0 and QWEN in listed.stdout.splitlines() and typo not in listed.stdout


def checked(extra: list[str], tag: str = "v0.5.0", recipe: str = QWEN) -> list[str]:
    keys = nemo_rl_index.keys_of(tag, recipe)
    assert keys is not None
    others = {other: nemo_rl_index.keys_of(other, recipe) or {} for other in nemo_rl_index.TAGS if other != tag}
    problems, _ = stack_check.override_problems(keys, [(item, "override") for item in extra], recipe, tag, others)
    return [one_line(p).replace(recipe, "R.yaml") for p in problems]


def test_override_keys_are_held_against_the_recipes_keys_in_the_index():
    assert checked(["grpo.max_num_step=20", "+grpo.seed=1", "~policy.nope", "cluster.x=1"]) == [
        "config 'nemo-rl-jobs:extraOverrides' item 'grpo.max_num_step=20': grpo.max_num_step is not a key of R.yaml "
        "in NeMo RL v0.5.0, and its loader refuses it at train: did you mean grpo.max_num_steps or "
        "grpo.max_num_epochs?",
        "config 'nemo-rl-jobs:extraOverrides' item '+grpo.seed=1': grpo.seed is already a key of R.yaml in NeMo RL "
        "v0.5.0 (Hydra refuses to append it): drop the '+' (grpo.seed=1)",
        "config 'nemo-rl-jobs:extraOverrides' item '~policy.nope': policy.nope is not a key of R.yaml in NeMo RL "
        "v0.5.0, and its loader refuses it at train: there is nothing to remove: drop the item",
        "config 'nemo-rl-jobs:extraOverrides' item 'cluster.x=1': cluster.x is not a key of R.yaml in NeMo RL v0.5.0, "
        "and its loader refuses it at train: write +cluster.x=... to add a new key",
    ]
    # Applied in order, as Hydra does: a key added with + can then be set, one deleted with ~ is gone.
    assert checked(["+grpo.new_key=1", "grpo.new_key=2", "++grpo.seed=3", "~grpo.seed", "grpo.seed=4"]) == [
        "config 'nemo-rl-jobs:extraOverrides' item 'grpo.seed=4': grpo.seed is not a key of R.yaml in NeMo RL v0.5.0, "
        "and its loader refuses it at train: write +grpo.seed=... to add a new key"
    ]


@pytest.mark.parametrize(
    ("item", "declared", "given"),
    [
        ("grpo.max_num_steps=twenty", "an integer", "a string"),
        ("grpo.max_num_steps=1e3", "an integer", "a floating-point number"),
        ("policy.generation.colocated.enabled=1", "true or false", "an integer"),
        ("grpo.num_prompts_per_step=[8]", "an integer", "a list [...]"),
    ],
)
def test_an_override_of_the_wrong_type_is_refused_where_the_recipe_has_one(item: str, declared: str, given: str):
    key, value = item.split("=", 1)
    assert checked([item]) == [
        f"config 'nemo-rl-jobs:extraOverrides' item {item!r}: {key} takes {declared} in R.yaml (NeMo RL v0.5.0: the "
        f"type of the recipe's value), and {value!r} is {given}"
    ]


def test_values_of_the_recipes_types_null_and_interpolations_are_accepted():
    fine = [
        "grpo.max_num_steps=20",
        "loss_fn.reference_policy_kl_penalty=0",  # an integer where a float is
        "policy.generation.colocated.enabled=False",
        "policy.model_name=Qwen/Qwen2.5-1.5B",
        "logger.wandb.name=2024",  # a string takes any scalar
        "policy.logprob_batch_size=${policy.train_micro_batch_size}",
        "grpo.max_num_steps=null",
    ]
    assert checked(fine) == []
    assert [stack_check.value_type(v) for v in ("1", "-2", "1.5", ".5", "1e-6", "inf", "TRUE", "null", "x", "'1'")] == [
        "int", "int", "float", "float", "float", "float", "bool", None, "str", "str"
    ]  # fmt: skip


def test_a_key_the_release_dropped_names_the_release_that_has_it():
    """v0.7.0 moved the GRPO data keys under data.default/train/validation: a v0.5.0 override on a v0.7.0 image."""
    assert checked(["data.prompt_file=examples/prompts/cot.txt"], tag="v0.7.0") == [
        "config 'nemo-rl-jobs:extraOverrides' item 'data.prompt_file=examples/prompts/cot.txt': data.prompt_file is "
        "not a key of R.yaml in NeMo RL v0.7.0 (it is one in NeMo RL v0.5.0), and its loader refuses it at train: "
        "did you mean data.default.prompt_file?"
    ]
    # The job stack's own overrides: named as its own, the recipe being what the user chose.
    keys = nemo_rl_index.keys_of("v0.7.0", QWEN) or {}
    problems, _ = stack_check.override_problems(keys, [("data.dataset_name=X", "stack")], QWEN, "v0.7.0", {})
    assert one_line(problems[0]).startswith(
        f"config 'nemo-rl-jobs:recipe' = {QWEN!r}: the job stack's own override 'data.dataset_name=X': "
    )
    assert problems[0].endswith("(others: python3 tools/nemo_rl_index.py --list v0.7.0)")


def test_the_shown_values_say_where_each_came_from():
    keys = nemo_rl_index.keys_of("v0.5.0", QWEN) or {}
    words = [("grpo.max_num_steps=3", "stack"), ("+grpo.max_num_step=20", "override")]
    words += [("policy.model_name=M", "override")]
    problems, set_by = stack_check.override_problems(keys, words, QWEN, "v0.5.0", {})
    assert problems == []  # a + of a new key is Hydra's to add, and the plan's to show
    assert stack_check.shown_values(nemo_rl_index.values_of("v0.5.0", QWEN), set_by) == (
        "steps 3 (stack), prompts/step 32 (recipe), generations/prompt 16 (recipe), sequence length 512 (recipe), "
        "model M (override), checkpoint every 10 steps (recipe)"
    )


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
    from config_rules import UnknownKeyError, check_keys, keys_of

    from infra.settings import KEY_ALIASES, MODEL, SECRETS

    with pytest.raises(UnknownKeyError) as caught:
        check_keys("nemo-rl-gke", [f"nemo-rl-gke:{key}"], [*keys_of(MODEL), *SECRETS], KEY_ALIASES)
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
    from config_rules import UnknownKeyError, check_keys, keys_of
    from launcher.job_settings import KEY_ALIASES, MODEL

    with pytest.raises(UnknownKeyError) as caught:
        check_keys("nemo-rl-jobs", [f"nemo-rl-jobs:{key}"], keys_of(MODEL), KEY_ALIASES)
    assert str(caught.value).startswith(f"config 'nemo-rl-jobs:{key}' is not a key this program reads: {hint}")


def test_a_megatron_recipe_outside_the_performance_table_is_refused():
    """The job stack knows the Megatron sizes of the performance recipes only: any other Megatron recipe would get a
    DTensor tensor-parallel override and a DTensor batch check; the plan, resolving it, says so."""
    words = ["--config=R.yaml", "policy.dtensor_cfg.tensor_parallel_size=8", "grpo.max_num_steps=10"]
    problem = stack_check.backend_problem(True, words, "R.yaml", "v0.5.0")
    assert problem is not None and one_line(problem) == problem
    assert problem.startswith("config 'nemo-rl-jobs:recipe' = 'R.yaml': it trains with Megatron")
    assert "jobs/launcher/performance.py" in problem
    # A performance recipe (no DTensor override written) or a DTensor recipe: nothing to say.
    assert stack_check.backend_problem(True, words[:1] + words[2:], "R.yaml", "v0.5.0") is None
    assert stack_check.backend_problem(False, words, "R.yaml", "v0.5.0") is None


def test_the_plan_refuses_a_megatron_recipe_it_would_run_as_dtensor():
    """From the index (the recipe's policy.megatron_cfg.enabled), with no sources at hand."""
    recipe = "examples/configs/recipes/llm/grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3.yaml"
    with pytest.raises(
        plan_stacks.PlanError, match=r"it trains with Megatron \(policy\.megatron_cfg\.enabled\) in NeMo RL"
    ):
        plan_run.run_plan("h200", job_overrides=[f"recipe={recipe}"], nemo_rl_sources=Path("/nonexistent"))
    # The fix it offers is accepted: DTensor instead.
    extra = 'extraOverrides=["policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"]'
    plan_run.run_plan("h200", job_overrides=[f"recipe={recipe}", extra], nemo_rl_sources=Path("/nonexistent"))


def test_a_deletion_of_a_null_key_is_refused_as_hydra_refuses_it():
    assert checked(["~loss_fn.ratio_clip_c"]) == [
        "config 'nemo-rl-jobs:extraOverrides' item '~loss_fn.ratio_clip_c': loss_fn.ratio_clip_c is null in R.yaml "
        "(NeMo RL v0.5.0), and Hydra deletes only a key that is set: drop the item"
    ]


def test_a_recipe_the_index_lists_without_keys_is_planned_and_said_to_be_unchecked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    """A v0.7.0 recipe whose defaults chain ../shared/reference lacks: it is a recipe of the release (not refused),
    and without sources that hold it the plan says its keys were not checked and how to fetch the sources."""
    recipe = "examples/configs/recipes/llm/grpo-qwen3-1.7b-2n8g-megatron-super-rlhf.yaml"
    assert nemo_rl_index.keys_of("v0.7.0", recipe) is None and nemo_rl_index.unindexed_reason("v0.7.0", recipe)
    image = "nemoRlImage=nvcr.io/nvidia/nemo-rl:v0.7.0"
    plan_run.run_plan("dev", [image], [f"recipe={recipe}"], nemo_rl_sources=tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    assert f"{recipe}: keys not in the index (the loader could not resolve it from the sources the index" in out
    assert f"NOT checked against NeMo RL v0.7.0: no sources of that release at {tmp_path}/nemo-rl-v0.7.0" in out
