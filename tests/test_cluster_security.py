"""The cluster a security review would pass (issue 17, GCP side): private nodes and Cloud NAT on the cluster VPC
only, a control plane reached through its IAM-gated DNS endpoint (IP endpoint off or fenced by authorizedNetworks),
no client certificates, shielded nodes on both pools, optional KMS secrets encryption, image digests. The GKE and
Compute arguments are also held against Google's own API schemas: the discovery documents google-api-python-client
ships (container v1, compute v1)."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from config_rules import validated
from conftest import INFRA_STACKS, ROOT, run_infra_stack, shared_infra_run
from upstream import reference

from infra import gke_rules
from infra.cluster import build_kubeconfig
from infra.nemo_rl_releases import release_for
from infra.settings import ConfigError, InfraSettings
from tools.offline import MOCK_PROJECT_NUMBER, load_stack_config, mock_dns_endpoint, run_program
from workloads.ray_values import build_ray_values, split_image
from workloads.stack import RELEASE_NAME

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
ROUTER = "gcp:compute/router:Router"
NAT = "gcp:compute/routerNat:RouterNat"
KMS_MEMBER = "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember"

BASE = {"gcp:project": "p", "gcp:region": "europe-west1", "zone": "europe-west1-b", "gpuType": "nvidia-h200-141gb"}
SPOT = {**BASE, "gpuProvisioning": "spot"}
KEY = "projects/my-kms-project/locations/europe-west1/keyRings/gke/cryptoKeys/secrets"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def settings_with(**values: Any):
    return validated(InfraSettings, {**SPOT, **values})


def expect_error(key: str, fragment: str, **values: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        settings_with(**values)
    assert caught.value.key == key, str(caught.value)
    assert fragment in str(caught.value), str(caught.value)
    return caught.value


# --- settings ---------------------------------------------------------------------------------------------------


def test_secure_defaults():
    settings = settings_with()
    assert settings.private_nodes is True
    assert settings.authorized_networks == ()
    assert settings.database_encryption_key is None


def test_private_nodes_can_be_turned_off_and_is_a_boolean():
    assert settings_with(privateNodes="false").private_nodes is False
    assert settings_with(privateNodes=True).private_nodes is True
    expect_error("privateNodes", "true or false", privateNodes="yes")


@pytest.mark.parametrize(
    "raw",
    [
        ["203.0.113.0/24", "198.51.100.7/32"],
        '["203.0.113.0/24", "198.51.100.7/32"]',  # as Pulumi hands a list from the stack file
        "203.0.113.0/24, 198.51.100.7/32",  # as `pulumi config set authorizedNetworks A,B` stores it
    ],
)
def test_authorized_networks_forms(raw: Any):
    assert settings_with(authorizedNetworks=raw).authorized_networks == ("203.0.113.0/24", "198.51.100.7/32")


def test_empty_authorized_networks_is_none():
    empties: tuple[Any, ...] = ([], "[]", "", None)
    for empty in empties:
        assert settings_with(authorizedNetworks=empty).authorized_networks == ()


@pytest.mark.parametrize(
    ("raw", "key", "fragment"),
    [
        (["203.0.113.1/24"], "authorizedNetworks[0]", "no host bits"),
        (["203.0.113.0/24", "not-a-cidr"], "authorizedNetworks[1]", "IPv4 CIDR"),
        (["2001:db8::/32"], "authorizedNetworks[0]", "IPv4"),
        (["0.0.0.0/0"], "authorizedNetworks[0]", "/8 or narrower"),
        (["203.0.113.0/24", "198.51.100.0/24", "203.0.113.0/24"], "authorizedNetworks[2]", "authorizedNetworks[0]"),
        ([f"10.{n}.0.0/16" for n in range(51)], "authorizedNetworks", "at most 50"),
        ('{"cidr": "203.0.113.0/24"}', "authorizedNetworks", "a list of CIDR ranges"),
        ("[203.0.113.0/24", "authorizedNetworks", "a list of CIDR ranges"),
    ],
)
def test_bad_authorized_networks_name_the_item(raw: Any, key: str, fragment: str):
    error = expect_error(key, fragment, authorizedNetworks=raw)
    assert "is not allowed" in str(error)


def test_kms_key_is_checked_for_form_and_region():
    assert settings_with(databaseEncryptionKey=KEY).database_encryption_key == KEY
    assert settings_with(databaseEncryptionKey="").database_encryption_key is None
    expect_error(
        "databaseEncryptionKey",
        "locations/europe-west1",
        databaseEncryptionKey=KEY.replace("europe-west1", "us-central1"),
    )
    expect_error(
        "databaseEncryptionKey", "cluster's region", databaseEncryptionKey=KEY.replace("europe-west1", "global")
    )
    for bad in (
        f"{KEY}/cryptoKeyVersions/1",  # a key version, not the key
        "projects/my-kms-project/locations/europe-west1/keyRings/gke",  # a key ring
        "my-kms-project/europe-west1/gke/secrets",  # the provider's short form is not GKE's key name
        KEY.replace("projects/my-kms-project", "projects/My_Project"),
    ):
        expect_error(
            "databaseEncryptionKey", "projects/PROJECT/locations/europe-west1/keyRings/RING", databaseEncryptionKey=bad
        )


def test_image_digest_pins_the_image_and_the_tag_still_picks_the_release():
    for tag, ray in (("v0.5.0", "2.49.2"), ("v0.7.0", "2.55.1")):
        image = f"nvcr.io/nvidia/nemo-rl:{tag}@{DIGEST}"
        settings = settings_with(nemoRlImage=image)
        assert settings.nemo_rl_image == image  # the full reference, digest and all
        assert settings.nemo_rl_release is release_for(image) is release_for(f"nvcr.io/nvidia/nemo-rl:{tag}")
        assert settings.ray_version == ray
    mirror = f"reg.local:5000/nvidia/nemo-rl:v0.7.0@{DIGEST}"
    assert settings_with(nemoRlImage=mirror).ray_version == "2.55.1"


@pytest.mark.parametrize(
    ("image", "fragment"),
    [
        (f"nvcr.io/nvidia/nemo-rl:v0.5.0@sha256:{'0' * 63}", "64 lowercase hex"),
        (f"nvcr.io/nvidia/nemo-rl:v0.5.0@sha256:{'A' * 64}", "64 lowercase hex"),
        (f"nvcr.io/nvidia/nemo-rl:v0.5.0@sha512:{'0' * 128}", "sha256:"),
        ("nvcr.io/nvidia/nemo-rl:v0.5.0@", "sha256:"),
        (f"nvcr.io/nvidia/nemo-rl:v0.5.0@{DIGEST}@{DIGEST}", "sha256:"),
        (f"nvcr.io/nvidia/nemo-rl@{DIGEST}", "pinned tag"),  # no tag: the release could not be known
        (f"nvcr.io/nvidia/nemo-rl:latest@{DIGEST}", "pinned tag"),
    ],
)
def test_bad_digests_and_tags_are_refused(image: str, fragment: str):
    expect_error("nemoRlImage", fragment, nemoRlImage=image)


def test_private_nodes_floor_is_a_documented_rule():
    floors = gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "spot", private_nodes=True)
    assert gke_rules.PRIVATE_NODES_PSC_FLOOR in floors
    assert gke_rules.below_floor("1.28.15-gke.1000", gke_rules.PRIVATE_NODES_PSC_FLOOR)
    assert not gke_rules.below_floor("1.29", gke_rules.PRIVATE_NODES_PSC_FLOOR)
    assert gke_rules.PRIVATE_NODES_PSC_FLOOR not in gke_rules.version_floors(gke_rules.LUSTRE_CSI_FLOOR, "spot")


# --- the program under mocks ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=INFRA_STACKS)
def shipped(request: pytest.FixtureRequest):
    return request.param, shared_infra_run(request.param)


def test_shipped_stacks_are_private_with_a_fenced_control_plane(shipped):
    _, run = shipped
    cluster = run.one(CLUSTER).inputs
    # Private Service Connect: private nodes without a control-plane CIDR or peering.
    assert cluster["privateClusterConfig"] == {"enablePrivateNodes": True}
    assert cluster["controlPlaneEndpointsConfig"] == {
        "dnsEndpointConfig": {"allowExternalTraffic": True},
        "ipEndpointsConfig": {"enabled": False},
    }
    assert "masterAuthorizedNetworksConfig" not in cluster
    assert cluster["masterAuth"] == {"clientCertificateConfig": {"issueClientCertificate": False}}
    assert cluster["enableShieldedNodes"] is True
    assert cluster["databaseEncryption"] == {"state": "DECRYPTED"}
    assert run.of_type(KMS_MEMBER) == []


def test_authorized_networks_open_the_ip_endpoint_to_those_ranges_only(run_infra):
    run = run_infra("h200", {"authorizedNetworks": ["203.0.113.0/24", "198.51.100.7/32"]})
    cluster = run.one(CLUSTER).inputs
    assert cluster["controlPlaneEndpointsConfig"]["ipEndpointsConfig"] == {"enabled": True}
    assert cluster["controlPlaneEndpointsConfig"]["dnsEndpointConfig"] == {"allowExternalTraffic": True}
    networks = cluster["masterAuthorizedNetworksConfig"]
    assert [block["cidrBlock"] for block in networks["cidrBlocks"]] == ["203.0.113.0/24", "198.51.100.7/32"]
    assert networks["gcpPublicCidrsAccessEnabled"] is False  # not every Google Cloud VM's public IP


def test_nat_on_the_cluster_vpc_only(shipped):
    stack, run = shipped
    prefix = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]["nemo-rl-gke:clusterName"]
    networks = {r.name: r for r in run.of_type("gcp:compute/network:Network")}
    router = run.one(ROUTER)
    cluster_network_id = f"projects/my-gcp-project/global/networks/{networks['networks-cluster'].inputs['name']}"
    assert router.inputs["network"] == cluster_network_id  # and so neither the gVNIC nor the RDMA VPC
    assert router.inputs["name"] == f"{prefix}-router"
    nat = run.one(NAT).inputs
    assert nat["router"] == router.inputs["name"] and nat["region"] == router.inputs["region"]
    assert nat["natIpAllocateOption"] == "AUTO_ONLY"
    assert nat["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
    cluster_subnet = run.one("gcp:compute/subnetwork:Subnetwork", "networks-cluster")
    subnet_id = f"projects/my-gcp-project/regions/{cluster_subnet.inputs['region']}/subnetworks/{prefix}-subnet"
    assert nat["subnetworks"] == [{"name": subnet_id, "sourceIpRangesToNats": ["ALL_IP_RANGES"]}]
    assert nat["logConfig"] == {"enable": True, "filter": "ERRORS_ONLY"}
    egress = run.one("nemo-rl-gke:infra:ClusterEgress")
    assert router.parent == egress.urn and run.one(NAT).parent == egress.urn


def test_public_nodes_get_neither_private_config_nor_nat(run_infra):
    run = run_infra("dev", {"privateNodes": False})
    assert "privateClusterConfig" not in run.one(CLUSTER).inputs
    assert run.of_type(ROUTER) == [] and run.of_type(NAT) == []
    assert run.of_type("nemo-rl-gke:infra:ClusterEgress") == []


def test_secure_boot_and_integrity_monitoring_on_both_pools(shipped):
    _, run = shipped
    shielded = {"enableSecureBoot": True, "enableIntegrityMonitoring": True}
    pools = {r.inputs["name"]: r.inputs for r in run.of_type(NODE_POOL)}
    assert set(pools) == {"cpu-pool", "gpu-pool"}
    for pool in pools.values():
        assert pool["nodeConfig"]["shieldedInstanceConfig"] == shielded
    # Secure boot with GKE's own (signed) GPU driver, as Cluster Toolkit's A3 Ultra/A4 GPU pools run it.
    (accelerator,) = pools["gpu-pool"]["nodeConfig"]["guestAccelerators"]
    assert accelerator["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "DEFAULT"}
    # The default pool, which lives only while the cluster is created, too.
    assert run.one(CLUSTER).inputs["nodeConfig"]["shieldedInstanceConfig"] == shielded


def test_kms_key_grant_only_when_set_and_before_the_cluster(run_infra):
    run = run_infra("b200", {"databaseEncryptionKey": KEY.replace("europe-west1", "us-central1")})
    key = KEY.replace("europe-west1", "us-central1")
    cluster = run.one(CLUSTER)
    assert cluster.inputs["databaseEncryption"] == {"state": "ENCRYPTED", "keyName": key}
    grant = run.one(KMS_MEMBER)
    assert grant.inputs == {
        "cryptoKeyId": key,
        "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
        # GKE's service agent of the cluster's project (its number read from the project).
        "member": f"serviceAccount:service-{MOCK_PROJECT_NUMBER}@container-engine-robot.iam.gserviceaccount.com",
    }
    assert grant.urn in cluster.dependencies  # GKE checks the key when it creates the cluster
    assert run.depends_on(grant, run.one("gcp:projects/service:Service", "apis-container"))
    assert grant.parent == run.one("nemo-rl-gke:infra:GkeCluster").urn


def test_pulumi_reaches_the_api_through_the_dns_endpoint(shipped):
    """The Kubernetes provider and the kubeconfig output both use the DNS endpoint GKE reports, never the IP."""
    _, run = shipped
    region = run.one(CLUSTER).inputs["location"]
    provider = yaml.safe_load(run.one("pulumi:providers:kubernetes").inputs["kubeconfig"])
    assert provider["clusters"][0]["cluster"] == {"server": f"https://{mock_dns_endpoint(region)}"}
    assert provider == yaml.safe_load(run.outputs["kubeconfig"])
    assert json.loads(build_kubeconfig("c", "gke-x.europe-west1.gke.goog"))["clusters"][0]["cluster"] == {
        "server": "https://gke-x.europe-west1.gke.goog"
    }


# --- against Google's API schemas -------------------------------------------------------------------------------


def discovery(api: str) -> dict[str, Any]:
    """The discovery document google-api-python-client (requirements-dev.txt) ships for `api` (e.g. container.v1)."""
    documents = resources.files("googleapiclient.discovery_cache") / "documents"
    return json.loads((documents / f"{api}.json").read_text())


def api_violations(value: Any, schema: dict[str, Any], schemas: dict[str, Any], path: str) -> list[str]:
    """Where `value` does not fit the discovery `schema`: unknown fields, output-only fields set, wrong types,
    values outside an enum."""
    if "$ref" in schema:
        schema = schemas[schema["$ref"]]
    if str(schema.get("description", "")).startswith("Output only"):
        return [f"{path}: output only"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        found = []
        for key, item in value.items():
            if key not in schema.get("properties", {}):
                found.append(f"{path}.{key}: no such field")
            else:
                found += api_violations(item, schema["properties"][key], schemas, f"{path}.{key}")
        return found
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [
            p for n, item in enumerate(value) for p in api_violations(item, schema["items"], schemas, f"{path}[{n}]")
        ]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: not a boolean"]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: not a string"]
        return (
            [f"{path}: {value!r} not in {schema['enum']}"] if "enum" in schema and value not in schema["enum"] else []
        )
    return []


# Our Cluster arguments that share GKE's API names and shapes (pulumi-gcp's maintenancePolicy, enableShieldedNodes
# and a few others are shaped differently by the provider, so they are not compared field by field).
CLUSTER_FIELDS = (
    "privateClusterConfig",
    "controlPlaneEndpointsConfig",
    "masterAuthorizedNetworksConfig",
    "masterAuth",
    "databaseEncryption",
    "nodeConfig",
)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"authorizedNetworks": ["203.0.113.0/24"], "databaseEncryptionKey": KEY}, {"privateNodes": False}],
    ids=["default", "fenced-ip-and-kms", "public-nodes"],
)
def test_cluster_arguments_fit_the_container_v1_api(run_infra, overrides: dict[str, Any]):
    container = discovery("container.v1")
    schemas = container["schemas"]
    run = run_infra("dev", overrides)
    cluster = run.one(CLUSTER).inputs
    body = {field: cluster[field] for field in CLUSTER_FIELDS if field in cluster}
    assert api_violations(body, schemas["Cluster"], schemas, "Cluster") == []
    for pool in run.of_type(NODE_POOL):
        shielded = {"shieldedInstanceConfig": pool.inputs["nodeConfig"]["shieldedInstanceConfig"]}
        assert api_violations(shielded, schemas["NodeConfig"], schemas, pool.name) == []
    # Combinations the API documents as invalid (field descriptions in the discovery document).
    endpoints = cluster["controlPlaneEndpointsConfig"]
    assert "authorizedNetworksConfig" not in endpoints["ipEndpointsConfig"]  # not both with masterAuthorizedNetworks
    assert "enablePublicEndpoint" not in endpoints["ipEndpointsConfig"] or "enablePrivateEndpoint" not in cluster.get(
        "privateClusterConfig", {}
    )
    assert "defaultEnablePrivateNodes" not in cluster.get("networkConfig", {})  # not both with enablePrivateNodes
    # What gke_rules takes from the same document.
    assert "up to 50" in schemas["MasterAuthorizedNetworksConfig"]["properties"]["cidrBlocks"]["description"]
    assert gke_rules.MAX_AUTHORIZED_NETWORKS == 50
    example = schemas["DatabaseEncryption"]["properties"]["keyName"]["description"].split("Ex. ")[1].split()[0]
    assert gke_rules.KMS_KEY_RE.match(example), example
    assert {"ENCRYPTED", "DECRYPTED"} <= set(schemas["DatabaseEncryption"]["properties"]["state"]["enum"])


def test_nat_arguments_fit_the_compute_v1_api(run_infra):
    schemas = discovery("compute.v1")["schemas"]
    nat = run_infra("dev").one(NAT).inputs
    # pulumi-gcp's only rename here: sourceIpRangesToNats is the API's sourceIpRangesToNat.
    body = {
        key: copy.deepcopy(nat[key])
        for key in ("name", "natIpAllocateOption", "sourceSubnetworkIpRangesToNat", "subnetworks", "logConfig")
    }
    for subnet in body["subnetworks"]:
        subnet["sourceIpRangesToNat"] = subnet.pop("sourceIpRangesToNats")
    assert api_violations(body, schemas["RouterNat"], schemas, "RouterNat") == []


def test_the_schema_check_catches_what_it_should():
    """The checker itself: a misspelt field, an output-only field and a value outside an enum are each caught."""
    schemas = discovery("container.v1")["schemas"]
    bad = {
        "masterAuth": {"issueClientCertificate": False},  # belongs one level down
        "databaseEncryption": {"state": "ON", "currentState": "CURRENT_STATE_ENCRYPTED"},
        "controlPlaneEndpointsConfig": {"dnsEndpointConfig": {"allowExternalTraffic": "yes"}},
    }
    assert sorted(api_violations(bad, schemas["Cluster"], schemas, "Cluster")) == [
        "Cluster.controlPlaneEndpointsConfig.dnsEndpointConfig.allowExternalTraffic: not a boolean",
        "Cluster.databaseEncryption.currentState: output only",
        "Cluster.databaseEncryption.state: 'ON' not in "
        "['UNKNOWN', 'ENCRYPTED', 'DECRYPTED', 'ALL_OBJECTS_ENCRYPTION_ENABLED']",
        "Cluster.masterAuth.issueClientCertificate: no such field",
    ]


# --- the digest reaches every pod that runs the image ----------------------------------------------------------


def test_split_image_keeps_the_digest_with_the_tag():
    assert split_image(f"nvcr.io/nvidia/nemo-rl:v0.5.0@{DIGEST}") == ("nvcr.io/nvidia/nemo-rl", f"v0.5.0@{DIGEST}")
    assert split_image(f"reg.local:5000/nemo-rl:v1@{DIGEST}") == ("reg.local:5000/nemo-rl", f"v1@{DIGEST}")
    with pytest.raises(ValueError):
        split_image(f"nvcr.io/nvidia/nemo-rl@{DIGEST}")


def test_rendered_ray_pods_run_the_digest_pinned_image():
    """The real ray-cluster chart writes `repository:tag`: with the digest on the tag, head and workers get the
    full reference."""
    from test_ray_values import make_refs

    image = f"nvcr.io/nvidia/nemo-rl:v0.7.0@{DIGEST}"
    values = build_ray_values(settings_with(nemoRlImage=image), make_refs())
    chart = helm_python.Chart.load(str(reference("kuberay-v1.5.1") / Path("helm-chart", "ray-cluster")))
    rendered = chart.render(values, name=RELEASE_NAME, namespace="default")
    (cluster,) = [
        doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "RayCluster"
    ]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    workers = [c for group in cluster["spec"]["workerGroupSpecs"] for c in group["template"]["spec"]["containers"]]
    ray_containers = [c for c in head + workers if c["name"] != "fluent-bit"]
    assert ray_containers and {c["image"] for c in ray_containers} == {image}


def test_job_submitter_runs_the_digest_pinned_image():
    image = f"nvcr.io/nvidia/nemo-rl:v0.5.0@{DIGEST}"
    infra = run_infra_stack("dev", {"nemoRlImage": image})
    assert infra.outputs["nemoRlImage"] == image
    jobs = ROOT / "jobs"
    project, config = load_stack_config(jobs, "dev")
    reference_name = config[f"{project}:infraStack"]
    run = run_program(
        jobs,
        config,
        stack="dev",
        stack_outputs={reference_name: infra.outputs},
        stack_secret_outputs={reference_name: infra.secret_outputs},
    )
    (container,) = run.one("kubernetes:batch/v1:Job").inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image
