"""The submitter: a Kubernetes Job that runs the pipeline's Ray jobs one after another through ray_submit.py."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s
from submitter.ray_auth import AUTH_MODE_ENV, AUTH_TOKEN_ENV

from launcher.infra_outputs import InfraOutputs
from launcher.job_settings import JobSettings
from launcher.paths import SCRIPTS_MOUNT, SUBMITTER_PACKAGE, job_name, run_marker_name
from launcher.script import STOP_TIMEOUT_S

JOBS_DIR = Path(__file__).resolve().parent.parent
# What the submitter pod carries: the submitter itself (and every module of its package, see launcher_files) and the
# scripts it copies to Lustre for the Ray jobs.
SCRIPT_FILES = (
    "ray_submit.py",
    "wait_for_workers.py",
    "admission.py",
    "scripts/prepare_gsm8k.py",
    "scripts/prepare_jsonl.py",
    "scripts/convert_checkpoint.py",
    "scripts/checkpoint_guard.py",
    "scripts/export_gcs.py",
    "scripts/archive_gcs.py",
    "scripts/eval_model.py",
    "scripts/eval_summary.py",
    "scripts/prefetch_weights.py",
    "scripts/prepare_openmathinstruct2.py",
    "scripts/benchmark_summary.py",
    "scripts/topology_report.py",
    "preflight/nccl_allreduce.py",
    "preflight/lustre_io.py",
)
PIPELINE_FILE = "pipeline.sh"
# ray_submit.py exits 1 (a Ray job FAILED), 2 (usage) or 3 (STOPPED): a new pod would only report the same
# outcome, so the Job fails at once. Exit 4 (Ray unreachable) and pod evictions are retried.
FINAL_EXIT_CODES = [1, 2, 3]
KEEP_FINISHED_SECONDS = 7 * 24 * 3600
# The provider's await condition: satisfied as soon as the Job exists, instead of waiting for it to finish.
WAIT_FOR = "pulumi.com/waitFor"
CREATED = "jsonpath={.metadata.uid}"
# Where the submitter finds its token for the Kubernetes API (the path in-cluster clients expect).
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600  # the kubelet renews the projected token well before it expires
# On SIGTERM the submitter asks the API twice (5 s timeout each), then stops the Ray job and waits up to
# STOP_TIMEOUT_S for STOPPED: the pod's grace period covers that with room to spare.
GRACE_SECONDS = 2 * 5 + STOP_TIMEOUT_S + 20
# Deleting the Job waits for its pod to be gone (foreground): the pod's grace period, and room for the API.
DELETE_TIMEOUT = f"{-(-(GRACE_SECONDS + 120) // 60)}m"
# Delete the pod before the Job object disappears, so that the Role it reads its Job with outlives it.
DELETION_PROPAGATION = "pulumi.com/deletionPropagationPolicy"
RBAC_GROUP = "rbac.authorization.k8s.io"


def ray_auth_env(secret_name: str | None) -> list[k8s.core.v1.EnvVarArgs]:
    """The submitter's Ray credentials, by reference to the infra stack's Secret (keyed by the token's variable,
    workloads/ray_auth.py); none without token authentication (then the NetworkPolicies alone fence the head)."""
    if not secret_name:
        return []
    return [
        k8s.core.v1.EnvVarArgs(name=AUTH_MODE_ENV, value="token"),
        k8s.core.v1.EnvVarArgs(
            name=AUTH_TOKEN_ENV,
            value_from=k8s.core.v1.EnvVarSourceArgs(
                secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(name=secret_name, key=AUTH_TOKEN_ENV)
            ),
        ),
    ]


@dataclass(frozen=True)
class PipelineJobArgs:
    job: JobSettings
    infra: InfraOutputs
    script: str


def launcher_files() -> dict[str, Path]:
    """What the launcher volume holds, by path under the mount: each script under its base name, side by side, and
    every module of the submitter's package in its folder beside ray_submit.py, which imports it from there."""
    files = {Path(name).name: JOBS_DIR / name for name in SCRIPT_FILES}
    for module in sorted((JOBS_DIR / SUBMITTER_PACKAGE).glob("*.py")):
        files[f"{SUBMITTER_PACKAGE}/{module.name}"] = module
    return files


def config_map_key(path: str) -> str:
    """A ConfigMap key cannot hold '/': submitter/cli.py is kept as submitter.cli.py, put back by the volume's items."""
    return path.replace("/", ".")


def script_files() -> dict[str, str]:
    """ConfigMap data: each file of the launcher volume under its key."""
    return {config_map_key(path): source.read_text() for path, source in launcher_files().items()}


def volume_items(keys: list[str]) -> list[k8s.core.v1.KeyToPathArgs]:
    """Every key of the ConfigMap at its path under the mount (a volume with items projects only the keys listed)."""
    paths = {config_map_key(path): path for path in launcher_files()}
    return [k8s.core.v1.KeyToPathArgs(key=key, path=paths.get(key, key)) for key in sorted(keys)]


class PipelineJob(pulumi.ComponentResource):
    config_map: k8s.core.v1.ConfigMap
    network_policy: k8s.networking.v1.NetworkPolicy
    job: k8s.batch.v1.Job
    run_marker: k8s.core.v1.ConfigMap | None = None

    def __init__(self, name: str, args: PipelineJobArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-jobs:launcher:PipelineJob", name, None, opts)
        job, infra = args.job, args.infra
        data = {**script_files(), PIPELINE_FILE: args.script}
        # Content-addressed and immutable: a changed script is a new ConfigMap, never an edit under a running pod.
        digest = hashlib.sha256("".join(f"{k}\0{v}\0" for k, v in sorted(data.items())).encode()).hexdigest()[:10]
        labels = {
            "app.kubernetes.io/part-of": "nemo-rl-gke",
            "app.kubernetes.io/component": "ray-submitter",
            "nemo-rl-gke/run": job.run_name,
        }
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-scripts",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=f"{job.run_name}-launcher-{digest}", namespace=infra.namespace, labels=labels
            ),
            data=data,
            immutable=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        label_key, label_value = infra.submitter_label
        pod_labels = {**labels, label_key: label_value}
        # The submitter only calls out (to the Ray head); nothing may connect to it.
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-no-ingress",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=f"{job.run_name}-submitter-no-ingress", namespace=infra.namespace, labels=labels
            ),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels), policy_types=["Ingress"]
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        access = self._api_access(name, job, infra, labels) if job.stop_on_delete else None
        self.job = k8s.batch.v1.Job(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=job_name(job),
                namespace=infra.namespace,
                labels=pod_labels,
                # `pulumi up` returns once the Job exists (it has a uid); the run is followed with kubectl (see the
                # outputs). Not skipAwait: that would also skip waiting for the Job's deletion, and `pulumi destroy`
                # would then delete the submitter's Role while its pod still needs it to decide whether to stop Ray.
                annotations={WAIT_FOR: CREATED, DELETION_PROPAGATION: "foreground"},
            ),
            spec=k8s.batch.v1.JobSpecArgs(
                backoff_limit=4,
                # One submitter pod at a time: a replacement starts only once the old pod has ended (a pod lost with
                # its node is failed once its node is gone), never beside it. (The API requires Failed with a
                # podFailurePolicy anyway; spelled out because the run's one-submitter rule rests on it.)
                pod_replacement_policy="Failed",
                ttl_seconds_after_finished=KEEP_FINISHED_SECONDS,
                pod_failure_policy=k8s.batch.v1.PodFailurePolicyArgs(
                    rules=[
                        k8s.batch.v1.PodFailurePolicyRuleArgs(
                            action="FailJob",
                            on_exit_codes=k8s.batch.v1.PodFailurePolicyOnExitCodesRequirementArgs(
                                container_name="submitter", operator="In", values=FINAL_EXIT_CODES
                            ),
                        ),
                        k8s.batch.v1.PodFailurePolicyRuleArgs(
                            action="Ignore",
                            on_pod_conditions=[
                                # status is the API's default, spelled out: the schema of Kubernetes
                                # before 1.35 marks it required, and strict validation follows the schema.
                                k8s.batch.v1.PodFailurePolicyOnPodConditionsPatternArgs(
                                    type="DisruptionTarget", status="True"
                                )
                            ],
                        ),
                    ]
                ),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    # The failure policy's exit codes in the template, which pulumi-kubernetes knows is immutable
                    # (diff.go forceNewProperties: .spec.template): a change of them replaces the Job as any other.
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=pod_labels,
                        annotations={"nemo-rl-gke/final-exit-codes": ",".join(map(str, FINAL_EXIT_CODES))},
                    ),
                    spec=k8s.core.v1.PodSpecArgs(
                        restart_policy="Never",
                        node_selector={"cloud.google.com/gke-nodepool": infra.cpu_node_pool},
                        # No token by default; with stopOnDelete one projected, short-lived token of an account
                        # that may only read this Job and the run marker (see _api_access).
                        automount_service_account_token=False,
                        service_account_name=access.service_account.metadata.name if access else None,
                        termination_grace_period_seconds=GRACE_SECONDS,
                        # Pod-level too, so that every container (and any added later) gets the runtime's seccomp
                        # filter. Not runAsNonRoot: the image runs as root and the Lustre files it writes are root's.
                        security_context=k8s.core.v1.PodSecurityContextArgs(
                            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
                        ),
                        containers=[
                            k8s.core.v1.ContainerArgs(
                                name="submitter",
                                # The NeMo RL image: its Ray client is the cluster's Ray by construction, and the
                                # CPU node already holds the image for the Ray head, so nothing new is pulled.
                                image=infra.image,
                                image_pull_policy="IfNotPresent",
                                command=["bash", f"{SCRIPTS_MOUNT}/{PIPELINE_FILE}"],
                                env=[
                                    k8s.core.v1.EnvVarArgs(name="PYTHONUNBUFFERED", value="1"),
                                    k8s.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"),
                                    k8s.core.v1.EnvVarArgs(name="RAY_USAGE_STATS_ENABLED", value="0"),
                                    *ray_auth_env(infra.ray_auth_secret),
                                ],
                                resources=k8s.core.v1.ResourceRequirementsArgs(
                                    requests={"cpu": "250m", "memory": "512Mi"},
                                    limits={"cpu": "1", "memory": "1Gi"},
                                ),
                                security_context=k8s.core.v1.SecurityContextArgs(
                                    allow_privilege_escalation=False,
                                    read_only_root_filesystem=True,
                                    capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
                                    seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
                                ),
                                volume_mounts=[
                                    k8s.core.v1.VolumeMountArgs(
                                        name="launcher", mount_path=SCRIPTS_MOUNT, read_only=True
                                    ),
                                    k8s.core.v1.VolumeMountArgs(name="data", mount_path=infra.mount_path),
                                    k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                                    *(
                                        [k8s.core.v1.VolumeMountArgs(name="api", mount_path=TOKEN_DIR, read_only=True)]
                                        if access
                                        else []
                                    ),
                                ],
                            )
                        ],
                        volumes=[
                            k8s.core.v1.VolumeArgs(
                                name="launcher",
                                config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                                    name=self.config_map.metadata.name, items=volume_items(list(data))
                                ),
                            ),
                            k8s.core.v1.VolumeArgs(
                                name="data",
                                persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                                    claim_name=infra.pvc_name
                                ),
                            ),
                            k8s.core.v1.VolumeArgs(
                                name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="1Gi")
                            ),
                            *([api_token_volume()] if access else []),
                        ],
                    ),
                ),
            ),
            # A Job's template cannot change in place: a new pipeline replaces it, and the idempotent submission
            # ids make the new pod resume where the old one stopped.
            # The roles and their bindings are deleted only after the Job (and so its pod) is gone.
            # No delete_before_replace: pulumi-kubernetes v4.32 provider.go Diff deletes first only when the name
            # and namespace stay. A new runName (a new name) is created first, and the engine deletes the old Job at
            # the end of the update in reverse dependency order (step_generator.go ScheduleDeletes): its marker
            # first, so the old submitter stops its Ray job, as on `pulumi destroy`.
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[access.role, access.binding, access.node_reader, access.node_binding] if access else None,
                custom_timeouts=pulumi.CustomTimeouts(delete=DELETE_TIMEOUT),
            ),
        )
        if job.stop_on_delete:
            # Created after the Job, so `pulumi destroy` deletes it first: a submitter whose Job is deleted while
            # the marker stays is being replaced (or was deleted by hand) and leaves the Ray job running.
            self.run_marker = k8s.core.v1.ConfigMap(
                f"{name}-run-marker",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=run_marker_name(job), namespace=infra.namespace, labels=labels
                ),
                data={
                    "job": job_name(job),
                    "meaning": "While this exists, deleting the Job does not stop the run's Ray jobs.",
                },
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.job]),
            )
        self.register_outputs({"job": self.job.metadata.name, "configMap": self.config_map.metadata.name})

    def _api_access(self, name: str, job: JobSettings, infra: InfraOutputs, labels: dict[str, str]) -> ApiAccess:
        """A service account that can `get` exactly two objects: this run's Job and its marker ConfigMap.

        The trade-off: the submitter otherwise runs with no token at all. Reading its own Job is what tells a
        `pulumi destroy` (stop the GPUs) from an eviction (keep training). resourceNames pins the Role to those two
        names, `get` only (no list or watch, which resourceNames cannot narrow), and the NetworkPolicy still
        admits nothing to the pod."""
        child = pulumi.ResourceOptions(parent=self)
        meta = k8s.meta.v1.ObjectMetaArgs(name=f"{job.run_name}-submitter", namespace=infra.namespace, labels=labels)
        account = k8s.core.v1.ServiceAccount(
            f"{name}-submitter", metadata=meta, automount_service_account_token=False, opts=child
        )
        role = k8s.rbac.v1.Role(
            f"{name}-submitter",
            metadata=meta,
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=["batch"], resources=["jobs"], resource_names=[job_name(job)], verbs=["get"]
                ),
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=[""], resources=["configmaps"], resource_names=[run_marker_name(job)], verbs=["get"]
                ),
            ],
            opts=child,
        )
        subjects = [
            k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name, namespace=infra.namespace)
        ]
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-submitter",
            metadata=meta,
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=role.metadata.name),
            subjects=subjects,
            opts=child,
        )
        # After the NCCL pre-flight, the blocks and sub-blocks of the run's GPU nodes (scripts/topology_report.py):
        # node labels are not in the downward API. `get` on nodes only: no list or watch, nothing else cluster-wide
        # (nodes are cluster-scoped, so a ClusterRole; node names are not known ahead, so no resourceNames).
        cluster_meta = k8s.meta.v1.ObjectMetaArgs(name=node_reader_name(job, infra), labels=labels)
        node_reader = k8s.rbac.v1.ClusterRole(
            f"{name}-node-reader",
            metadata=cluster_meta,
            rules=[k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes"], verbs=["get"])],
            opts=child,
        )
        node_binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-node-reader",
            metadata=cluster_meta,
            role_ref=k8s.rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=node_reader.metadata.name),
            subjects=subjects,
            opts=child,
        )
        return ApiAccess(
            service_account=account, role=role, binding=binding, node_reader=node_reader, node_binding=node_binding
        )


def node_reader_name(job: JobSettings, infra: InfraOutputs) -> str:
    """Cluster-wide, so named after the namespace too: two Ray namespaces may hold runs of the same name."""
    return f"{infra.namespace}-{job.run_name}-node-reader"


@dataclass(frozen=True)
class ApiAccess:
    service_account: k8s.core.v1.ServiceAccount
    role: k8s.rbac.v1.Role
    binding: k8s.rbac.v1.RoleBinding
    node_reader: k8s.rbac.v1.ClusterRole
    node_binding: k8s.rbac.v1.ClusterRoleBinding


def api_token_volume() -> k8s.core.v1.VolumeArgs:
    """The token and the cluster CA, as in-cluster clients expect them; the token expires after an hour and is
    renewed by the kubelet."""
    return k8s.core.v1.VolumeArgs(
        name="api",
        projected=k8s.core.v1.ProjectedVolumeSourceArgs(
            sources=[
                k8s.core.v1.VolumeProjectionArgs(
                    service_account_token=k8s.core.v1.ServiceAccountTokenProjectionArgs(
                        path="token", expiration_seconds=TOKEN_SECONDS
                    )
                ),
                k8s.core.v1.VolumeProjectionArgs(
                    config_map=k8s.core.v1.ConfigMapProjectionArgs(
                        name="kube-root-ca.crt", items=[k8s.core.v1.KeyToPathArgs(key="ca.crt", path="ca.crt")]
                    )
                ),
            ]
        ),
    )
