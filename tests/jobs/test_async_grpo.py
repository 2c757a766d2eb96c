"""asyncGrpo: the overrides go through each release's own loader, and the resolved config then passes what NeMo RL's
async path checks before it trains, read from the release's sources (../shared/reference): the async branch of the
GRPO entrypoint (examples/run_grpo*.py: DAPO features, v0.7.0's multiple dataloaders) and the top of
algorithms/grpo.py's async_grpo_train (its asserts: async vLLM engine, importance-sampling correction, non-colocated
generation; its warning for an age past 1 without in-flight weight updates). The same checks refuse the synchronous
config, so they do check something."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
from config_rules import ConfigError
from launcher.cost import run_estimate
from launcher.job_settings import build_job_settings
from test_nemo_rl_loader import RELEASES, infra, resolve, stack_values  # noqa: F401 (the module fixture)
from upstream import reference


class Config(dict[str, Any]):
    """A resolved config read both ways: v0.5.0 indexes it (master_config["grpo"]), v0.7.0 reads the pydantic
    MasterConfig's fields as attributes (master_config.grpo["async_grpo"], master_config.loss_fn.<field>); a field
    the config does not have is None, as the model's optional fields are."""

    def __getattr__(self, name: str) -> Any:
        value = self.get(name)
        return Config(value) if isinstance(value, dict) else value


def _router_replay_enabled(policy: dict[str, Any]) -> bool:
    # v0.7.0's nemo_rl/models/megatron/router_replay.py (not in the reference set): the same one-line test.
    return bool((policy.get("router_replay") or {}).get("enabled", False))


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}


def _async_branch(entrypoint: Path) -> list[ast.stmt]:
    """The statements of main()'s `if ... async_grpo ... enabled:` branch before it imports async_grpo_train."""
    main = _functions(entrypoint)["main"]
    branch = next(s for s in main.body if isinstance(s, ast.If) and "async_grpo" in ast.unparse(s.test))
    body = []
    for statement in branch.body:
        if isinstance(statement, ast.ImportFrom):
            break
        body.append(statement)
    assert body, f"no checks before async_grpo_train in {entrypoint}"
    return body


def _train_prologue(grpo: Path) -> list[ast.stmt]:
    """async_grpo_train's top-level asserts, ifs and assignments: what it checks before the training loop."""
    prologue: list[ast.stmt] = []
    for statement in _functions(grpo)["async_grpo_train"].body:
        if isinstance(statement, (ast.Try, ast.While, ast.For)):
            break  # the training loop
        returns = any(isinstance(node, ast.Return) for node in ast.walk(statement))
        if isinstance(statement, (ast.Assert, ast.If, ast.Assign)) and not returns:
            prologue.append(statement)
    return prologue


def run_async_checks(release: str, config: dict[str, Any]) -> str:
    """Run NeMo RL's own async checks on a resolved config; returns what they printed (warnings). Raises what they
    raise (AssertionError, NotImplementedError)."""
    tree = reference(f"nemo-rl-{release}")
    grpo = tree / "nemo_rl" / "algorithms" / "grpo.py"
    entrypoint = (
        tree / "examples" / ("run_grpo_math.py" if (tree / "examples/run_grpo_math.py").is_file() else "run_grpo.py")
    )
    helper = ast.Module(body=[_functions(grpo)["_should_use_async_rollouts"]], type_ignores=[])
    scope: dict[str, Any] = {"router_replay_enabled": _router_replay_enabled, "MasterConfig": dict}
    exec(compile(helper, str(grpo), "exec"), scope)
    scope["config"] = scope["master_config"] = Config(config)
    printed = io.StringIO()
    checked = 0
    with contextlib.redirect_stdout(printed):
        for source, statements in ((entrypoint, _async_branch(entrypoint)), (grpo, _train_prologue(grpo))):
            for statement in statements:
                try:
                    exec(compile(ast.Module(body=[statement], type_ignores=[]), str(source), "exec"), scope)
                except NameError:  # a runtime object (the policy, a timer): not a config check
                    text = ast.unparse(statement)
                    checks_config = isinstance(statement, (ast.Assert, ast.If)) and "config" in text
                    assert not checks_config, f"a config check that could not run: {text}"
                    continue
                checked += isinstance(statement, ast.Assert)
    assert checked >= 3, f"found only {checked} asserts in {grpo}'s async_grpo_train"
    return printed.getvalue()


def async_values(stack: str, **changes: Any) -> dict[str, Any]:
    return stack_values(stack, asyncGrpo=True, **changes)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    ("stack", "changes"),
    [("h200", {}), ("b200", {}), ("h200", {"maxTrajectoryAgeSteps": 2}), ("h200", {"numPromptsPerStep": 8})],
    ids=["h200", "b200", "h200-age2", "h200-8prompts"],
)
def test_async_grpo_resolves_and_passes_nemo_rls_async_checks(infra, release, stack, changes):  # noqa: F811
    net = infra[release][stack]
    job = build_job_settings(async_values(stack, **changes), net)
    config = resolve(job, net)
    assert config["grpo"]["async_grpo"]["enabled"] is True
    assert config["grpo"]["async_grpo"]["max_trajectory_age_steps"] == job.max_trajectory_age_steps
    assert config["policy"]["generation"]["colocated"]["enabled"] is False
    printed = run_async_checks(release, config)
    assert "WARNING" not in printed  # in-flight weight updates are on, so an age past 1 is not wasted

    # The same checks refuse the run without what asyncGrpo adds: each key is needed.
    sync = resolve(build_job_settings(stack_values(stack), net), net)
    sync["grpo"]["async_grpo"]["enabled"] = True
    with pytest.raises(AssertionError, match=r"(?i)async"):
        run_async_checks(release, sync)
    for path, wrong in (
        (("loss_fn", "use_importance_sampling_correction"), False),
        (("policy", "generation", "vllm_cfg", "async_engine"), False),
        (("policy", "generation", "colocated", "enabled"), True),
    ):
        broken = resolve(job, net)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = wrong
        with pytest.raises(AssertionError):
            run_async_checks(release, broken)


@pytest.mark.parametrize("release", RELEASES)
def test_nemo_rls_checks_refuse_a_dapo_feature_and_warn_past_one_step_without_in_flight_updates(infra, release):  # noqa: F811
    net = infra[release]["h200"]
    config = resolve(build_job_settings(async_values("h200", maxTrajectoryAgeSteps=3), net), net)
    config["grpo"]["use_dynamic_sampling"] = True
    with pytest.raises(NotImplementedError, match="use_dynamic_sampling"):
        run_async_checks(release, config)
    config["grpo"]["use_dynamic_sampling"] = False
    config["grpo"]["async_grpo"]["in_flight_weight_updates"] = False
    assert "In-flight weight updates must be enabled" in run_async_checks(release, config)


def test_colocated_generation_refuses_async_grpo_in_one_line_naming_the_key(infra):  # noqa: F811
    net = infra[RELEASES[0]]["dev"]
    with pytest.raises(ConfigError) as error:
        build_job_settings(async_values("dev"), net)
    assert error.value.key == "asyncGrpo"
    message = str(error.value)
    assert "\n" not in message and message.startswith("config 'asyncGrpo'") and "generationNodes" in message
    # The h200 stack colocated by choice: the same refusal.
    with pytest.raises(ConfigError, match="asyncGrpo"):
        build_job_settings(async_values("h200", generationNodes=0), infra[RELEASES[0]]["h200"])


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("grpo.use_dynamic_sampling=true", "dynamic sampling"),
        ("grpo.reward_shaping.enabled=True", "reward shaping"),
        ("policy.generation.vllm_cfg.kv_cache_dtype=fp8", "FP8 KV cache"),
        ("loss_fn.use_importance_sampling_correction=false", "must stay true"),
        ("policy.generation.vllm_cfg.async_engine=False", "must stay true"),
        ("grpo.async_grpo.enabled=true", "derived from asyncGrpo"),
        ("grpo.async_grpo.max_trajectory_age_steps=4", "derived from maxTrajectoryAgeSteps"),
    ],
)
def test_an_extra_override_that_breaks_the_async_path_is_refused(infra, override, why):  # noqa: F811
    net = infra[RELEASES[0]]["h200"]
    with pytest.raises(ConfigError, match=why) as error:
        build_job_settings(async_values("h200", extraOverrides=[override]), net)
    assert error.value.key == "extraOverrides"
    # Without asyncGrpo the DAPO features and the FP8 cache are the recipe's business.
    if "async" not in override and "importance" not in override:
        build_job_settings(stack_values("h200", extraOverrides=[override]), net)


def test_a_trajectory_age_without_async_grpo_is_refused(infra):  # noqa: F811
    with pytest.raises(ConfigError, match=r"maxTrajectoryAgeSteps.*unless asyncGrpo"):
        build_job_settings(stack_values("h200", maxTrajectoryAgeSteps=2), infra[RELEASES[0]]["h200"])
    with pytest.raises(ConfigError, match="maxTrajectoryAgeSteps"):
        build_job_settings(async_values("h200", maxTrajectoryAgeSteps=0), infra[RELEASES[0]]["h200"])


def test_the_estimate_has_no_off_policy_step_for_the_gemma_recipe(infra):  # noqa: F811
    net = infra[RELEASES[0]]["h200"]
    assert net.gpu_node_hourly_usd
    no_evals = {"evalBase": False, "evalFinal": False}
    synchronous = run_estimate(build_job_settings(stack_values("h200", **no_evals), net), net)
    off_policy = run_estimate(build_job_settings(async_values("h200", **no_evals), net), net)
    # Google's sample measured the Gemma 3 27B recipe synchronously only: async gets no borrowed number.
    assert synchronous["secondsPerStep"] == pytest.approx(942.51) and synchronous["usd"] > 0
    assert off_policy["secondsPerStep"] is None and off_policy["firstStepSeconds"] is None
    assert off_policy["usd"] is None and off_policy["gpuHours"] is None and off_policy["asyncGrpo"] is True
    assert any(note.startswith("seconds per step unknown") and "secondsPerStep" in note for note in off_policy["notes"])
    # The user's own figure wins, for the first step too (no ratio borrowed from another model).
    own = run_estimate(build_job_settings(async_values("h200", secondsPerStep="50"), net), net)
    assert own["secondsPerStep"] == own["firstStepSeconds"] == 50
    assert own["secondsPerStepFrom"] == "secondsPerStep"
