"""Seeing what a run does: TensorBoard served read-only from Lustre, GPU metrics declared (Managed Prometheus and
DCGM), one log shipper in the Ray pods (and the pod-fit check counting what runs), and a Ray dashboard that loads
in NeMo RL's image."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import re
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
from conftest import ROOT, RunInfra
from upstream import reference

from infra import gke_rules
from infra.settings import AUTOSCALER, LOG_SIDECAR, ConfigError
from infra.sizing import cpu_cores, memory_bytes
from tools.render import manifest
from workloads.ray_values import DASHBOARD_FOLLOW_SYMLINKS_ENV
from workloads.tensorboard import TENSORBOARD_PORT

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
CLUSTER = "gcp:container/cluster:Cluster"


# --- TensorBoard --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["dev", "h200", "b200"])
def test_tensorboard_serves_lustre_read_only_and_validates(run_infra: RunInfra, stack: str):
    run = run_infra(stack)
    deployment = manifest(run.one(DEPLOYMENT, "tensorboard"))
    service = manifest(run.one(SERVICE, "tensorboard"))
    policy = manifest(run.one(POLICY, "tensorboard-isolated"))
    assert deployment and service and policy
    for obj in (deployment, service, policy):
        kubernetes_validate.validate(obj, run.outputs["kubernetesMinorVersion"], strict=True)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The pinned NeMo RL image, on the CPU pool, serving /data.
    assert container["image"] == run.outputs["nemoRlImage"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": run.outputs["cpuNodePool"]}
    assert container["command"] == ["tensorboard"]
    assert container["args"][:2] == ["--logdir", run.outputs["lustreMountPath"]]
    # Lustre read-only, twice over: the claim and the mount.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": run.outputs["lustrePvcName"], "readOnly": True}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]  # the only writable place
    # Hardened.
    security = container["securityContext"]
    assert security == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    # A ClusterIP Service in front; a policy that selects the pod and admits nothing either way.
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["ports"][0]["port"] == TENSORBOARD_PORT
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert not policy["spec"].get("ingress") and not policy["spec"].get("egress")
    assert run.depends_on(run.one(DEPLOYMENT, "tensorboard"), run.one(POLICY, "tensorboard-isolated"))
    namespace, name = run.outputs["namespace"], service["metadata"]["name"]
    assert run.outputs["tensorboardPortForward"] == (
        f"kubectl --namespace {namespace} port-forward service/{name} {TENSORBOARD_PORT}:{TENSORBOARD_PORT}"
    )


def test_tensorboard_can_be_turned_off(run_infra: RunInfra):
    run = run_infra("dev", {"tensorboard": "false"})
    assert not run.of_type(DEPLOYMENT) and not run.of_type(SERVICE)
    assert run.outputs["tensorboardPortForward"] == ""
    with pytest.raises(ConfigError, match="tensorboard"):
        run_infra("dev", {"tensorboard": "sometimes"})


@pytest.mark.parametrize("release", ["nemo-rl-v0.5.0", "nemo-rl-v0.7.0"])
def test_tensorboard_is_in_nemo_rls_image(release: str):
    """A core dependency of the release (pyproject.toml `dependencies`), so the image's venv has the command."""
    project = tomllib.loads((reference(release) / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"tensorboard\b", requirement) for requirement in project["dependencies"])


# --- GPU metrics --------------------------------------------------------------------------------------------------


def container_api_enum() -> set[str]:
    """MonitoringComponentConfig.enableComponents' enum in GKE's own API schema (google-api-python-client's copy)."""
    (path,) = glob.glob(
        str(ROOT / ".venv/lib/python*/site-packages/googleapiclient/discovery_cache/documents/container.v1.json")
    )
    schema = json.loads(Path(path).read_text())["schemas"]["MonitoringComponentConfig"]
    return set(schema["properties"]["enableComponents"]["items"]["enum"])


@pytest.mark.parametrize("stack", ["dev", "h200"])
def test_managed_prometheus_and_dcgm_are_declared(run_infra: RunInfra, stack: str):
    run = run_infra(stack)
    monitoring = run.one(CLUSTER).inputs["monitoringConfig"]
    assert monitoring["managedPrometheus"] == {"enabled": True}
    components = monitoring["enableComponents"]
    assert "DCGM" in components and "SYSTEM_COMPONENTS" in components  # an empty list would turn monitoring off
    assert set(components) <= container_api_enum() - {"COMPONENT_UNSPECIFIED"}
    assert len(set(components)) == len(components)
    # Managed DCGM needs GKE-installed GPU drivers (GKE docs, dcgm-metrics).
    pool = run.one("gcp:container/nodePool:NodePool", "gpu")
    accelerator = pool.inputs["nodeConfig"]["guestAccelerators"][0]
    assert accelerator["gpuDriverInstallationConfig"]["gpuDriverVersion"] == "DEFAULT"


def test_dcgm_floor_is_data_and_enforced():
    assert gke_rules.DCGM_FLOOR in gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "reservation")
    assert gke_rules.below_floor("1.32.1-gke.1356999", gke_rules.DCGM_FLOOR)
    assert not gke_rules.below_floor("1.32.1-gke.1357000", gke_rules.DCGM_FLOOR)
    assert gke_rules.DCGM_FLOOR.source.startswith("GKE docs")


# --- one log shipper, counted by the fit check ---------------------------------------------------------------------


def test_one_log_shipper_per_ray_pod(run_infra: RunInfra):
    run = run_infra("dev")
    ray = run.one(CLUSTER).inputs["addonsConfig"]["rayOperatorConfigs"][0]
    assert ray["enabled"] is True
    assert ray["rayClusterLoggingConfig"] == {"enabled": False}  # GKE would inject a second Fluent Bit
    assert ray["rayClusterMonitoringConfig"] == {"enabled": True}
    values = run.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    groups = [values["head"], *values["additionalWorkerGroups"].values()]
    for group in groups:
        shippers = [c for c in group["sidecarContainers"] if "fluent-bit" in c["image"]]
        assert len(shippers) == 1


def requested(containers: list[dict]) -> tuple[float, int]:
    return (
        sum(cpu_cores(c["resources"]["requests"]["cpu"]) for c in containers),
        sum(memory_bytes(c["resources"]["requests"]["memory"]) for c in containers),
    )


@pytest.mark.parametrize(("stack", "autoscaling"), [("dev", "true"), ("h200", "false")])
def test_the_fit_check_counts_every_container_beside_ray(run_infra: RunInfra, stack: str, autoscaling: str):
    """What infra.settings.check_fits reserves beside the Ray container is exactly what the pods carry: the log
    sidecar in every pod, and the autoscaler in the head when it is on. Nothing else is injected (GKE's logging
    injection is off, see above)."""
    values = run_infra(stack, {"rayAutoscaling": autoscaling}).one("kubernetes:helm.sh/v3:Release").inputs["values"]
    head_beside = list(values["head"]["sidecarContainers"])
    if "autoscalerOptions" in values["head"]:
        head_beside.append(values["head"]["autoscalerOptions"])
    reserved_head = [LOG_SIDECAR, *([AUTOSCALER] if autoscaling == "true" else [])]
    assert requested(head_beside) == (
        sum(cpu_cores(r.cpu) for r in reserved_head),
        sum(memory_bytes(r.memory) for r in reserved_head),
    )
    for group in values["additionalWorkerGroups"].values():
        assert requested(group["sidecarContainers"]) == (cpu_cores(LOG_SIDECAR.cpu), memory_bytes(LOG_SIDECAR.memory))


# --- the Ray dashboard in NeMo RL's image ----------------------------------------------------------------------------


@pytest.mark.parametrize("venv", [".venv", ".venv-ray2551"])
def test_ray_reads_the_follow_symlinks_setting_for_its_static_files(venv: str):
    """Ray 2.49.2 (v0.5.0's) and 2.55.1 (v0.7.0's) serve /static with follow_symlinks from this variable."""
    (source,) = glob.glob(str(ROOT / venv / "lib/python*/site-packages/ray/dashboard/http_server_head.py"))
    text = Path(source).read_text()
    assert f'ENV_VAR_FOLLOW_SYMLINKS = "{DASHBOARD_FOLLOW_SYMLINKS_ENV}"' in text
    assert 'os.environ.get(ENV_VAR_FOLLOW_SYMLINKS) == "1"' in text
    assert 'routes.static("/static", static_dir, follow_symlinks=FOLLOW_SYMLINKS_ENABLED)' in text


def test_v0_5_0_links_its_venv_with_symlinks():
    dockerfile = (reference("nemo-rl-v0.5.0") / "docker" / "Dockerfile").read_text()
    assert "uv sync --link-mode symlink --locked --no-install-project" in dockerfile


def test_aiohttp_refuses_symlinked_static_files_unless_told(tmp_path: Path):
    """The failure and the fix, with Ray's own aiohttp: a static file that is a symlink out of the folder (as uv's
    symlink mode leaves them) is a 404 without follow_symlinks and served with it."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    cache = tmp_path / "uv-cache"
    cache.mkdir()
    (cache / "main.js").write_text("console.log('dashboard')")
    static = tmp_path / "build" / "static"
    static.mkdir(parents=True)
    os.symlink(cache / "main.js", static / "main.js")

    async def fetch(follow: bool) -> int:
        app = web.Application()
        app.router.add_static("/static", static, follow_symlinks=follow)
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/static/main.js")
            return response.status

    assert asyncio.run(fetch(False)) == 404
    assert asyncio.run(fetch(True)) == 200


def test_the_head_follows_the_symlinks(run_infra: RunInfra):
    values = run_infra("dev").one("kubernetes:helm.sh/v3:Release").inputs["values"]
    assert {"name": DASHBOARD_FOLLOW_SYMLINKS_ENV, "value": "1"} in values["head"]["containerEnv"]
