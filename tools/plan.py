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
It prints a summary that fits one screen (what would be created, counted by kind; GPUs and Lustre; the run; the
cost's totals; the modeled time to the first GRPO step; warnings) and names the files above for the details.
Everything written is deterministic (sorted keys, stable order, no timestamps, no absolute paths), so a checked-in
copy (tests/golden/) shows any change to what gets deployed in review. The folder is replaced as a whole, but only
when it is an earlier plan output (or empty): another folder in its place is an error (exit 2), not deleted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/plan.py` puts tools/ first, not the repository
    sys.path.insert(0, str(ROOT))
# The job program's own modules (launcher.*), as its language host finds them: first_step reads its model sizes there.
if str(ROOT / "jobs") not in sys.path:
    sys.path.append(str(ROOT / "jobs"))

from infra.cost import USER_RATE, dollar_range, summary_lines  # noqa: E402
from tools import day2_preview, first_step, nemo_rl_index, ray_pods, stack_check, timeline  # noqa: E402
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
NEMORL_PYTHON = ROOT / ".venv-nemorl" / "bin" / "python"
# Obviously fake: they must never show up in anything written (tests check), only "[secret]" does.
PLACEHOLDER_SECRETS = {"hfToken": "hf_PLACEHOLDER_not_a_token", "wandbApiKey": "wandb_PLACEHOLDER_not_a_key"}
EXIT_CONFIG = 2
# The stack files the repository ships as examples: the tests, golden plans and checkov hold these, and only these,
# so a user's own stack (Pulumi.<mine>.yaml, real values, encrypted secrets) never breaks `make test`.
INFRA_EXAMPLE_STACKS = ("dev", "h200", "b200", "h200-4node")
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


class PlanError(Exception):
    """A problem with what was asked (unknown stack, bad override): printed alone, exit 2."""


@dataclass
class Plan:
    stack: str
    infra: ProgramRun
    jobs: ProgramRun
    timeline: timeline.Timeline
    # What the programs warned about (pulumi.log.warn), in order, each once: `pulumi up` would show these.
    warnings: list[str] = dataclasses.field(default_factory=list)


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


def _named_infra_stack(stack: str) -> str:
    """The job stack file's infraStack, as written ('' when the file or the key is missing)."""
    job_file = JOBS_DIR / f"Pulumi.{stack}.yaml"
    try:
        config = (yaml.safe_load(job_file.read_text()) or {}).get("config") or {}
    except (OSError, yaml.YAMLError):
        return ""
    return str(config.get("nemo-rl-jobs:infraStack") or "")


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


class _WarningsKept(logging.Handler):
    """Under mocks, pulumi.log.warn goes to the root logger (Pulumi's MockEngine): kept here for the summary."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.messages:
            self.messages.append(message)


def run_plan(
    stack: str,
    infra_overrides: Sequence[str] = (),
    job_overrides: Sequence[str] = (),
    wandb: bool = True,
    nemo_rl_sources: Path | None = None,
) -> Plan:
    """Both programs under mocks; raises PlanError for an unknown stack, pulumi.RunError for bad config. With
    wandb=False no W&B key is given, as for a user without one: the run logs to TensorBoard instead. What the
    programs warn about is kept in Plan.warnings (printed before the error when a program fails)."""
    named = _named_infra_stack(stack)
    if stack not in stacks_available() and (JOBS_DIR / f"Pulumi.{stack}.yaml").is_file() and named:
        raise PlanError(
            f"config 'nemo-rl-jobs:infraStack' = {named!r} in jobs/Pulumi.{stack}.yaml names no infra stack file "
            f"here (neither Pulumi.{stack}.yaml nor Pulumi.{named.rpartition('/')[2]}.yaml exists): name one of "
            f"{', '.join(stack_check_infra_files())}: pulumi config set --cwd jobs --stack {stack} infraStack "
            "organization/nemo-rl-gke/<infra stack>"
        )
    kept = _WarningsKept()
    root = logging.getLogger()
    root.addHandler(kept)
    try:
        plan = _run_programs(stack, infra_overrides, job_overrides, wandb, named, nemo_rl_sources)
    except Exception:
        for message in kept.messages:
            print(f"warning: {message}", file=sys.stderr)
        raise
    finally:
        root.removeHandler(kept)
    plan.warnings = kept.messages
    return plan


def _run_programs(
    stack: str,
    infra_overrides: Sequence[str],
    job_overrides: Sequence[str],
    wandb: bool,
    named: str | None,
    nemo_rl_sources: Path | None,
) -> Plan:
    if stack not in stacks_available():
        raise PlanError(
            f"no stack {stack!r}: STACK must name jobs/Pulumi.{stack}.yaml and an infra stack file, "
            f"Pulumi.{stack}.yaml or the one its infraStack names; "
            f"available: {', '.join(stacks_available())}"
        )
    progress(1, "infra program (mocks)")
    infra_stack = infra_stack_of(stack) or stack
    problem = stack_check.infra_stack_problem(stack, infra_stack, named) if named else None
    if problem:
        raise PlanError(problem)
    project, config = load_stack_config(ROOT, infra_stack)
    _apply_overrides(project, config, infra_overrides)
    infra_file = f"Pulumi.{infra_stack}.yaml"
    if stack not in EXAMPLE_STACKS:  # a user's stack: what `pulumi up` would refuse, or run with a stand-in
        problems = stack_check.infra_secret_problems(infra_stack, config, infra_file)
        problems += stack_check.placeholder_problems(infra_stack, config, infra_file)
        if problems:
            raise PlanError("\nplan: ".join(problems))
        secrets = {}  # only the secrets the stack holds (encrypted): without a W&B key the run logs to TensorBoard
    else:  # the examples hold no secrets: planned as for a user who set both
        secrets = {f"{project}:{key}": value for key, value in PLACEHOLDER_SECRETS.items()}
    secrets.update(_placeholders_for_encrypted(project, config, infra_file))
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

    for line in check_with_nemo_rl(infra, jobs, job_config.get(f"{job_project}:extraOverrides") or [], nemo_rl_sources):
        print("\n".join(_wrapped(line, "      ", "        ")))

    progress(3, "timeline model")
    model = timeline.build([infra.resources, jobs.resources])
    return Plan(stack=stack, infra=infra, jobs=jobs, timeline=model)


def stack_check_infra_files() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))


def _nemo_rl_loader(sources: Path, words: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    """NeMo RL's own loader (tools/nemorl_config.py in .venv-nemorl) on the release's sources: (resolved config,
    '') or (None, its one-line refusal)."""
    result = subprocess.run(
        [str(NEMORL_PYTHON), str(ROOT / "tools" / "nemorl_config.py"), "--nemo-rl", str(sources), "--", *words],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if result.returncode == 0:
        return json.loads(result.stdout), ""
    lines = result.stderr.strip().splitlines()
    return None, lines[-1] if lines else f"exit {result.returncode}"


def check_with_nemo_rl(
    infra: ProgramRun, jobs: ProgramRun, extra: Sequence[str], sources_root: Path | None
) -> list[str]:
    """Every GRPO step's recipe and overrides against the image's NeMo RL release, as its loader reads them (the
    first thing the entrypoint does at train, after the GPU nodes are up): against the release's index
    (tools/nemo_rl_index.json), or, for a recipe the index has no keys for, with the release's own loader on its
    sources when they are at hand. Raises PlanError for what it refuses; returns the lines to print (what was
    checked and the recipe's values a user most likely meant to change, or why nothing was checked)."""
    release = infra.outputs.get("nemoRlRelease") or {}
    tag, entrypoint = release.get("tag"), release.get("grpoEntrypoint")
    if not tag or not entrypoint:
        return ["recipe and override keys NOT checked: the image's NeMo RL release is not one the project knows"]
    root = sources_root or stack_check.default_sources_root()
    checked, loaded, notes, values = [], [], [], ""
    for step in jobs.outputs.get("pipeline") or []:
        words = shlex.split(str(step.get("entrypoint") or ""))
        if entrypoint not in words:
            continue
        words = words[words.index(entrypoint) + 1 :]
        recipe = words[0].removeprefix("--config=")
        tail = list(extra) if extra and words[-len(extra) :] == list(extra) else []
        ours = words[1 : len(words) - len(tail)]
        keys = nemo_rl_index.keys_of(tag, recipe)
        if keys is None:
            note = _check_with_loader(tag, recipe, ours, tail, stack_check.release_sources(root, tag))
            if note:
                notes.append(note)
            else:
                loaded.append(step["step"])
            continue
        elsewhere = {other: nemo_rl_index.keys_of(other, recipe) or {} for other in nemo_rl_index.TAGS if other != tag}
        sources = [(word, "stack") for word in ours] + [(word, "override") for word in tail]
        problems, set_by = stack_check.override_problems(keys, sources, recipe, tag, elsewhere)
        recipe_values = nemo_rl_index.values_of(tag, recipe)
        megatron = set_by.get("policy.megatron_cfg.enabled", (recipe_values.get("policy.megatron_cfg.enabled"),))[0]
        backend = stack_check.backend_problem(str(megatron).lower() == "true", ours, recipe, tag)
        problems += [backend] if backend else []
        if problems:
            raise PlanError("\nplan: ".join(problems))
        checked.append(step["step"])
        values = values or f"{step['step']}: {stack_check.shown_values(recipe_values, set_by)}"
    index = f"recipe and override keys checked against NeMo RL {tag}'s index (tools/nemo_rl_index.json): "
    lines = ([index + ", ".join(checked)] if checked else []) + ([values] if values else [])
    if loaded:
        lines.append(f"NeMo RL {tag}'s own loader accepted the recipe and overrides of: {', '.join(loaded)} ({root})")
    return lines + notes


def _check_with_loader(tag: str, recipe: str, ours: list[str], tail: list[str], sources: Path) -> str | None:
    """A recipe the index has no keys for, through the release's own loader on its sources: raises PlanError for
    what it refuses; returns None when it accepted, else the line that says why nothing was checked."""
    reason = nemo_rl_index.unindexed_reason(tag, recipe)
    if not (sources / recipe).is_file():
        if reason is None:  # not a recipe of the release at all
            raise PlanError(stack_check.recipe_problem(tag, recipe))
        missing = stack_check.sources_problem(sources.parent, tag)
        return f"{recipe}: keys not in the index ({reason}): {missing or 'the sources lack it'}"
    if not NEMORL_PYTHON.is_file():
        return (
            f"recipe and override keys NOT checked against NeMo RL {tag}: no {NEMORL_PYTHON.parent.parent.name} "
            "(NeMo RL's loader needs its own Python): create it with: make .venv-nemorl/.installed"
        )
    resolved, refusal = _nemo_rl_loader(sources, [f"--config={recipe}", *ours])
    if resolved is None:
        raise PlanError(f"NeMo RL {tag}'s loader refused the config ({recipe}): {refusal}")
    keys = nemo_rl_index.flat_keys(resolved)
    problems, _ = stack_check.override_problems(keys, [(word, "override") for word in tail], recipe, tag, {})
    megatron = (resolved.get("policy") or {}).get("megatron_cfg") or {}
    backend = stack_check.backend_problem(megatron.get("enabled") is True, ours, recipe, tag)
    problems += [backend] if backend else []
    if problems:
        raise PlanError("\nplan: ".join(problems))
    if tail:
        resolved, refusal = _nemo_rl_loader(sources, [f"--config={recipe}", *ours, *tail])
        if resolved is None:
            raise PlanError(
                f"config 'nemo-rl-jobs:extraOverrides' = {tail!r}: NeMo RL {tag}'s loader refused them on "
                f"{recipe}: {refusal}: fix or remove the item it names"
            )
    return None


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


RUN_TOTAL_PREFIX = "one run, steps and evaluations:"


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
        f"{RUN_TOTAL_PREFIX} {hours(run.get('gpuHours'))}, {cost('usd')}{rate} (not counted: the wait "
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


# ---------------------------------------------------------------------------------------------------------------
# Summary: one screen; the details stay in the files under build/<stack>/ that it names.

# What `make plan` prints, progress lines included, fits one terminal screen (tests hold every shipped stack to it).
SCREEN_LINES = 40
SCREEN_WIDTH = 120
# cost.txt lines the summary leaves to cost.txt: each part's rate, the notes on where a price comes from (counted
# among the warnings), the date of the prices (in the heading). Any other line (totals, one run, what is not
# counted) is printed.
COST_DETAIL_PREFIXES = (
    "one GPU node per hour:",
    "one CPU node per hour:",
    "GKE cluster fee per hour:",
    "boot disk per node-month:",
    "note: ",
    "prices read on ",
    "step time from:",
)
# cost.txt blocks (a heading and its indented rows) left to cost.txt: the price of a GPU node by how it is bought.
COST_DETAIL_BLOCKS = ("one GPU node per hour by how it is bought",)
# Names for what would be created in Google Cloud, by resource type, in the order the summary lists them; a type
# not listed shows as its last segment (`CryptoKeyIAMMember`), after these.
CREATED_LABELS: Mapping[str, str] = {
    "gcp:projects/service:Service": "API",
    "gcp:compute/network:Network": "VPC",
    "gcp:compute/subnetwork:Subnetwork": "subnet",
    "gcp:compute/firewall:Firewall": "firewall rule",
    "gcp:compute/router:Router": "router",
    "gcp:compute/routerNat:RouterNat": "NAT",
    "gcp:compute/globalAddress:GlobalAddress": "peering range",
    "gcp:servicenetworking/connection:Connection": "peering",
    "gcp:container/cluster:Cluster": "GKE cluster",
    "gcp:container/nodePool:NodePool": "node pool",
    "gcp:lustre/instance:Instance": "Lustre instance",
    "gcp:storage/bucket:Bucket": "bucket",
    "gcp:serviceaccount/account:Account": "service account",
    "gcp:projects/iAMMember:IAMMember": "IAM grant",
    "gcp:serviceaccount/iAMMember:IAMMember": "IAM grant",
    "gcp:storage/bucketIAMMember:BucketIAMMember": "IAM grant",
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": "IAM grant",
}
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
# What each file or folder under build/<stack>/ holds, as the summary names it ("" when its name says it).
DETAIL_FILES = (
    ("cost.txt", ""),
    ("timeline.txt", ""),
    ("resources.txt", ""),
    ("resources.json", "the resource tree"),
    ("outputs.json", "stack outputs"),
    ("pipeline.yaml", "Ray jobs"),
    ("manifests/", "{manifests} objects"),
    ("helm/", ""),
    (f"{RAY_PODS_DIR}/", ""),
)


def created_counts(plan: Plan) -> dict[str, dict[str, int]]:
    """What `pulumi up` of both stacks would create, counted by kind: {"Google Cloud": {label: n}, "Kubernetes":
    {kind: n}, "Helm": {release name: 1}}, Google Cloud in CREATED_LABELS' order, Kubernetes in KIND_ORDER's.
    Components, providers and stack references create nothing in the cloud or the cluster: not counted."""
    cloud: dict[str, int] = {}
    cluster: dict[str, int] = {}
    helm: dict[str, int] = {}
    for run in (plan.infra, plan.jobs):
        for resource in run.resources:
            if not resource.custom or resource.type.startswith("pulumi:"):
                continue
            if resource.type == HELM_RELEASE:
                name = str(resource.inputs.get("name") or resource.name)
                helm[name] = helm.get(name, 0) + 1
            elif resource.type.startswith("kubernetes:"):
                kind = resource.type.rpartition(":")[2]
                cluster[kind] = cluster.get(kind, 0) + 1
            else:
                label = CREATED_LABELS.get(resource.type, resource.type.rpartition(":")[2])
                cloud[label] = cloud.get(label, 0) + 1
    order = list(dict.fromkeys(CREATED_LABELS.values()))
    return {
        "Google Cloud": dict(sorted(cloud.items(), key=lambda item: _rank(order, item[0]))),
        "Kubernetes": dict(sorted(cluster.items(), key=lambda item: _rank(list(KIND_ORDER), item[0]))),
        "Helm": helm,
    }


def _rank(order: list[str], name: str) -> tuple[int, str]:
    return (order.index(name) if name in order else len(order), name)


def _wrapped(text: str, indent: str = "  ", hanging: str = "    ") -> list[str]:
    return textwrap.wrap(
        text,
        width=SCREEN_WIDTH,
        initial_indent=indent,
        subsequent_indent=hanging,
        break_on_hyphens=False,
        break_long_words=False,  # a path or URL stays whole, to copy
    )


def _counted(counts: Mapping[str, int], plural: bool) -> list[str]:
    """ "VPC" for one, "3 VPCs" (plural) or "3 Network" (a Kubernetes kind) for more."""
    return [label if n == 1 else f"{n} {label}{'s' if plural else ''}" for label, n in counts.items()]


def _created_lines(plan: Plan) -> list[str]:
    counts = created_counts(plan)
    cloud, cluster, helm = counts["Google Cloud"], counts["Kubernetes"], counts["Helm"]
    releases = [f"Helm release {name}" + (f" x{n}" if n > 1 else "") for name, n in helm.items()]
    return [
        *_wrapped(f"Google Cloud ({sum(cloud.values())}): {', '.join(_counted(cloud, plural=True))}"),
        *_wrapped(
            f"Kubernetes ({sum(cluster.values()) + sum(helm.values())}): "
            + ", ".join([*releases, *_counted(cluster, plural=False)])
        ),
    ]


def plan_warnings(plan: Plan) -> list[str]:
    """What the plan asks the reader to look at: the programs' own warnings (pulumi.log.warn, as `pulumi up` would
    show them), prices that are derived, borrowed or missing."""
    found = list(plan.warnings)
    cost = plan.infra.outputs.get("estimatedCost")
    if isinstance(cost, dict):
        notes = [note for note in cost.get("notes") or [] if isinstance(note, str)]
        if notes:
            found.append(f"cost: {len(notes)} price(s) derived, borrowed or given by you: the notes in cost.txt")
        if cost.get("unpriced"):
            found.append(f"cost: no price for {', '.join(map(str, cost['unpriced']))}; the totals leave it out")
    run = plan.jobs.outputs.get("estimatedRun")
    if isinstance(run, dict):
        if run.get("secondsPerStep") is None:
            found.append("run estimate: seconds per step unknown for this recipe: set secondsPerStep (see cost.txt)")
        elif run.get("notes"):
            found.append(
                f"run estimate: {len(run['notes'])} note(s) on the step time's source and scaling, in cost.txt"
            )
    return found


def summary(plan: Plan, out_dir: Path, files: Mapping[str, str]) -> str:
    """What `make plan` prints: what would be created (counts by kind), GPUs and Lustre, the run, cost, time to the
    first GRPO step, warnings, and which files under out_dir hold the details. One screen (SCREEN_LINES, progress
    lines included, for the shipped stacks); the files hold the rest."""
    o = plan.infra.outputs
    lines = [f"Plan for stack {plan.stack!r}: what `pulumi up` would create (offline: mocks, placeholder secrets)"]
    lines += _created_lines(plan)
    nodes, per_node = o.get("gpuNodes"), o.get("gpusPerNode")
    total = nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else "?"
    hardware = f"GPUs: {nodes} x {o.get('gpuMachineType')} ({per_node} x {o.get('gpuType')} each, {total} in all)"
    capacity, tier = o.get("lustreCapacityGib"), o.get("lustreThroughputMbpsPerTib")
    if isinstance(capacity, int) and isinstance(tier, int):
        hardware += f"; Lustre {capacity} GiB at {tier} MB/s/TiB ({capacity / 1024 * tier / 1000:.1f} GB/s)"
    lines += _wrapped(hardware)
    j = plan.jobs.outputs
    steps = [str(s.get("step")) for s in j.get("pipeline") or []]
    if steps:
        retries = f" (up to {j['maxRestarts']} retries)" if "maxRestarts" in j else ""
        named = [f"{step}{retries}" if step == "train" else step for step in steps]
        destination = f"; the model goes to {j['modelUri']}" if j.get("modelUri") else ""
        lines += _wrapped(f"Run: {', '.join(named)}{destination}")
    cost = o.get("estimatedCost")
    read_on = f" read on {cost.get('pricesReadOn')}" if isinstance(cost, dict) else ""
    lines.append(f"  Estimated cost (USD, list prices{read_on}; each part and its source in cost.txt):")
    in_detail_block = False
    for line in cost_text(plan).splitlines():
        # The per-purchase table is detail too: its heading and its indented rows stay in cost.txt.
        in_detail_block = line.startswith(COST_DETAIL_BLOCKS) or (in_detail_block and line.startswith("  "))
        if not in_detail_block and not line.startswith(COST_DETAIL_PREFIXES):
            lines += _wrapped(line, "    ", "      ")
    t = plan.timeline
    lustre, cluster = t.steps.get("Instance/lustre"), t.steps.get("Cluster/gke")
    beside = lustre and cluster and "Cluster/gke" not in t.ancestors("Instance/lustre")
    lines += _wrapped(
        f"Time (modeled, timeline.txt): infrastructure {t.total:.1f} min"
        + (", Lustre beside the cluster" if beside else "")
        + f" ({t.sequential:.1f} min one after another)"
    )
    for line in first_step.summary_lines(startup(plan)):
        lines += _wrapped(line, "    ", "      ")
    warnings = plan_warnings(plan)
    if not warnings:
        lines.append("  Warnings: none")
    for index, warning in enumerate(warnings):
        lines += _wrapped(warning, f"  Warnings ({len(warnings)}): " if index == 0 else "    ", "    ")
    problem = ray_pods.chart_problem()
    if problem:  # information: `make plan`'s own virtualenv has no test tools; checkov, which reads these, does
        lines += _wrapped(f"Note: {RAY_PODS_DIR}/ (for checkov) left out: {problem}")
    manifests = sum(1 for name in files if name.startswith("manifests/"))
    named = [
        f"{name} ({what.format(manifests=manifests)})" if what else name
        for name, what in DETAIL_FILES
        if any(path == name or path.startswith(name) for path in files)
    ]
    lines += _wrapped(f"Details in {_display(out_dir)}/: {', '.join(named) or 'nothing written'}")
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
    parser.add_argument("--quiet", action="store_true", help="no summary: the progress lines and the warnings only")
    parser.add_argument(
        "--nemo-rl-sources",
        type=Path,
        default=None,
        help="folder holding nemo-rl-<tag>/, NeMo RL's sources at the image's release, to check a recipe the index "
        f"(tools/nemo_rl_index.json) cannot know with its own loader (default {stack_check.default_sources_root()})",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="the deployed infra stack's outputs (pulumi stack output --json --show-secrets, or a plan's "
        "outputs.json): print what the day-2 guard makes of each changed key (tools/day2_preview.py)",
    )
    args = parser.parse_args(argv)
    try:
        previous = day2_preview.previous_record(args.previous) if args.previous else None
    except day2_preview.PreviousError as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        plan = run_plan(
            args.stack, args.config, args.job_config, wandb=not args.no_wandb, nemo_rl_sources=args.nemo_rl_sources
        )
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
    if previous is not None:
        project, config = load_stack_config(ROOT, infra_stack_of(args.stack) or args.stack)
        _apply_overrides(project, config, args.config)
        current = plan.infra.outputs[day2_preview.day2.DEPLOYED_SETTINGS_OUTPUT]
        allowed = day2_preview.allowed_keys(config, project)
        print(day2_preview.report(previous, current, allowed, str(args.previous)))
    else:  # what `pulumi up` would warn about is never silent
        for warning in plan.warnings:
            print(f"warning: {warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
