"""`make plan STACK=<stack>`: what `pulumi up` of the infra stack, then of the job stack, would create, offline.

Runs the infra program under Pulumi's mocks, then the job program fed with the infra program's outputs, with
placeholder secrets, and writes build/<stack>/:
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

import argparse
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/plan.py` puts tools/ first, not the repository
    sys.path.insert(0, str(ROOT))

from infra.cost import USER_RATE, dollars, summary_lines  # noqa: E402
from tools import first_step, ray_pods, timeline  # noqa: E402
from tools.offline import (  # noqa: E402
    REDACTED,
    MissingConfigError,
    ProgramRun,
    Registered,
    StackFileError,
    encrypted_keys,
    load_stack_config,
    run_program,
    set_config_path,
)
from tools.render import manifest, redact  # noqa: E402

JOBS_DIR = ROOT / "jobs"
# Obviously fake: they must never show up in anything written (tests check), only "[secret]" does.
PLACEHOLDER_SECRETS = {"hfToken": "hf_PLACEHOLDER_not_a_token", "wandbApiKey": "wandb_PLACEHOLDER_not_a_key"}
EXIT_CONFIG = 2
# The stack files the repository ships as examples: the tests, golden plans and checkov hold these, and only these,
# so a user's own stack (Pulumi.<mine>.yaml, real values, encrypted secrets) never breaks `make test`.
INFRA_EXAMPLE_STACKS = ("dev", "h200", "b200")
# Job stack files shipped beside those pairs, each running on one of their infra stacks (the stack its infraStack
# names): job stack -> infra stack. Planned, golden and checkov'd like the pairs.
JOB_EXAMPLE_STACKS = {"h200-benchmark": "h200", "smoke": "h200"}
EXAMPLE_STACKS = (*INFRA_EXAMPLE_STACKS, *JOB_EXAMPLE_STACKS)
STEPS = 4

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


class PlanError(Exception):
    """A problem with what was asked (unknown stack, bad override): printed alone, exit 2."""


@dataclass
class Plan:
    stack: str
    infra: ProgramRun
    jobs: ProgramRun
    timeline: timeline.Timeline


# ---------------------------------------------------------------------------------------------------------------
# Running the programs


def infra_stack_of(stack: str) -> str | None:
    """The infra stack a job stack runs on: the infra stack file of the same name, else the one its infraStack
    names (organization/nemo-rl-gke/h200 -> h200) when that stack file exists; None when neither does."""
    if (ROOT / f"Pulumi.{stack}.yaml").is_file():
        return stack
    job_file = JOBS_DIR / f"Pulumi.{stack}.yaml"
    if not job_file.is_file():
        return None
    try:
        config = (yaml.safe_load(job_file.read_text()) or {}).get("config") or {}
    except yaml.YAMLError:
        return None
    named = str(config.get("nemo-rl-jobs:infraStack") or "").rpartition("/")[2]
    return named if named and (ROOT / f"Pulumi.{named}.yaml").is_file() else None


def stacks_available() -> list[str]:
    """Job stack files with an infra stack to run on: one of the same name, or the one its infraStack names."""
    jobs = {p.name[len("Pulumi.") : -len(".yaml")] for p in JOBS_DIR.glob("Pulumi.*.yaml")}
    return sorted(stack for stack in jobs if infra_stack_of(stack))


def _apply_overrides(project: str, config: dict[str, Any], overrides: Sequence[str]) -> None:
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise PlanError(f"bad override {item!r}: expected key=value")
        full = key if ":" in key else f"{project}:{key}"
        nested = "." in key.rpartition(":")[2]  # as `pulumi config set --path` stores it
        if raw == "" and nested:
            _remove_config_path(project, config, key)
        elif raw == "":
            config.pop(full, None)
        elif nested:
            set_config_path(project, config, key, yaml.safe_load(raw))
        else:
            config[full] = yaml.safe_load(raw)


def _remove_config_path(project: str, config: dict[str, Any], key: str) -> None:
    """`-c lustre.capacityGib=` is `pulumi config rm --path lustre.capacityGib`: that field goes, its object stays."""
    if "[" in key:
        raise PlanError(f"bad override {key + '='!r}: a list element cannot be removed; set the whole list")
    top, *fields = key.split(".")
    node = config.get(top if ":" in top else f"{project}:{top}")
    for field in fields[:-1]:
        node = node.get(field) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(fields[-1], None)


def _placeholders_for_encrypted(project: str, config: dict[str, Any], stack_file: str) -> dict[str, str]:
    """Secrets the stack file holds encrypted (`secure:`): the plan cannot decrypt them, so each is replaced by a
    placeholder, and says so."""
    secrets = {}
    for full in encrypted_keys(config):
        del config[full]
        key = full.rpartition(":")[2]
        secrets[full] = PLACEHOLDER_SECRETS.get(key, f"PLACEHOLDER_for_encrypted_{key}")
        print(f"      {full}: encrypted in {stack_file}; planned with a placeholder (only the CLI can decrypt it)")
    return secrets


def run_plan(
    stack: str, infra_overrides: Sequence[str] = (), job_overrides: Sequence[str] = (), wandb: bool = True
) -> Plan:
    """Both programs under mocks; raises PlanError for an unknown stack, pulumi.RunError for bad config. With
    wandb=False no W&B key is given, as for a user without one: the run logs to TensorBoard instead."""
    if stack not in stacks_available():
        raise PlanError(
            f"no stack {stack!r}: STACK must name jobs/Pulumi.{stack}.yaml and an infra stack file, "
            f"Pulumi.{stack}.yaml or the one its infraStack names; "
            f"available: {', '.join(stacks_available())}"
        )
    progress(1, "infra program (mocks)")
    infra_stack = infra_stack_of(stack) or stack
    project, config = load_stack_config(ROOT, infra_stack)
    _apply_overrides(project, config, infra_overrides)
    secrets = {f"{project}:{key}": value for key, value in PLACEHOLDER_SECRETS.items()}
    secrets.update(_placeholders_for_encrypted(project, config, f"Pulumi.{infra_stack}.yaml"))
    if not wandb:  # as for a user without a W&B key, whatever the stack file holds
        secrets.pop(f"{project}:wandbApiKey", None)
    infra = run_program(ROOT, config, secrets=secrets, stack=infra_stack)

    progress(2, "job program (mocks), fed with the infra outputs")
    job_project, job_config = load_stack_config(JOBS_DIR, stack)
    _apply_overrides(job_project, job_config, job_overrides)
    job_secrets = _placeholders_for_encrypted(job_project, job_config, f"jobs/Pulumi.{stack}.yaml")
    reference = str(job_config.get(f"{job_project}:infraStack") or "")
    jobs = run_program(
        JOBS_DIR,
        job_config,
        secrets=job_secrets,
        stack=stack,
        stack_outputs={reference: infra.outputs} if reference else {},
        stack_secret_outputs={reference: infra.secret_outputs} if reference else {},
    )

    progress(3, "timeline model")
    model = timeline.build([infra.resources, jobs.resources])
    return Plan(stack=stack, infra=infra, jobs=jobs, timeline=model)


def progress(step: int, what: str) -> None:
    print(f"[{step}/{STEPS}] {what}…", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Rendering (pure: Plan -> {relative path: text})


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
            provider = r.provider.rsplit("::", 1)[0] if r.provider else ""
            entries.append(
                {
                    "program": program,
                    "label": labels[r.urn],
                    "type": r.type,
                    "name": r.name,
                    "parent": labels.get(r.parent),
                    "custom": r.custom,
                    "provider": labels.get(provider),
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
    provisioning = timeline.render(plan.timeline, lustre_label="Instance/lustre", cluster_label="Cluster/gke")
    return provisioning + timeline.render_run_steps(steps) + "\n" + first_step.render(startup(plan))


def cost_text(plan: Plan) -> str:
    """The infra stack's estimatedCost and the job stack's estimatedRun, in dollars (docs/cost.md)."""
    cost = plan.infra.outputs.get("estimatedCost")
    if not isinstance(cost, dict):
        return "no estimatedCost output\n"
    lines = summary_lines(cost)
    run = plan.jobs.outputs.get("estimatedRun")
    if isinstance(run, dict):
        lines.insert(
            -1,
            f"one run (training steps only): {run['nodes']} GPU node(s) x {run['steps']} steps x "
            f"{run['secondsPerStep']:g} s = {run['gpuHours']:g} GPU-hours, {dollars(run['usd'])}"
            + (" at your gpuNodeHourlyPrice" if run.get("priceFrom") == USER_RATE else ""),
        )
    return "\n".join(lines) + "\n"


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


# ---------------------------------------------------------------------------------------------------------------
# Summary


def _subnets(run: ProgramRun) -> dict[str, dict[str, Any]]:
    return {str(r.inputs.get("name")): r.inputs for r in run.of_type("gcp:compute/subnetwork:Subnetwork")}


def summary(plan: Plan, out_dir: Path, files: Mapping[str, str]) -> str:
    o = plan.infra.outputs
    lines = [f"Plan for stack {plan.stack!r} (offline, mocks, placeholder secrets)"]
    nodes, per_node = o.get("gpuNodes"), o.get("gpusPerNode")
    total = nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else "?"
    lines.append(f"  GPUs: {o.get('gpuType')} on {o.get('gpuMachineType')}: {nodes} nodes x {per_node} = {total}")
    lines.append(f"  Ray workers: {o.get('rayWorkerReplicas')} (cluster {o.get('rayClusterName')})")
    subnets = _subnets(plan.infra)
    cluster_subnet = next((s for s in subnets.values() if s.get("secondaryIpRanges")), None)
    if cluster_subnet:
        secondary = {r["rangeName"]: r["ipCidrRange"] for r in cluster_subnet["secondaryIpRanges"]}
        lines.append(
            f"  Cluster network {o.get('clusterNetwork')}: subnet {cluster_subnet.get('ipCidrRange')}, "
            + ", ".join(f"{k} {v}" for k, v in sorted(secondary.items()))
        )
    gvnic = [s for s in subnets.values() if s.get("name", "").endswith("-gvnic-sub")]
    for subnet in gvnic:
        lines.append(f"  gVNIC network {o.get('gvnicNetwork')}: {subnet.get('name')} {subnet.get('ipCidrRange')}")
    rdma = [subnets[name] for name in o.get("rdmaSubnets") or [] if name in subnets]
    lines.append(
        f"  RDMA network {o.get('rdmaNetwork')}: {len(rdma)} subnets "
        + ", ".join(str(s.get("ipCidrRange")) for s in rdma)
    )
    capacity, tier = o.get("lustreCapacityGib"), o.get("lustreThroughputMbpsPerTib")
    if isinstance(capacity, int) and isinstance(tier, int):
        lines.append(
            f"  Lustre: {capacity} GiB at {tier} MB/s per TiB = {capacity / 1024 * tier / 1000:.1f} GB/s aggregate"
        )
    lines.append("  Estimated cost (USD, list prices):")
    lines += [f"    {line}" for line in cost_text(plan).splitlines()]
    j = plan.jobs.outputs
    if "maxRestarts" in j:
        destination = j.get("modelUri") or "nowhere (no conversion)"
        lines.append(
            f"  Run: a failed train attempt is retried up to {j['maxRestarts']} times "
            f"({', '.join(j.get('trainAttempts') or [])}); the model goes to {destination}"
        )
    for name, run in (("infra", plan.infra), ("jobs", plan.jobs)):
        lines.append(f"  {name} stack outputs:")
        for key, value in redacted_outputs(run).items():
            text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
            if key == "pipeline":
                text = " -> ".join(s["step"] for s in value)
            lines.append(f"    {key}: {text if len(text) <= 110 else text[:107] + '...'}")
    manifests = sum(1 for f in files if f.startswith("manifests/"))
    lines.append(f"  Wrote {len(files)} files ({manifests} manifests) to {_display(out_dir)}/")
    problem = ray_pods.chart_problem()
    if problem:
        lines.append(f"  {RAY_PODS_DIR}/ not written: {problem}")
    t = plan.timeline
    lines.append(
        f"  Timeline (modeled): {t.total:.1f} min in parallel vs {t.sequential:.1f} min one after another; "
        f"critical path: {' -> '.join(s.label for s in t.critical_path if s.duration.minutes >= 1)}"
    )
    lustre, cluster = t.steps.get("Instance/lustre"), t.steps.get("Cluster/gke")
    if lustre and cluster and "Cluster/gke" not in t.ancestors("Instance/lustre"):
        lines.append(
            f"  Lustre builds beside the cluster ({lustre.start:.1f}-{lustre.end:.1f} min vs "
            f"{cluster.start:.1f}-{cluster.end:.1f} min); see timeline.txt"
        )
    lines += [f"  {line}" for line in first_step.summary_lines(startup(plan))]
    return "\n".join(lines)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stack", default="dev", help="stack name: Pulumi.<stack>.yaml and jobs/Pulumi.<stack>.yaml")
    parser.add_argument("--out", default=str(ROOT / "build"), help="folder that gets <stack>/ (default build/)")
    parser.add_argument(
        "-c", "--config", action="append", default=[], metavar="KEY=VALUE", help="override an infra config key"
    )
    parser.add_argument(
        "-j", "--job-config", action="append", default=[], metavar="KEY=VALUE", help="override a job config key"
    )
    parser.add_argument(
        "--no-wandb", action="store_true", help="give no W&B key (the run logs to TensorBoard on Lustre)"
    )
    parser.add_argument("--quiet", action="store_true", help="no summary, only the progress lines")
    args = parser.parse_args(argv)
    try:
        plan = run_plan(args.stack, args.config, args.job_config, wandb=not args.no_wandb)
    except (PlanError, StackFileError) as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except (pulumi.RunError, MissingConfigError) as error:  # ConfigError names key, value and what is allowed
        print(f"plan: invalid config for stack {args.stack!r}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    out_dir = Path(args.out) / args.stack
    progress(4, f"render and write {_display(out_dir)}/")
    files = render_files(plan)
    try:
        write_files(out_dir, files)
    except PlanError as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if not args.quiet:
        print(summary(plan, out_dir, files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
