"""The gIB NCCL installer DaemonSet (workloads/nccl_installer.py), written from Google's manifest at a pinned commit:
what it puts on the node is where the Ray workers look for it, it reaches every GPU type the stack offers, its images
are pinned, and it is a valid DaemonSet of the targeted Kubernetes version."""

from __future__ import annotations

import re

import kubernetes_validate

from infra.presets import GPU_PRESETS
from workloads import nccl_installer as installer
from workloads import ray_values


def daemonset() -> dict:
    labels = installer.daemonset_labels()
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": installer.NAME, "namespace": installer.NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": installer.pod_spec()},
        },
    }


def test_provenance_is_a_commit_not_a_branch():
    assert re.fullmatch(r"[0-9a-f]{40}", installer.INSTALLER_COMMIT)
    assert f"/blob/{installer.INSTALLER_COMMIT}/gpudirect-rdma/nccl-rdma-installer.yaml" in installer.INSTALLER_SOURCE


def test_it_writes_where_the_ray_workers_read():
    """The workers mount the gIB directory and the driver directory from the host and source set_nccl_env.sh from
    the former: the installer must write exactly there."""
    host_paths = {v["hostPath"]["path"] for v in installer.pod_spec()["volumes"]}
    assert ray_values.GIB_HOST_DIR in host_paths
    assert any(path.startswith(ray_values.NVIDIA_HOST_DIR + "/") for path in host_paths)
    mounts = {m["mountPath"] for m in installer.pod_spec()["initContainers"][0]["volumeMounts"]}
    script = installer.install_script()
    for path in host_paths:  # each host directory is a copy's destination, through its mount
        assert f"{installer.MOUNT_PREFIX}{path}" in mounts
        assert re.search(rf"cp -r \S+ {re.escape(installer.MOUNT_PREFIX + path)}$", script, re.MULTILINE), path
    assert f"{ray_values.GIB_DIR}/scripts/set_nccl_env.sh" in ray_values.worker_start_script()


def test_it_runs_on_every_gpu_type_the_stack_offers():
    (term,) = installer.pod_spec()["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == ray_values.ACCELERATOR_LABEL
    assert {preset.gpu_type for preset in GPU_PRESETS.values()} <= set(expression["values"])
    assert {"operator": "Exists"} in installer.pod_spec()["tolerations"]  # the GPU taint included


def test_images_are_pinned():
    spec = installer.pod_spec()
    images = [c["image"] for key in ("initContainers", "containers") for c in spec[key]]
    for image in images:
        assert not image.endswith(":latest") and re.search(r":v?\d+(\.\d+)+(@sha256:[0-9a-f]{64})?$", image), image
    assert "@sha256:" in installer.PAUSE_IMAGE


def test_only_the_installer_is_privileged_and_nothing_calls_the_api():
    spec = installer.pod_spec()
    assert [c["name"] for c in spec["initContainers"] if c["securityContext"].get("privileged")] == [installer.NAME]
    pause = spec["containers"][0]["securityContext"]
    assert pause["allowPrivilegeEscalation"] is False and pause["capabilities"]["drop"] == ["ALL"]
    assert spec["automountServiceAccountToken"] is False


def test_it_is_a_valid_daemonset():
    kubernetes_validate.validate(daemonset(), "1.35", strict=True)
