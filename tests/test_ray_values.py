"""The ray-cluster chart values: chart keys, GPU placement and sizes, secrets, start commands, whole pods
as the chart would render them (validated against the Kubernetes schema), and the log sidecar's config."""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from config_rules import validated
from upstream import reference

from infra.settings import LOG_SIDECAR, InfraSettings
from infra.sizing import memory_bytes
from workloads import ray_chart, ray_values
from workloads.ray_chart import CHART_VALUE_KEYS, CHART_VERSION, unknown_value_keys
from workloads.ray_values import RayClusterRefs, build_ray_values, fluent_bit_config
from workloads.stack import RELEASE_NAME

BASE = {"gcp:project": "p", "gcp:region": "us-central1", "zone": "us-central1-b", "reservation": "r"}
H200 = {**BASE, "gpuType": "nvidia-h200-141gb"}
# Non-default sizes, so a value that ignores the settings shows up.
B200 = {
    **BASE,
    "gpuType": "nvidia-b200",
    "gpuNodes": 4,
    "rayWorkerReplicas": 3,
    "rayWorker": {"cpu": "200", "memory": "3000Gi"},
    "rayHead": {"cpu": "40", "memory": "300G"},
    "shmSize": "512Gi",
    "nemoRlImage": "us-docker.pkg.dev/p/repo/nemo-rl:v0.5.0-custom",
    "rayVersion": "2.49.2",
}
EXPECTED = {
    "nvidia-h200-141gb": ("tuner_config_a3u.txtpb", "nvidia-h200-141gb"),
    "nvidia-b200": ("tuner_config_a4.txtpb", "nvidia-b200"),
}
SECRET_NAMES = {"HF_TOKEN", "WANDB_API_KEY"}


def make_refs(secret_keys: tuple[str, ...] = ("HF_TOKEN",)) -> RayClusterRefs:
    return RayClusterRefs(
        cluster_name="nemo-rl",
        cpu_pool_name="nemo-rl-cpu",
        pvc_name="lustre-pvc",
        secret_name="nemo-rl-tokens",
        secret_keys=secret_keys,
        service_account="ray-ksa",
        fluentbit_configmap="nemo-rl-fluentbit",
    )


@pytest.fixture(params=[H200, B200], ids=["h200", "b200"])
def settings(request: pytest.FixtureRequest) -> InfraSettings:
    return validated(InfraSettings, request.param)


def worker_group(values: dict[str, Any]) -> dict[str, Any]:
    return values["additionalWorkerGroups"][ray_values.WORKER_GROUP]


# --- The chart, as its v1.5.1 templates turn values into pod templates --------------------------------

CHART_LABELS = {
    "helm.sh/chart": f"ray-cluster-{CHART_VERSION}",
    "app.kubernetes.io/instance": RELEASE_NAME,
    "app.kubernetes.io/managed-by": "Helm",
}
# Labels KubeRay puts on every Ray pod itself.
KUBERAY_LABELS = {
    "ray.io/cluster",
    "ray.io/node-type",
    "ray.io/group",
    "ray.io/is-ray-node",
    "ray.io/identifier",
    "app.kubernetes.io/name",
    "app.kubernetes.io/created-by",
}


def render_pod(values: dict[str, Any], group_name: str | None) -> dict[str, Any]:
    """A v1 Pod built from the values the way the chart's templates fill the pod template (a key is
    rendered only when set and non-empty, like Helm's `with`), plus the annotation KubeRay copies
    from the RayCluster. group_name None is the head. It runs without the chart's sources; where they are at hand,
    tests/test_ray_chart_render.py holds it to what the real chart renders."""
    group = values["head"] if group_name is None else values["additionalWorkerGroups"][group_name]
    image = group.get("image") or values["image"]
    ray: dict[str, Any] = {
        "name": "ray-head" if group_name is None else "ray-worker",
        "image": f"{image['repository']}:{image['tag']}",
        "imagePullPolicy": image["pullPolicy"],
    }
    for key in ("command", "args"):
        if group.get(key):
            ray[key] = group[key]
    env = list(values.get("common", {}).get("containerEnv", [])) + list(group.get("containerEnv") or [])
    if env:
        ray["env"] = env
    for key in ("envFrom", "volumeMounts", "ports", "resources", "lifecycle", "securityContext"):
        if group.get(key):
            ray[key] = group[key]
    spec: dict[str, Any] = {"containers": [ray, *(group.get("sidecarContainers") or [])]}
    if values.get("imagePullSecrets"):
        spec["imagePullSecrets"] = values["imagePullSecrets"]
    for key in (
        "initContainers",
        "volumes",
        "dnsConfig",
        "nodeSelector",
        "affinity",
        "tolerations",
        "priorityClassName",
        "priority",
        "topologySpreadConstraints",
        "restartPolicy",
        "serviceAccountName",
    ):
        if group.get(key):
            spec[key] = group[key]
    if group.get("podSecurityContext"):
        spec["securityContext"] = group["podSecurityContext"]
    annotations = dict(group.get("annotations") or {})
    if str(values.get("annotations", {}).get("ray.io/overwrite-container-cmd", "")).lower() == "true":
        annotations["ray.io/overwrite-container-cmd"] = "true"
    metadata: dict[str, Any] = {
        "name": f"{values['fullnameOverride']}-{'head' if group_name is None else group_name}-x1",
        "labels": {**CHART_LABELS, **(group.get("labels") or {})},
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def all_pods(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [render_pod(values, None), render_pod(values, ray_values.WORKER_GROUP)]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def tolerates_gpu_taint(tolerations: list[dict[str, Any]]) -> bool:
    """Whether any toleration admits GKE's GPU taint nvidia.com/gpu=present:NoSchedule."""
    for toleration in tolerations:
        key, operator = toleration.get("key", ""), toleration.get("operator", "Equal")
        key_ok = key == "nvidia.com/gpu" or (key == "" and operator == "Exists")
        value_ok = operator == "Exists" or toleration.get("value") == "present"
        effect_ok = toleration.get("effect", "") in ("", "NoSchedule")
        if key_ok and value_ok and effect_ok:
            return True
    return False


# --- Chart keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("secret_keys", [("HF_TOKEN",), ("HF_TOKEN", "WANDB_API_KEY")])
def test_every_value_is_a_key_the_chart_reads(settings: InfraSettings, secret_keys: tuple[str, ...]) -> None:
    values = build_ray_values(settings, make_refs(secret_keys))
    assert unknown_value_keys(values) == []


def test_walker_reports_misspelt_and_unknown_keys(settings: InfraSettings) -> None:
    values = copy.deepcopy(build_ray_values(settings, make_refs()))
    values["head"]["nodeSelecter"] = {"a": "b"}
    worker_group(values)["tolerations_"] = []
    worker_group(values)["annotation"] = {"x": "y"}
    values["image"]["tagg"] = "v1"
    values["imagePullSecret"] = [{"name": "x"}]
    values["worker"]["replica"] = 2
    values["serviceAccount"] = {"create": True}  # only in a helper the templates never include
    values["additionalWorkerGroups"]["other"] = {"nodeSelector": {"k": "v"}, "sidecars": []}
    assert sorted(unknown_value_keys(values)) == sorted(
        [
            "head.nodeSelecter",
            f"additionalWorkerGroups.{ray_values.WORKER_GROUP}.tolerations_",
            f"additionalWorkerGroups.{ray_values.WORKER_GROUP}.annotation",
            "image.tagg",
            "imagePullSecret",
            "worker.replica",
            "serviceAccount",
            "additionalWorkerGroups.other.sidecars",
        ]
    )


def test_walker_descends_only_to_keys_the_chart_reads() -> None:
    # Contents of a key read as a whole are not checked; a list or scalar where the chart expects a
    # map of known keys is reported.
    assert unknown_value_keys({"head": {"nodeSelector": {"any/label": "x"}, "resources": {"limits": {}}}}) == []
    assert unknown_value_keys({"image": "nvcr.io/nvidia/nemo-rl:v0.5.0"}) == ["image"]
    assert unknown_value_keys({"head": [1]}) == ["head"]
    assert unknown_value_keys({"gcsFaultTolerance": {"enabled": False, "redisAdress": "x"}}) == [
        "gcsFaultTolerance.redisAdress"
    ]


def test_chart_pin_and_keys_cover_each_group() -> None:
    assert ray_chart.CHART_NAME == "ray-cluster"
    assert ray_chart.CHART_REPO == "https://ray-project.github.io/kuberay-helm/"
    assert re.fullmatch(r"1\.5\.[0-9]+", CHART_VERSION)
    for prefix in ("head", "worker", f"additionalWorkerGroups.{ray_chart.GROUP}"):
        for key in ("annotations", "volumes", "sidecarContainers", "serviceAccountName", "command", "nodeSelector"):
            assert f"{prefix}.{key}" in CHART_VALUE_KEYS
    assert "head.rayVersion" in CHART_VALUE_KEYS and "worker.rayVersion" not in CHART_VALUE_KEYS
    assert f"additionalWorkerGroups.{ray_chart.GROUP}.replicas" in CHART_VALUE_KEYS
    assert "head.replicas" not in CHART_VALUE_KEYS
    assert "annotations" in CHART_VALUE_KEYS and "fullnameOverride" in CHART_VALUE_KEYS


# --- Cluster-wide values -------------------------------------------------------------------------------


def test_image_cluster_name_and_operator_settings(settings: InfraSettings) -> None:
    refs = make_refs()
    values = build_ray_values(settings, refs)
    repository, tag = settings.nemo_rl_image.rsplit(":", 1)
    assert values["image"] == {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}
    assert values["fullnameOverride"] == refs.cluster_name
    assert values["annotations"] == {"ray.io/overwrite-container-cmd": "true"}
    assert values["head"]["rayVersion"] == settings.ray_version
    assert values["head"]["enableInTreeAutoscaling"] is False
    assert values["worker"] == {"disabled": True}
    assert list(values["additionalWorkerGroups"]) == [ray_values.WORKER_GROUP]


def test_split_image_keeps_registry_port() -> None:
    assert ray_values.split_image("nvcr.io/nvidia/nemo-rl:v0.5.0") == ("nvcr.io/nvidia/nemo-rl", "v0.5.0")
    assert ray_values.split_image("reg.local:5000/nemo-rl:v1") == ("reg.local:5000/nemo-rl", "v1")
    with pytest.raises(ValueError):
        ray_values.split_image("reg.local:5000/nemo-rl")


def test_service_name_and_ports() -> None:
    assert ray_values.head_service_name("nemo-rl") == "nemo-rl-head-svc"
    assert (ray_values.DASHBOARD_PORT, ray_values.CLIENT_PORT, ray_values.GCS_PORT, ray_values.METRICS_PORT) == (
        8265,
        10001,
        6379,
        8080,
    )
    assert ray_values.LUSTRE_MOUNT_PATH == "/data"
    values = build_ray_values(validated(InfraSettings, H200), make_refs())
    ports = {port["name"]: port["containerPort"] for port in values["head"]["ports"]}
    assert ports == {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "metrics": 8080}


# --- GPU workers ---------------------------------------------------------------------------------------


def test_gpu_workers_follow_the_preset_and_settings(settings: InfraSettings) -> None:
    values = build_ray_values(settings, make_refs())
    group = worker_group(values)
    tuner, accelerator = EXPECTED[settings.preset.gpu_type]
    replicas = settings.ray_worker_replicas
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (replicas, replicas, replicas)
    assert group["disabled"] is False
    assert group["nodeSelector"] == {"cloud.google.com/gke-accelerator": accelerator}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in group["tolerations"]
    expected = {"cpu": settings.ray_worker.cpu, "memory": settings.ray_worker.memory, "nvidia.com/gpu": 8}
    assert group["resources"] == {"requests": expected, "limits": expected}
    assert settings.preset.gpus_per_node == 8

    env = {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in group["containerEnv"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}  # for the pre-flight's topology report
    assert env["NCCL_TUNER_CONFIG_PATH"] == f"/usr/local/gib/configs/{tuner}"
    assert env["NCCL_NET"] == "gIB"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_CROSS_NIC"] == "0"
    assert env["NCCL_NET_GDR_LEVEL"] == "PIX"
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        assert env[name] == "eth0"
    # A pod env entry would replace the image's own library path; the start script prepends instead.
    assert "LD_LIBRARY_PATH" not in env

    shm = next(volume for volume in group["volumes"] if volume["name"] == ray_values.VOLUME_SHM)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": settings.shm_size}


def test_gpu_workers_get_every_nic_in_order(settings: InfraSettings) -> None:
    annotations = worker_group(build_ray_values(settings, make_refs()))["annotations"]
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    interfaces = json.loads(annotations["networking.gke.io/interfaces"])
    assert [entry["interfaceName"] for entry in interfaces] == [f"eth{n}" for n in range(10)]
    assert [entry["network"] for entry in interfaces] == ["default", "gvnic-1"] + [f"rdma-{n}" for n in range(8)]


def test_b200_sizes_come_from_settings() -> None:
    settings = validated(InfraSettings, B200)
    values = build_ray_values(settings, make_refs())
    group = worker_group(values)
    assert group["replicas"] == 3
    assert group["resources"]["limits"] == {"cpu": "200", "memory": "3000Gi", "nvidia.com/gpu": 8}
    assert values["head"]["resources"]["limits"] == {"cpu": "40", "memory": "300G"}
    assert values["image"]["repository"] == "us-docker.pkg.dev/p/repo/nemo-rl"
    assert values["image"]["tag"] == "v0.5.0-custom"
    shm = next(volume for volume in group["volumes"] if volume["name"] == ray_values.VOLUME_SHM)
    assert shm["emptyDir"]["sizeLimit"] == "512Gi"


# --- Head ----------------------------------------------------------------------------------------------


def test_head_stays_on_the_cpu_pool(settings: InfraSettings) -> None:
    refs = make_refs()
    head = build_ray_values(settings, refs)["head"]
    assert head["nodeSelector"] == {"cloud.google.com/gke-nodepool": refs.cpu_pool_name}
    assert "cloud.google.com/gke-accelerator" not in head["nodeSelector"]
    assert not tolerates_gpu_taint(head.get("tolerations", []))
    terms = head["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "DoesNotExist"}]}]
    expected = {"cpu": settings.ray_head.cpu, "memory": settings.ray_head.memory}
    assert head["resources"] == {"requests": expected, "limits": expected}
    assert head["rayStartParams"] == {
        "dashboard-host": "0.0.0.0",
        "num-gpus": "0",
        "min-worker-port": "10002",
        "max-worker-port": "11000",
    }
    # Memory-backed /dev/shm counts against the memory limit: it must stay below it.
    shm = next(volume for volume in head["volumes"] if volume["name"] == ray_values.VOLUME_SHM)
    assert 0 < memory_bytes(shm["emptyDir"]["sizeLimit"]) < memory_bytes(settings.ray_head.memory)


def test_gpu_toleration_check_is_not_vacuous() -> None:
    assert tolerates_gpu_taint([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert tolerates_gpu_taint([{"operator": "Exists"}])
    assert not tolerates_gpu_taint([{"key": "other", "operator": "Exists"}])


# --- Secrets, service account, volumes ----------------------------------------------------------------


@pytest.mark.parametrize("secret_keys", [("HF_TOKEN",), ("HF_TOKEN", "WANDB_API_KEY")])
def test_tokens_come_from_the_secret_by_reference(settings: InfraSettings, secret_keys: tuple[str, ...]) -> None:
    refs = make_refs(secret_keys)
    values = build_ray_values(settings, refs)
    for pod in all_pods(values):
        ray, *sidecars = pod["spec"]["containers"]
        env = env_of(ray)
        for key in secret_keys:
            assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": refs.secret_name, "key": key}}}
        assert ("WANDB_API_KEY" in env) == ("WANDB_API_KEY" in secret_keys)
        # Nothing anywhere carries a literal token.
        for container in pod["spec"]["containers"]:
            for entry in container.get("env", []):
                if entry["name"] in SECRET_NAMES or re.search(r"TOKEN|API_KEY|PASSWORD", entry["name"]):
                    assert "value" not in entry and "secretKeyRef" in entry["valueFrom"]
        for sidecar in sidecars:
            assert SECRET_NAMES.isdisjoint(env_of(sidecar))


def test_refs_reject_missing_or_malformed_secret_keys() -> None:
    with pytest.raises(ValueError):
        make_refs(())
    with pytest.raises(ValueError):
        make_refs(("hf-token",))


def test_hf_cache_is_on_lustre(settings: InfraSettings) -> None:
    for pod in all_pods(build_ray_values(settings, make_refs())):
        hf_home = env_of(pod["spec"]["containers"][0])["HF_HOME"]["value"]
        assert hf_home.startswith("/data/")


def test_pods_run_as_the_workload_identity_account_and_mount_what_they_need(settings: InfraSettings) -> None:
    refs = make_refs()
    values = build_ray_values(settings, refs)
    head, worker = all_pods(values)
    for pod in (head, worker):
        spec = pod["spec"]
        assert spec["serviceAccountName"] == refs.service_account
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        assert len(volumes) == len(spec["volumes"])
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{container['name']} mounts undeclared {mount['name']}"
        ray_mounts = {mount["mountPath"]: mount["name"] for mount in spec["containers"][0]["volumeMounts"]}
        assert volumes[ray_mounts["/data"]]["persistentVolumeClaim"] == {"claimName": refs.pvc_name}
        assert volumes[ray_mounts["/tmp/ray"]] == {"name": ray_mounts["/tmp/ray"], "emptyDir": {}}
        assert volumes[ray_mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert {"configMap": {"name": refs.fluentbit_configmap}}.items() <= volumes[
            ray_values.VOLUME_FLUENT_BIT
        ].items()
    worker_mounts = {mount["mountPath"]: mount["name"] for mount in worker["spec"]["containers"][0]["volumeMounts"]}
    worker_volumes = {volume["name"]: volume for volume in worker["spec"]["volumes"]}
    assert worker_volumes[worker_mounts["/usr/local/nvidia"]]["hostPath"]["path"] == "/home/kubernetes/bin/nvidia"
    assert worker_volumes[worker_mounts["/usr/local/gib"]]["hostPath"]["path"] == "/home/kubernetes/bin/gib"


def test_no_privileged_containers(settings: InfraSettings) -> None:
    for pod in all_pods(build_ray_values(settings, make_refs())):
        for container in pod["spec"]["containers"]:
            context = container.get("securityContext", {})
            assert not context.get("privileged")
            assert not context.get("capabilities", {}).get("add")
        assert not pod["spec"].get("hostNetwork")


def test_labels_leave_chart_and_kuberay_labels_alone(settings: InfraSettings) -> None:
    values = build_ray_values(settings, make_refs())
    for group in (values["head"], worker_group(values)):
        assert group["labels"]
        assert set(group["labels"]).isdisjoint({*CHART_LABELS, *KUBERAY_LABELS})


# --- Log sidecar ---------------------------------------------------------------------------------------


def test_log_sidecar_is_pinned_and_sized_as_reserved(settings: InfraSettings) -> None:
    for pod in all_pods(build_ray_values(settings, make_refs())):
        containers = pod["spec"]["containers"]
        assert [container["name"] for container in containers] == [containers[0]["name"], "fluent-bit"]
        sidecar = containers[1]
        image, tag = sidecar["image"].rsplit(":", 1)
        assert image.endswith("fluent/fluent-bit") and re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", tag)
        expected = {"cpu": LOG_SIDECAR.cpu, "memory": LOG_SIDECAR.memory}
        assert sidecar["resources"] == {"requests": expected, "limits": expected}
        mounts = {mount["mountPath"]: mount for mount in sidecar["volumeMounts"]}
        assert mounts["/tmp/ray"]["name"] == containers[0]["volumeMounts"][0]["name"]
        assert mounts["/tmp/ray"]["readOnly"] is True
        config_path = sidecar["args"][sidecar["args"].index("-c") + 1]
        config_dir, config_file = config_path.rsplit("/", 1)
        assert mounts[config_dir]["name"] == ray_values.VOLUME_FLUENT_BIT
        assert config_file in fluent_bit_config("nemo-rl")


def parse_fluent_bit(text: str) -> list[tuple[str, dict[str, list[str]]]]:
    """Fluent Bit's classic format: [SECTION] headers, then `Key value` lines (keys case-insensitive)."""
    sections: list[tuple[str, dict[str, list[str]]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([A-Z]+)\]", line)
        if header:
            sections.append((header.group(1), {}))
            continue
        assert sections, f"entry before any section: {line!r}"
        key, _, value = line.partition(" ")
        assert value.strip(), f"key without value: {line!r}"
        sections[-1][1].setdefault(key.lower(), []).append(value.strip())
    return sections


def test_fluent_bit_config_tails_ray_logs_into_cloud_logging() -> None:
    data = fluent_bit_config("my-ray")
    assert set(data) == {"fluent-bit.conf"}
    sections = parse_fluent_bit(data["fluent-bit.conf"])
    inputs = [body for name, body in sections if name == "INPUT"]
    outputs = [body for name, body in sections if name == "OUTPUT"]
    assert [name for name, _ in sections].count("SERVICE") == 1
    tails = [body for body in inputs if body["name"] == ["tail"]]
    assert tails and all(body["path"][0].startswith("/tmp/ray/session_latest/logs/") for body in tails)
    [stackdriver] = [body for body in outputs if body["name"] == ["stackdriver"]]
    for tail in tails:
        pattern = re.escape(stackdriver["match"][0]).replace(r"\*", ".*")
        assert re.fullmatch(pattern, tail["tag"][0]), "the output must match what the inputs tag"
    assert stackdriver["resource"] == ["generic_node"]
    assert stackdriver["namespace"] == ["my-ray"]
    for key in ("location", "node_id"):
        assert stackdriver[key][0]


def test_every_variable_the_log_config_reads_is_set_on_the_sidecar(settings: InfraSettings) -> None:
    referenced = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", fluent_bit_config("nemo-rl")["fluent-bit.conf"]))
    assert referenced
    for pod in all_pods(build_ray_values(settings, make_refs())):
        sidecar_env = env_of(pod["spec"]["containers"][1])
        assert referenced <= set(sidecar_env)
        assert sidecar_env["CLUSTER_LOCATION"]["value"] == settings.region


# --- Start commands ------------------------------------------------------------------------------------

FORBIDDEN = re.compile(r"\b(apt-get|apt|pip|pip3|uv|git|curl|wget|conda)\b")


def test_start_commands_prepare_then_exec_the_generated_ray_start(settings: InfraSettings) -> None:
    values = build_ray_values(settings, make_refs())
    worker_command = worker_group(values)["command"]
    head_command = values["head"]["command"]
    for command in (worker_command, head_command):
        assert command[:2] == ["/bin/bash", "-c"] and len(command) == 3
        script = command[2]
        assert not FORBIDDEN.search(script), script
        last = script.strip().splitlines()[-1]
        assert last.startswith("exec ${KUBERAY_GEN_RAY_START_CMD")
        subprocess.run(["bash", "-n", "-c", script], check=True)
    worker_script = worker_command[2]
    ldconfig = worker_script.index("ldconfig /usr/local/nvidia/lib64")
    source = worker_script.index("source /usr/local/gib/scripts/set_nccl_env.sh")
    run = worker_script.index("exec ${KUBERAY_GEN_RAY_START_CMD")
    assert ldconfig < source < run
    assert "gib" not in head_command[2]


def _fake_node(tmp_path: Path, with_plugin: bool = True) -> tuple[Path, Path, dict[str, str]]:
    nvidia, gib, bin_dir = tmp_path / "nvidia", tmp_path / "gib", tmp_path / "bin"
    (nvidia / "lib64").mkdir(parents=True)
    (gib / "scripts").mkdir(parents=True)
    bin_dir.mkdir()
    if with_plugin:
        (gib / "scripts" / "set_nccl_env.sh").write_text("export NCCL_FROM_GIB=sourced\n")
    ldconfig = bin_dir / "ldconfig"
    ldconfig.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/ldconfig.args\n')
    ldconfig.chmod(ldconfig.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    return nvidia, gib, env


def test_worker_script_runs_the_generated_command_with_the_plugin_env(tmp_path: Path) -> None:
    nvidia, gib, env = _fake_node(tmp_path)
    script = ray_values.worker_start_script(str(nvidia), str(gib))
    env["KUBERAY_GEN_RAY_START_CMD"] = "printenv NCCL_FROM_GIB LD_LIBRARY_PATH"
    env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64"  # what the image sets
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sourced", f"{nvidia}/lib64:{gib}/lib64:/usr/local/cuda/lib64"]
    assert (tmp_path / "ldconfig.args").read_text().strip() == f"{nvidia}/lib64"


def test_worker_script_stops_without_the_plugin_or_the_generated_command(tmp_path: Path) -> None:
    nvidia, gib, env = _fake_node(tmp_path, with_plugin=False)
    marker = tmp_path / "started"
    env["KUBERAY_GEN_RAY_START_CMD"] = f"touch {marker}"
    result = subprocess.run(
        ["bash", "-c", ray_values.worker_start_script(str(nvidia), str(gib))],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0 and "nccl-rdma-installer" in result.stderr
    assert not marker.exists()
    env.pop("KUBERAY_GEN_RAY_START_CMD")
    result = subprocess.run(["bash", "-c", ray_values.head_start_script()], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "ray.io/overwrite-container-cmd" in result.stderr


def test_head_script_execs_the_generated_command(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "KUBERAY_GEN_RAY_START_CMD": "echo ray start --head --num-gpus=0"}
    result = subprocess.run(["bash", "-c", ray_values.head_start_script()], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ray start --head --num-gpus=0"


# --- Whole pods against the Kubernetes schema ----------------------------------------------------------


@pytest.mark.parametrize("secret_keys", [("HF_TOKEN",), ("HF_TOKEN", "WANDB_API_KEY")])
def test_rendered_pods_are_valid_kubernetes(settings: InfraSettings, secret_keys: tuple[str, ...]) -> None:
    values = build_ray_values(settings, make_refs(secret_keys))
    head, worker = all_pods(values)
    for pod in (head, worker):
        assert kubernetes_validate.validate(pod, settings.gke_minor, strict=True) == settings.gke_minor == "1.35"
    # The worker annotations and the operator's annotation reach the pod, as the chart renders them.
    annotations = worker["metadata"]["annotations"]
    assert "networking.gke.io/interfaces" in annotations
    assert annotations["ray.io/overwrite-container-cmd"] == "true"
    assert worker["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": settings.preset.gpu_type}
    assert [container["name"] for container in worker["spec"]["containers"]] == ["ray-worker", "fluent-bit"]
    assert [container["name"] for container in head["spec"]["containers"]] == ["ray-head", "fluent-bit"]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda v: v["head"]["tolerations"].append({"key": "x", "operater": "Exists"}),
        lambda v: worker_group(v)["volumes"].append({"name": "bad", "hostpath": {"path": "/x"}}),
        lambda v: worker_group(v)["sidecarContainers"][0].update(resources={"limits": {"cpu": ["1"]}}),
        lambda v: v["head"].update(serviceAccountName=7),
    ],
    ids=["toleration-field", "volume-field", "quantity-type", "account-type"],
)
def test_schema_validation_catches_broken_fields(breakage: Any) -> None:
    settings = validated(InfraSettings, H200)
    values = copy.deepcopy(build_ray_values(settings, make_refs()))
    values["head"].setdefault("tolerations", [])
    breakage(values)
    with pytest.raises(kubernetes_validate.ValidationError):
        for pod in all_pods(values):
            kubernetes_validate.validate(pod, settings.gke_minor, strict=True)


# --- Ray's worker ports against NeMo RL's and vLLM's -----------------------------------------------------------------

# The kernel's ephemeral ports on stock Linux (net.ipv4.ip_local_port_range), where NeMo RL v0.5.0 takes its master
# port (bind to port 0) and vLLM any port it asks the kernel for.
EPHEMERAL = (32768, 60999)


def _constants(path: Path) -> dict[str, int]:
    """The module-level integer constants of a Python file (NAME = 123)."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^([A-Z_]+)\s*=\s*(\d+)\s*$", path.read_text(), re.MULTILINE)}


def nemo_rl_port_ranges() -> dict[str, tuple[int, int]]:
    """Every port range NeMo RL v0.5.0 and v0.7.0 use (closed intervals), read from their virtual_cluster.py."""
    ranges = {"kernel ephemeral (v0.5.0 master port, vLLM's free ports)": EPHEMERAL}
    v050 = reference("nemo-rl-v0.5.0") / "nemo_rl" / "distributed" / "virtual_cluster.py"
    # v0.5.0 has no port range of its own: its master port is whatever the kernel gives for port 0.
    assert 's.bind(("", 0))' in v050.read_text() and not any("PORT" in name for name in _constants(v050))
    v070 = _constants(reference("nemo-rl-v0.7.0") / "nemo_rl" / "distributed" / "virtual_cluster.py")
    for name in ("GENERATION", "GYM", "MASTER"):
        low, high = v070[f"DEFAULT_{name}_PORT_RANGE_LOW"], v070[f"DEFAULT_{name}_PORT_RANGE_HIGH"]
        ranges[f"v0.7.0 {name.lower()}"] = (low, high)
    # vLLM's TP/DP rendezvous: LOW + engine * PORTS_PER_ENGINE, up to 8 engines a node (TP=1 on 8 GPUs).
    low, step = v070["DEFAULT_VLLM_PORT_RANGE_LOW"], v070["DEFAULT_VLLM_PORTS_PER_ENGINE"]
    ranges["v0.7.0 vLLM rendezvous"] = (low, low + 8 * step)
    return ranges


def test_ray_worker_ports_overlap_no_nemo_rl_or_vllm_range(settings: InfraSettings) -> None:
    values = build_ray_values(settings, make_refs())
    groups = [values["head"], worker_group(values)]
    for group in groups:
        params = group["rayStartParams"]
        low, high = int(params["min-worker-port"]), int(params["max-worker-port"])
        assert (low, high) == (ray_values.MIN_WORKER_PORT, ray_values.MAX_WORKER_PORT)
        for name, (first, last) in nemo_rl_port_ranges().items():
            assert high < first or low > last, f"Ray's worker ports {low}-{high} overlap {name} {first}-{last}"
        fixed = (ray_values.GCS_PORT, ray_values.DASHBOARD_PORT, ray_values.CLIENT_PORT, ray_values.METRICS_PORT)
        assert not any(low <= port <= high for port in (*fixed, 52365))  # 52365: the dashboard agent
    # Ray's default (10002-19999) would fail the check above: it is not vacuous.
    ranges = nemo_rl_port_ranges()
    assert any(not (first > 19999 or last < 10002) for first, last in ranges.values())


def test_ray_containers_drop_raw_sockets_and_device_nodes(settings: InfraSettings) -> None:
    values = build_ray_values(settings, make_refs())
    for group in (values["head"], worker_group(values)):
        dropped = set(group["securityContext"]["capabilities"]["drop"])
        assert {"NET_RAW", "MKNOD"} <= dropped
        assert not group["securityContext"]["capabilities"].get("add")
