"""What the infra program puts on the cluster, read from what the mocks register."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml
from conftest import HF_TOKEN, ROOT, WANDB_KEY, RunInfra

from infra.settings import ConfigError
from tools.offline import plaintext_paths
from tools.render import is_built_in, manifest, manifests
from workloads.nics import extra_nics

PARAM_SET = "kubernetes:networking.gke.io/v1:GKENetworkParamSet"
NETWORK = "kubernetes:networking.gke.io/v1:Network"
RELEASE = "kubernetes:helm.sh/v3:Release"


def stack_config(stack: str) -> dict:
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def test_every_kubernetes_object_uses_the_cluster_provider(stack_run):
    _, run = stack_run
    provider = run.one("pulumi:providers:kubernetes")
    k8s_objects = [r for r in run.resources if r.type.startswith("kubernetes:") and r.custom]
    assert len(k8s_objects) > 20
    for obj in k8s_objects:
        assert obj.provider.startswith(provider.urn + "::"), f"{obj.type} {obj.name} uses {obj.provider or 'default'}"


def test_network_mapping(stack_run):
    stack, run = stack_run
    prefix = stack_config(stack)["nemo-rl-gke:clusterName"]
    param_sets = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in run.of_type(PARAM_SET)}
    networks = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in run.of_type(NETWORK)}
    expected_names = [nic.network for nic in extra_nics()]
    assert (
        sorted(param_sets)
        == sorted(networks)
        == sorted(expected_names)
        == sorted(["gvnic-1"] + [f"rdma-{n}" for n in range(8)])
    )
    assert param_sets["gvnic-1"] == {
        "vpc": f"{prefix}-gvnic-net",
        "vpcSubnet": f"{prefix}-gvnic-sub",
        "deviceMode": "NetDevice",
    }
    for n in range(8):
        assert param_sets[f"rdma-{n}"] == {
            "vpc": f"{prefix}-rdma-net",
            "vpcSubnet": f"{prefix}-rdma-sub-{n}",
            "deviceMode": "RDMA",
        }
    for name, spec in networks.items():
        assert spec["type"] == "Device"
        assert spec["parametersRef"] == {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": name}


def test_worker_interfaces_annotation_uses_the_same_names(stack_run):
    _, run = stack_run
    values = run.one(RELEASE).inputs["values"]
    annotations = [
        group["annotations"]
        for group in [values.get("worker", {}), *values.get("additionalWorkerGroups", {}).values()]
        if not group.get("disabled") and "annotations" in group
    ]
    assert len(annotations) == 1
    interfaces = json.loads(annotations[0]["networking.gke.io/interfaces"])
    networks = sorted(r.inputs["metadata"]["name"] for r in run.of_type(NETWORK))
    assert [i["network"] for i in interfaces] == ["default", "gvnic-1"] + [f"rdma-{n}" for n in range(8)]
    assert [i["interfaceName"] for i in interfaces] == [f"eth{n}" for n in range(10)]
    assert sorted(i["network"] for i in interfaces[1:]) == networks


def test_nccl_installer_is_pinned_and_follows_the_gpu_pool(stack_run):
    _, run = stack_run
    installer = run.one("kubernetes:yaml/v2:ConfigFile")
    url = installer.inputs["files"][0] if "files" in installer.inputs else installer.inputs["file"]
    assert re.fullmatch(
        r"https://raw\.githubusercontent\.com/GoogleCloudPlatform/container-engine-accelerators/[0-9a-f]{40}/"
        r"gpudirect-rdma/nccl-rdma-installer\.yaml",
        url,
    ), url
    gpu_pool = run.one("gcp:container/nodePool:NodePool", "gpu")
    assert run.depends_on(installer, gpu_pool) or run.depends_on(run.by_urn(installer.parent), gpu_pool)


def test_lustre_volume(stack_run):
    stack, run = stack_run
    config = stack_config(stack)
    prefix = config["nemo-rl-gke:clusterName"]
    pv = run.one("kubernetes:core/v1:PersistentVolume").inputs
    pvc = run.one("kubernetes:core/v1:PersistentVolumeClaim").inputs
    capacity = "9000Gi" if stack == "dev" else "18000Gi"
    csi = pv["spec"]["csi"]
    assert csi["driver"] == "lustre.csi.storage.gke.io"
    assert csi["volumeHandle"] == f"{config['gcp:project']}/{config['nemo-rl-gke:zone']}/{prefix}-lustre"
    # From the instance's outputs (the mock answers 10.32.0.2 for the mount point), never typed in.
    assert csi["volumeAttributes"] == {"ip": "10.32.0.2", "filesystem": "lustrefs"}
    assert pv["spec"]["capacity"] == {"storage": capacity}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    # Growing the instance resizes the volume; a claim on a static volume cannot be resized, so it is left alone.
    assert run.one("kubernetes:core/v1:PersistentVolumeClaim").ignore_changes == ["spec.resources"]
    assert pvc["spec"]["resources"]["requests"] == {"storage": capacity}
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["claimRef"] == {"name": pvc["metadata"]["name"], "namespace": "default"}


def test_tokens_secret_and_secret_key_refs(run_infra: RunInfra):
    run = run_infra("h200", secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    secret = run.one("kubernetes:core/v1:Secret")
    assert sorted(secret.inputs["stringData"]) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert run.outputs["secretKeys"] == ["HF_TOKEN", "WANDB_API_KEY"]
    refs = secret_key_refs(run.one(RELEASE).inputs["values"])
    secret_name = secret.inputs["metadata"]["name"]
    for key in ("HF_TOKEN", "WANDB_API_KEY"):
        assert {"name": secret_name, "key": key} in refs, key


def secret_key_refs(value) -> list[dict]:
    if isinstance(value, dict):
        found = [value["secretKeyRef"]] if "secretKeyRef" in value else []
        return found + [ref for v in value.values() for ref in secret_key_refs(v)]
    if isinstance(value, list):
        return [ref for v in value for ref in secret_key_refs(v)]
    return []


def test_no_wandb_key_means_no_wandb_env(run_infra: RunInfra):
    run = run_infra("dev")
    assert sorted(run.one("kubernetes:core/v1:Secret").inputs["stringData"]) == ["HF_TOKEN"]
    assert "WANDB_API_KEY" not in json.dumps(run.one(RELEASE).inputs["values"])


def test_secrets_never_in_plaintext_anywhere(run_infra: RunInfra):
    """Scan everything the mocks register (what state would hold) and every stack output."""
    run = run_infra("b200", secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    assert any(HF_TOKEN in json.dumps(r.inputs) for r in run.resources), "the token must reach the Secret"
    for secret in (HF_TOKEN, WANDB_KEY):
        for resource in run.resources:
            assert plaintext_paths(resource.raw_inputs, secret) == [], f"{resource.type} {resource.name}"
        for name, value in run.outputs.items():
            assert secret not in json.dumps(value) or name in run.secret_outputs, name
        for obj in manifests(run):
            assert secret not in json.dumps(obj), f"rendered {obj['kind']} shows a secret"


def test_workload_identity(stack_run):
    stack, run = stack_run
    config = stack_config(stack)
    project, prefix = config["gcp:project"], config["nemo-rl-gke:clusterName"]
    gsa = run.one("gcp:serviceaccount/account:Account", "ray-identity-gsa")
    email = f"{prefix}-ray@{project}.iam.gserviceaccount.com"
    assert gsa.inputs["accountId"] == f"{prefix}-ray"
    ksa = run.one("kubernetes:core/v1:ServiceAccount").inputs["metadata"]
    assert ksa["name"] == "generic-ksa"
    assert ksa["annotations"] == {"iam.gke.io/gcp-service-account": email}
    binding = run.one("gcp:serviceaccount/iAMMember:IAMMember").inputs
    assert binding["role"] == "roles/iam.workloadIdentityUser"
    assert binding["member"] == f"serviceAccount:{project}.svc.id.goog[default/generic-ksa]"
    roles = {
        r.inputs["role"] for r in run.of_type("gcp:projects/iAMMember:IAMMember") if r.name.startswith("ray-identity")
    }
    assert roles == {"roles/logging.logWriter"}  # object access: on the export bucket only
    values = run.one(RELEASE).inputs["values"]
    assert values["head"]["serviceAccountName"] == "generic-ksa"


def test_ray_release(stack_run):
    _, run = stack_run
    release = run.one(RELEASE).inputs
    assert release["chart"] == "ray-cluster"
    assert release["repositoryOpts"] == {"repo": "https://ray-project.github.io/kuberay-helm/"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", release["version"])
    # GKE's RayOperator add-on is the operator: nothing installs kuberay-operator.
    assert not any("kuberay-operator" in json.dumps(r.inputs) for r in run.resources if r.type == RELEASE)
    assert release["values"]["image"] == {
        "repository": "nvcr.io/nvidia/nemo-rl",
        "tag": "v0.5.0",
        "pullPolicy": "IfNotPresent",
    }
    assert release["values"]["head"]["rayVersion"] == "2.49.2"


def test_release_waits_for_everything_the_pods_need(stack_run):
    _, run = stack_run
    release = run.one(RELEASE)
    needed = [
        run.one("gcp:container/nodePool:NodePool", "gpu"),
        run.one("kubernetes:core/v1:PersistentVolumeClaim"),
        run.one("kubernetes:core/v1:Secret"),
        run.one("kubernetes:core/v1:ServiceAccount"),
        run.one("kubernetes:core/v1:ConfigMap"),
        run.one("kubernetes:yaml/v2:ConfigFile"),
        *run.of_type(NETWORK),
        *run.of_type(PARAM_SET),
    ]
    for resource in needed:
        direct = resource.urn in release.dependencies
        via_component = resource.parent in release.dependencies
        assert direct or via_component or run.depends_on(release, resource), (
            f"release does not wait for {resource.name}"
        )


def test_head_network_policy(stack_run):
    stack, run = stack_run
    cluster = f"{stack_config(stack)['nemo-rl-gke:clusterName']}-ray"
    spec = run.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "ray-head-policy").inputs["spec"]
    assert spec["podSelector"]["matchLabels"] == {"ray.io/cluster": cluster, "ray.io/node-type": "head"}
    assert spec["policyTypes"] == ["Ingress"]
    sources = [peer for rule in spec["ingress"] for peer in rule["from"]]
    assert {"podSelector": {"matchLabels": {"ray.io/cluster": cluster}}} in sources
    label_key, label_value = next(iter(run.outputs["submitterPodLabel"].items()))
    submitter_rule = next(
        r for r in spec["ingress"] if r["from"] == [{"podSelector": {"matchLabels": {label_key: label_value}}}]
    )
    assert {p["port"] for p in submitter_rule["ports"]} == {8265, 10001}
    # No rule admits everyone.
    assert all(rule.get("from") for rule in spec["ingress"])


def test_job_stack_outputs(stack_run):
    stack, run = stack_run
    prefix = stack_config(stack)["nemo-rl-gke:clusterName"]
    out = run.outputs
    assert out["namespace"] == "default"
    assert out["rayHeadService"] == f"{prefix}-ray-head-svc.default.svc.cluster.local"
    assert out["rayDashboardPort"] == 8265
    assert out["rayAddress"] == f"http://{prefix}-ray-head-svc.default.svc.cluster.local:8265"
    assert out["lustrePvcName"] == f"{prefix}-lustre"
    assert out["lustreMountPath"] == "/data"
    assert out["secretName"] == f"{prefix}-tokens"
    assert out["serviceAccount"] == "generic-ksa"
    assert out["gpusPerNode"] == 8
    assert out["nemoRlImage"] == "nvcr.io/nvidia/nemo-rl:v0.5.0"
    assert out["rayVersion"] == "2.49.2"
    assert (
        out["dashboardPortForward"]
        == f"kubectl --namespace default port-forward service/{prefix}-ray-head-svc 8265:8265"
    )


def test_custom_namespace_is_created_and_used(run_infra: RunInfra):
    run = run_infra("dev", {"namespace": "rl"})
    assert run.one("kubernetes:core/v1:Namespace").inputs["metadata"]["name"] == "rl"
    for kind in ("PersistentVolumeClaim", "Secret", "ServiceAccount", "ConfigMap"):
        assert run.one(f"kubernetes:core/v1:{kind}").inputs["metadata"]["namespace"] == "rl"
    assert run.one(RELEASE).inputs["namespace"] == "rl"
    assert run.outputs["rayHeadService"].endswith(".rl.svc.cluster.local")


def test_bad_namespace_stops_before_anything(run_infra: RunInfra):
    with pytest.raises(ConfigError, match="namespace"):
        run_infra("dev", {"namespace": "Bad_NS"})


@pytest.mark.parametrize("stack", ["dev", "h200", "b200"])
def test_every_built_in_object_validates_strictly(run_infra: RunInfra, stack: str):
    run = run_infra(stack, {"namespace": "rl"}, secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    gke_minor = run.outputs["kubernetesMinorVersion"]
    assert gke_minor == "1.35"
    objects = [m for m in manifests(run) if is_built_in(m)]
    kinds = {o["kind"] for o in objects}
    assert kinds >= {
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Secret",
        "ConfigMap",
        "ServiceAccount",
        "NetworkPolicy",
        "Namespace",
    }
    for obj in objects:
        kubernetes_validate.validate(obj, gke_minor, strict=True)


def test_validation_catches_a_bad_field():
    """The gate above is real: a misspelt field fails strict validation."""
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "dataa": {"a": "b"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.33", strict=True)


def test_rendered_secret_keeps_keys_and_hides_values(run_infra: RunInfra):
    run = run_infra("dev")
    rendered = manifest(run.one("kubernetes:core/v1:Secret"))
    assert rendered is not None
    assert rendered["stringData"] == {"HF_TOKEN": "[secret]"}


def test_ray_pods_get_object_access_on_the_export_bucket_only(run_infra: RunInfra):
    created = run_infra("h200")  # exportBucket: create
    bucket = created.one("gcp:storage/bucket:Bucket").inputs
    assert bucket["name"] == "my-gcp-project-nemo-rl-h200-models"
    assert bucket["uniformBucketLevelAccess"] is True and bucket["publicAccessPrevention"] == "enforced"
    assert bucket["forceDestroy"] is False
    assert created.one("gcp:storage/bucket:Bucket").protect  # protectData, like Lustre
    grant = created.one("gcp:storage/bucketIAMMember:BucketIAMMember").inputs
    assert grant == {
        "bucket": bucket["name"],
        "role": "roles/storage.objectUser",
        "member": "serviceAccount:nemo-rl-h200-ray@my-gcp-project.iam.gserviceaccount.com",
    }
    assert created.outputs["exportBucket"] == bucket["name"]
    none = run_infra("dev")  # exportBucket not set
    for run in (created, none):  # never a project-wide storage role
        project_roles = {r.inputs["role"] for r in run.of_type("gcp:projects/iAMMember:IAMMember")}
        assert not any(role.startswith("roles/storage.") for role in project_roles)
    given = run_infra("dev", {"exportBucket": "team-models"})
    assert not given.of_type("gcp:storage/bucket:Bucket")  # a user-given bucket is used, not created
    assert given.one("gcp:storage/bucketIAMMember:BucketIAMMember").inputs["bucket"] == "team-models"
    assert given.outputs["exportBucket"] == "team-models"
    assert not none.of_type("gcp:storage/bucketIAMMember:BucketIAMMember") and none.outputs["exportBucket"] == ""
