"""The Ray cluster: KubeRay's ray-cluster chart (GKE's RayOperator add-on is the operator) and its log config."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.settings import InfraSettings, StorageSettings
from workloads.ray_chart import CHART_NAME, CHART_REPO, CHART_VERSION
from workloads.ray_values import RayClusterRefs, build_ray_values, fluent_bit_config, pod_template_digest


def replacement_digest(values: dict[str, Any], settings: StorageSettings) -> str:
    """What replaces the RayCluster when it changes (the release's replacement_trigger; the day-2 guard records and
    compares it): the pod templates (pod_template_digest), the chart version (a new chart renders new pods, which
    KubeRay 1.5.1 would give only to pods created later), and the Lustre instance every pod mounts through the claim
    (a replaced instance replaces the volume and the claim, whose deletion waits for every pod that mounts it)."""
    lustre = settings.lustre
    identity = {
        "pods": pod_template_digest(values),
        "chart": CHART_VERSION,
        "lustre": [
            settings.project,
            settings.zone,
            settings.lustre_instance_id,
            lustre.filesystem,
            lustre.throughput_mbps_per_tib,
        ],
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RayClusterArgs:
    release_name: str
    namespace: pulumi.Input[str]
    settings: InfraSettings
    refs: RayClusterRefs
    # Everything the pods need before they can start: GPU nodes, network objects, the installer, the claim,
    # the Secret and the service account. None of it flows into the chart's values, so it is ordered explicitly.
    prerequisites: list[pulumi.Resource]
    # What the pods mount (the Lustre instance, its volume and claim): a delete-first replacement of any of them
    # deletes the release first (replace_with), so the claim is never deleted under running pods.
    mounts: list[pulumi.Resource]


class RayCluster(pulumi.ComponentResource):
    release: k8s.helm.v3.Release
    log_config: k8s.core.v1.ConfigMap

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("nemo-rl-gke:workloads:RayCluster", name, None, opts)
        self.log_config = k8s.core.v1.ConfigMap(
            f"{name}-fluent-bit",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.refs.fluentbit_configmap, namespace=args.namespace),
            data=fluent_bit_config(args.refs.cluster_name),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.values = build_ray_values(args.settings, args.refs)
        self.release = k8s.helm.v3.Release(
            name,
            name=args.release_name,
            namespace=args.namespace,
            chart=CHART_NAME,
            version=CHART_VERSION,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=CHART_REPO),
            values=self.values,
            # Helm cannot judge a RayCluster's health; KubeRay reports it on the object itself.
            skip_await=True,
            atomic=False,
            # KubeRay 1.5.1 applies a changed pod template only to pods it creates later (raycluster_controller.go,
            # reconcilePods), which would leave running workers on the old image. So a template change replaces
            # the release, and with it the RayCluster and every pod; the old one is uninstalled first (the new one
            # has the same name). infra/day2.py refuses that change unless the user allows it.
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*args.prerequisites, self.log_config],
                replacement_trigger=replacement_digest(self.values, args.settings),
                delete_before_replace=True,
                # pulumi v3.259 step_generator.go generateStepsFromDiff: a delete-before-replace deletes first the
                # dependents calculateDependentReplacements finds (property dependencies only: depends_on is not
                # one) and every resource findResourcesReplacedWith names, this one last in, so first out.
                replace_with=args.mounts,
            ),
        )
        self.register_outputs({"release": self.release.name, "rayCluster": args.refs.cluster_name})
