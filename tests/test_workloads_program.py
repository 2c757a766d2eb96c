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


def test_nccl_installer_is_our_daemonset_and_follows_the_gpu_pool(stack_run):
    """No manifest is fetched at deploy time: the installer is a DaemonSet the program writes (its facts are held
    to upstream's in test_nccl_installer.py), so the plan shows it and checkov scans it."""
    _, run = stack_run
    assert not run.of_type("kubernetes:yaml/v2:ConfigFile")
    installer = run.one("kubernetes:apps/v1:DaemonSet", "nccl-rdma-installer")
    assert installer.inputs["metadata"] == {
        "name": "nccl-rdma-installer",
        "namespace": "kube-system",
        "labels": {"k8s-app": "nccl-rdma-installer"},
        "annotations": {"pulumi.com/skipAwait": "true"},
    }
    images = [
        c["image"]
        for key in ("initContainers", "containers")
        for c in installer.inputs["spec"]["template"]["spec"][key]
    ]
    assert all(re.search(r":v?\d[\w.]*(@sha256:[0-9a-f]{64})?$", image) for image in images), images
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
    assert pv["spec"]["claimRef"] == {"name": pvc["metadata"]["name"], "namespace": "nemo-rl"}


def test_tokens_secret_and_secret_key_refs(run_infra: RunInfra):
    run = run_infra("h200", secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    secret = run.one("kubernetes:core/v1:Secret", "tokens")
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
    assert sorted(run.one("kubernetes:core/v1:Secret", "tokens").inputs["stringData"]) == ["HF_TOKEN"]
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
    accounts = {r.inputs["metadata"]["name"]: r.inputs for r in run.of_type("kubernetes:core/v1:ServiceAccount")}
    head, worker = "generic-ksa", f"{prefix}-ray-worker"
    assert sorted(accounts) == sorted([head, worker])
    for account in accounts.values():
        assert account["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": email}
        # No pod of these accounts gets a Kubernetes token unless it mounts one itself (only the autoscaler does).
        assert account["automountServiceAccountToken"] is False
    members = sorted(
        b.inputs["member"]
        for b in run.of_type("gcp:serviceaccount/iAMMember:IAMMember")
        if b.inputs["role"] == "roles/iam.workloadIdentityUser"
    )
    assert members == sorted(f"serviceAccount:{project}.svc.id.goog[nemo-rl/{ksa}]" for ksa in (head, worker))
    roles = {
        r.inputs["role"] for r in run.of_type("gcp:projects/iAMMember:IAMMember") if r.name.startswith("ray-identity")
    }
    assert roles == {"roles/logging.logWriter"}  # object access: on the export bucket only
    values = run.one(RELEASE).inputs["values"]
    assert values["head"]["serviceAccountName"] == head
    assert values["additionalWorkerGroups"]["gpu-workers"]["serviceAccountName"] == worker
    assert run.outputs["workerServiceAccount"] == worker


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
        *run.of_type("kubernetes:core/v1:Secret"),
        *run.of_type("kubernetes:core/v1:ServiceAccount"),
        *run.of_type("gcp:serviceaccount/iAMMember:IAMMember"),
        run.one("kubernetes:core/v1:ConfigMap"),
        run.one("kubernetes:apps/v1:DaemonSet", "nccl-rdma-installer"),
        *run.of_type(NETWORK),
        *run.of_type(PARAM_SET),
    ]
    for resource in needed:
        direct = resource.urn in release.dependencies
        via_component = resource.parent in release.dependencies
        assert direct or via_component or run.depends_on(release, resource), (
            f"release does not wait for {resource.name}"
        )


def test_network_policies_fence_every_ray_pod(stack_run):
    """Which pods each policy selects is held against the real chart's pods in test_ray_pods.py; here: what is
    registered, in the Ray namespace."""
    stack, run = stack_run
    cluster = f"{stack_config(stack)['nemo-rl-gke:clusterName']}-ray"
    policies = {
        r.inputs["metadata"]["name"]: r.inputs
        for r in run.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
        if r.inputs["metadata"]["name"].startswith(cluster)
    }
    assert sorted(policies) == [f"{cluster}-{suffix}" for suffix in ("egress", "head", "pods", "submitter-egress")]
    assert {p["metadata"]["namespace"] for p in policies.values()} == {"nemo-rl"}
    pods, head = policies[f"{cluster}-pods"]["spec"], policies[f"{cluster}-head"]["spec"]
    assert pods["podSelector"] == {"matchLabels": {"ray.io/cluster": cluster}}
    assert pods["ingress"][0] == {"from": [{"podSelector": {"matchLabels": {"ray.io/cluster": cluster}}}]}
    assert head["podSelector"]["matchLabels"] == {"ray.io/cluster": cluster, "ray.io/node-type": "head"}
    assert pods["policyTypes"] == ["Ingress"] and head["policyTypes"] == ["Ingress", "Egress"]
    assert policies[f"{cluster}-egress"]["spec"]["policyTypes"] == ["Egress"]
    label_key, label_value = next(iter(run.outputs["submitterPodLabel"].items()))
    assert policies[f"{cluster}-submitter-egress"]["spec"]["podSelector"] == {"matchLabels": {label_key: label_value}}
    submitter_rule = next(
        r for r in head["ingress"] if r["from"] == [{"podSelector": {"matchLabels": {label_key: label_value}}}]
    )
    # Ray Client only where the autoscaler is (tests/test_network_flows.py holds every flow).
    autoscaling = run.one(RELEASE).inputs["values"]["head"]["enableInTreeAutoscaling"]
    assert {p["port"] for p in submitter_rule["ports"]} == ({8265, 10001} if autoscaling else {8265})
    prometheus_rule = next(r for r in pods["ingress"] if "namespaceSelector" in r["from"][0])
    assert prometheus_rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    # No rule admits everyone, and every rule but the cluster's own names its ports.
    assert all(rule.get("from") for spec in (pods, head) for rule in spec["ingress"])
    assert all(rule.get("ports") for rule in head["ingress"])


def test_job_stack_outputs(stack_run):
    stack, run = stack_run
    prefix = stack_config(stack)["nemo-rl-gke:clusterName"]
    out = run.outputs
    assert out["namespace"] == "nemo-rl"
    assert out["rayHeadService"] == f"{prefix}-ray-head-svc.nemo-rl.svc.cluster.local"
    assert out["rayDashboardPort"] == 8265
    assert out["rayAddress"] == f"http://{prefix}-ray-head-svc.nemo-rl.svc.cluster.local:8265"
    assert out["lustrePvcName"] == f"{prefix}-lustre"
    assert out["lustreMountPath"] == "/data"
    assert out["secretName"] == f"{prefix}-tokens"
    assert out["serviceAccount"] == "generic-ksa"
    assert out["gpusPerNode"] == 8
    assert out["nemoRlImage"] == "nvcr.io/nvidia/nemo-rl:v0.5.0"
    assert out["rayVersion"] == "2.49.2"
    assert out["rayAuthSecret"] is None and out["rayAuthTokenCommand"] is None  # Ray 2.49.2: no token auth
    assert (
        out["dashboardPortForward"]
        == f"kubectl --namespace nemo-rl port-forward service/{prefix}-ray-head-svc 8265:8265"
    )


def test_custom_namespace_is_created_and_used(run_infra: RunInfra):
    run = run_infra("dev", {"namespace": "rl"})
    assert run.one("kubernetes:core/v1:Namespace").inputs["metadata"]["name"] == "rl"
    for kind in ("PersistentVolumeClaim", "Secret", "ServiceAccount", "ConfigMap"):
        for obj in run.of_type(f"kubernetes:core/v1:{kind}"):
            assert obj.inputs["metadata"]["namespace"] == "rl"
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
    rendered = manifest(run.one("kubernetes:core/v1:Secret", "tokens"))
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


V070 = {"nemoRlImage": "nvcr.io/nvidia/nemo-rl:v0.7.0"}


def test_ray_token_auth_where_the_images_ray_has_it(run_infra: RunInfra):
    """v0.7.0 (Ray 2.55.1): a random token in its own Secret, referenced by every Ray container, the autoscaler and
    (through the job stack) the submitter; the value itself is a secret everywhere it goes."""
    from tools.offline import mock_password
    from workloads.ray_auth import TOKEN_LENGTH

    run = run_infra("h200", V070, secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    password = run.one("random:index/randomPassword:RandomPassword")
    assert password.inputs["length"] == TOKEN_LENGTH and password.inputs["special"] is False
    secret = run.one("kubernetes:core/v1:Secret", "ray-auth")
    name = secret.inputs["metadata"]["name"]
    assert (name, secret.inputs["metadata"]["namespace"]) == ("nemo-rl-h200-ray-auth", "nemo-rl")
    assert sorted(secret.inputs["stringData"]) == ["RAY_AUTH_TOKEN"]
    assert run.outputs["rayAuthSecret"] == name
    assert name in run.outputs["rayAuthTokenCommand"] and "RAY_AUTH_TOKEN" in run.outputs["rayAuthTokenCommand"]
    token = mock_password(TOKEN_LENGTH)
    assert secret.inputs["stringData"]["RAY_AUTH_TOKEN"] == token  # the made token reaches the Secret...
    for resource in run.resources:  # ...and only as a secret: never plaintext in state, outputs or manifests
        assert plaintext_paths(resource.raw_inputs, token) == [], f"{resource.type} {resource.name}"
    assert not any(token in json.dumps(value) for value in run.outputs.values())
    assert not any(token in json.dumps(obj) for obj in manifests(run))

    values = run.one(RELEASE).inputs["values"]
    mode = {"name": "RAY_AUTH_MODE", "value": "token"}
    ref = {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "RAY_AUTH_TOKEN"}}}
    # common.containerEnv reaches every group's Ray container (and KubeRay's wait-gcs-ready copies the worker's);
    # the autoscaler is a container KubeRay adds, so it gets them through autoscalerOptions.
    assert mode in values["common"]["containerEnv"] and ref in values["common"]["containerEnv"]
    assert "autoscalerOptions" not in values["head"]  # h200: a reservation, no autoscaler
    autoscaled = run_infra("h200", {**V070, "rayAutoscaling": True}).one(RELEASE).inputs["values"]["head"]
    assert autoscaled["autoscalerOptions"]["env"] == [mode, ref]
    # The Release waits for the Secret the pods read.
    release = run.one(RELEASE)
    assert run.depends_on(release, secret) or secret.parent in release.dependencies


def test_no_token_auth_on_ray_2_49_2(stack_run):
    """v0.5.0's Ray has none: no token is made, and nothing refers to one (the NetworkPolicies are the fence)."""
    _, run = stack_run
    assert not run.of_type("random:index/randomPassword:RandomPassword")
    assert [r.name for r in run.of_type("kubernetes:core/v1:Secret")] == ["tokens"]
    assert "RAY_AUTH" not in json.dumps(run.one(RELEASE).inputs["values"])


def test_the_ray_namespace_carries_pod_security_labels(stack_run):
    from workloads.pod_security import namespace_labels

    _, run = stack_run
    namespace = run.one("kubernetes:core/v1:Namespace").inputs["metadata"]
    assert namespace["name"] == "nemo-rl"
    assert namespace["labels"] == namespace_labels("1.35")
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespace["labels"]["pod-security.kubernetes.io/warn"] == "baseline"


def test_a_built_in_namespace_is_used_not_created(run_infra: RunInfra):
    run = run_infra("dev", {"namespace": "default"})
    assert not run.of_type("kubernetes:core/v1:Namespace")
    assert run.one(RELEASE).inputs["namespace"] == "default"


def test_the_head_account_cannot_take_the_workers_name(run_infra: RunInfra):
    with pytest.raises(ConfigError, match=r"kubernetesServiceAccount.*workers"):
        run_infra("dev", {"kubernetesServiceAccount": "nemo-rl-dev-ray-worker"})
