"""The GKE Standard cluster, its node service account and the CPU node pool, plus a kubeconfig and provider."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.gke_rules import (
    KMS_ENCRYPTER_DECRYPTER_ROLE,
    MAINTENANCE_EXCLUSION_START,
    MONITORING_COMPONENTS,
    gke_service_agent,
)
from infra.iam import grant_project_roles
from infra.network import POD_RANGE_NAME, SERVICE_RANGE_NAME, Networks
from infra.services import ProjectServices
from infra.settings import ClusterSettings

# What a node needs and nothing more: write logs and metrics, read its own metadata, pull images.
NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/artifactregistry.reader",
)
CPU_POOL_NAME = "cpu-pool"
# The autoscaler owns how many nodes exist; initial counts are read back as the live count and would
# otherwise show as a diff (and initialNodeCount as a replacement) on every `pulumi up`.
AUTOSCALED_FIELDS = ["initialNodeCount", "nodeCount"]
# Node pools keep fixed names, so a pool that must be replaced (new machine type, provisioning mode or
# reservation) is deleted first: GKE refuses a second pool of the same name.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Secure boot and integrity monitoring on every node (see gke_rules: GKE's own GPU drivers are signed).
SHIELDED_NODE = {"enable_secure_boot": True, "enable_integrity_monitoring": True}


@dataclass(frozen=True)
class ClusterArgs:
    settings: ClusterSettings
    networks: Networks
    services: ProjectServices
    protect: bool = False  # Pulumi's protect on the cluster (protectCompute, infra.day2.compute_locks)


def build_kubeconfig(name: str, dns_endpoint: str) -> str:
    """A kubeconfig for the control plane's DNS endpoint, authenticating through gke-gcloud-auth-plugin: no static
    token is ever stored. The DNS endpoint serves a publicly trusted certificate, so no cluster CA is needed (as
    `gcloud container clusters get-credentials --dns-endpoint` writes it); IAM checks every request before the
    Kubernetes API server sees it."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": f"https://{dns_endpoint}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "users": [
            {
                "name": name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "gke-gcloud-auth-plugin",
                        "installHint": "gcloud components install gke-gcloud-auth-plugin",
                        "provideClusterInfo": True,
                    }
                },
            }
        ],
    }
    return json.dumps(config, indent=2)


def control_plane_access(
    authorized_networks: tuple[str, ...],
) -> tuple[
    gcp.container.ClusterControlPlaneEndpointsConfigArgs, gcp.container.ClusterMasterAuthorizedNetworksConfigArgs | None
]:
    """The DNS endpoint always on (IAM-gated, reachable wherever Google APIs are); the IP endpoint only when
    authorized networks are given, and then for those ranges alone (not even Google Cloud's public IPs)."""
    endpoints = gcp.container.ClusterControlPlaneEndpointsConfigArgs(
        dns_endpoint_config=gcp.container.ClusterControlPlaneEndpointsConfigDnsEndpointConfigArgs(
            allow_external_traffic=True
        ),
        ip_endpoints_config=gcp.container.ClusterControlPlaneEndpointsConfigIpEndpointsConfigArgs(
            enabled=bool(authorized_networks)
        ),
    )
    if not authorized_networks:
        return endpoints, None
    return endpoints, gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
        cidr_blocks=[
            gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(
                cidr_block=cidr, display_name=f"authorizedNetworks-{n}"
            )
            for n, cidr in enumerate(authorized_networks)
        ],
        gcp_public_cidrs_access_enabled=False,
    )


def database_encryption(key_name: str | None) -> gcp.container.ClusterDatabaseEncryptionArgs:
    """Secrets in etcd encrypted with the given Cloud KMS key, or GKE's default encryption at rest (stated, so that
    removing the key is a visible change)."""
    if key_name:
        return gcp.container.ClusterDatabaseEncryptionArgs(state="ENCRYPTED", key_name=key_name)
    return gcp.container.ClusterDatabaseEncryptionArgs(state="DECRYPTED")


def maintenance_policy(window_start: str, exclusion: str | None) -> gcp.container.ClusterMaintenancePolicyArgs:
    """A daily window for what GKE must still do, and (by default) an exclusion that keeps GKE from upgrading or
    recreating nodes until the minor version's end of support, so no Ray worker is drained mid-run (Cluster Toolkit's
    gke-a3-ultragpu and gke-a4 blueprints do the same). Upgrade nodes yourself between runs."""
    exclusions = []
    if exclusion:
        exclusions.append(
            gcp.container.ClusterMaintenancePolicyMaintenanceExclusionArgs(
                exclusion_name="no-node-upgrades-during-training",
                start_time=MAINTENANCE_EXCLUSION_START,
                exclusion_options=gcp.container.ClusterMaintenancePolicyMaintenanceExclusionExclusionOptionsArgs(
                    scope=exclusion, end_time_behavior="UNTIL_END_OF_SUPPORT"
                ),
            )
        )
    return gcp.container.ClusterMaintenancePolicyArgs(
        daily_maintenance_window=gcp.container.ClusterMaintenancePolicyDailyMaintenanceWindowArgs(
            start_time=window_start
        ),
        maintenance_exclusions=exclusions or None,
    )


class GkeCluster(pulumi.ComponentResource):
    """Regional GKE Standard cluster with Workload Identity, Dataplane V2, multi-networking, the RayOperator
    and Lustre CSI add-ons, a least-privilege node service account and a CPU pool for system pods and Ray's head."""

    cluster: gcp.container.Cluster
    node_service_account: gcp.serviceaccount.Account
    node_roles: list[gcp.projects.IAMMember]
    cpu_pool: gcp.container.NodePool
    kms_binding: gcp.kms.CryptoKeyIAMMember | None
    dns_endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    cluster_identifier: pulumi.Output[str]
    cluster_instance: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:GkeCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.node_service_account = gcp.serviceaccount.Account(
            f"{name}-nodes",
            account_id=f"{args.settings.cluster_name}-nodes",
            display_name=f"GKE nodes of {args.settings.cluster_name}",
            project=args.settings.project,
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.services.needed_by("iam")),
        )
        self.node_roles = grant_project_roles(
            f"{name}-nodes",
            args.settings.project,
            self.node_service_account.member,
            NODE_ROLES,
            parent=self,
            apis=args.services.needed_by("cloudresourcemanager"),
        )

        # GKE's service agent must be able to use the KMS key before the cluster is created with it. The agent
        # exists once the Kubernetes Engine API is on.
        self.kms_binding = None
        if args.settings.database_encryption_key:
            project_number = gcp.organizations.get_project_output(
                project_id=args.settings.project, opts=pulumi.InvokeOutputOptions(parent=self)
            ).number
            self.kms_binding = gcp.kms.CryptoKeyIAMMember(
                f"{name}-secrets-key",
                crypto_key_id=args.settings.database_encryption_key,
                role=KMS_ENCRYPTER_DECRYPTER_ROLE,
                member=project_number.apply(lambda number: f"serviceAccount:{gke_service_agent(str(number))}"),
                opts=pulumi.ResourceOptions(parent=self, depends_on=args.services.needed_by("container")),
            )
        endpoints, authorized_networks = control_plane_access(args.settings.authorized_networks)

        self.cluster = gcp.container.Cluster(
            name,
            name=args.settings.cluster_name,
            project=args.settings.project,
            location=args.settings.region,
            network=args.networks.cluster_network.id,
            subnetwork=args.networks.cluster_subnet.id,
            networking_mode="VPC_NATIVE",
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(
                cluster_secondary_range_name=POD_RANGE_NAME,
                services_secondary_range_name=SERVICE_RANGE_NAME,
            ),
            datapath_provider="ADVANCED_DATAPATH",
            enable_multi_networking=True,
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=f"{args.settings.project}.svc.id.goog"
            ),
            addons_config=gcp.container.ClusterAddonsConfigArgs(
                ray_operator_configs=[
                    gcp.container.ClusterAddonsConfigRayOperatorConfigArgs(
                        enabled=True,
                        # Off: it has GKE inject its own Fluent Bit into every Ray pod, beside our pinned sidecar
                        # (workloads/ray_values.py), which ships the same files. Ours stays: its image and its
                        # requests are ours, so the pod-fit check counts exactly what runs; GKE's requests are not
                        # published and changed between patch versions (ai-on-gke PR #817).
                        ray_cluster_logging_config=gcp.container.ClusterAddonsConfigRayOperatorConfigRayClusterLoggingConfigArgs(
                            enabled=False
                        ),
                        ray_cluster_monitoring_config=gcp.container.ClusterAddonsConfigRayOperatorConfigRayClusterMonitoringConfigArgs(
                            enabled=True
                        ),
                    )
                ],
                # Port 6988: Lustre's default 988 clashes with gke-metadata-server, which Workload Identity needs.
                lustre_csi_driver_config=gcp.container.ClusterAddonsConfigLustreCsiDriverConfigArgs(
                    enabled=True, enable_legacy_lustre_port=True
                ),
            ),
            # Declared, not left to GKE's defaults: Managed Prometheus (the Ray metrics port and DCGM go there) and
            # DCGM's GPU metrics, where GPU utilisation is seen (see docs/operations.md, Following the run).
            monitoring_config=gcp.container.ClusterMonitoringConfigArgs(
                enable_components=list(MONITORING_COMPONENTS),
                managed_prometheus=gcp.container.ClusterMonitoringConfigManagedPrometheusArgs(enabled=True),
            ),
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=args.settings.release_channel),
            min_master_version=args.settings.gke_version,
            maintenance_policy=maintenance_policy(
                args.settings.maintenance_window_start, args.settings.maintenance_exclusion
            ),
            # Nodes without external IPs (Private Service Connect: no control-plane CIDR to pick); Cloud NAT gives
            # them the internet. Pulumi's docs advise leaving the block out rather than setting it false.
            private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(enable_private_nodes=True)
            if args.settings.private_nodes
            else None,
            control_plane_endpoints_config=endpoints,
            master_authorized_networks_config=authorized_networks,
            # No client certificate is issued: every identity goes through IAM (and RBAC).
            master_auth=gcp.container.ClusterMasterAuthArgs(
                client_certificate_config=gcp.container.ClusterMasterAuthClientCertificateConfigArgs(
                    issue_client_certificate=False
                )
            ),
            enable_shielded_nodes=True,
            database_encryption=database_encryption(args.settings.database_encryption_key),
            # Node pools are managed below; the default pool only exists while the cluster is created.
            remove_default_node_pool=True,
            initial_node_count=1,
            node_config=gcp.container.ClusterNodeConfigArgs(
                service_account=self.node_service_account.email,
                oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                shielded_instance_config=gcp.container.ClusterNodeConfigShieldedInstanceConfigArgs(**SHIELDED_NODE),
            ),
            deletion_protection=args.settings.deletion_protection,
            opts=pulumi.ResourceOptions(
                parent=self,
                # GKE turns on system logging and monitoring at creation: those APIs must be on too.
                depends_on=[
                    *args.services.needed_by("container", "logging", "monitoring"),
                    *([self.kms_binding] if self.kms_binding else []),
                ],
                ignore_changes=["nodeConfig", "initialNodeCount"],
                # The engine refuses to delete or replace it while protected (protectCompute).
                protect=args.protect,
            ),
        )

        self.cpu_pool = gcp.container.NodePool(
            f"{name}-cpu",
            name=CPU_POOL_NAME,
            project=args.settings.project,
            cluster=self.cluster.id,
            location=args.settings.region,
            # The head sits in the GPU zone, beside the workers and the zonal Lustre instance.
            node_locations=[args.settings.zone],
            initial_node_count=args.settings.cpu_pool_min_nodes,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                total_min_node_count=args.settings.cpu_pool_min_nodes,
                total_max_node_count=args.settings.cpu_pool_max_nodes,
                location_policy="BALANCED",
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=args.settings.cpu_machine_type,
                disk_type="pd-balanced",
                disk_size_gb=500,  # the NeMo RL image is tens of GB
                service_account=self.node_service_account.email,
                oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(**SHIELDED_NODE),
            ),
            # Nodes pull images and write logs with these roles from their first boot.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=self.node_roles, ignore_changes=AUTOSCALED_FIELDS, delete_before_replace=True
            ),
        )

        # Pulumi and kubectl reach the API through the DNS endpoint only (the IP endpoint may well be off).
        self.dns_endpoint = self.cluster.control_plane_endpoints_config.apply(
            lambda config: str(config.dns_endpoint_config.endpoint)  # type: ignore[union-attr]
        )
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(self.cluster.name, self.dns_endpoint).apply(
                lambda parts: build_kubeconfig(str(parts[0]), str(parts[1]))
            )
        )
        # Only a new cluster replaces the provider (and with it every Kubernetes object of the stack); a changed
        # kubeconfig (endpoint, CA rotation, the DNS endpoint) is an update. The id names project, location and
        # cluster; a cluster replaced under the same name is caught by the engine, which replaces the dependents
        # of a delete-before-replace whose inputs come from it (this one does).
        self.cluster_identifier = self.cluster.id
        # The id is the same for a cluster replaced under the same name; its DNS endpoint is not (it names the
        # cluster's uid: gke-<uid>-<project number>.<location>.gke.goog). The job stack's provider, which no engine
        # dependency ties to this cluster, takes both as its cluster_identifier, so it follows a replaced cluster.
        self.cluster_instance = pulumi.Output.concat(self.cluster.id, "@", self.dns_endpoint)
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            cluster_identifier=self.cluster_identifier,
            enable_server_side_apply=True,
            # A Secret's new data (a new hfToken or wandbApiKey) is applied in place; without this pulumi-kubernetes
            # replaces the Secret (provider/pkg/provider/diff.go, forceNewProperties): deleted, then created, and a
            # Ray pod starting in between fails to start.
            enable_secret_mutable=True,
            opts=child,
        )

        self.register_outputs(
            {
                "clusterName": self.cluster.name,
                "location": self.cluster.location,
                "cpuPool": self.cpu_pool.name,
                "nodeServiceAccount": self.node_service_account.email,
                "dnsEndpoint": self.dns_endpoint,
                "kubeconfig": self.kubeconfig,
            }
        )
