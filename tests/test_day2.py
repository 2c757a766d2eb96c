"""Day 2: a second `pulumi up` with a changed config. The program runs once under mocks, its outputs are fed back as
the stack's own outputs (the StackReference to itself), and one key changes: a replacing change is refused before
anything is registered, then goes through once the key is listed in allowReplace; in-place changes pass."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import HF_TOKEN, ROOT, WANDB_KEY

from infra import day2, zones
from infra.day2 import ReplacementRefused
from infra.settings import ConfigError
from tools import offline
from tools.offline import ProgramRun, load_stack_config, run_program

LUSTRE = "gcp:lustre/instance:Instance"
RELEASE = "kubernetes:helm.sh/v3:Release"
DEV_LUSTRE = {"capacityGib": 9000, "perUnitStorageThroughput": 1000, "filesystem": "lustrefs"}


def run_dev(
    overrides: dict[str, Any] | None = None,
    previous: dict[str, Any] | None = None,
    secrets: dict[str, str] | None = None,
) -> ProgramRun:
    project, config = load_stack_config(ROOT, "dev")
    for key, value in (overrides or {}).items():
        config[key if ":" in key else f"{project}:{key}"] = value
    given = {"hfToken": HF_TOKEN} if secrets is None else secrets
    return run_program(
        ROOT, config, secrets={f"{project}:{k}": v for k, v in given.items()}, stack="dev", previous_outputs=previous
    )


@pytest.fixture(scope="module")
def deployed() -> dict[str, Any]:
    """The outputs of a first `pulumi up` of the dev stack."""
    run = run_dev()
    assert day2.DEPLOYED_SETTINGS_OUTPUT in run.outputs
    assert day2.DEPLOYED_SETTINGS_OUTPUT not in run.secret_outputs
    return run.outputs


def registered_types(run_it) -> list[str]:
    """What a run registers (reads such as the StackReference are not registrations)."""
    calls: list[str] = []
    original = offline.RecordingMonitor.RegisterResource

    def spy(self, request):
        if request.type != "pulumi:pulumi:Stack":
            calls.append(request.type)
        return original(self, request)

    offline.RecordingMonitor.RegisterResource = spy  # type: ignore[method-assign]
    try:
        run_it()
    finally:
        offline.RecordingMonitor.RegisterResource = original  # type: ignore[method-assign]
    return calls


# key -> (config overrides that change it, every guarded key those overrides change)
REPLACING_CHANGES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "gcp:project": ({"gcp:project": "another-project"}, ["gcp:project"]),
    "gcp:region": ({"gcp:region": "us-central1", "zone": "us-central1-b"}, ["gcp:region", "zone"]),
    "clusterName": ({"clusterName": "nemo-rl-other"}, ["clusterName"]),
    "zone": ({"zone": "europe-west1-c"}, ["zone"]),
    "lustre.filesystem": ({"lustre": {**DEV_LUSTRE, "filesystem": "scratch"}}, ["lustre.filesystem"]),
    "lustre.perUnitStorageThroughput": (
        {"lustre": {**DEV_LUSTRE, "perUnitStorageThroughput": 500, "capacityGib": 18000}},
        ["lustre.perUnitStorageThroughput"],
    ),
    "networkRanges.clusterSubnet": (
        {"networkRanges": {"clusterSubnet": "10.1.0.0/20"}},
        ["networkRanges.clusterSubnet"],
    ),
    "networkRanges.gvnicSubnet": ({"networkRanges": {"gvnicSubnet": "192.168.9.0/24"}}, ["networkRanges.gvnicSubnet"]),
    "networkRanges.rdmaSubnets": (
        {"networkRanges": {"rdmaSubnets": ["192.168.10.0/24", *(f"192.168.{n}.0/24" for n in range(2, 9))]}},
        ["networkRanges.rdmaSubnets"],
    ),
    "networkRanges.lustrePeering": (
        {"networkRanges": {"lustrePeering": "10.48.0.0/20"}},
        ["networkRanges.lustrePeering"],
    ),
    "gpuType": ({"gpuType": "nvidia-b200"}, ["gpuType"]),
    "gpuProvisioning": ({"gpuProvisioning": "spot"}, ["gpuProvisioning"]),
    # Reservation mode turns the autoscaler off by default: that changes the head pod too, reported under
    # gpuProvisioning (the key the user changed), so allowing it allows both.
    "reservation": (
        {"gpuProvisioning": "reservation", "reservation": "blk-1"},
        ["gpuProvisioning", "reservation"],
    ),
    "maxRunHours": ({"maxRunHours": 48}, ["maxRunHours"]),
    "imageCacheDisk": ({"imageCacheDisk": "nemo-rl-v050-cache"}, ["imageCacheDisk"]),
    "cpuMachineType": ({"cpuMachineType": "n2-highmem-96"}, ["cpuMachineType"]),
    "namespace": ({"namespace": "training"}, ["namespace"]),
    "kubernetesServiceAccount": ({"kubernetesServiceAccount": "ray-ksa"}, ["kubernetesServiceAccount"]),
    # rayVersion unset follows the image's release: one line, one allowance.
    "nemoRlImage": ({"nemoRlImage": "nvcr.io/nvidia/nemo-rl:v0.7.0"}, ["nemoRlImage"]),
    # Set by the user (an image of no known release), it is a change of its own.
    "rayVersion": (
        {"nemoRlImage": "nvcr.io/nvidia/nemo-rl:custom-build", "rayVersion": "2.50.0"},
        ["nemoRlImage", "rayVersion"],
    ),
    "rayHead": ({"rayHead": {"cpu": "32", "memory": "400G"}}, ["rayHead"]),
    "rayWorker": ({"rayWorker": {"cpu": "200", "memory": "2400Gi"}}, ["rayWorker"]),
    "shmSize": ({"shmSize": "200Gi"}, ["shmSize"]),
    "rayAutoscaling": ({"rayAutoscaling": "false"}, ["rayAutoscaling"]),
}


def test_every_replacing_key_of_the_table_is_exercised():
    exercised = {key for _, keys in REPLACING_CHANGES.values() for key in keys} | {"wandbApiKey", day2.RAY_CLUSTER}
    exercised |= {"gpuNodes", "rayWorkerReplicas"}  # tests/test_day2_changes.py: a decrease
    assert set(day2.REPLACEABLE_KEYS) == exercised


UNLOCKED = {"protectData": False, "protectCompute": False}


@pytest.fixture(scope="module")
def deployed_unprotected() -> dict[str, Any]:
    """The outputs of an `up` with protectData and protectCompute off: Lustre, and the networks under the cluster and
    the GPU pool, can be replaced from there (tests/test_day2_changes.py)."""
    return run_dev(UNLOCKED).outputs


@pytest.mark.parametrize("key", sorted(REPLACING_CHANGES))
def test_a_replacing_change_is_refused_before_anything_then_allowed_once_listed(
    deployed, deployed_unprotected, key, monkeypatch, tmp_path
):
    overrides, changed = REPLACING_CHANGES[key]
    # Lustre and the networks under the cluster are replaced only once their protection was lifted.
    if set(changed) & {*day2.REPLACES_LUSTRE, *day2.REPLACES_NETWORKS}:
        deployed, overrides = deployed_unprotected, {**overrides, **UNLOCKED}
    if key == "zone":  # europe-west1-b is A3 Ultra's only zone there in the shipped table: a refreshed one adds -c
        table = json.loads(zones.TABLE_FILE.read_text())
        table["gpu_machine_zones"]["zones"]["a3-ultragpu-8g"].append("europe-west1-c")
        monkeypatch.setattr(zones, "TABLE_FILE", tmp_path / "zone_table.json")
        zones.TABLE_FILE.write_text(json.dumps(table))
    caught: list[ReplacementRefused] = []

    def refused() -> None:
        with pytest.raises(ReplacementRefused) as error:
            run_dev(overrides, previous=deployed)
        caught.append(error.value)

    assert registered_types(refused) == []  # refused before a single resource is registered
    lines = caught[0].lines
    key_lines = [line for line in lines if not line.startswith("to go ahead with all")]
    assert sorted(
        line.split(":")[0] if not line.startswith("gcp:") else ":".join(line.split(":")[:2]) for line in key_lines
    ) == sorted(changed)
    index, line = next((n, line) for n, line in enumerate(key_lines) if line.startswith(f"{key}: "))
    old = deployed[day2.DEPLOYED_SETTINGS_OUTPUT][key]
    shown = "{" + ", ".join(f"{k}: {old[k]!r}" for k in sorted(old)) + "}" if isinstance(old, dict) else repr(old)
    assert line.startswith(f"{key}: {shown} -> ")  # key, old value, new value, what it replaces, how to go ahead
    # Each line appends at the next free index, so following every line's command allows them all.
    assert f"pulumi config set --path 'allowReplace[{index}]' {key}" in line
    assert "put the old value back" in line
    assert day2.EFFECTS_BY_KEY[key].what in line

    run = run_dev({**overrides, "allowReplace": changed}, previous=deployed)
    assert run.outputs[day2.DEPLOYED_SETTINGS_OUTPUT][key] != old
    # Allowing one key of two is not enough.
    if len(changed) > 1:
        with pytest.raises(ReplacementRefused):
            run_dev({**overrides, "allowReplace": changed[:1]}, previous=deployed)


IN_PLACE_CHANGES: dict[str, dict[str, Any]] = {
    "unchanged": {},
    "gpuNodes": {"gpuNodes": 3},
    "rayWorkerReplicas": {"gpuNodes": 3, "rayWorkerReplicas": 2},
    "rayWorkerReplicas set to what it was": {"rayWorkerReplicas": 1},
    "rayIdleTimeoutSeconds": {"rayIdleTimeoutSeconds": 900},
    "cpuPoolNodes": {"cpuPoolMinNodes": 2, "cpuPoolMaxNodes": 4},
    "gkeVersion": {"gkeVersion": "1.35.8-gke.1036000"},
    "releaseChannel": {"releaseChannel": "RAPID"},
    "maintenance": {"maintenanceWindowStart": "02:00", "maintenanceExclusion": "none"},
    "protection": {"protectData": False, "deletionProtection": True},
    "exportBucket": {"exportBucket": "create"},
    "lustre.capacityGib increase": {"lustre": {**DEV_LUSTRE, "capacityGib": 18000}},
    "networkRanges.clusterSubnet grows": {"networkRanges": {"clusterSubnet": "10.0.0.0/19"}},
    "authorizedNetworks": {"authorizedNetworks": ["203.0.113.0/24"]},
    "databaseEncryptionKey": {
        "databaseEncryptionKey": "projects/my-gcp-project/locations/europe-west1/keyRings/r/cryptoKeys/k"
    },
    "gpuNodeHourlyPrice": {"gpuNodeHourlyPrice": "70"},
    "tensorboard": {"tensorboard": False},
}


@pytest.mark.parametrize("name", sorted(IN_PLACE_CHANGES))
def test_unchanged_and_in_place_changes_pass_silently(deployed, name):
    run = run_dev(IN_PLACE_CHANGES[name], previous=deployed)
    assert run.one(LUSTRE)
    # ...and do not touch the Ray pod template (no RayCluster replacement).
    assert (
        run.outputs[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
        == deployed[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
    )


def test_a_new_hf_token_value_passes_but_adding_a_wandb_key_changes_the_pods(deployed):
    run_dev(previous=deployed, secrets={"hfToken": "hf_another_token_value"})
    with pytest.raises(ReplacementRefused, match=r"wandbApiKey: 'not set' -> 'set'"):
        run_dev(previous=deployed, secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    run_dev(
        {"allowReplace": ["wandbApiKey"]}, previous=deployed, secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY}
    )


def test_a_lustre_capacity_decrease_is_refused_even_when_listed():
    bigger = run_dev({"lustre": {**DEV_LUSTRE, "capacityGib": 18000}}).outputs
    with pytest.raises(ReplacementRefused, match=r"lustre.capacityGib: 18000 -> 9000 is refused: .*only grows"):
        run_dev(previous=bigger)
    with pytest.raises(ConfigError, match=r"allowReplace\[0\].*refused even when listed"):
        run_dev({"allowReplace": ["lustre.capacityGib"]}, previous=bigger)
    # The pure guard refuses it whatever is listed.
    previous, current = {"lustre.capacityGib": 18000}, {"lustre.capacityGib": 9000}
    assert day2.refusals(previous, current, allowed=["lustre.capacityGib"])


def test_a_pod_range_change_is_refused_outright(deployed):
    with pytest.raises(ReplacementRefused, match=r"networkRanges.pods: .* is refused"):
        run_dev({"networkRanges": {"pods": "10.24.0.0/14"}}, previous=deployed)
    with pytest.raises(ConfigError, match=r"allowReplace"):
        run_dev({"allowReplace": ["networkRanges.pods"]}, previous=deployed)


def test_a_pod_template_change_from_the_program_itself_is_asked_about(deployed):
    """A new version of this program that changes the Ray pods (no config change) still replaces the RayCluster."""
    recorded = dict(deployed[day2.DEPLOYED_SETTINGS_OUTPUT], rayCluster="0" * 16)
    previous = {**deployed, day2.DEPLOYED_SETTINGS_OUTPUT: recorded}
    with pytest.raises(ReplacementRefused, match=r"rayCluster: the Ray pod template changed without a config change"):
        run_dev(previous=previous)
    run_dev({"allowReplace": ["rayCluster"]}, previous=previous)


def test_allow_replace_names_only_replacing_keys():
    with pytest.raises(
        ConfigError, match=r"allowReplace\[1\].*'zoen'.*one of gcp:project, gcp:region, clusterName, zone"
    ):
        run_dev({"allowReplace": ["zone", "zoen"]})
    with pytest.raises(ConfigError, match=r"allowReplace.*a list of key names"):
        run_dev({"allowReplace": "zone"})
    with pytest.raises(ConfigError, match=r"gkeVersion"):
        run_dev({"allowReplace": ["gkeVersion"]})  # in place: nothing to allow


def test_first_deployment_and_older_records_compare_nothing():
    assert day2.refusals(None, {"zone": "b"}, ()) == []
    assert day2.refusals({}, {"zone": "b"}, ()) == []
    # A record from an older version of the program lacks some keys: those are not compared.
    assert day2.refusals({"zone": "a"}, {"zone": "a", "gpuType": "x"}, ()) == []
    assert day2.refusals({"zone": "a"}, {"zone": "b"}, ())


def test_subnet_ranges_grow_in_place_and_anything_else_replaces():
    key = "networkRanges.rdmaSubnets"
    old = [f"192.168.{n}.0/24" for n in range(1, 9)]
    grown = ["192.168.0.0/23", *old[1:]]
    assert day2.refusals({key: old}, {key: grown}, ()) == []
    moved = ["192.168.20.0/24", *old[1:]]
    assert day2.refusals({key: old}, {key: moved}, ())
    assert day2.refusals({key: old}, {key: moved}, (key,)) == []
    # The peering address is replaced even by a larger range (address and prefix_length are ForceNew).
    peering = "networkRanges.lustrePeering"
    assert day2.refusals({peering: "10.32.0.0/20"}, {peering: "10.32.0.0/19"}, ())


def test_allow_replace_entries_that_change_nothing_are_reported():
    assert day2.check({"zone": "a"}, {"zone": "a"}, ("zone",)) == ["zone"]
    assert day2.check({"zone": "a"}, {"zone": "b"}, ("zone",)) == []


def test_the_guard_table_is_pure_data():
    for effect in day2.EFFECTS:
        assert effect.effect in (
            day2.IN_PLACE,
            day2.ROLLS_NODES,
            day2.REPLACES,
            day2.REFUSED,
            day2.DELETES_WORKERS,
        ), effect.key
        assert effect.what and effect.source, effect.key
    # Every guarded key is recorded, so the next `pulumi up` can compare it.
    recorded = set(run_dev().outputs[day2.DEPLOYED_SETTINGS_OUTPUT])
    # So is every other key (for `make plan PREVIOUS=...`), but the secret one and allowReplace itself, and which
    # keys were derived.
    unrecorded = {"hfToken", day2.ALLOW_REPLACE_KEY}
    assert {e.key for e in day2.EFFECTS} - unrecorded | {day2.DERIVED_KEYS} == recorded


def test_the_operations_guide_has_a_row_for_every_key_of_the_table():
    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide[guide.index("## Changing a deployed stack") :]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", section, re.MULTILINE)}
    assert set(rows) == set(day2.EFFECTS_BY_KEY)
    for key, row in rows.items():
        effect = day2.EFFECTS_BY_KEY[key]
        gate = row.split("|")[4].strip()
        expected = {day2.REFUSED: "refused, even when listed", day2.IN_PLACE: "passes"}.get(effect.effect, "refused")
        assert gate == expected, key
        assert effect.effect in row.split("|")[2], key


def test_every_key_the_program_reads_has_a_row_in_the_table():
    from config_rules import keys_of, object_keys

    from infra.settings import MODEL, SECRETS

    object_rows = {key.split(".")[0] for key in day2.EFFECTS_BY_KEY}
    for key in (*(key for key in keys_of(MODEL) if key not in object_keys(MODEL)), *SECRETS):
        assert key in day2.EFFECTS_BY_KEY, key
    for key in object_keys(MODEL):
        assert key in object_rows, key


def test_lustre_deletion_policy_follows_protect_data():
    protected = run_dev().one(LUSTRE)
    assert protected.inputs["deletionPolicy"] == "PREVENT"
    assert protected.protect
    unprotected = run_dev({"protectData": False}).one(LUSTRE)
    assert "deletionPolicy" not in unprotected.inputs
    assert not unprotected.protect


def test_lustre_firewall_follows_the_reserved_address():
    run = run_dev()
    address = run.one("gcp:compute/globalAddress:GlobalAddress")
    firewall = run.one("gcp:compute/firewall:Firewall", "lustre-ingress")
    assert firewall.inputs["sourceRanges"] == [f"{address.inputs['address']}/{int(address.inputs['prefixLength'])}"]
    assert address.urn in firewall.property_dependencies["sourceRanges"]


def test_kubernetes_provider_carries_the_cluster_identifier():
    run = run_dev()
    cluster = run.one("gcp:container/cluster:Cluster")
    provider = run.one("pulumi:providers:kubernetes")
    expected = "projects/my-gcp-project/locations/europe-west1/clusters/nemo-rl-dev"
    assert provider.inputs["clusterIdentifier"] == expected == run.outputs["clusterId"]
    assert cluster.urn in provider.property_dependencies["clusterIdentifier"]


def test_a_ray_pod_template_change_replaces_the_ray_cluster(deployed):
    release = run_dev().one(RELEASE)
    assert release.delete_before_replace  # same RayCluster name: the old release goes first
    trigger = release.replacement_trigger
    assert trigger == deployed[day2.DEPLOYED_SETTINGS_OUTPUT][day2.RAY_CLUSTER]
    # What KubeRay applies to running pods leaves it alone; a new image does not.
    scaled = run_dev({"gpuNodes": 3, "rayWorkerReplicas": 3, "rayIdleTimeoutSeconds": 900}).one(RELEASE)
    assert scaled.replacement_trigger == trigger
    assert scaled.inputs["values"] != release.inputs["values"]
    image = {"nemoRlImage": "nvcr.io/nvidia/nemo-rl:v0.7.0", "allowReplace": ["nemoRlImage", "rayVersion"]}
    assert run_dev(image).one(RELEASE).replacement_trigger != trigger
