"""A 32-node plan (issue 34), not a shipped stack: the h200 infra stack at 32 A3 Ultra nodes running NeMo RL's
Qwen3-235B 32n8g 1-step off-policy recipe (16 generation + 16 training nodes, as the recipe splits them), rendered
offline the way `make plan` renders a stack (tools/plan_run.py run_plan, tools/render.py render_files, with the
overrides `make plan -c` takes), and every rendered Kubernetes object validated strictly for the cluster's version.
The size-dependent checks each have their own test (tests/test_scale.py, tests/jobs/test_checkpoints.py); here the
whole plan holds together at that size."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tools import first_step, plan_run, render
from tools.render import is_built_in

NODES = 32
RECIPE = "examples/configs/recipes/llm/performance/grpo-qwen3-235b-32n8g-async-1off.yaml"
INFRA = [f"gpuNodes={NODES}", "clusterName=nemo-rl-32n"]
JOB = [
    f"recipe={RECIPE}",
    "runName=qwen3-235b-32n",
    f"numNodes={NODES}",
    "generationNodes=16",  # the recipe's policy.generation.colocated.resources.num_nodes
    "asyncGrpo=true",
    "vllmTensorParallelSize=8",  # the recipe's vllm_cfg.tensor_parallel_size
    "numPromptsPerStep=16",  # the recipe's (from its 16n8g base)
    "numGenerationsPerPrompt=32",
    # A Megatron recipe: its checkpoints are not converted (the conversion reads DTensor checkpoints only), so no
    # final evaluation of a converted model either.
    "convertToHf=false",
    "evalFinal=false",
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[plan_run.Plan, Path]:
    # An empty sources folder: the recipe and overrides are checked against the index (tools/nemo_rl_index.json).
    empty = tmp_path_factory.mktemp("no-sources")
    result = plan_run.run_plan("h200", infra_overrides=INFRA, job_overrides=JOB, nemo_rl_sources=empty)
    out = tmp_path_factory.mktemp("plan32") / "h200-32n"
    render.write_files(out, render.render_files(result))
    return result, out


def manifests(out: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((out / "manifests").glob("*.yaml"))]


def test_every_rendered_object_validates_at_32_nodes(rendered: tuple[plan_run.Plan, Path]):
    result, out = rendered
    minor = result.infra.outputs["kubernetesMinorVersion"]
    kinds = []
    for obj in manifests(out):
        if is_built_in(obj):
            kubernetes_validate.validate(obj, minor, strict=True)
            kinds.append(obj["kind"])
    assert {"Job", "DaemonSet", "ConfigMap", "NetworkPolicy", "PersistentVolume"} <= set(kinds)
    pods = sorted((out / render.RAY_PODS_DIR).glob("*.yaml"))
    for path in pods:  # the Ray pods the real chart renders, where it is at hand
        kubernetes_validate.validate(yaml.safe_load(path.read_text()), minor, strict=True)


def test_the_cluster_is_sized_for_32_gpu_nodes(rendered: tuple[plan_run.Plan, Path]):
    result, _ = rendered
    pool = result.infra.one("gcp:container/nodePool:NodePool", "gpu").inputs
    assert pool["autoscaling"]["totalMaxNodeCount"] == NODES
    assert pool["initialNodeCount"] == NODES  # a reservation without the Ray autoscaler starts with its nodes
    assert "placementPolicy" not in pool  # the reservation places them (its blocks and sub-blocks)
    values = result.infra.one("kubernetes:helm.sh/v3:Release", "ray").inputs["values"]
    group = values["additionalWorkerGroups"]["gpu-workers"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == NODES
    topology = [
        t["podAffinityTerm"]["topologyKey"]
        for t in group["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    ]
    assert topology == ["cloud.google.com/gce-topology-subblock", "cloud.google.com/gce-topology-block"]
    outputs = result.infra.outputs
    assert outputs["gpuNodes"] == outputs["rayWorkerReplicas"] == NODES


def test_the_run_is_sized_from_its_recipe(rendered: tuple[plan_run.Plan, Path]):
    result, _ = rendered
    steps = {s["step"]: shlex.split(s["entrypoint"]) for s in result.jobs.outputs["pipeline"]}
    train = steps["train"]
    assert f"--config={RECIPE}" in train
    assert f"cluster.num_nodes={NODES}" in train
    assert "policy.generation.colocated.resources.num_nodes=16" in train
    # The pre-flights check the run's 32 nodes.
    assert f"--nodes={NODES}" in steps["preflight-nccl"] and f"--nodes={NODES}" in steps["preflight-lustre"]
    run = result.jobs.outputs["estimatedRun"]
    assert run["nodes"] == NODES and run["asyncGrpo"] is True
    # NVIDIA's published figure for this recipe at its own shape (256 GPUs, 512 samples a step: v0.5.0's performance
    # summary, DGX-H100, carried to H200 as the step-time table says), unscaled.
    assert run["secondsPerStep"] == pytest.approx(203.0)
    assert run["gpuHours"] and run["gpuHours"] > NODES * 8 * run["steps"] * 203.0 / 3600 - 0.01


def test_the_first_step_model_knows_the_models_size(rendered: tuple[plan_run.Plan, Path]):
    result, _ = rendered
    inputs = first_step.inputs_from_plan(result)
    assert inputs.model == "Qwen/Qwen3-235B-A22B"
    assert inputs.model_gb == pytest.approx(470)  # 235B x 2 bytes, not the 8B fallback
    assert inputs.train_nodes == NODES
