"""What `make plan` prints: one screen that sums the plan up and names the files under build/<stack>/ for the rest."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from tools import first_step, ray_pods
from tools.plan_run import Plan, wrapped
from tools.render import KIND_ORDER, RAY_PODS_DIR, cost_text, startup

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
    cloud, cluster, helm = Counter[str](), Counter[str](), Counter[str]()
    for run in (plan.infra, plan.jobs):
        for resource in run.resources:
            if not resource.custom or resource.type.startswith("pulumi:"):
                continue
            if resource.type == HELM_RELEASE:
                helm[str(resource.inputs.get("name") or resource.name)] += 1
            elif resource.type.startswith("kubernetes:"):
                cluster[resource.type.rpartition(":")[2]] += 1
            else:
                cloud[CREATED_LABELS.get(resource.type, resource.type.rpartition(":")[2])] += 1
    order = list(dict.fromkeys(CREATED_LABELS.values()))
    return {
        "Google Cloud": dict(sorted(cloud.items(), key=lambda item: _rank(order, item[0]))),
        "Kubernetes": dict(sorted(cluster.items(), key=lambda item: _rank(list(KIND_ORDER), item[0]))),
        "Helm": dict(helm),
    }


def _rank(order: list[str], name: str) -> tuple[int, str]:
    return (order.index(name) if name in order else len(order), name)


def _counted(counts: Mapping[str, int], plural: bool) -> list[str]:
    """ "VPC" for one, "3 VPCs" (plural) or "3 Network" (a Kubernetes kind) for more."""
    return [label if n == 1 else f"{n} {label}{'s' if plural else ''}" for label, n in counts.items()]


def _created_lines(plan: Plan) -> list[str]:
    counts = created_counts(plan)
    cloud, cluster, helm = counts["Google Cloud"], counts["Kubernetes"], counts["Helm"]
    releases = [f"Helm release {name}" + (f" x{n}" if n > 1 else "") for name, n in helm.items()]
    return [
        *wrapped(f"Google Cloud ({sum(cloud.values())}): {', '.join(_counted(cloud, plural=True))}"),
        *wrapped(
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
    lines += wrapped(hardware)
    j = plan.jobs.outputs
    steps = [str(s.get("step")) for s in j.get("pipeline") or []]
    if steps:
        retries = f" (up to {j['maxRestarts']} retries)" if "maxRestarts" in j else ""
        named = [f"{step}{retries}" if step == "train" else step for step in steps]
        destination = f"; the model goes to {j['modelUri']}" if j.get("modelUri") else ""
        lines += wrapped(f"Run: {', '.join(named)}{destination}")
    cost = o.get("estimatedCost")
    read_on = f" read on {cost.get('pricesReadOn')}" if isinstance(cost, dict) else ""
    lines.append(f"  Estimated cost (USD, list prices{read_on}; each part and its source in cost.txt):")
    in_detail_block = False
    for line in cost_text(plan).splitlines():
        # The per-purchase table is detail too: its heading and its indented rows stay in cost.txt.
        in_detail_block = line.startswith(COST_DETAIL_BLOCKS) or (in_detail_block and line.startswith("  "))
        if not in_detail_block and not line.startswith(COST_DETAIL_PREFIXES):
            lines += wrapped(line, "    ", "      ")
    t = plan.timeline
    lustre, cluster = t.steps.get("Instance/lustre"), t.steps.get("Cluster/gke")
    beside = lustre and cluster and "Cluster/gke" not in t.ancestors("Instance/lustre")
    lines += wrapped(
        f"Time (modeled, timeline.txt): infrastructure {t.total:.1f} min"
        + (", Lustre beside the cluster" if beside else "")
        + f" ({t.sequential:.1f} min one after another)"
    )
    for line in first_step.summary_lines(startup(plan)):
        lines += wrapped(line, "    ", "      ")
    warnings = plan_warnings(plan)
    if not warnings:
        lines.append("  Warnings: none")
    for index, warning in enumerate(warnings):
        lines += wrapped(warning, f"  Warnings ({len(warnings)}): " if index == 0 else "    ", "    ")
    problem = ray_pods.chart_problem()
    if problem:  # information: `make plan`'s own virtualenv has no test tools; checkov, which reads these, does
        lines += wrapped(f"Note: {RAY_PODS_DIR}/ (for checkov) left out: {problem}")
    manifests = sum(1 for name in files if name.startswith("manifests/"))
    named = [
        f"{name} ({what.format(manifests=manifests)})" if what else name
        for name, what in DETAIL_FILES
        if any(path == name or path.startswith(name) for path in files)
    ]
    lines += wrapped(f"Details in {display_path(out_dir)}/: {', '.join(named) or 'nothing written'}")
    return "\n".join(lines)


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
