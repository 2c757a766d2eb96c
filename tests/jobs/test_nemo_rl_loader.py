"""The train step's overrides as NeMo RL itself takes them: each stack's recipe is loaded with NeMo RL's own loader
(nemo_rl/utils/config.py from ../shared/reference/, in .venv-nemorl) and every override the pipeline generates is
applied the way examples/run_grpo_math.py applies them (strict: an unknown key is an error), then the resolved
config is checked: what the run will really train with."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import upstream
from conftest import ROOT, run_infra_stack
from launcher.pipeline import entrypoint_text, pipeline_steps
from launcher.settings import InfraOutputs, JobSettings, build_infra_outputs, build_job_settings
from upstream import NemoRlRefusedError, reference, resolve_with_nemo_rl

from tools.offline import load_stack_config

NEMO_RL = "nemo-rl-v0.5.0"
ENTRYPOINT = "examples/run_grpo_math.py"


@pytest.fixture(scope="module")
def infra() -> dict[str, InfraOutputs]:
    """Each infra stack file's real outputs."""
    return {stack: build_infra_outputs(run_infra_stack(stack).outputs) for stack in ("dev", "h200", "b200")}


def stack_values(stack: str, **changes: Any) -> dict[str, Any]:
    """A job stack file's config (with jobs/Pulumi.yaml's defaults), as build_job_settings reads it."""
    project, config = load_stack_config(ROOT / "jobs", stack)
    values = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{project}:")}
    return {**values, **changes}


def entry_args(job: JobSettings, infra: InfraOutputs) -> list[str]:
    """The words the train step passes to NeMo RL's entrypoint, as bash will split them on the Ray head."""
    train = next(step for step in pipeline_steps(job, infra) if step.name == "train")
    words = shlex.split(entrypoint_text(train))
    return words[words.index(ENTRYPOINT) + 1 :]


def resolve(job: JobSettings, infra: InfraOutputs) -> dict[str, Any]:
    return resolve_with_nemo_rl(reference(NEMO_RL), entry_args(job, infra))


@pytest.mark.parametrize("stack", ["dev", "h200", "b200"])
def test_each_stacks_train_step_resolves_with_nemo_rls_loader(infra, stack):
    net = infra[stack]
    job = build_job_settings(stack_values(stack), net)
    config = resolve(job, net)
    assert config["cluster"] == {"num_nodes": job.num_nodes, "gpus_per_node": net.gpus_per_node}
    assert config["grpo"]["num_prompts_per_step"] == job.num_prompts_per_step
    assert config["grpo"]["num_generations_per_prompt"] == job.num_generations_per_prompt
    assert config["grpo"]["max_num_steps"] == job.max_num_steps
    generation = config["policy"]["generation"]
    assert generation["colocated"]["enabled"] == (job.generation_nodes == 0)
    if job.generation_nodes:
        assert generation["colocated"]["resources"] == {
            "num_nodes": job.generation_nodes,
            "gpus_per_node": net.gpus_per_node,
        }
    assert generation["vllm_cfg"]["tensor_parallel_size"] == job.vllm_tensor_parallel_size
    assert config["policy"]["dtensor_cfg"]["tensor_parallel_size"] == job.dtensor_tensor_parallel_size
    assert config["checkpointing"]["checkpoint_dir"] == f"{net.mount_path}/{job.run_name}"
    assert config["data"]["train_data_path"] == f"{net.mount_path}/datasets/gsm8k/train.jsonl"


def test_an_override_nemo_rl_does_not_know_is_refused(infra):
    """The check is strict, as the entrypoint is: a misspelt key fails here, not on the cluster."""
    net = infra["dev"]
    job = build_job_settings(stack_values("dev", extraOverrides=["grpo.max_num_stepz=3"]), net)
    with pytest.raises(NemoRlRefusedError, match=r"grpo\.max_num_stepz"):
        resolve(job, net)


def test_a_missing_reference_skips_with_how_to_get_it_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no upstream reference nemo-rl-v9\.9\.9 .*shared/reference"):
        upstream.reference("nemo-rl-v9.9.9")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run these tests"):
        upstream.reference("nemo-rl-v9.9.9")
    monkeypatch.setattr(upstream, "NEMORL_PYTHON", upstream.ROOT / ".venv-missing" / "bin" / "python")
    with pytest.raises(pytest.fail.Exception, match=r"make \.venv-nemorl/\.installed"):
        upstream.nemo_rl_python()
