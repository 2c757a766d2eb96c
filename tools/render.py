"""A plan turned into what `make plan` writes under build/<stack>/ (pure: Plan -> {relative path: text}):
  manifests/NN-<kind>-<name>.yaml   every Kubernetes object of both programs (secrets shown as "[secret]")
  helm/<release>.yaml               each Helm release: chart, repository, version, name, namespace, values
  ray-pods/<pod>.yaml               the Ray pods KubeRay creates from the RayCluster the real chart renders with those
                                    values (tools/ray_pods.py), for checkov; only where the chart is at hand
  pipeline.yaml                     the Ray jobs the launcher submits, in order
  resources.txt, resources.json     the resource tree: type, name, key properties, what each depends on
  outputs.json                      both stacks' outputs, secret outputs as "[secret]"
  timeline.txt                      the modeled provisioning timeline (tools/timeline.py), then the start-up to the
                                    end of the first GRPO step, cold and warm (tools/first_step.py)
  cost.txt                          the estimated cost (infra estimatedCost, job estimatedRun), as docs/cost.md quotes
Everything written is deterministic (sorted keys, stable order, no timestamps, no absolute paths), so a checked-in
copy (tests/golden/) shows any change to what gets deployed in review. The folder is replaced as a whole, but only
when it is an earlier plan output (or empty): another folder in its place is an error (exit 2), not deleted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from infra.cost import USER_RATE, dollar_range, summary_lines
from tools import first_step, ray_pods, timeline
from tools.offline import REDACTED, SECRET_SIG, SECRET_SIG_KEY, ProgramRun, Registered
from tools.plan_run import Plan
from tools.plan_stacks import PlanError

# Manifests are numbered in the order an operator would apply them: namespaces, policy and identity, data, the
# GKE network objects, and the Job last. Kinds not listed come after the listed ones, by name.
KIND_ORDER = (
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "NetworkPolicy",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "Secret",
    "ConfigMap",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "GKENetworkParamSet",
    "Network",
    "Service",
    "Deployment",
    "DaemonSet",
    "Job",
)

# Key properties per resource type for resources.txt/json: a short selection, as dotted paths into the inputs.
KEY_PROPERTIES: Mapping[str, tuple[str, ...]] = {
    "gcp:compute/network:Network": ("name", "mtu", "networkProfile"),
    "gcp:compute/subnetwork:Subnetwork": ("name", "region", "ipCidrRange", "secondaryIpRanges"),
    "gcp:compute/firewall:Firewall": ("name", "direction", "sourceRanges"),
    "gcp:compute/globalAddress:GlobalAddress": ("name", "purpose", "address", "prefixLength"),
    "gcp:servicenetworking/connection:Connection": ("service", "reservedPeeringRanges"),
    "gcp:projects/service:Service": ("service", "disableOnDestroy"),
    "gcp:serviceaccount/account:Account": ("accountId",),
    "gcp:projects/iAMMember:IAMMember": ("role", "member"),
    "gcp:serviceaccount/iAMMember:IAMMember": ("role", "member"),
    "gcp:storage/bucket:Bucket": ("name", "location", "uniformBucketLevelAccess", "publicAccessPrevention"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("bucket", "role", "member"),
    "gcp:compute/router:Router": ("name", "region", "network"),
    "gcp:compute/routerNat:RouterNat": (
        "name",
        "natIpAllocateOption",
        "sourceSubnetworkIpRangesToNat",
        "subnetworks",
    ),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": ("cryptoKeyId", "role", "member"),
    "gcp:container/cluster:Cluster": (
        "name",
        "location",
        "minMasterVersion",
        "releaseChannel.channel",
        "datapathProvider",
        "enableMultiNetworking",
        "deletionProtection",
        "maintenancePolicy",
        "privateClusterConfig",
        "controlPlaneEndpointsConfig",
        "masterAuthorizedNetworksConfig",
        "masterAuth.clientCertificateConfig",
        "databaseEncryption",
    ),
    "gcp:container/nodePool:NodePool": (
        "name",
        "nodeLocations",
        "nodeConfig.machineType",
        "nodeConfig.guestAccelerators",
        "nodeConfig.flexStart",
        "nodeConfig.spot",
        "nodeConfig.reservationAffinity",
        "nodeConfig.maxRunDuration",
        "nodeConfig.shieldedInstanceConfig",
        "management",
        "autoscaling",
    ),
    "gcp:lustre/instance:Instance": (
        "instanceId",
        "location",
        "capacityGib",
        "perUnitStorageThroughput",
        "filesystem",
        "gkeSupportEnabled",
    ),
    "kubernetes:helm.sh/v3:Release": ("name", "namespace", "chart", "version", "repositoryOpts.repo", "skipAwait"),
    "pulumi:pulumi:StackReference": ("name",),
}
K8S_KEY_PROPERTIES = ("metadata.name", "metadata.namespace")
# Pulumi-only inputs that are not part of a Kubernetes object.
_NOT_MANIFEST = {"__defaults", "__inputs"}


def redact(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            inner = value.get("value")
            # A secret map keeps its keys visible: which tokens exist is not itself a secret.
            return {k: REDACTED for k in inner} if isinstance(inner, dict) else REDACTED
        return {k: redact(v) for k, v in value.items() if k not in _NOT_MANIFEST}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def api_version_and_kind(type_token: str) -> tuple[str, str] | None:
    """'kubernetes:core/v1:PersistentVolume' -> ('v1', 'PersistentVolume'); None for non-objects (providers,
    Helm releases, YAML components)."""
    if not type_token.startswith("kubernetes:"):
        return None
    _, group_version, kind = type_token.split(":")
    if group_version.startswith(("helm.sh/", "yaml/", "kustomize/")):
        return None
    group, version = group_version.rsplit("/", 1)
    return (version if group == "core" else f"{group}/{version}"), kind


def manifest(resource: Registered) -> dict[str, Any] | None:
    """The object the provider would send to the API server, secrets shown as '[secret]'."""
    kind_info = api_version_and_kind(resource.type)
    if kind_info is None:
        return None
    api_version, kind = kind_info
    body = redact(resource.raw_inputs)
    ordered = {"apiVersion": api_version, "kind": kind, "metadata": body.pop("metadata", {})}
    return {**ordered, **{k: v for k, v in body.items() if k not in ("apiVersion", "kind")}}


def manifests(run: ProgramRun) -> list[dict[str, Any]]:
    return [m for m in (manifest(r) for r in run.resources) if m is not None]


def is_built_in(obj: dict[str, Any]) -> bool:
    """Kinds the Kubernetes OpenAPI schema knows (custom resources such as GKE's Network are not in it)."""
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    return group == "" or group.endswith(".k8s.io") or group in ("apps", "batch", "policy", "autoscaling")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None  # scripts in ConfigMaps stay readable in review
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def to_yaml(value: Any) -> str:
    # No line folding: a long command line stays on one line, so a change to it is a one-line diff.
    return yaml.dump(
        _number(value), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 30
    )


def to_json(value: Any) -> str:
    return json.dumps(_number(value), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _ordered_manifest(obj: dict[str, Any]) -> dict[str, Any]:
    head: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    head["metadata"] = _sorted(head.get("metadata", {}))
    return {**head, **{k: _sorted(obj[k]) for k in sorted(obj) if k not in head}}


def rendered_manifests(plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) for every Kubernetes object of both programs, numbered in a stable order."""
    found: list[tuple[tuple[int, int, str, str, str], dict[str, Any]]] = []
    for program_index, run in enumerate((plan.infra, plan.jobs)):
        for resource in run.resources:
            obj = manifest(resource)
            if obj is None:
                continue
            kind = obj["kind"]
            rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or resource.name)
            found.append(((rank, program_index, kind, str(meta.get("namespace") or ""), name), obj))
    found.sort(key=lambda item: item[0])
    width = max(2, len(str(len(found))))
    files = []
    for index, ((_, _, kind, _, name), obj) in enumerate(found, start=1):
        files.append((f"{index:0{width}d}-{kind.lower()}-{name}.yaml", _ordered_manifest(obj)))
    return files


def helm_releases(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per release name: what the Release resource was given, values exactly as passed (secrets redacted)."""
    releases: dict[str, dict[str, Any]] = {}
    for run in (plan.infra, plan.jobs):
        for resource in run.of_type("kubernetes:helm.sh/v3:Release"):
            inputs = redact(resource.raw_inputs)
            main = ("chart", "repositoryOpts", "version", "name", "namespace", "values")
            releases[str(inputs.get("name") or resource.name)] = {
                "chart": inputs.get("chart"),
                "repository": (inputs.get("repositoryOpts") or {}).get("repo"),
                "version": inputs.get("version"),
                "releaseName": inputs.get("name"),
                "namespace": inputs.get("namespace"),
                "options": _sorted({k: v for k, v in inputs.items() if k not in main}),
                "values": _sorted(inputs.get("values") or {}),
            }
    return releases


def _get(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _number(value: Any) -> Any:
    """Protobuf hands every number over as a float; the provider sends 4, not 4.0, to the API server."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _number(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def key_properties(resource: Registered) -> dict[str, Any]:
    paths = KEY_PROPERTIES.get(resource.type)
    if paths is None and resource.type.startswith("kubernetes:") and resource.custom:
        paths = K8S_KEY_PROPERTIES
    inputs = redact(resource.raw_inputs)
    selected = {path: _number(_get(inputs, path)) for path in paths or ()}
    selected = {k: v for k, v in selected.items() if v is not None}
    if resource.protect:
        selected["protect"] = True
    if resource.ignore_changes:
        selected["ignoreChanges"] = sorted(resource.ignore_changes)
    if resource.delete_before_replace:
        selected["deleteBeforeReplace"] = True
    return _sorted(selected)


def resource_tree(plan: Plan) -> list[dict[str, Any]]:
    """Every resource of both programs: program, type, name, parent, key properties, direct dependencies."""
    entries = []
    for program, run in (("infra", plan.infra), ("jobs", plan.jobs)):
        labels = {r.urn: timeline.label_of(r) for r in run.resources}
        for r in run.resources:
            deps = set(r.dependencies) | {u for urns in r.property_dependencies.values() for u in urns}
            entries.append(
                {
                    "program": program,
                    "label": labels[r.urn],
                    "type": r.type,
                    "name": r.name,
                    "parent": labels.get(r.parent),
                    "custom": r.custom,
                    "provider": labels.get(timeline.provider_urn(r.provider)),
                    "properties": key_properties(r),
                    "dependsOn": sorted(labels[u] for u in deps if u in labels and u != r.urn),
                }
            )
    return sorted(entries, key=lambda e: (e["program"] != "infra", e["label"]))


def resource_text(entries: list[dict[str, Any]]) -> str:
    lines = ["Resource tree: children under their parents; [props] key properties; <- direct dependencies", ""]
    for program in ("infra", "jobs"):
        mine = [e for e in entries if e["program"] == program]
        lines.append(f"{program} program ({len(mine)} resources)")
        children: dict[str | None, list[dict[str, Any]]] = {}
        for entry in mine:
            children.setdefault(entry["parent"], []).append(entry)

        def walk(parent: str | None, depth: int, children: dict[str | None, list[dict[str, Any]]] = children) -> None:
            for entry in children.get(parent, []):
                props = ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in entry["properties"].items())
                line = f"{'  ' * depth}- {entry['label']}  ({entry['type']})"
                if props:
                    line += f"  [{props}]"
                lines.append(line)
                if entry["dependsOn"]:
                    lines.append(f"{'  ' * depth}    <- {', '.join(entry['dependsOn'])}")
                walk(entry["label"], depth + 1)

        walk(None, 1)
        lines.append("")
    return "\n".join(lines)


def redacted_outputs(run: ProgramRun) -> dict[str, Any]:
    return _sorted({k: (REDACTED if k in run.secret_outputs else v) for k, v in run.outputs.items()})


def pipeline_doc(plan: Plan) -> dict[str, Any]:
    steps = plan.jobs.outputs.get("pipeline") or []
    return {
        "jobName": plan.jobs.outputs.get("jobName"),
        "steps": [
            {"step": s.get("step"), "submissionId": s.get("submissionId"), "entrypoint": s.get("entrypoint")}
            for s in steps
        ],
    }


def startup(plan: Plan) -> first_step.Result:
    """The modeled start-up to the first GRPO step (tools/first_step.py)."""
    return first_step.model(first_step.inputs_from_plan(plan))


def timeline_text(plan: Plan) -> str:
    steps = [step["step"] for step in plan.jobs.outputs.get("pipeline", [])]
    tier = plan.infra.outputs.get("lustreThroughputMbpsPerTib")
    provisioning = timeline.render(
        plan.timeline,
        lustre_label="Instance/lustre",
        cluster_label="Cluster/gke",
        lustre_tier=tier if isinstance(tier, int) else None,
    )
    return provisioning + timeline.render_run_steps(steps) + "\n" + first_step.render(startup(plan))


def cost_text(plan: Plan) -> str:
    """The infra stack's estimatedCost and the job stack's estimatedRun, in dollars (docs/cost.md)."""
    cost = plan.infra.outputs.get("estimatedCost")
    if not isinstance(cost, dict):
        return "no estimatedCost output\n"
    lines = summary_lines(cost)
    run = plan.jobs.outputs.get("estimatedRun")
    if isinstance(run, dict):
        lines[-1:-1] = run_lines(run)
    return "\n".join(lines) + "\n"


def run_lines(run: Mapping[str, Any]) -> list[str]:
    """estimatedRun as cost.txt prints it: the training steps, the evaluations and their sum, each on its own line
    and saying what it counts; a figure that depends on an unknown step time says unknown."""
    rate = " at your gpuNodeHourlyPrice" if run.get("priceFrom") == USER_RATE else ""

    def hours(value: Any) -> str:
        return "unknown GPU-hours" if value is None else f"{value:g} GPU-hours"

    def cost(key: str) -> str:
        """The figure, as a range where the infra prices its GPU nodes as one (a reservation)."""
        high = run.get(key)
        return dollar_range(run.get(f"{key}Low", high), high)

    seconds = run.get("secondsPerStep")
    per_step = "unknown s (set secondsPerStep)" if seconds is None else f"{seconds:g} s"
    lines = [
        f"one run, training steps: {run['nodes']} GPU node(s) x {run['steps']} steps x {per_step} = "
        f"{hours(run.get('stepGpuHours'))}, {cost('stepUsd')}{rate}",
        f"one run, evaluations: {run['nodes']} GPU node(s) x {run['evals']} evaluation(s), "
        f"{run['evalMinutes']:g} min = {hours(run.get('evalGpuHours'))}, {cost('evalUsd')}{rate}",
        f"one run, steps and evaluations: {hours(run.get('gpuHours'))}, {cost('usd')}{rate} (not counted: the wait "
        "for nodes, pre-flights, data, conversion)",
    ]
    if seconds is not None and run.get("secondsPerStepFrom"):
        source = run["secondsPerStepFrom"]
        lines.append(f"step time from: {'your secondsPerStep' if source == 'secondsPerStep' else source}")
    shown_elsewhere = ("seconds per step: ", "no price", "GPU node rate")  # the step-time line, the infra's notes
    lines += [f"note: {note}" for note in run.get("notes") or [] if not note.startswith(shown_elsewhere)]
    return lines


RAY_PODS_DIR = "ray-pods"


def rendered_ray_pods(plan: Plan) -> list[dict[str, Any]]:
    """The Ray pods of every ray-cluster release, rendered by the real chart (empty when it is not at hand)."""
    if ray_pods.chart_problem():
        return []
    pods = []
    for release in helm_releases(plan).values():
        if release["chart"] != ray_pods.CHART_DIR.name:
            continue
        cluster = ray_pods.render_raycluster(_number(release["values"]), release["releaseName"], release["namespace"])
        pods += ray_pods.ray_pods(cluster)
    return pods


def render_files(plan: Plan) -> dict[str, str]:
    """Relative path -> content: everything `make plan` writes under build/<stack>/."""
    files: dict[str, str] = {}
    for name, obj in rendered_manifests(plan):
        files[f"manifests/{name}"] = to_yaml(obj)
    for name, release in helm_releases(plan).items():
        files[f"helm/{name}.yaml"] = to_yaml(release)
    for pod in rendered_ray_pods(plan):
        files[f"{RAY_PODS_DIR}/{pod['metadata']['name']}.yaml"] = to_yaml(_ordered_manifest(pod))
    files["pipeline.yaml"] = to_yaml(pipeline_doc(plan))
    entries = resource_tree(plan)
    files["resources.json"] = to_json(entries)
    files["resources.txt"] = resource_text(entries)
    files["outputs.json"] = to_json({"infra": redacted_outputs(plan.infra), "jobs": redacted_outputs(plan.jobs)})
    files["timeline.txt"] = timeline_text(plan)
    files["cost.txt"] = cost_text(plan)
    return dict(sorted(files.items()))


# Files every plan output has: a folder holding neither is not one, and write_files will not remove it.
PLAN_OUTPUT_MARKERS = ("pipeline.yaml", "resources.json")


def write_files(out_dir: Path, files: Mapping[str, str]) -> None:
    """Replace out_dir with exactly `files`.

    out_dir is removed first only if it looks like an earlier plan output (it has pipeline.yaml or resources.json)
    or is empty; anything else there (a mistyped --out, e.g. `--out / --stack dev` is /dev) raises PlanError and is
    left alone."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise PlanError(f"{out_dir} exists and is not a folder; refusing to replace it (choose another --out)")
    if out_dir.exists():
        if any(out_dir.iterdir()) and not any((out_dir / name).is_file() for name in PLAN_OUTPUT_MARKERS):
            raise PlanError(
                f"{out_dir} exists and is not a plan output (it has neither "
                f"{' nor '.join(PLAN_OUTPUT_MARKERS)}); refusing to delete it: choose another --out, "
                "or remove the folder yourself"
            )
        shutil.rmtree(out_dir)
    for relative, content in files.items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
