"""Validation of the infra settings: every bad input stops with a message naming key, value and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from infra.presets import GPU_PRESETS
from infra.settings import ConfigError, build_settings, validate_lustre_capacity
from infra.sizing import allocatable_cpu, allocatable_memory_bytes, cpu_cores, memory_bytes

BASE: dict[str, Any] = {
    "gcp:project": "p",
    "gcp:region": "us-central1",
    "zone": "us-central1-b",
    "gpuType": "nvidia-b200",
    "reservation": "my-res",
}


def settings_with(**changes: Any):
    values = {**BASE, **changes}
    return build_settings({k: v for k, v in values.items() if v is not None})


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
    assert settings.namespace == "default"
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
    expect_error("reservation", "None", "pulumi config set reservation", reservation=None)


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


def test_lustre_unknown_key():
    expect_error("lustre.capacity", "18000", "capacityGib", lustre={"capacity": 18000})


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
    expect_error("rayVersion", "None", "v0.5.0", nemoRlImage="nvcr.io/nvidia/nemo-rl:v9.9.9")
    assert settings_with(nemoRlImage="nvcr.io/nvidia/nemo-rl:v9.9.9", rayVersion="2.60.0").ray_version == "2.60.0"


def test_gke_version_below_the_gpu_minimum():
    expect_error("gkeVersion", "1.31", "1.32.2-gke.1422000", gkeVersion="1.31")
    # The right minor but a patch below the B200 minimum.
    expect_error("gkeVersion", "1.32.0-gke.1", "1.32.2-gke.1422000", gkeVersion="1.32.0-gke.1")
    expect_error("gkeVersion", "latest", "full version", gkeVersion="latest")
    assert settings_with(gkeVersion="1.32").gke_minor == "1.32"
    assert settings_with(gkeVersion="1.32.2-gke.1422000").gke_minor == "1.32"
    assert settings_with(gkeVersion="1.33.5-gke.100").gke_version == "1.33.5-gke.100"


def test_unknown_cpu_machine_type():
    expect_error("cpuMachineType", "e2-micro", "n2-highmem-80", cpuMachineType="e2-micro")


def test_cpu_pool_bounds():
    expect_error("cpuPoolMinNodes", "0", "1 or more", cpuPoolMinNodes=0)
    expect_error("cpuPoolMaxNodes", "1", "cpuPoolMinNodes (2)", cpuPoolMinNodes=2, cpuPoolMaxNodes=1)


def test_bad_boolean():
    expect_error("protectData", "maybe", "true or false", protectData="maybe")


def test_missing_required_keys_name_the_key():
    expect_error("gcp:project", "None", "GCP project", **{"gcp:project": None})
    expect_error("zone", "None", "required", zone=None)
    expect_error("gpuType", "None", "nvidia-h200-141gb", gpuType=None)


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


def test_export_bucket_choices():
    assert settings_with().export_bucket_name == ""  # no export unless asked
    assert settings_with(exportBucket="create", clusterName="nemo-rl").export_bucket_name == "p-nemo-rl-models"
    assert settings_with(exportBucket="my_models-1").export_bucket_name == "my_models-1"


@pytest.mark.parametrize("bucket", ["Models", "a", "my.models.example", "goog-models", "-x-", "gs://b"])
def test_bad_export_bucket(bucket: str):
    expect_error("exportBucket", bucket, "an existing bucket's name", exportBucket=bucket)
