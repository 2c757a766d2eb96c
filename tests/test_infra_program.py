"""The whole infra program under Pulumi's mocks, for every stack file, as `pulumi up` would run it."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
import yaml
from conftest import HF_TOKEN, INFRA_STACKS, ROOT, WANDB_KEY, RunInfra
from pydantic import BaseModel

from infra.settings import ConfigError
from tools.offline import (
    MissingConfigError,
    load_stack_config,
    mock_dns_endpoint,
    plaintext_paths,
    run_program,
    set_config_path,
)

NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
LUSTRE = "gcp:lustre/instance:Instance"


def test_networks(stack_run):
    stack, run = stack_run
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    zone, project = config["nemo-rl-gke:zone"], config["gcp:project"]
    networks = {r.inputs["name"]: r for r in run.of_type(NETWORK)}
    assert len(networks) == 3
    for network in networks.values():
        assert network.inputs["autoCreateSubnetworks"] is False  # custom mode
    rdma = next(n for n in networks.values() if n.name.endswith("-rdma"))
    assert rdma.inputs["networkProfile"] == f"projects/{project}/global/networkProfiles/{zone}-vpc-roce"
    assert rdma.inputs["mtu"] == 8896
    # 8896 as Cluster Toolkit's A3 Ultra/A4 blueprints and xpk have it (8244 is the A3 Mega value).
    assert run.one(NETWORK, "networks-gvnic").inputs["mtu"] == 8896
    assert run.one(NETWORK, "networks-cluster").inputs["mtu"] == 8896  # Managed Lustre's best

    subnets = run.of_type(SUBNET)
    cluster_subnet = next(s for s in subnets if s.name == "networks-cluster")
    secondary = {r["rangeName"] for r in cluster_subnet.inputs["secondaryIpRanges"]}
    assert secondary == {"pods", "services"}
    rdma_network_id = f"projects/{project}/global/networks/{rdma.inputs['name']}"
    rdma_subnets = [s for s in subnets if s.inputs["network"] == rdma_network_id]
    assert sorted(s.inputs["ipCidrRange"] for s in rdma_subnets) == sorted(f"192.168.{n}.0/24" for n in range(1, 9))
    # Parallel: each RDMA subnet waits for the RDMA network (and the Compute API) and nothing else.
    compute_api = run.one("gcp:projects/service:Service", "apis-compute")
    for subnet in rdma_subnets:
        assert sorted(subnet.dependencies) == sorted([rdma.urn, compute_api.urn])
        assert subnet.parent == run.one("nemo-rl-gke:infra:Networks").urn


def test_gvnic_firewall_is_internal_only(stack_run):
    _, run = stack_run
    firewall = run.one("gcp:compute/firewall:Firewall", "networks-gvnic-internal")
    assert firewall.inputs["sourceRanges"] == ["192.168.0.0/24"]
    for cidr in firewall.inputs["sourceRanges"]:
        assert ipaddress.ip_network(cidr).is_private
    assert {a["protocol"] for a in firewall.inputs["allows"]} == {"tcp", "udp", "icmp"}
    gvnic = run.one(NETWORK, "networks-gvnic")
    assert firewall.inputs["network"].endswith(gvnic.inputs["name"])


def test_cluster(stack_run):
    stack, run = stack_run
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    cluster = run.one(CLUSTER)
    inputs = cluster.inputs
    assert inputs["location"] == config["gcp:region"]
    assert inputs["workloadIdentityConfig"]["workloadPool"] == f"{config['gcp:project']}.svc.id.goog"
    assert inputs["datapathProvider"] == "ADVANCED_DATAPATH"
    assert inputs["enableMultiNetworking"] is True
    assert inputs["networkingMode"] == "VPC_NATIVE"
    assert inputs["ipAllocationPolicy"] == {
        "clusterSecondaryRangeName": "pods",
        "servicesSecondaryRangeName": "services",
    }
    assert inputs["network"].endswith(f"/networks/{config['nemo-rl-gke:clusterName']}-net")
    addons = inputs["addonsConfig"]
    assert addons["rayOperatorConfigs"][0]["enabled"] is True
    assert addons["lustreCsiDriverConfig"] == {"enabled": True, "enableLegacyLustrePort": True}
    assert inputs["deletionProtection"] is False
    assert inputs["removeDefaultNodePool"] is True
    node_sa = run.one("gcp:serviceaccount/account:Account", "gke-nodes")
    assert inputs["nodeConfig"]["serviceAccount"].startswith(node_sa.inputs["accountId"] + "@")


def test_node_service_account_has_only_node_roles(stack_run):
    _, run = stack_run
    roles = {r.inputs["role"] for r in run.of_type("gcp:projects/iAMMember:IAMMember") if "nodes" in r.name}
    assert roles == {
        "roles/logging.logWriter",
        "roles/monitoring.metricWriter",
        "roles/monitoring.viewer",
        "roles/stackdriver.resourceMetadata.writer",
        "roles/artifactregistry.reader",
    }
    assert not any("admin" in role or role in ("roles/editor", "roles/owner") for role in roles)


def test_cpu_pool(stack_run):
    stack, run = stack_run
    pool = run.one(NODE_POOL, "gke-cpu")
    expected_max = 2 if stack == "dev" else 5
    assert pool.inputs["autoscaling"]["totalMinNodeCount"] == 1
    assert pool.inputs["autoscaling"]["totalMaxNodeCount"] == expected_max
    assert pool.inputs["nodeConfig"]["machineType"] == "n2-highmem-80"
    assert "guestAccelerators" not in pool.inputs["nodeConfig"]
    assert set(pool.ignore_changes) >= {"initialNodeCount", "nodeCount"}
    assert pool.delete_before_replace  # fixed name: a replacement must delete the old pool first


def test_gpu_pool(stack_run):
    stack, run = stack_run
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    gpu_type = config["nemo-rl-gke:gpuType"]
    pool = run.one(NODE_POOL, "gpu").inputs
    node = pool["nodeConfig"]
    assert node["machineType"] == {"nvidia-h200-141gb": "a3-ultragpu-8g", "nvidia-b200": "a4-highgpu-8g"}[gpu_type]
    accelerator = node["guestAccelerators"][0]
    assert (accelerator["type"], accelerator["count"]) == (gpu_type, 8)
    assert accelerator["gpuDriverInstallationConfig"]["gpuDriverVersion"] == "DEFAULT"
    assert pool["nodeLocations"] == [config["nemo-rl-gke:zone"]]
    # A reservation (its nodes billed anyway) starts with the Ray cluster's nodes and keeps them; the others from 0.
    at_creation = int(config["nemo-rl-gke:gpuNodes"]) if "nemo-rl-gke:reservation" in config else 0
    assert pool["initialNodeCount"] == at_creation
    assert pool["autoscaling"]["totalMinNodeCount"] == at_creation
    assert pool["autoscaling"]["totalMaxNodeCount"] == int(config["nemo-rl-gke:gpuNodes"])
    assert node["gvnic"] == {"enabled": True}
    assert "secondaryBootDisks" not in node and "gcfsConfig" not in node  # no imageCacheDisk in the shipped stacks
    assert set(run.one(NODE_POOL, "gpu").ignore_changes) >= {"initialNodeCount", "nodeCount"}
    assert run.one(NODE_POOL, "gpu").delete_before_replace


def test_gpu_pool_networks_in_nic_order(stack_run):
    stack, run = stack_run
    prefix = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]["nemo-rl-gke:clusterName"]
    networks = run.one(NODE_POOL, "gpu").inputs["networkConfig"]["additionalNodeNetworkConfigs"]
    assert [(n["network"], n["subnetwork"]) for n in networks] == [(f"{prefix}-gvnic-net", f"{prefix}-gvnic-sub")] + [
        (f"{prefix}-rdma-net", f"{prefix}-rdma-sub-{n}") for n in range(8)
    ]


@pytest.mark.parametrize(
    ("mode", "reservation", "expected"),
    [
        (
            "reservation",
            "blk-1",
            {
                "reservationAffinity": {
                    "consumeReservationType": "SPECIFIC_RESERVATION",
                    "key": "compute.googleapis.com/reservation-name",
                    "values": ["blk-1"],
                }
            },
        ),
        ("spot", None, {"spot": True, "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"}}),
        ("flexStart", None, {"flexStart": True, "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"}}),
    ],
)
def test_gpu_provisioning_modes(run_infra: RunInfra, mode, reservation, expected):
    run = run_infra("h200", {"gpuProvisioning": mode, "reservation": reservation})
    node = run.one(NODE_POOL, "gpu").inputs["nodeConfig"]
    for key, value in expected.items():
        assert node[key] == value
    others = {"spot", "flexStart"} - set(expected)
    assert not any(node.get(key) for key in others)


def test_flex_start_pool_meets_googles_preconditions(run_infra: RunInfra):
    """Cluster Toolkit refuses a flex-start pool with auto-repair on; GKE wants NO_RESERVATION, no spot, min 0."""
    run = run_infra("dev")  # the dev stack is the flex-start one
    pool = run.one(NODE_POOL, "gpu").inputs
    assert pool["nodeConfig"]["flexStart"] is True
    assert pool["management"] == {"autoRepair": False, "autoUpgrade": True}
    assert pool["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert not pool["nodeConfig"].get("spot")
    assert pool["autoscaling"]["totalMinNodeCount"] == 0
    assert "maxRunDuration" not in pool["nodeConfig"]
    limited = run_infra("dev", {"maxRunHours": 48}).one(NODE_POOL, "gpu").inputs["nodeConfig"]
    assert limited["maxRunDuration"] == f"{48 * 3600}s"
    # Every other mode keeps auto-repair.
    reserved = run_infra("h200").one(NODE_POOL, "gpu").inputs
    assert reserved["management"] == {"autoRepair": True, "autoUpgrade": True}


def test_flex_start_preconditions_catch_each_violation():
    from infra.gke_rules import flex_start_violations

    good = {
        "flex_start": True,
        "spot": False,
        "auto_repair": False,
        "reservation_type": "NO_RESERVATION",
        "min_nodes": 0,
    }
    assert flex_start_violations(**good) == []  # type: ignore[arg-type]
    for change, word in (
        ({"auto_repair": True}, "auto-repair"),
        ({"spot": True}, "spot"),
        ({"reservation_type": "SPECIFIC_RESERVATION"}, "NO_RESERVATION"),
        ({"min_nodes": 1}, "0 nodes"),
    ):
        [problem] = flex_start_violations(**{**good, **change})  # type: ignore[arg-type]
        assert word in problem
    assert flex_start_violations(**{**good, "flex_start": False, "auto_repair": True}) == []  # type: ignore[arg-type]


def test_gpu_nodes_are_not_upgraded_mid_run(stack_run):
    """The cluster's maintenance exclusion keeps GKE from draining a GPU node for an upgrade during training."""
    _, run = stack_run
    policy = run.one(CLUSTER).inputs["maintenancePolicy"]
    assert policy["dailyMaintenanceWindow"] == {"startTime": "09:00"}
    [exclusion] = policy["maintenanceExclusions"]
    assert exclusion["exclusionOptions"] == {
        "scope": "NO_MINOR_OR_NODE_UPGRADES",
        "endTimeBehavior": "UNTIL_END_OF_SUPPORT",
    }
    assert exclusion["startTime"].endswith("Z")


def test_maintenance_policy_from_config(run_infra: RunInfra):
    run = run_infra("h200", {"maintenanceExclusion": "none", "maintenanceWindowStart": "02:30"})
    policy = run.one(CLUSTER).inputs["maintenancePolicy"]
    assert policy == {"dailyMaintenanceWindow": {"startTime": "02:30"}}


API_WAITS = {
    # resource type -> the APIs it must wait for
    NETWORK: {"compute"},
    SUBNET: {"compute"},
    "gcp:compute/firewall:Firewall": {"compute"},
    "gcp:compute/globalAddress:GlobalAddress": {"compute"},
    "gcp:compute/router:Router": {"compute"},
    "gcp:compute/routerNat:RouterNat": {"compute"},
    # With databaseEncryptionKey: GKE's service agent exists once the Kubernetes Engine API is on.
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": {"container"},
    "gcp:servicenetworking/connection:Connection": {"servicenetworking"},
    LUSTRE: {"lustre"},
    CLUSTER: {"container", "logging", "monitoring"},
    NODE_POOL: {"container"},
    "gcp:serviceaccount/account:Account": {"iam"},
    "gcp:serviceaccount/iAMMember:IAMMember": {"iam"},
    "gcp:projects/iAMMember:IAMMember": {"cloudresourcemanager"},
    "gcp:storage/bucket:Bucket": {"storage"},
    "gcp:storage/bucketIAMMember:BucketIAMMember": {"storage"},
}


def test_a_new_project_gets_its_apis_enabled_first(stack_run):
    _, run = stack_run
    services = {r.inputs["service"].split(".")[0]: r for r in run.of_type("gcp:projects/service:Service")}
    assert set(services) == {
        "compute", "container", "lustre", "servicenetworking", "iam", "cloudresourcemanager", "logging", "monitoring",
        "storage",
    }  # fmt: skip
    for service in services.values():
        assert service.inputs["disableOnDestroy"] is False  # never switch an API off under the rest of the project
    # Every Google resource the stack registers is listed above: a new kind cannot skip its API.
    google_types = {r.type for r in run.resources if r.type.startswith("gcp:")} - {"gcp:projects/service:Service"}
    assert google_types <= set(API_WAITS), sorted(google_types - set(API_WAITS))
    for type_, apis in API_WAITS.items():
        for resource in run.of_type(type_):
            for api in apis:
                assert run.depends_on(resource, services[api]), f"{resource.name} does not wait for {api}"
    # Waiting for APIs joins nothing: Lustre still builds beside the cluster (test_lustre_builds_beside_the_cluster).


def test_configuration_table_has_a_row_for_every_key_the_program_reads():
    """A key added to settings (and Pulumi.yaml) but not to docs/configuration.md's infra table is undocumented; a row
    for a key the program no longer reads would be refused by check_keys."""
    from config_rules import keys_of

    from infra.settings import MODEL, SECRETS

    guide = (ROOT / "docs" / "configuration.md").read_text()
    section = guide[guide.index("## Infra stack (root project") : guide.index("## Job stack (")]
    rows = set(re.findall(r"^\| `([^`]+)`", section, re.MULTILINE))
    read = {key for key in [*keys_of(MODEL), *SECRETS] if not key.startswith("gcp:")}
    documented = {row.split(".")[0] for row in rows if not row.startswith("gcp:")}
    assert read - documented == set(), "keys without a row in docs/configuration.md"
    assert documented - read == set(), "rows in docs/configuration.md for keys the program does not read"


def test_docs_list_every_api_and_the_deployers_roles():
    from infra.services import DEPLOYER_ROLES, REQUIRED_APIS

    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide[guide.index("## What a new project needs") : guide.index("## Configuring and creating")]
    for name in [*REQUIRED_APIS, *DEPLOYER_ROLES]:
        assert f"`{name}`" in section, name
    assert "roles/compute.networkAdmin" in DEPLOYER_ROLES  # private services access: what Editor lacks
    assert "Owner" in section and "Editor is not enough" in section


def test_unknown_config_keys_stop_the_program_before_anything(run_infra: RunInfra):
    with pytest.raises(ConfigError, match=r"'nemo-rl-gke:gpuNode'.*'gpuNodes'"):
        run_infra("dev", {"gpuNode": 3})
    with pytest.raises(ConfigError, match=r"'nemo-rl:zone'.*'nemo-rl-gke:zone'"):
        run_infra("dev", {"nemo-rl:zone": "europe-west1-c"})


def test_path_style_nested_keys_reach_validation(run_infra: RunInfra):
    """`pulumi config set --path lustre.capacityGib 1234` stores {lustre: {capacityGib: 1234}}: validated."""
    project, config = load_stack_config(ROOT, "h200")
    set_config_path(project, config, "lustre.capacityGib", 1234)
    assert config["nemo-rl-gke:lustre"] == {"capacityGib": 1234}
    with pytest.raises(ConfigError, match=r"lustre.capacityGib"):
        run_program(ROOT, config, secrets={"nemo-rl-gke:hfToken": HF_TOKEN}, stack="h200")
    set_config_path(project, config, "lustre.capacityGib", 36000)
    run = run_program(ROOT, config, secrets={"nemo-rl-gke:hfToken": HF_TOKEN}, stack="h200")
    assert run.one(LUSTRE).inputs["capacityGib"] == "36000"
    # A misspelt field of an object is refused too, naming the path.
    set_config_path(project, config, "lustre.capacity", 36000)
    with pytest.raises(ConfigError, match=r"lustre.capacity"):
        run_program(ROOT, config, secrets={"nemo-rl-gke:hfToken": HF_TOKEN}, stack="h200")


def test_lustre(stack_run):
    stack, run = stack_run
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    lustre = run.one(LUSTRE)
    expected_capacity = "9000" if stack == "dev" else "18000"
    expected_tier = "1000" if stack == "dev" else "500"
    assert lustre.inputs["capacityGib"] == expected_capacity
    assert lustre.inputs["perUnitStorageThroughput"] == expected_tier
    assert lustre.inputs["filesystem"] == "lustrefs"
    assert lustre.inputs["gkeSupportEnabled"] is True
    assert lustre.inputs["location"] == config["nemo-rl-gke:zone"]
    assert lustre.inputs["network"].endswith(f"/networks/{config['nemo-rl-gke:clusterName']}-net")
    assert lustre.protect is True

    address = run.one("gcp:compute/globalAddress:GlobalAddress")
    assert (address.inputs["purpose"], address.inputs["prefixLength"]) == ("VPC_PEERING", 20)
    peering = run.one("gcp:servicenetworking/connection:Connection")
    # DELETE fails while the producer holds the range; ABANDON leaves a peering that blocks deleting the VPC.
    assert peering.inputs["deletionPolicy"] == "REMOVE_PEERING"
    assert run.depends_on(lustre, peering)
    firewall = run.one("gcp:compute/firewall:Firewall", "lustre-ingress").inputs
    assert firewall["sourceRanges"] == [f"{address.inputs['address']}/20"]
    assert firewall["allows"] == [{"protocol": "tcp", "ports": ["988", "6988"]}]
    assert firewall["network"] == lustre.inputs["network"]


def test_lustre_builds_beside_the_cluster(stack_run):
    """Lustre must not wait for GKE: it takes far longer, so both are created at once."""
    _, run = stack_run
    lustre = run.one(LUSTRE)
    for blocker in [run.one(CLUSTER), *run.of_type(NODE_POOL)]:
        assert not run.depends_on(lustre, blocker), f"Lustre waits for {blocker.name}"
    # ...and the cluster does not wait for Lustre either.
    assert not run.depends_on(run.one(CLUSTER), lustre)


def test_unprotected_data_when_opted_out(run_infra: RunInfra):
    run = run_infra("dev", {"protectData": False})
    assert run.one(LUSTRE).protect is False


def test_deletion_protection_from_config(run_infra: RunInfra):
    run = run_infra("dev", {"deletionProtection": True})
    assert run.one(CLUSTER).inputs["deletionProtection"] is True


def test_outputs(stack_run):
    stack, run = stack_run
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    out = run.outputs
    prefix = config["nemo-rl-gke:clusterName"]
    assert out["clusterName"] == prefix
    assert out["clusterLocation"] == config["gcp:region"]
    assert out["zone"] == config["nemo-rl-gke:zone"]
    assert out["gpuType"] == config["nemo-rl-gke:gpuType"]
    assert out["gpuNodes"] == int(config["nemo-rl-gke:gpuNodes"])
    assert out["rayWorkerReplicas"] == int(config["nemo-rl-gke:gpuNodes"])
    assert out["rdmaSubnets"] == [f"{prefix}-rdma-sub-{n}" for n in range(8)]
    assert (out["clusterNetwork"], out["gvnicNetwork"], out["rdmaNetwork"]) == (
        f"{prefix}-net",
        f"{prefix}-gvnic-net",
        f"{prefix}-rdma-net",
    )
    assert out["lustreInstanceId"] == f"{prefix}-lustre"
    assert out["lustreIp"] == "10.32.0.2"  # parsed from the instance's mount point, not hard-coded
    assert out["lustreMountPoint"] == "10.32.0.2@tcp:/lustrefs"
    assert out["lustreFilesystem"] == "lustrefs"


def test_kubeconfig_is_a_secret_with_exec_auth(stack_run):
    _, run = stack_run
    assert "kubeconfig" in run.secret_outputs
    kubeconfig = yaml.safe_load(run.outputs["kubeconfig"])
    user = kubeconfig["users"][0]["user"]
    assert user["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert "token" not in user
    # The IAM-gated DNS endpoint GKE reports for the cluster, never the IP endpoint (off unless authorizedNetworks).
    region = run.one(CLUSTER).inputs["location"]
    assert kubeconfig["clusters"][0]["cluster"] == {"server": f"https://{mock_dns_endpoint(region)}"}
    assert "203.0.113.10" not in run.outputs["kubeconfig"]
    provider = run.one("pulumi:providers:kubernetes")
    assert provider.raw_inputs["kubeconfig"].get("4dabf18193072939515e22adb298388d")  # stored encrypted


def test_secrets_never_plaintext(run_infra: RunInfra):
    run = run_infra("h200", secrets={"hfToken": HF_TOKEN, "wandbApiKey": WANDB_KEY})
    for secret in (HF_TOKEN, WANDB_KEY):
        for resource in run.resources:
            assert plaintext_paths(resource.raw_inputs, secret) == [], f"{secret} in {resource.type} {resource.name}"
        for name, value in run.outputs.items():
            if secret in str(value):
                assert name in run.secret_outputs, f"output {name} carries a secret in plaintext"


def test_missing_hf_token_stops_the_cli_before_the_program():
    """hfToken is declared without a default: the CLI refuses to run the program without it."""
    _, config = load_stack_config(ROOT, "dev")
    with pytest.raises(MissingConfigError, match="missing configuration value 'hfToken'"):
        run_program(ROOT, config, secrets={}, stack="dev")


def test_missing_hf_token_says_how_to_set_it_when_the_program_runs_anyway():
    """Without the CLI's check (the Automation API, an older CLI), the program's own message says how to set it."""
    _, config = load_stack_config(ROOT, "dev")
    with pytest.raises(ConfigError) as caught:
        run_program(ROOT, config, secrets={}, stack="dev", enforce_required=False)
    assert caught.value.key == "hfToken"
    assert "pulumi config set --secret hfToken" in str(caught.value)


def test_bad_config_registers_nothing(run_infra: RunInfra):
    from tools import offline

    monitor_calls: list[str] = []
    original = offline.RecordingMonitor.RegisterResource

    def spy(self, request):
        if request.type != "pulumi:pulumi:Stack":
            monitor_calls.append(request.type)
        return original(self, request)

    offline.RecordingMonitor.RegisterResource = spy  # type: ignore[method-assign]
    try:
        with pytest.raises(ConfigError):
            run_infra("dev", {"lustre": {"capacityGib": 1234}})
    finally:
        offline.RecordingMonitor.RegisterResource = original  # type: ignore[method-assign]
    assert monitor_calls == []


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def test_project_file_declares_every_plain_key_with_type_and_description():
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    declared = project["config"]
    for key, declaration in declared.items():
        assert declaration["type"] in ("string", "integer", "boolean", "array"), key  # what Pulumi's schema allows
        assert declaration.get("description"), key
        assert set(declaration) <= {"type", "description", "default", "secret", "items"}, key
    from config_rules import keys_of

    from infra.settings import MODEL

    plain = {key for key, field in keys_of(MODEL).items() if ":" not in key and not _is_model(field.annotation)}
    assert plain <= set(declared)
    assert declared["hfToken"]["secret"] is True and "default" not in declared["hfToken"]


def test_stack_files_carry_no_secrets():
    for stack in INFRA_STACKS:
        text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
        config = yaml.safe_load(text)["config"]
        assert not any(key.endswith(("hfToken", "wandbApiKey")) for key in config), stack
        assert "secure:" not in text


def test_h200_and_b200_stacks_differ_only_in_what_the_gpu_implies():
    h200 = yaml.safe_load(Path(ROOT / "Pulumi.h200.yaml").read_text())["config"]
    b200 = yaml.safe_load(Path(ROOT / "Pulumi.b200.yaml").read_text())["config"]
    differing = {key for key in h200.keys() | b200.keys() if h200.get(key) != b200.get(key)}
    gpu_bound = {
        "gcp:region",
        "nemo-rl-gke:zone",
        "nemo-rl-gke:gpuType",
        "nemo-rl-gke:reservation",
        "nemo-rl-gke:clusterName",
    }
    assert differing <= gpu_bound


@pytest.mark.parametrize("project_dir", [ROOT, ROOT / "jobs"], ids=["infra", "jobs"])
def test_stack_values_have_the_declared_types(project_dir: Path):
    """The CLI rejects a stack value whose type differs from the project's declaration: check it here first."""
    project = yaml.safe_load((project_dir / "Pulumi.yaml").read_text())
    python_types = {"string": str, "integer": int, "boolean": bool, "array": list}
    declared = {f"{project['name']}:{key}": python_types[d["type"]] for key, d in project["config"].items()}
    for key, declaration in project["config"].items():
        if "default" in declaration:
            assert isinstance(declaration["default"], python_types[declaration["type"]]), f"default of {key}"
    for stack in INFRA_STACKS:  # a user's stack may hold `secure:` values: not ours to judge
        stack_file = project_dir / f"Pulumi.{stack}.yaml"
        for key, value in (yaml.safe_load(stack_file.read_text())["config"] or {}).items():
            if key in declared:
                wanted = declared[key]
                ok = isinstance(value, wanted) and not (wanted is int and isinstance(value, bool))
                assert ok, f"{stack_file.name}: {key} = {value!r} is not a {wanted.__name__}"


def test_reservation_pool_starts_with_the_ray_nodes_only_without_the_autoscaler(run_infra: RunInfra):
    """Nodes at creation follow the Ray workers the cluster holds (not the pool's maximum), and only where nothing
    would scale them away: with the Ray autoscaler on, the reservation pool starts from zero like the others."""
    pool = run_infra("h200", {"gpuNodes": 3, "rayWorkerReplicas": 2}).one(NODE_POOL, "gpu").inputs
    assert (pool["initialNodeCount"], pool["autoscaling"]["totalMinNodeCount"]) == (2, 2)
    assert pool["autoscaling"]["totalMaxNodeCount"] == 3
    autoscaled = run_infra("h200", {"rayAutoscaling": "true"}).one(NODE_POOL, "gpu").inputs
    assert (autoscaled["initialNodeCount"], autoscaled["autoscaling"]["totalMinNodeCount"]) == (0, 0)
    spot = run_infra("h200", {"gpuProvisioning": "spot", "reservation": None}).one(NODE_POOL, "gpu").inputs
    assert spot["initialNodeCount"] == 0


def test_image_cache_disk_gives_gpu_nodes_a_secondary_boot_disk_with_image_streaming(run_infra: RunInfra):
    import json

    from infra.gke_rules import IMAGE_CACHE_DISK_MODE

    run = run_infra("dev", {"imageCacheDisk": "nemo-rl-v050-cache"})
    node = run.one(NODE_POOL, "gpu").inputs["nodeConfig"]
    assert node["secondaryBootDisks"] == [
        {"diskImage": "projects/my-gcp-project/global/images/nemo-rl-v050-cache", "mode": IMAGE_CACHE_DISK_MODE}
    ]
    assert node["gcfsConfig"] == {"enabled": True}  # GKE requires image streaming for the cache disk
    # The CPU pool is untouched; a disk image of another project is taken as given.
    assert "secondaryBootDisks" not in run.one(NODE_POOL, "gke-cpu").inputs["nodeConfig"]
    other = run_infra("dev", {"imageCacheDisk": "projects/images-prj/global/images/nemo-cache"})
    [disk] = other.one(NODE_POOL, "gpu").inputs["nodeConfig"]["secondaryBootDisks"]
    assert disk["diskImage"] == "projects/images-prj/global/images/nemo-cache"
    # Google's own API schema (the discovery document google-api-python-client ships) has the mode we send.
    import googleapiclient

    documents = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
    schema = json.loads((documents / "container.v1.json").read_text())["schemas"]
    assert IMAGE_CACHE_DISK_MODE in schema["SecondaryBootDisk"]["properties"]["mode"]["enum"]
    assert set(disk) <= set(schema["SecondaryBootDisk"]["properties"])
    assert "gcfsConfig" in schema["NodeConfig"]["properties"]
