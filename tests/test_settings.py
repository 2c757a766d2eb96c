"""Validation of the infra settings: every bad input stops with a message naming key, value and what is allowed."""

from __future__ import annotations

import dataclasses
from typing import Any

import config_rules
import pytest
import yaml
from config_rules import validated
from conftest import ROOT

from infra import gke_rules
from infra.presets import GPU_PRESETS
from infra.settings import KEY_ALIASES, SECRETS, ConfigError, InfraSettings, PodResources, validate_lustre_capacity
from infra.sizing import allocatable_cpu, allocatable_memory_bytes, cpu_cores, memory_bytes

BASE: dict[str, Any] = {
    "gcp:project": "p",
    "gcp:region": "us-central1",
    "zone": "us-central1-b",
    "gpuType": "nvidia-b200",
    "reservation": "my-res",
}


def check_keys(project: str, keys: list[str]) -> None:
    """The infra program's refusal of keys it would ignore (its read_config runs the same)."""
    config_rules.check_keys(project, keys, [*config_rules.keys_of(InfraSettings), *SECRETS], KEY_ALIASES)


def settings_with(**changes: Any):
    values = {**BASE, **changes}
    return validated(InfraSettings, {k: v for k, v in values.items() if v is not None})


def expect_error(key: str, value_fragment: str, allowed_fragment: str, **changes: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        settings_with(**changes)
    error = caught.value
    assert error.key == key
    message = str(error)
    assert f"'{key}'" in message
    assert value_fragment in message
    assert allowed_fragment in message
    return error


def test_defaults_follow_the_issue_contract():
    settings = settings_with()
    assert settings.gpu_provisioning == "reservation"
    assert settings.gpu_nodes == 2
    assert settings.ray_worker_replicas == 2
    assert settings.cluster_name == "nemo-rl"
    assert settings.cpu_machine_type == "n2-highmem-80"
    assert (settings.cpu_pool_min_nodes, settings.cpu_pool_max_nodes) == (1, 5)
    assert (settings.lustre.capacity_gib, settings.lustre.throughput_mbps_per_tib, settings.lustre.filesystem) == (
        18000,
        500,
        "lustrefs",
    )
    assert settings.protect_data is True
    assert settings.deletion_protection is False
    assert settings.namespace == "nemo-rl"
    assert settings.kubernetes_service_account == "generic-ksa"
    assert settings.nemo_rl_image == "nvcr.io/nvidia/nemo-rl:v0.5.0"
    assert settings.ray_version == "2.49.2"
    assert settings.ranges.gvnic_subnet == "192.168.0.0/24"
    assert settings.ranges.rdma_subnets == tuple(f"192.168.{n}.0/24" for n in range(1, 9))


def test_presets_are_the_only_gpu_knowledge():
    h200, b200 = GPU_PRESETS["nvidia-h200-141gb"], GPU_PRESETS["nvidia-b200"]
    assert (h200.machine_type, h200.tuner_config) == ("a3-ultragpu-8g", "tuner_config_a3u.txtpb")
    assert (b200.machine_type, b200.tuner_config) == ("a4-highgpu-8g", "tuner_config_a4.txtpb")
    assert (h200.vcpus, h200.memory_gb, b200.vcpus, b200.memory_gb) == (224, 2952, 224, 3968)
    assert h200.gpus_per_node == b200.gpus_per_node == 8


def test_unknown_gpu_type():
    expect_error("gpuType", "nvidia-a100", "nvidia-b200", gpuType="nvidia-a100")


def test_unknown_provisioning():
    expect_error("gpuProvisioning", "preemptible", "flexStart", gpuProvisioning="preemptible")


def test_zone_outside_region():
    expect_error("zone", "europe-west1-b", "us-central1", zone="europe-west1-b")


def test_malformed_zone():
    expect_error("zone", "us-central1", "inside gcp:region", zone="us-central1")


def test_missing_reservation_when_reserving():
    expect_error("reservation", "is not set", "pulumi config set reservation", reservation=None)


def test_reservation_with_spot_is_contradictory():
    expect_error("reservation", "my-res", "unset", gpuProvisioning="spot")


def test_spot_and_flex_start_need_no_reservation():
    assert settings_with(gpuProvisioning="spot", reservation=None).reservation is None
    assert settings_with(gpuProvisioning="flexStart", reservation="").gpu_provisioning == "flexStart"


@pytest.mark.parametrize("nodes", [0, -1])
def test_gpu_nodes_below_one(nodes: int):
    expect_error("gpuNodes", str(nodes), "1 or more", gpuNodes=nodes)


def test_gpu_nodes_not_a_number():
    expect_error("gpuNodes", "two", "whole number", gpuNodes="two")


def test_more_ray_workers_than_gpu_nodes():
    expect_error("rayWorkerReplicas", "3", "gpuNodes (2)", rayWorkerReplicas=3)


def test_ray_workers_zero_means_one_per_node():
    assert settings_with(gpuNodes=4, rayWorkerReplicas=0).ray_worker_replicas == 4
    assert settings_with(gpuNodes=4, rayWorkerReplicas=3).ray_worker_replicas == 3


@pytest.mark.parametrize("name", ["Nemo", "1nemo", "nemo-", "nemo_rl", "a" * 25, "", "a"])
def test_invalid_cluster_name(name: str):
    expect_error("clusterName", repr(name), "2-24 characters", clusterName=name)


@pytest.mark.parametrize(
    ("tier", "capacity", "allowed"),
    [
        (500, 9000, "18000..20016000"),  # under the tier's minimum
        (500, 20000, "multiple of 18000"),  # off the step
        (1000, 1_540_000, "multiple of 72000"),  # above the step change, off the larger step
        (125, 36000, "72000..12240000"),
    ],
)
def test_lustre_capacity_not_a_valid_step(tier: int, capacity: int, allowed: str):
    expect_error(
        "lustre.capacityGib",
        str(capacity),
        allowed,
        lustre={"capacityGib": capacity, "perUnitStorageThroughput": tier},
    )


@pytest.mark.parametrize(
    ("tier", "capacity"),
    [(1000, 9000), (1000, 1_530_000), (1000, 1_584_000), (500, 18000), (500, 36000), (250, 36000), (125, 144000)],
)
def test_lustre_capacity_valid_steps(tier: int, capacity: int):
    validate_lustre_capacity("lustre.capacityGib", capacity, tier)


def test_lustre_unknown_tier():
    expect_error(
        "lustre.perUnitStorageThroughput", "300", "[125, 250, 500, 1000]", lustre={"perUnitStorageThroughput": 300}
    )


@pytest.mark.parametrize("filesystem", ["lustre_fs", "waytoolongname", ""])
def test_lustre_bad_filesystem(filesystem: str):
    expect_error("lustre.filesystem", repr(filesystem), "1 to 8 letters or digits", lustre={"filesystem": filesystem})


def test_unknown_fields_of_objects_name_the_closest_one():
    expect_error("lustre.capacity", "not a key", "did you mean 'capacityGib'", lustre={"capacity": 18000})
    expect_error("networkRanges.pod", "not a key", "did you mean 'pods'", networkRanges={"pod": "10.16.0.0/14"})
    expect_error("rayHead.memmory", "not a key", "did you mean 'memory'", rayHead={"cpu": "8", "memmory": "64G"})


def test_overlapping_ranges():
    error = expect_error(
        "networkRanges.rdmaSubnets[3]",
        "192.168.0.0/24",
        "does not overlap networkRanges.gvnicSubnet",
        networkRanges={"rdmaSubnets": [f"192.168.{n}.0/24" for n in (1, 2, 3, 0, 5, 6, 7, 8)]},
    )
    assert "192.168.0.0/24" in error.allowed


def test_pod_range_overlapping_node_subnet():
    expect_error(
        "networkRanges.pods", "10.0.0.0/14", "networkRanges.clusterSubnet", networkRanges={"pods": "10.0.0.0/14"}
    )


def test_rdma_subnets_must_be_eight():
    expect_error(
        "networkRanges.rdmaSubnets", "192.168.1.0/24", "exactly 8", networkRanges={"rdmaSubnets": ["192.168.1.0/24"]}
    )


@pytest.mark.parametrize("cidr", ["8.8.8.0/24", "127.0.0.0/24", "169.254.0.0/24", "100.64.0.0/24"])
def test_non_rfc1918_range_rejected(cidr: str):
    expect_error("networkRanges.gvnicSubnet", cidr, "192.168.0.0/16", networkRanges={"gvnicSubnet": cidr})


def test_lustre_peering_must_be_a_slash_20():
    expect_error("networkRanges.lustrePeering", "10.32.0.0/24", "/20", networkRanges={"lustrePeering": "10.32.0.0/24"})


def test_head_resources_must_fit_the_cpu_machine():
    expect_error("rayHead.cpu", "96", "at most", rayHead={"cpu": 96, "memory": "500G"})
    expect_error("rayHead.memory", "700G", "n2-highmem-80", rayHead={"cpu": 32, "memory": "700G"})


def test_worker_resources_must_fit_the_gpu_machine():
    expect_error("rayWorker.cpu", "224", "a4-highgpu-8g", rayWorker={"cpu": 224, "memory": "2400Gi"})
    # 3500Gi fits an A4 node (3968 GB) but not an A3 Ultra node (2952 GB).
    assert settings_with(rayWorker={"cpu": 206, "memory": "3500Gi"}).ray_worker.memory == "3500Gi"
    expect_error(
        "rayWorker.memory",
        "3500Gi",
        "a3-ultragpu-8g",
        gpuType="nvidia-h200-141gb",
        rayWorker={"cpu": 206, "memory": "3500Gi"},
    )


def test_bad_quantity():
    expect_error("rayWorker.memory", "lots", "memory quantity", rayWorker={"memory": "lots"})


def test_shm_must_fit_worker_memory():
    expect_error("shmSize", "3000Gi", "less than the worker memory", shmSize="3000Gi")


@pytest.mark.parametrize("namespace", ["Default", "ns_1", "-x"])
def test_bad_namespace(namespace: str):
    expect_error("namespace", namespace, "DNS label", namespace=namespace)


def test_bad_service_account_name():
    expect_error("kubernetesServiceAccount", "KSA", "DNS label", kubernetesServiceAccount="KSA")


def test_unpinned_image():
    expect_error(
        "nemoRlImage", "nvcr.io/nvidia/nemo-rl:latest", "pinned tag", nemoRlImage="nvcr.io/nvidia/nemo-rl:latest"
    )


def test_unknown_image_needs_ray_version():
    expect_error("rayVersion", "is not set", "v0.5.0", nemoRlImage="nvcr.io/nvidia/nemo-rl:v9.9.9")
    assert settings_with(nemoRlImage="nvcr.io/nvidia/nemo-rl:v9.9.9", rayVersion="2.60.0").ray_version == "2.60.0"


def test_gke_version_below_google_floors():
    expect_error("gkeVersion", "latest", "full version", gkeVersion="latest")
    # Managed Lustre's CSI driver needs 1.33.2-gke.1111000: no 1.31 or 1.32 cluster, whatever the GPU.
    for gpu in GPU_PRESETS:
        expect_error("gkeVersion", "1.31", "1.33.2-gke.1111000", gkeVersion="1.31", gpuType=gpu)
        expect_error("gkeVersion", "1.32.2-gke.1475000", "Lustre", gkeVersion="1.32.2-gke.1475000", gpuType=gpu)
    expect_error("gkeVersion", "1.33.2-gke.1000000", "Lustre", gkeVersion="1.33.2-gke.1000000")
    assert settings_with(gkeVersion="1.33").gke_minor == "1.33"
    assert settings_with(gkeVersion="1.33.2-gke.1111000").gke_version == "1.33.2-gke.1111000"


def test_gpu_floors_are_googles():
    # GKE docs (GPUDirect RDMA): A4 needs 1.32.2-gke.1475000, not the 1.32.2-gke.1422000 once listed here.
    assert GPU_PRESETS["nvidia-b200"].min_gke_version == "1.32.2-gke.1475000"
    floor = gke_rules.VersionFloor(GPU_PRESETS["nvidia-b200"].min_gke_version, "A4", "test")
    assert gke_rules.below_floor("1.32.2-gke.1422000", floor)
    assert not gke_rules.below_floor("1.32.2-gke.1475000", floor)
    assert gke_rules.below_floor("1.31", floor) and not gke_rules.below_floor("1.32", floor)


def test_flex_start_has_its_own_floor():
    flex = gke_rules.FLEX_START_FLOOR
    assert flex.version == "1.32.2-gke.1652000"
    assert flex in gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "flexStart")
    assert flex not in gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "reservation")
    assert gke_rules.below_floor("1.32.2-gke.1600000", flex)


def test_default_gke_version_is_one_google_still_supports():
    assert gke_rules.DEFAULT_GKE_VERSION == "1.35"
    assert settings_with().gke_version == "1.35"
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]["gkeVersion"]["default"]
    assert declared == gke_rules.DEFAULT_GKE_VERSION  # what the CLI applies is the same default


def test_maintenance_policy_defaults_to_no_node_upgrades():
    settings = settings_with()
    assert settings.maintenance_exclusion == "NO_MINOR_OR_NODE_UPGRADES"
    assert settings.maintenance_window_start == "09:00"
    assert settings_with(maintenanceExclusion="none").maintenance_exclusion is None
    assert settings_with(maintenanceExclusion="NO_MINOR_UPGRADES").maintenance_exclusion == "NO_MINOR_UPGRADES"
    # NO_UPGRADES cannot last until the end of support (at most 30 days): refused, as anything else.
    expect_error("maintenanceExclusion", "NO_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES", maintenanceExclusion="NO_UPGRADES")
    expect_error("maintenanceWindowStart", "9am", "HH:MM", maintenanceWindowStart="9am")
    expect_error("maintenanceWindowStart", "24:00", "HH:MM", maintenanceWindowStart="24:00")


def test_max_run_hours_only_with_flex_start():
    flex = {"gpuProvisioning": "flexStart", "reservation": None}
    assert settings_with(**flex).max_run_hours is None
    assert settings_with(**flex, maxRunHours=24).max_run_hours == 24
    expect_error("maxRunHours", "169", "1..168", **flex, maxRunHours=169)
    expect_error("maxRunHours", "24", "flexStart", maxRunHours=24)


def test_unknown_cpu_machine_type():
    expect_error("cpuMachineType", "e2-micro", "n2-highmem-80", cpuMachineType="e2-micro")


def test_cpu_pool_bounds():
    expect_error("cpuPoolMinNodes", "0", "1 or more", cpuPoolMinNodes=0)
    expect_error("cpuPoolMaxNodes", "1", "cpuPoolMinNodes (2)", cpuPoolMinNodes=2, cpuPoolMaxNodes=1)


def test_bad_boolean():
    expect_error("protectData", "maybe", "true or false", protectData="maybe")


def test_missing_required_keys_name_the_key():
    expect_error("gcp:project", "is not set", "GCP project", **{"gcp:project": None})
    expect_error("zone", "is not set", "us-central1-b", zone=None)
    expect_error("gpuType", "is not set", "nvidia-h200-141gb", gpuType=None)


def test_a_required_key_unset_or_empty_says_how_to_set_it():
    lines = {
        "gpuType": "config 'gpuType' is not set: required: one of ['nvidia-b200', 'nvidia-h200-141gb'] "
        "(pulumi config set gpuType ...)",
        "gcp:project": "config 'gcp:project' is not set: required: the GCP project id (pulumi config set gcp:project "
        "...)",
        "gcp:region": "config 'gcp:region' is not set: required: the region of the control plane and subnets, e.g. "
        "us-central1 (pulumi config set gcp:region ...)",
    }
    for key, line in lines.items():
        with pytest.raises(ConfigError) as caught:
            settings_with(**{key: None})
        assert str(caught.value) == line
        with pytest.raises(ConfigError) as caught:
            settings_with(**{key: ""})
        assert str(caught.value) == line.replace("is not set", "= '' is not allowed")
    # A value that is set but wrong: the rule alone.
    with pytest.raises(ConfigError) as caught:
        settings_with(gpuType="nvidia-a100")
    assert (
        str(caught.value)
        == "config 'gpuType' = 'nvidia-a100' is not allowed: one of ['nvidia-b200', 'nvidia-h200-141gb']"
    )


def test_pod_resources_that_are_no_object_are_refused_with_an_example():
    for key in ("rayHead", "rayWorker"):
        for given, shown in (("64", "'64'"), ([1], "[1]")):
            with pytest.raises(ConfigError) as caught:
                settings_with(**{key: given})
            assert str(caught.value) == (
                f"config '{key}' = {shown} is not allowed: an object with keys cpu and memory, e.g. "
                "{cpu: 64, memory: 500G}"
            )


def test_unset_values_read_not_set_never_none():
    for changes in ({"gcp:project": None}, {"zone": None}, {"gpuType": None}, {"reservation": None}):
        with pytest.raises(ConfigError) as caught:
            settings_with(**changes)
        assert "None" not in str(caught.value) and "is not set" in str(caught.value)


def test_unknown_keys_are_refused_with_the_closest_known_one():
    with pytest.raises(ConfigError, match=r"'nemo-rl-gke:gpuNode'.*did you mean 'gpuNodes'"):
        check_keys("nemo-rl-gke", ["nemo-rl-gke:zone", "nemo-rl-gke:gpuNode", "gcp:project"])
    with pytest.raises(ConfigError, match=r"'nemo-rl-gke:gpunodes'.*'gpuNodes'"):
        check_keys("nemo-rl-gke", ["nemo-rl-gke:gpunodes"])
    # A project namespace that is a near miss: the key would go to nobody.
    with pytest.raises(ConfigError, match=r"'nemo-rl:zone'.*did you mean 'nemo-rl-gke:zone'"):
        check_keys("nemo-rl-gke", ["nemo-rl:zone"])
    # A nested key set without --path lands as a flat key: say how to set it.
    with pytest.raises(ConfigError, match=r"--path lustre.capacityGib"):
        check_keys("nemo-rl-gke", ["nemo-rl-gke:lustre.capacityGib"])
    with pytest.raises(ConfigError, match=r"'nemo-rl-gke:colour'.*docs/configuration.md"):
        check_keys("nemo-rl-gke", ["nemo-rl-gke:colour"])
    # Every key the program reads, and the providers' own keys, pass.
    known = [f"nemo-rl-gke:{key}" for key in yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]]
    check_keys("nemo-rl-gke", [*known, "nemo-rl-gke:lustre", "nemo-rl-gke:wandbApiKey", "gcp:zone", "kubernetes:x"])


def test_quantities_and_allocatable():
    assert memory_bytes("500G") == 500 * 10**9
    assert memory_bytes("2400Gi") == 2400 * 2**30
    assert cpu_cores("500m") == 0.5
    assert cpu_cores(64) == 64
    with pytest.raises(ValueError):
        memory_bytes("12 GB")
    # 224 vCPU: 0.06 + 0.01 + 2 x 0.005 + 220 x 0.0025 = 0.63 reserved, less 2 cores for DaemonSets.
    assert allocatable_cpu(224) == pytest.approx(224 - 0.63 - 2)
    # 16 GiB: 1 + 0.8 + 0.8 = 2.6 GiB reserved, 100 MiB eviction, 8 GiB DaemonSets.
    assert allocatable_memory_bytes(16 * 2**30) == int(16 * 2**30 - 2.6 * 2**30 - 100 * 2**20 - 8 * 2**30)


# --- GPU autoscaling (KubeRay in-tree autoscaler) ---------------------------------------------------------------


def test_autoscaling_keys_are_validated():
    spot = {**BASE, "reservation": None, "gpuProvisioning": "spot"}
    with pytest.raises(ConfigError, match=r"'rayIdleTimeoutSeconds' = 30 is not allowed: 60\.\.86400 seconds"):
        validated(InfraSettings, {**spot, "rayIdleTimeoutSeconds": 30})
    with pytest.raises(ConfigError, match="'rayAutoscaling' = 'sometimes'"):
        validated(InfraSettings, {**spot, "rayAutoscaling": "sometimes"})
    assert validated(InfraSettings, {**spot, "rayAutoscaling": "false"}).gpu_autoscaling is False
    assert validated(InfraSettings, {**spot, "rayAutoscaling": ""}).gpu_autoscaling is True  # empty: by mode


def test_the_head_must_leave_room_for_the_autoscaler():
    # 77.5 cores fit n2-highmem-80 beside the log sidecar, but not beside the autoscaler as well (0.5 more).
    head = {"cpu": "77.5", "memory": "400G"}
    fixed = {**BASE, "cpuMachineType": "n2-highmem-80", "rayHead": head}
    assert validated(InfraSettings, fixed).ray_head.cpu == "77.5"  # reservation: autoscaler off by default
    with pytest.raises(ConfigError, match=r"'rayHead\.cpu' = '77\.5'.*at most 77\.0 cores on n2-highmem-80"):
        validated(InfraSettings, {**fixed, "rayAutoscaling": True})


def test_export_bucket_choices():
    assert settings_with().export_bucket_name == ""  # no export unless asked
    assert settings_with(exportBucket="create", clusterName="nemo-rl").export_bucket_name == "p-nemo-rl-models"
    assert settings_with(exportBucket="my_models-1").export_bucket_name == "my_models-1"


@pytest.mark.parametrize("bucket", ["Models", "a", "my.models.example", "goog-models", "-x-", "gs://b"])
def test_bad_export_bucket(bucket: str):
    expect_error("exportBucket", bucket, "an existing bucket's name", exportBucket=bucket)


def test_declared_defaults_are_the_programs_own():
    """The CLI applies Pulumi.yaml's defaults; the model has its own for a key that is absent. They must agree,
    or the same stack deploys differently under the CLI and wherever the defaults are not applied."""
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    defaults = {key: d["default"] for key, d in declared.items() if "default" in d and key not in BASE}
    assert {"rayIdleTimeoutSeconds", "maintenanceWindowStart", "maxRunHours", "exportBucket"} <= set(defaults)
    plain = settings_with()
    for key, default in defaults.items():
        assert settings_with(**{key: default}) == plain, f"{key}: Pulumi.yaml's default {default!r} differs"


def test_image_cache_disk_is_a_disk_image_of_the_project_or_a_full_path():
    assert settings_with().image_cache_disk == ""
    assert settings_with(imageCacheDisk="nemo-cache-1").image_cache_disk == "projects/p/global/images/nemo-cache-1"
    full = "projects/other-prj/global/images/nemo-cache-1"
    assert settings_with(imageCacheDisk=full).image_cache_disk == full
    for bad in ("Nemo_Cache", "gs://bucket/image", "projects/p/global/disks/x", "global/images/x"):
        expect_error("imageCacheDisk", bad, "projects/PROJECT/global/images/NAME", imageCacheDisk=bad)


def test_image_cache_disk_has_its_gke_floor(monkeypatch: pytest.MonkeyPatch):
    floor = gke_rules.IMAGE_CACHE_DISK_FLOOR
    assert floor.version == "1.28.3-gke.1067000"  # GKE docs, data-container-image-preloading (Standard clusters)
    assert floor in gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "reservation", image_cache_disk=True)
    assert floor not in gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "reservation")
    # Lustre's floor (1.33.2) and DCGM's are higher today, so they bind first; with them out of the way, the cache
    # disk's floor is the one the settings name.
    monkeypatch.setattr(gke_rules, "LUSTRE_CSI_FLOOR", gke_rules.VersionFloor("1.20.0-gke.1", "Lustre", "test"))
    monkeypatch.setattr(gke_rules, "DCGM_FLOOR", gke_rules.VersionFloor("1.20.0-gke.1", "DCGM", "test"))
    monkeypatch.setitem(
        GPU_PRESETS, "nvidia-b200", dataclasses.replace(GPU_PRESETS["nvidia-b200"], min_gke_version="1.20.0-gke.1")
    )
    public = {"privateNodes": False}  # private nodes have a floor of their own (1.29), above this one
    expect_error(
        "gkeVersion", "1.28.2-gke.1", "imageCacheDisk", gkeVersion="1.28.2-gke.1", imageCacheDisk="c", **public
    )
    assert settings_with(gkeVersion="1.28.2-gke.1", **public).gke_version == "1.28.2-gke.1"


def test_every_ray_pod_leaves_room_for_the_image_holder():
    """The pre-pull DaemonSet's container runs beside every Ray pod: the sizing check counts it."""
    from infra.settings import IMAGE_HOLDER, LOG_SIDECAR, check_fits
    from infra.sizing import allocatable_cpu, cpu_cores

    room = allocatable_cpu(224) - cpu_cores(LOG_SIDECAR.cpu)
    exact = f"{int(room * 1000)}m"  # fits with the sidecar alone, not with the holder too
    assert cpu_cores(exact) + cpu_cores(IMAGE_HOLDER.cpu) > room
    expect_error("rayWorker.cpu", exact, "at most", rayWorker={"cpu": exact, "memory": "2400Gi"})
    check_fits("x", PodResources(cpu=exact, memory="1Gi"), "a4-highgpu-8g", 224, 3968)  # the same without it
