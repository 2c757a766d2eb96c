"""Wires the cluster workloads onto the infra: every Kubernetes object goes through the cluster's provider."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.cluster import CPU_POOL_NAME
from infra.settings import InfraSettings, RaySettings, Secrets, SiteSettings
from infra.stack import Infra
from workloads.admission_policy import PodAdmission, PodAdmissionArgs
from workloads.identity import RayIdentity, RayIdentityArgs
from workloads.image_prepull import ImagePrepull, ImagePrepullArgs
from workloads.nccl_installer import NcclInstaller
from workloads.network_objects import NetworkMapping, NetworkMappingArgs
from workloads.network_policy import SUBMITTER_LABEL, RayPolicies, RayPoliciesArgs
from workloads.nics import extra_nics
from workloads.pod_security import namespace_labels
from workloads.ray_auth import TOKEN_KEY, RayAuthToken, RayAuthTokenArgs, supports_token_auth
from workloads.ray_values import (
    CLIENT_PORT,
    DASHBOARD_PORT,
    LUSTRE_MOUNT_PATH,
    METRICS_PORT,
    RayClusterRefs,
    build_ray_values,
    head_service_name,
)
from workloads.raycluster import RayCluster, RayClusterArgs, replacement_digest
from workloads.secrets import Tokens, TokensArgs, token_keys
from workloads.storage import LustreVolume, LustreVolumeArgs
from workloads.tensorboard import TensorBoard, TensorBoardArgs, port_forward_command

RELEASE_NAME = "ray-cluster"
# Namespaces Kubernetes creates itself; any other configured namespace is created here.
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public")


@dataclass
class Workloads:
    refs: RayClusterRefs
    tokens: Tokens
    volume: LustreVolume
    identity: RayIdentity
    ray: RayCluster
    policies: RayPolicies
    admission: PodAdmission
    auth: RayAuthToken | None
    prepull: ImagePrepull
    tensorboard: TensorBoard | None = None


def ray_cluster_refs(settings: RaySettings, secret_keys: tuple[str, ...]) -> RayClusterRefs:
    prefix = settings.cluster_name
    return RayClusterRefs(
        cluster_name=f"{prefix}-ray",
        cpu_pool_name=CPU_POOL_NAME,
        pvc_name=f"{prefix}-lustre",
        secret_name=f"{prefix}-tokens",
        secret_keys=secret_keys,
        service_account=settings.kubernetes_service_account,
        fluentbit_configmap=f"{prefix}-ray-fluent-bit",
        worker_service_account=worker_service_account(prefix),
        auth_secret=ray_auth_secret_name(prefix) if supports_token_auth(settings.ray_version) else None,
    )


def ray_pod_template(settings: InfraSettings, has_wandb_key: bool) -> str:
    """What replaces the RayCluster when it changes, known before anything is registered (the day-2 guard compares
    it)."""
    values = build_ray_values(settings, ray_cluster_refs(settings, token_keys(has_wandb_key)))
    return replacement_digest(values, settings)


def build_workloads(settings: InfraSettings, secrets: Secrets, infra: Infra) -> Workloads:
    provider = pulumi.ResourceOptions(provider=infra.cluster.provider)
    prefix = settings.cluster_name
    namespace: pulumi.Input[str] = settings.namespace
    if settings.namespace not in BUILT_IN_NAMESPACES:
        # Pod Security Admission at the strictest level the Ray workers allow (workloads/pod_security.py).
        namespace = k8s.core.v1.Namespace(
            "namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=settings.namespace, labels=namespace_labels(settings.gke_minor)),
            opts=provider,
        ).metadata.name

    # Every node starts pulling the NeMo RL image as soon as it joins: this waits for the cluster alone (its
    # provider), not for Lustre or the Ray cluster, so the pull leaves the path to the first GRPO step.
    prepull = ImagePrepull(
        "image-prepull", ImagePrepullArgs(name=f"{prefix}-image-prepull", image=settings.nemo_rl_image), opts=provider
    )

    nics = extra_nics(settings.preset.rdma_nics)
    networks = infra.networks
    mapping = NetworkMapping(
        "network-mapping",
        NetworkMappingArgs(
            nics=nics,
            gvnic_network=networks.gvnic_network.name,
            gvnic_subnet=networks.gvnic_subnet.name,
            rdma_network=networks.rdma_network.name,
            rdma_subnets=[subnet.name for subnet in networks.rdma_subnets],
        ),
        opts=provider,
    )
    # The DaemonSet targets GPU nodes only; applying it before the pool exists would leave it idle and hide
    # a missing pool, so it follows the pool.
    installer = NcclInstaller(
        "nccl-rdma-installer", opts=pulumi.ResourceOptions(provider=infra.cluster.provider, depends_on=[infra.gpu_pool])
    )
    lustre = infra.lustre.instance
    volume = LustreVolume(
        "lustre-volume",
        LustreVolumeArgs(
            pv_name=f"{prefix}-lustre-pv",
            pvc_name=f"{prefix}-lustre",
            namespace=namespace,
            project=settings.project,
            zone=settings.zone,
            instance_id=lustre.instance_id,
            ip=infra.lustre.ip,
            filesystem=lustre.filesystem,
            capacity_gib=lustre.capacity_gib,
        ),
        opts=provider,
    )
    tokens = Tokens(
        "tokens",
        TokensArgs(
            name=f"{prefix}-tokens",
            namespace=namespace,
            hf_token=secrets.hf_token,
            wandb_api_key=secrets.wandb_api_key,
        ),
        opts=provider,
    )
    identity = RayIdentity(
        "ray-identity",
        RayIdentityArgs(
            project=settings.project,
            account_id=f"{prefix}-ray",
            namespace=namespace,
            kubernetes_service_account=settings.kubernetes_service_account,
            worker_service_account=worker_service_account(prefix),
            cluster=infra.cluster.cluster,
            iam_api=infra.services.needed_by("iam"),
            resource_manager_api=infra.services.needed_by("cloudresourcemanager"),
            export_bucket=(
                infra.export_bucket.bucket.name if infra.export_bucket else settings.export_bucket_name or None
            ),
            storage_api=infra.services.needed_by("storage"),
        ),
        opts=provider,
    )

    refs = ray_cluster_refs(settings, tokens.keys)
    # What pods may claim (host access, the NetworkPolicies' labels, the GPU networks): in place before the first
    # Ray pod, so none is created past it.
    admission = PodAdmission(
        "pod-admission",
        PodAdmissionArgs(
            prefix=prefix,
            namespace=settings.namespace,
            ray_cluster=refs.cluster_name,
            networks=tuple(nic.network for nic in nics),
        ),
        opts=provider,
    )

    # Ray's token authentication where the image's Ray has it; the NetworkPolicies fence Ray either way.
    auth = None
    if refs.auth_secret:
        auth = RayAuthToken(
            "ray-auth", RayAuthTokenArgs(secret_name=refs.auth_secret, namespace=namespace), opts=provider
        )
    ray = RayCluster(
        "ray",
        RayClusterArgs(
            release_name=RELEASE_NAME,
            namespace=namespace,
            settings=settings,
            refs=refs,
            prerequisites=[
                infra.gpu_pool.pool,
                mapping,
                installer,
                volume.pvc,
                tokens.secret,
                *([auth.secret] if auth else []),
                identity.kubernetes_service_account,
                identity.worker_service_account,
                identity.binding,
                identity.worker_binding,
                *admission.bindings,
            ],
            mounts=[lustre, volume.pv, volume.pvc],
        ),
        opts=provider,
    )
    policies = RayPolicies(
        "ray-policies",
        RayPoliciesArgs(
            namespace=namespace,
            ray_cluster=refs.cluster_name,
            dashboard_port=DASHBOARD_PORT,
            # Ray Client only where the submitter uses it: to ask the autoscaler for GPU workers.
            client_port=CLIENT_PORT if settings.gpu_autoscaling else None,
            metrics_port=METRICS_PORT,
            api_server_cidrs=(settings.ranges.cluster_subnet,),
        ),
        opts=provider,
    )
    tensorboard = None
    if settings.tensorboard:
        tensorboard = TensorBoard(
            "tensorboard",
            TensorBoardArgs(
                name=tensorboard_name(settings),
                namespace=namespace,
                image=settings.nemo_rl_image,
                cpu_pool_name=CPU_POOL_NAME,
                pvc_name=volume.pvc.metadata.name,
                mount_path=LUSTRE_MOUNT_PATH,
            ),
            opts=provider,
        )
    return Workloads(
        refs=refs,
        tokens=tokens,
        volume=volume,
        identity=identity,
        ray=ray,
        policies=policies,
        admission=admission,
        auth=auth,
        prepull=prepull,
        tensorboard=tensorboard,
    )


def what_the_workloads_record_describes(workloads: Workloads) -> list[pulumi.CustomResource]:
    """The Kubernetes objects whose settings the day-2 record describes (infra.stack.record_once_built)."""
    return [workloads.ray.release, workloads.tokens.secret, workloads.volume.pv, workloads.volume.pvc]


def tensorboard_name(settings: SiteSettings) -> str:
    return f"{settings.cluster_name}-tensorboard"


def worker_service_account(prefix: str) -> str:
    return f"{prefix}-ray-worker"


def ray_auth_secret_name(prefix: str) -> str:
    return f"{prefix}-ray-auth"


def export_workloads(settings: InfraSettings, workloads: Workloads) -> None:
    """Stack outputs the job stack reads. Names are a contract: change them with care."""
    refs = workloads.refs
    service = head_service_name(refs.cluster_name)
    head_dns = f"{service}.{settings.namespace}.svc.cluster.local"
    pulumi.export("namespace", settings.namespace)
    pulumi.export("rayClusterName", refs.cluster_name)
    pulumi.export("rayHeadService", head_dns)
    pulumi.export("rayDashboardPort", DASHBOARD_PORT)
    pulumi.export("rayAddress", f"http://{head_dns}:{DASHBOARD_PORT}")
    # Ray Client, through which the submitter asks the autoscaler for GPU workers (ray.autoscaler.sdk).
    pulumi.export("rayClientAddress", f"ray://{head_dns}:{CLIENT_PORT}")
    pulumi.export("lustrePvcName", workloads.volume.pvc.metadata.name)
    pulumi.export("lustreMountPath", LUSTRE_MOUNT_PATH)
    pulumi.export("secretName", workloads.tokens.secret.metadata.name)
    pulumi.export("secretKeys", list(refs.secret_keys))
    pulumi.export("serviceAccount", workloads.identity.kubernetes_service_account.metadata.name)
    pulumi.export("workerServiceAccount", workloads.identity.worker_service_account.metadata.name)
    # The Secret holding Ray's token (key RAY_AUTH_TOKEN); None when the image's Ray has no token authentication.
    auth = workloads.auth
    pulumi.export("rayAuthSecret", auth.secret.metadata.name if auth else None)
    pulumi.export(
        "rayAuthTokenCommand",
        f"kubectl --namespace {settings.namespace} get secret {refs.auth_secret} "
        f"-o jsonpath='{{.data.{TOKEN_KEY}}}' | base64 -d"
        if auth
        else None,
    )
    pulumi.export("submitterPodLabel", {SUBMITTER_LABEL: refs.cluster_name})
    pulumi.export("gpusPerNode", settings.preset.gpus_per_node)
    pulumi.export("nemoRlImage", settings.nemo_rl_image)
    pulumi.export("rayVersion", settings.ray_version)
    # The job stack builds the pipeline from this row (entrypoint, data layout); None for an image tag of no known
    # release, which the job stack refuses.
    release = settings.nemo_rl_release
    pulumi.export("nemoRlRelease", release.as_output() if release else None)
    pulumi.export("exportBucket", settings.export_bucket_name)
    # TensorBoard over every run's event files, read-only; "" when `tensorboard` is off.
    pulumi.export(
        "tensorboardPortForward",
        port_forward_command(settings.namespace, tensorboard_name(settings)) if workloads.tensorboard else "",
    )
    pulumi.export(
        "dashboardPortForward",
        f"kubectl --namespace {settings.namespace} port-forward service/{service} {DASHBOARD_PORT}:{DASHBOARD_PORT}",
    )
