"""The Google APIs the stack calls, enabled by the program itself, so a brand-new project needs no manual step."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

# Every API this program's resources call, and what calls it. (Enabling them goes through the Service Usage API,
# which every project has on from its creation.)
REQUIRED_APIS: dict[str, str] = {
    "compute.googleapis.com": "VPCs, subnets, firewall rules, the peering range; GKE nodes",
    "container.googleapis.com": "the GKE cluster and its node pools",
    "lustre.googleapis.com": "the Managed Lustre instance",
    "servicenetworking.googleapis.com": "private services access: the peering Lustre is reached through",
    "iam.googleapis.com": "the node and Ray service accounts, Workload Identity binding",
    "cloudresourcemanager.googleapis.com": "project-level role grants",
    "logging.googleapis.com": "the cluster's system logs; Ray logs (Fluent Bit ships to Cloud Logging)",
    "monitoring.googleapis.com": "the cluster's system metrics; Managed Prometheus scrapes the Ray head",
    "storage.googleapis.com": "the model export bucket and the Ray service account's access to it",
}


# What the person (or CI identity) running `pulumi up` needs on the project: Owner, or exactly these. Editor is not
# enough: it cannot grant project roles, and private services access needs compute.networkAdmin's peering rights.
DEPLOYER_ROLES: dict[str, str] = {
    "roles/serviceusage.serviceUsageAdmin": "enable the APIs above",
    "roles/compute.networkAdmin": "VPCs, subnets, the peering range, private services access, Cloud Router and NAT",
    "roles/compute.securityAdmin": "the gVNIC and Lustre firewall rules",
    "roles/servicenetworking.networksAdmin": "the Service Networking peering",
    "roles/container.admin": "the cluster, node pools and every Kubernetes object",
    "roles/lustre.admin": "the Managed Lustre instance",
    "roles/iam.serviceAccountAdmin": "the node and Ray service accounts, the Workload Identity binding",
    "roles/iam.serviceAccountUser": "run nodes as the node service account",
    "roles/resourcemanager.projectIamAdmin": "grant the service accounts their project roles",
    "roles/storage.admin": "the model export bucket and its IAM binding (exportBucket)",
}


@dataclass(frozen=True)
class ProjectServicesArgs:
    project: str


class ProjectServices(pulumi.ComponentResource):
    """One `Service` per required API. Never disabled on destroy: other things in the project may use them, and
    disabling e.g. compute would take down far more than this stack."""

    services: dict[str, gcp.projects.Service]

    def __init__(self, name: str, args: ProjectServicesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:infra:ProjectServices", name, None, opts)
        self.services = {
            api: gcp.projects.Service(
                f"{name}-{api.split('.')[0]}",
                project=args.project,
                service=api,
                disable_on_destroy=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for api in REQUIRED_APIS
        }
        self.register_outputs({"enabled": [service.service for service in self.services.values()]})

    def needed_by(self, *apis: str) -> list[pulumi.Resource]:
        """The Service resources a resource calling these APIs must wait for."""
        return [self.services[f"{api}.googleapis.com"] for api in apis]
