"""Workload Identity for the Ray pods: Kubernetes service accounts acting as one least-privilege GCP account.

Two Kubernetes accounts, both bound to the GCP one (every Ray pod ships its logs): the head's, whose token only
KubeRay's autoscaler container mounts (KubeRay grants it patch on pods and the RayCluster), and the GPU workers',
which has no Kubernetes token at all. Neither mounts its token by default (automountServiceAccountToken: false on the
account: the chart has no pod-level key); GKE's metadata server identifies the pod for Workload Identity without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.iam import grant_project_roles

# Ray pods ship logs (fluent-bit). Object access is granted on the export bucket alone, not project-wide.
RAY_POD_ROLES = ("roles/logging.logWriter",)
EXPORT_BUCKET_ROLE = "roles/storage.objectUser"  # list, read, create and replace objects; no bucket settings or IAM


@dataclass(frozen=True)
class RayIdentityArgs:
    project: str
    account_id: str
    namespace: pulumi.Input[str]
    kubernetes_service_account: str  # the head's
    worker_service_account: str  # the GPU workers'
    cluster: gcp.container.Cluster
    iam_api: Sequence[pulumi.Resource]  # the Service resources of the IAM ...
    resource_manager_api: Sequence[pulumi.Resource]  # ... and Resource Manager APIs
    export_bucket: pulumi.Input[str] | None  # the bucket models are copied to, if any
    storage_api: Sequence[pulumi.Resource]  # the Service resource of the Cloud Storage API


class RayIdentity(pulumi.ComponentResource):
    gcp_service_account: gcp.serviceaccount.Account
    kubernetes_service_account: k8s.core.v1.ServiceAccount
    worker_service_account: k8s.core.v1.ServiceAccount

    def __init__(self, name: str, args: RayIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:RayIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.gcp_service_account = gcp.serviceaccount.Account(
            f"{name}-gsa",
            account_id=args.account_id,
            display_name="NeMo RL Ray pods",
            project=args.project,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.iam_api)),
        )
        self.roles = grant_project_roles(
            name,
            args.project,
            self.gcp_service_account.member,
            RAY_POD_ROLES,
            parent=self,
            apis=args.resource_manager_api,
        )
        self.export_access = None
        if args.export_bucket is not None:
            self.export_access = gcp.storage.BucketIAMMember(
                f"{name}-export-objects",
                bucket=args.export_bucket,
                role=EXPORT_BUCKET_ROLE,
                member=self.gcp_service_account.member,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.storage_api)),
            )
        # The identity pool <project>.svc.id.goog exists once a Workload Identity cluster does.
        self.binding = self._bind(f"{name}-workload-identity", args, args.kubernetes_service_account)
        self.worker_binding = self._bind(f"{name}-worker-workload-identity", args, args.worker_service_account)
        self.kubernetes_service_account = self._account(f"{name}-ksa", args, args.kubernetes_service_account, child)
        self.worker_service_account = self._account(f"{name}-worker-ksa", args, args.worker_service_account, child)
        self.register_outputs(
            {
                "gcpServiceAccount": self.gcp_service_account.email,
                "kubernetesServiceAccount": self.kubernetes_service_account.metadata.name,
                "workerServiceAccount": self.worker_service_account.metadata.name,
            }
        )

    def _bind(self, name: str, args: RayIdentityArgs, ksa: str) -> gcp.serviceaccount.IAMMember:
        return gcp.serviceaccount.IAMMember(
            name,
            service_account_id=self.gcp_service_account.name,
            role="roles/iam.workloadIdentityUser",
            member=pulumi.Output.from_input(args.namespace).apply(
                lambda namespace: f"serviceAccount:{args.project}.svc.id.goog[{namespace}/{ksa}]"
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.cluster]),
        )

    def _account(
        self, name: str, args: RayIdentityArgs, ksa: str, opts: pulumi.ResourceOptions
    ) -> k8s.core.v1.ServiceAccount:
        return k8s.core.v1.ServiceAccount(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=ksa,
                namespace=args.namespace,
                annotations={"iam.gke.io/gcp-service-account": self.gcp_service_account.email},
            ),
            automount_service_account_token=False,
            opts=opts,
        )
