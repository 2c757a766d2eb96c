"""Day 2, each change as the providers apply it: a second `pulumi up` under mocks with the first one's outputs fed
back. One test per change whose effect the guard or the program gets wrong without care: private nodes and their
Cloud NAT, Lustre replaced delete-first, a token changed without a moment without its Secret, a protected bucket, a
derived key, the commands the guard suggests, the release switch the docs describe, a failed `up`."""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any

import pulumi
import pytest
import yaml
from conftest import HF_TOKEN, ROOT, WANDB_KEY
from launcher.infra_outputs import build_infra_outputs
from pulumi.runtime import settings as runtime_settings
from pulumi.runtime.settings import _get_rpc_manager
from test_day2 import DEV_LUSTRE, LUSTRE, RELEASE, UNLOCKED, registered_types, run_dev

from infra import day2
from infra.day2 import ReplacementRefused
from infra.settings import ConfigError
from tools import offline
from workloads import raycluster

SECRET = "kubernetes:core/v1:Secret"
NAT = "gcp:compute/routerNat:RouterNat"


@pytest.fixture(scope="module")
def deployed() -> dict[str, Any]:
    return run_dev().outputs


def forget_failed_run() -> None:
    """A failed run leaves the RPCs and outputs it did not wait for: drop them, or the next run in this process waits
    on them forever."""
    _get_rpc_manager().clear()
    with runtime_settings.SETTINGS.lock:
        runtime_settings.SETTINGS.outputs.clear()


def refused_lines(overrides: dict[str, Any], previous: dict[str, Any], **kwargs: Any) -> list[str]:
    with pytest.raises(ReplacementRefused) as error:
        run_dev(overrides, previous=previous, **kwargs)
    return error.value.lines


def test_private_nodes_cannot_be_switched_on_a_deployed_cluster(deployed):
    """pulumi-gcp would only change the default for future node pools while the program dropped Cloud NAT: the
    private nodes would lose the internet. Refused before anything is registered, even when listed."""
    assert run_dev().one(NAT)  # private nodes (the default) have their NAT
    caught: list[list[str]] = []
    assert registered_types(lambda: caught.append(refused_lines({"privateNodes": "false"}, deployed))) == []
    (line,) = caught[0]
    assert line.startswith("privateNodes: True -> False is refused: no node would change")
    assert "Cloud NAT" in line and "pulumi destroy" in line
    assert line.endswith("put the old value back: pulumi config set privateNodes true")
    with pytest.raises(ConfigError, match=r"allowReplace\[0\].*privateNodes is refused even when listed"):
        run_dev({"privateNodes": "false", "allowReplace": ["privateNodes"]}, previous=deployed)
    # The other way round as well: a NAT for nodes that keep their external IPs.
    public = run_dev({"privateNodes": "false"}).outputs
    assert not run_dev({"privateNodes": "false"}).of_type(NAT)
    assert "is refused" in refused_lines({}, public)[0]


def test_a_protected_lustre_is_not_replaced_even_when_listed(deployed):
    """Its state holds protect and deletion_policy PREVENT: the delete would fail halfway. protectData false must be
    applied first, with the old value, as the line says."""
    change = {"lustre": {**DEV_LUSTRE, "filesystem": "scratch"}, "protectData": False}
    for allowed in ([], ["lustre.filesystem"]):
        (line,) = refused_lines({**change, "allowReplace": allowed}, deployed)
        assert line.startswith("lustre.filesystem: 'lustrefs' -> 'scratch' is refused: it replaces Lustre, which the")
        assert "first pulumi config set protectData false && pulumi up with the old value" in line
        assert line.endswith("put the old value back: pulumi config set --path 'lustre.filesystem' lustrefs")


def test_an_allowed_lustre_replacement_deletes_first_and_takes_the_volume_and_the_ray_cluster():
    deployed = run_dev({"protectData": False}).outputs  # the `up` that lifted the protection
    change = {"lustre": {**DEV_LUSTRE, "filesystem": "scratch"}, "protectData": False}
    (line,) = refused_lines(change, deployed)
    assert "deleted before the new one is created" in line and "PersistentVolume and claim" in line
    run = run_dev({**change, "allowReplace": ["lustre.filesystem"]}, previous=deployed)
    instance = run.one(LUSTRE)
    assert instance.delete_before_replace  # same instance_id: the old one must go first
    assert not instance.protect
    # The Ray pods mount the claim, whose deletion waits for them: the RayCluster is replaced too (old one first).
    release = run.one(RELEASE)
    assert release.delete_before_replace
    assert release.replacement_trigger != deployed[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
    assert release.replacement_trigger == run.outputs[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]


def test_a_new_token_updates_the_secret_in_place(deployed):
    """pulumi-kubernetes replaces a Secret whose data changes (delete, then create) unless the provider allows
    Secrets to change: then there is no moment without the tokens."""
    run = run_dev(previous=deployed, secrets={"hfToken": "hf_another_token_value"})
    provider = run.one("pulumi:providers:kubernetes")
    assert provider.inputs["enableSecretMutable"] in (True, "true")
    tokens = next(r for r in run.of_type(SECRET) if r.inputs["metadata"]["name"].endswith("-tokens"))
    assert tokens.urn.endswith("::tokens")
    assert not tokens.delete_before_replace and not tokens.replace_on_changes
    # Same Ray pods: nothing to replace there.
    assert (
        run.outputs[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
        == deployed[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
    )


def test_dropping_a_protected_bucket_is_explained_before_the_engine_fails():
    created = run_dev({"exportBucket": "create"}).outputs  # protectData is on in the dev stack
    for later in ({"exportBucket": ""}, {"exportBucket": "", "protectData": False}):
        (line,) = refused_lines(later, created)
        assert line.startswith("exportBucket: 'create' -> '' is refused: the bucket the stack created")
        assert "pulumi config set protectData false" in line and "pulumi state delete" in line
        assert line.endswith("put the old value back: pulumi config set exportBucket create")
    # Once an `up` lifted the protection (protectData false, bucket still wanted), the bucket may go.
    lifted = run_dev({"exportBucket": "create", "protectData": False}).outputs
    run_dev({"exportBucket": "", "protectData": False}, previous=lifted)


def test_a_derived_key_is_reported_under_the_key_the_user_changed(deployed):
    change = {"gpuProvisioning": "reservation", "reservation": "blk-1"}
    lines = refused_lines(change, deployed)
    assert [line.split(":")[0] for line in lines] == ["gpuProvisioning", "reservation", "to go ahead with all 2"]
    assert not any(line.startswith("rayAutoscaling") for line in lines)
    assert "as rayAutoscaling is not set, it follows gpuProvisioning (True -> False)" in lines[0]
    assert "pulumi config set gpuProvisioning flexStart" in lines[0]
    assert "rayAutoscaling" not in lines[1]
    run_dev({**change, "allowReplace": ["gpuProvisioning", "reservation"]}, previous=deployed)
    # Set by the user, rayAutoscaling is a change of its own.
    lines = refused_lines({**change, "rayAutoscaling": "false"}, deployed)
    assert [line.split(":")[0] for line in lines][:3] == ["gpuProvisioning", "reservation", "rayAutoscaling"]


def test_following_every_line_allows_every_change(deployed):
    """Each suggested command appends at the next free index (none overwrites another); the last line does it in
    one command; what is already listed is kept."""
    change = {"nemoRlImage": "nvcr.io/nvidia/nemo-rl:custom-build", "rayVersion": "2.50.0", "shmSize": "200Gi"}
    lines = refused_lines(change, deployed)
    assert [re.search(r"'allowReplace\[(\d)\]' (\S+),", line).groups() for line in lines[:3]] == [  # type: ignore[union-attr]
        ("0", "nemoRlImage"),
        ("1", "rayVersion"),
        ("2", "shmSize"),
    ]
    assert lines[3] == (
        "to go ahead with all 3: pulumi config set-all --path --plaintext 'allowReplace[0]=nemoRlImage' "
        "--plaintext 'allowReplace[1]=rayVersion' --plaintext 'allowReplace[2]=shmSize'"
    )
    # One key already listed: the others go after it.
    lines = refused_lines({**change, "allowReplace": ["shmSize"]}, deployed)
    assert "'allowReplace[1]' nemoRlImage" in lines[0] and "'allowReplace[2]' rayVersion" in lines[1]


def test_undo_commands_are_commands_that_work():
    assert day2.undo_command("wandbApiKey", "not set") == "pulumi config rm wandbApiKey"
    assert day2.undo_command("wandbApiKey", "set") == "pulumi config set --secret wandbApiKey"  # it prompts
    assert day2.undo_command("privateNodes", True) == "pulumi config set privateNodes true"
    assert day2.undo_command("reservation", "") == "pulumi config rm reservation"
    assert day2.undo_command("maxRunHours", 0) == "pulumi config rm maxRunHours"
    assert day2.undo_command("gcp:project", "my-gcp-project") == "pulumi config set gcp:project my-gcp-project"
    assert day2.undo_command("rayHead", {"cpu": "32", "memory": "400G"}) == (
        "pulumi config set --path 'rayHead.cpu' 32 && pulumi config set --path 'rayHead.memory' 400G"
    )
    assert day2.undo_command("networkRanges.rdmaSubnets", ["192.168.1.0/24", "192.168.2.0/24"]) == (
        "pulumi config rm --path 'networkRanges.rdmaSubnets' && "
        "pulumi config set --path 'networkRanges.rdmaSubnets[0]' 192.168.1.0/24 && "
        "pulumi config set --path 'networkRanges.rdmaSubnets[1]' 192.168.2.0/24"
    )
    assert day2.undo_command("lustre.filesystem", "lustrefs") == "pulumi config set --path 'lustre.filesystem' lustrefs"


def test_adding_or_removing_the_wandb_key_suggests_a_working_undo(deployed):
    with_key = {"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY}
    (line,) = refused_lines({}, deployed, secrets=with_key)
    assert line.endswith("put the old value back: pulumi config rm wandbApiKey")
    set_before = run_dev(secrets=with_key).outputs
    (line,) = refused_lines({}, set_before)
    assert "pulumi config set --secret wandbApiKey" in line
    assert WANDB_KEY not in line


def _switch_commands() -> list[list[str]]:
    guide = (ROOT / "docs" / "configuration.md").read_text()
    section = guide[guide.index("**Switching.**") :]
    block = section[section.index("```sh") + len("```sh") : section.index("```", section.index("```sh") + 5)]
    return [shlex.split(line.split("#")[0]) for line in block.strip().splitlines()]


def test_the_release_switch_in_the_docs_passes_the_guard_as_documented(deployed):
    """docs/configuration.md's commands, applied to the dev stack's config in order: the `pulumi up` they lead to
    passes the guard and replaces the RayCluster; without the allowReplace line it is refused."""
    config: dict[str, Any] = {}
    ups = 0
    for words in _switch_commands():
        if words[:2] == ["cd", "jobs"]:
            break
        if words[:3] == ["pulumi", "config", "set"]:
            rest = [w for w in words[3:] if w != "--path"]
            key, value = rest
            match = re.fullmatch(r"(\w+)\[(\d+)\]", key)
            if match:
                listed = config.setdefault(match.group(1), [])
                assert int(match.group(2)) == len(listed)  # appends, as the guard suggests
                listed.append(value)
            else:
                config[key] = value
        elif words[:3] == ["pulumi", "config", "rm"]:
            config.pop(words[3], None)
        elif words == ["pulumi", "up"]:
            ups += 1
            with pytest.raises(ReplacementRefused):
                run_dev({k: v for k, v in config.items() if k != "allowReplace"}, previous=deployed)
            run = run_dev(config, previous=deployed)
            assert run.one(RELEASE).replacement_trigger != deployed[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
            assert run.outputs["nemoRlImage"] == "nvcr.io/nvidia/nemo-rl:v0.7.0"
    assert ups == 1
    assert "allowReplace" not in config  # removed afterwards, as the docs say
    assert "kubectl" not in " ".join(" ".join(words) for words in _switch_commands())


def test_a_failed_up_keeps_the_last_record(deployed, monkeypatch):
    """The record resolves only once what it describes exists: when the GPU pool fails, the stack registers no new
    `deployedSettings` (the engine keeps the old outputs), so putting the old value back is no change."""
    original = offline.CloudMocks.new_resource

    def failing(self, args):
        if args.typ == "gcp:container/nodePool:NodePool" and args.name == "gpu":
            raise RuntimeError("quota exceeded")
        return original(self, args)

    registered_outputs: list[dict[str, Any]] = []
    original_outputs = offline.RecordingMonitor.RegisterResourceOutputs

    def spy(self, request):
        if request.urn.endswith("pulumi:pulumi:Stack::nemo-rl-gke-dev"):
            registered_outputs.append(offline.json_format.MessageToDict(request.outputs))
        return original_outputs(self, request)

    monkeypatch.setattr(offline.CloudMocks, "new_resource", failing)
    monkeypatch.setattr(offline.RecordingMonitor, "RegisterResourceOutputs", spy, raising=False)
    with pytest.raises(Exception, match="quota exceeded"):
        run_dev({"allowReplace": ["maxRunHours"], "maxRunHours": 48}, previous=deployed)
    # The GPU pool was asked for, and it is what failed; the stack's outputs never carried a new record.
    assert day2.DEPLOYED_SETTINGS_OUTPUT not in {k for outputs in registered_outputs for k in outputs}
    forget_failed_run()
    monkeypatch.setattr(offline.CloudMocks, "new_resource", original)
    # The same `up` that succeeds records the new value.
    run = run_dev({"allowReplace": ["maxRunHours"], "maxRunHours": 48}, previous=deployed)
    assert run.outputs[day2.DEPLOYED_SETTINGS_OUTPUT]["maxRunHours"] == 48


def test_the_operations_guide_shows_the_table_as_the_guard_has_it():
    guide = (ROOT / "docs" / "operations.md").read_text()
    assert day2.markdown_table() in guide


def test_both_projects_require_a_cli_that_honours_the_replacement_trigger():
    for project in ("Pulumi.yaml", "jobs/Pulumi.yaml"):
        declared = yaml.safe_load((ROOT / project).read_text())["requiredPulumiVersion"]
        floor = re.fullmatch(r">=(\d+)\.(\d+)\.(\d+)", declared)
        assert floor, project
        assert tuple(int(n) for n in floor.groups()) >= (3, 226, 0), project


def test_a_new_chart_version_replaces_the_ray_cluster(monkeypatch):
    """A chart bump renders new pods, which KubeRay 1.5.1 gives only to pods created later: it is in the digest."""
    before = run_dev().one(RELEASE).replacement_trigger
    monkeypatch.setattr(raycluster, "CHART_VERSION", "9.9.9")
    assert run_dev().one(RELEASE).replacement_trigger != before


def test_the_job_stack_follows_a_cluster_replaced_under_the_same_name():
    """Same name, same id; a new cluster has a new uid, which its DNS endpoint names: the job stack's
    cluster_identifier (clusterInstance) changes with it, so its provider and Job are replaced."""
    outputs = run_dev().outputs
    assert outputs["clusterInstance"] == f"{outputs['clusterId']}@{offline.mock_dns_endpoint('europe-west1')}"
    assert build_infra_outputs(outputs).cluster_id == outputs["clusterInstance"]
    older = {k: v for k, v in outputs.items() if k != "clusterInstance"}  # an infra stack from before
    assert build_infra_outputs(older).cluster_id == outputs["clusterId"]


def test_a_legacy_diy_backend_gets_told_how_to_upgrade(monkeypatch):
    original = offline.CloudMocks.new_resource

    def legacy(self, args):
        if args.typ == "pulumi:pulumi:StackReference":
            raise RuntimeError("unknown stack name: organization/nemo-rl-gke/dev")
        return original(self, args)

    said: list[str] = []
    monkeypatch.setattr(offline.CloudMocks, "new_resource", legacy)
    monkeypatch.setattr(pulumi.log, "error", lambda message, *args, **kwargs: said.append(message))
    try:
        with pytest.raises(Exception, match="unknown stack name"):
            run_dev()
    finally:
        forget_failed_run()
    (message,) = said
    assert "organization/nemo-rl-gke/dev: unknown stack name" in message
    assert "legacy layout" in message and "pulumi state upgrade" in message


def test_the_cluster_and_gpu_pool_are_protected_unless_their_replacement_is_allowed(deployed):
    """A second line the engine enforces: a replacement the guard's table misses stops at Pulumi's protect."""
    cluster, pool = "gcp:container/cluster:Cluster", "gcp:container/nodePool:NodePool"
    run = run_dev()
    assert run.one(cluster).protect and run.one(pool, "gpu").protect
    assert not run.one(pool, "gke-cpu").protect  # a new CPU node only moves the Ray head
    # Allowing a change that replaces the GPU pool lifts its lock (in the same `up`), not the cluster's.
    allowed = run_dev({"gpuType": "nvidia-b200", "allowReplace": ["gpuType"]}, previous=deployed)
    assert allowed.one(cluster).protect and not allowed.one(pool, "gpu").protect
    # A new name replaces Lustre and the networks too: both locks lifted by an `up` first.
    unprotected = run_dev(UNLOCKED).outputs
    renamed = run_dev(
        {"clusterName": "nemo-rl-other", "allowReplace": ["clusterName"], "protectData": False}, previous=unprotected
    )
    assert not renamed.one(cluster).protect and not renamed.one(pool, "gpu").protect
    off = run_dev({"protectCompute": False})
    assert not off.one(cluster).protect and not off.one(pool, "gpu").protect
    for key in day2.REPLACES_GPU_POOL:
        assert day2.EFFECTS_BY_KEY[key].effect == day2.REPLACES, key


GVNIC_MOVED = {"networkRanges": {"gvnicSubnet": "192.168.9.0/24"}}


def test_a_network_change_under_protected_compute_is_refused_until_an_up_lifts_the_lock(deployed):
    """The subnet is replaced delete-first and the GPU pool with it as a dependent; the engine checks the protect
    flag the state holds for that dependent (pulumi v3.259 step_generator.go, generateStepsFromDiff), so listing
    the key alone would fail halfway. The two steps the line names pass."""
    for allowed in ([], ["networkRanges.gvnicSubnet"]):
        (line,) = refused_lines({**GVNIC_MOVED, "allowReplace": allowed}, deployed)
        assert line.startswith("networkRanges.gvnicSubnet: '192.168.0.0/24' -> '192.168.9.0/24' is refused: it")
        assert "protectCompute" in line and "checks the flag in the state" in line
        assert "first pulumi config set protectCompute false && pulumi up with the old value" in line
    # Step one: lift the lock with the old value (nothing is replaced); step two: the change, listed.
    lifted = run_dev({"protectCompute": False}, previous=deployed)
    assert not lifted.one("gcp:container/nodePool:NodePool", "gpu").protect
    run_dev(
        {**GVNIC_MOVED, "protectCompute": False, "allowReplace": ["networkRanges.gvnicSubnet"]}, previous=lifted.outputs
    )
    # A range that grows is updated in place: nothing to lift.
    run_dev({"networkRanges": {"clusterSubnet": "10.0.0.0/19"}}, previous=deployed)
    # A change that replaces the pool by its own diff is lifted in the same `up` (protect in state and program).
    run_dev({"maxRunHours": 48, "allowReplace": ["maxRunHours"]}, previous=deployed)


def test_fewer_gpu_workers_without_the_autoscaler_is_asked_about():
    """KubeRay 1.5.1 (reconcilePods) deletes running workers at random down to the new count when the in-tree
    autoscaler is off; with it on, only the ones the autoscaler names."""
    three = run_dev({"gpuNodes": 3, "rayAutoscaling": "false"}).outputs
    # rayWorkerReplicas unset follows gpuNodes: one line, under gpuNodes.
    (line,) = refused_lines({"gpuNodes": 2, "rayAutoscaling": "false"}, three)
    assert line.startswith("gpuNodes: 3 -> 2 changes the GPU pool's autoscaling limit")
    assert "as rayWorkerReplicas is not set, it follows gpuNodes (3 -> 2)" in line
    assert "pulumi config set --path 'allowReplace[0]' gpuNodes" in line
    run_dev({"gpuNodes": 2, "rayAutoscaling": "false", "allowReplace": ["gpuNodes"]}, previous=three)
    (line,) = refused_lines({"gpuNodes": 3, "rayWorkerReplicas": 2, "rayAutoscaling": "false"}, three)
    assert line.startswith("rayWorkerReplicas: 3 -> 2 changes with rayAutoscaling off, KubeRay deletes running")
    # More is in place; so is fewer with the autoscaler on (the dev stack's flex-start default).
    run_dev({"gpuNodes": 4, "rayAutoscaling": "false"}, previous=three)
    autoscaled = run_dev({"gpuNodes": 3}).outputs
    run_dev({"gpuNodes": 2}, previous=autoscaled)


def test_a_new_name_for_a_created_bucket_is_refused_and_the_way_round_it_passes():
    """clusterName and gcp:project name a created bucket; pulumi-gcp replaces it delete-first and a bucket holding
    objects cannot be deleted. The line's first step (the bucket kept under its own name) passes the guard."""
    created = run_dev({"exportBucket": "create", **UNLOCKED}).outputs
    rename = {"exportBucket": "create", "clusterName": "nemo-rl-other", **UNLOCKED}
    for allowed in ([], ["clusterName"]):
        (line,) = refused_lines({**rename, "allowReplace": allowed}, created)
        assert "renames the export bucket the stack created (my-gcp-project-nemo-rl-dev-models)" in line
        assert "pulumi state delete --force --target-dependents" in line
        assert "pulumi config set exportBucket my-gcp-project-nemo-rl-dev-models" in line
        assert "protectCompute" not in line and "protectData:" not in line  # those locks were lifted
    kept = run_dev({"exportBucket": "my-gcp-project-nemo-rl-dev-models", **UNLOCKED}, previous=created)
    assert not kept.of_type("gcp:storage/bucket:Bucket")
    run_dev(
        {"exportBucket": "my-gcp-project-nemo-rl-dev-models", "clusterName": "nemo-rl-other", **UNLOCKED,
         "allowReplace": ["clusterName"]},
        previous=kept.outputs,
    )  # fmt: skip
    # Kept while protectData was on: still the bucket's own name, so the guard lets it through.
    protected = run_dev({"exportBucket": "create"}).outputs
    run_dev({"exportBucket": "my-gcp-project-nemo-rl-dev-models"}, previous=protected)


def delete_first_chain(run: offline.ProgramRun, root: offline.Registered) -> list[str]:
    """What the engine deletes, in order, when `root` is replaced delete-first, read from the registered graph as
    pulumi v3.259 step_generator.go does: calculateDependentReplacements walks the dependents through property
    dependencies (a depends_on edge alone changes no input, so it never drags a resource in; here every such
    dependent is taken as replaced, which is what a ForceNew input does), findResourcesReplacedWith adds those whose
    replace_with names the root, and the deletes run in reverse: the last found goes first, the root last."""
    found: list[str] = []
    replaced = {root.urn}
    for resource in run.resources:  # registration order is dependency order
        if resource.custom and any(set(urns) & replaced for urns in resource.property_dependencies.values()):
            found.append(resource.urn)
            replaced.add(resource.urn)
    found += [r.urn for r in run.resources if root.urn in (r.replace_with or [])]
    return [*reversed(found), root.urn]


def test_a_lustre_replacement_deletes_the_ray_release_before_the_claim_it_mounts():
    """The claim's deletion waits (pvc-protection) for every pod that mounts it: in the delete-first chain of the
    instance, the release (and with it the Ray pods) must come before the claim, the claim before the volume."""
    run = run_dev({"protectData": False})
    instance, release = run.one(LUSTRE), run.one(RELEASE)
    pv, pvc = run.one("kubernetes:core/v1:PersistentVolume"), run.one("kubernetes:core/v1:PersistentVolumeClaim")
    assert instance.delete_before_replace
    order = delete_first_chain(run, instance)
    assert order.index(release.urn) < order.index(pvc.urn) < order.index(pv.urn) < order.index(instance.urn)
    # The release reaches the claim through depends_on alone: without replace_with it would not be in the chain.
    assert not any(pvc.urn in urns for urns in release.property_dependencies.values())
    assert pvc.urn in release.dependencies
    assert set(release.replace_with or []) == {instance.urn, pv.urn, pvc.urn}
    without = offline.ProgramRun(
        [dataclasses.replace(r, replace_with=None) for r in run.resources], run.outputs, run.secret_outputs
    )
    assert release.urn not in delete_first_chain(without, instance)
