"""A modeled provisioning timeline: how long `pulumi up` of the infra stack, then the job stack, should take.

Pure: it reads what the programs registered (tools.offline.Registered, or anything with the same fields) and one
table of typical creation times per resource type, and returns a schedule. Nothing is measured; the figures are
the ones in DURATIONS, each with where it comes from or marked as an estimate.

Model, as the Pulumi engine runs a program:
- a resource starts once everything it depends on is done: its explicit and property dependencies, its provider
  (a Kubernetes provider needs the cluster's endpoint), and its parent: a component parent's registration, a custom
  resource parent's creation;
- a dependency on a component waits for all the component's descendants; components themselves take no time;
- resources with nothing between them are created in parallel;
- the job stack is applied after the infra stack is complete (its StackReference reads the infra outputs).
The sequential sum is the same steps done one after another, the way a step-by-step tutorial runs its commands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

INFRA_DONE = "(infra stack complete)"


class ResourceLike(Protocol):
    """What the timeline reads of a registered resource (tools.offline.Registered has it all)."""

    @property
    def urn(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def parent(self) -> str: ...
    @property
    def dependencies(self) -> list[str]: ...
    @property
    def property_dependencies(self) -> dict[str, list[str]]: ...
    @property
    def provider(self) -> str: ...
    @property
    def custom(self) -> bool: ...
    @property
    def inputs(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Duration:
    minutes: float
    source: str  # a URL (optionally with a note), or "estimate: ..." when no published figure was found


LUSTRE_TYPE = "gcp:lustre/instance:Instance"
_LUSTRE_P99 = (
    "https://github.com/GoogleCloudPlatform/magic-modules/pull/14878 (2025-08-19, the Managed Lustre team: create "
    "P99 'around 40 to 80 minutes'; the provider's create timeout raised to 120 min)"
)
_LUSTRE_BY_TIER = (
    "https://github.com/GoogleCloudPlatform/cluster-toolkit/pull/5079 (2026-01-08, testing every tier: 125 and 250 "
    "MB/s/TiB 'take more than 1hr to deploy', 500 and 1000 'less than 1hr')"
)


@dataclass(frozen=True)
class LustreCreation:
    typical: Duration  # what the modeled timeline takes
    worst: Duration  # the worst case published: the cold-start range ends there


# Managed Lustre creation by throughput tier (MB/s per TiB). No median is published: "typical" is the bound the
# sources give for the tier (the low end of the P99 range for the tiers under an hour, one hour for the tiers over
# it), "worst" the top of the P99 range.
LUSTRE_CREATION: Mapping[int, LustreCreation] = {
    tier: LustreCreation(
        typical=Duration(
            60.0 if tier in (125, 250) else 40.0,
            (f"{_LUSTRE_BY_TIER}: more than an hour, its lower bound taken"
             if tier in (125, 250) else
             f"{_LUSTRE_P99}: the low end of the P99 range; {_LUSTRE_BY_TIER}: under an hour"),
        ),
        worst=Duration(80.0, f"{_LUSTRE_P99}: the top of the P99 range"),
    )
    for tier in (125, 250, 500, 1000)
}  # fmt: skip
_NETWORK_SOURCE = (
    "https://github.com/opea-project/GenAIInfra/pull/977 (apply log: google_compute_network "
    "'Creation complete after 22s')"
)

_K8S_OBJECT = Duration(0.05, "estimate: seconds (Kubernetes object)")
_IAM_GRANT = Duration(0.25, "estimate: seconds (one IAM policy read-modify-write)")
# One table: typical creation time per resource type. Types not listed take DEFAULT_DURATION (tests keep every
# type the programs register listed here).
DURATIONS: Mapping[str, Duration] = {
    "gcp:compute/network:Network": Duration(0.5, _NETWORK_SOURCE),
    "gcp:compute/subnetwork:Subnetwork": Duration(0.25, "estimate: seconds, like the network"),
    "gcp:compute/firewall:Firewall": Duration(0.25, "estimate: seconds"),
    "gcp:compute/globalAddress:GlobalAddress": Duration(0.25, "estimate: seconds"),
    "gcp:compute/router:Router": Duration(0.25, "estimate: seconds"),
    "gcp:compute/routerNat:RouterNat": Duration(0.5, "estimate: under a minute (a router update)"),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": _IAM_GRANT,
    "gcp:servicenetworking/connection:Connection": Duration(1.5, "estimate: 1-2 min for the VPC peering"),
    "gcp:projects/service:Service": Duration(
        1.0, "estimate: about a minute to enable an API on a new project; seconds when it is already on"
    ),
    "gcp:serviceaccount/account:Account": Duration(0.1, "estimate: seconds"),
    "gcp:projects/iAMMember:IAMMember": _IAM_GRANT,
    "gcp:serviceaccount/iAMMember:IAMMember": Duration(0.25, "estimate: seconds"),
    "gcp:container/cluster:Cluster": Duration(
        8.0, "estimate: 5-8 min for a regional Standard control plane with its temporary default pool"
    ),
    "gcp:container/nodePool:NodePool": Duration(
        4.0, "estimate: 3-5 min for the pool; its GPU nodes' boot is modeled in the first-step phases (first_step.py)"
    ),
    "pulumi:providers:kubernetes": Duration(0.0, "no cloud call: configuration only"),
    "pulumi:pulumi:StackReference": Duration(0.05, "estimate: one read of the infra stack's outputs"),
    "kubernetes:helm.sh/v3:Release": Duration(
        1.0, "estimate: ~1 min, chart fetch and install; skipAwait, so no wait for the pods"
    ),
    "kubernetes:apps/v1:DaemonSet": Duration(
        0.05, "estimate: seconds; skipAwait, so no wait for its pods or their image pulls (Kubernetes object)"
    ),
    "random:index/randomPassword:RandomPassword": Duration(0.01, "no cloud call: computed by the provider"),
    "kubernetes:core/v1:Namespace": _K8S_OBJECT,
    "kubernetes:core/v1:Secret": _K8S_OBJECT,
    "kubernetes:core/v1:ConfigMap": _K8S_OBJECT,
    "kubernetes:core/v1:ServiceAccount": _K8S_OBJECT,
    "kubernetes:core/v1:PersistentVolume": _K8S_OBJECT,
    "kubernetes:core/v1:PersistentVolumeClaim": Duration(
        0.1, "estimate: seconds, binding to the pre-created volume (Kubernetes object)"
    ),
    "kubernetes:networking.k8s.io/v1:NetworkPolicy": _K8S_OBJECT,
    "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy": _K8S_OBJECT,
    "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding": _K8S_OBJECT,
    "kubernetes:networking.gke.io/v1:GKENetworkParamSet": _K8S_OBJECT,
    "kubernetes:networking.gke.io/v1:Network": _K8S_OBJECT,
    "kubernetes:batch/v1:Job": Duration(
        0.05, "estimate: seconds; its waitFor is met once the Job exists, so `pulumi up` does not wait for the run"
    ),
    "kubernetes:rbac.authorization.k8s.io/v1:Role": _K8S_OBJECT,
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": _K8S_OBJECT,
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole": _K8S_OBJECT,
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": _K8S_OBJECT,
    "kubernetes:apps/v1:Deployment": Duration(
        0.1, "estimate: seconds; the provider waits for the pod, which starts from an image already on the node"
    ),
    "kubernetes:core/v1:Service": _K8S_OBJECT,
    "gcp:storage/bucket:Bucket": Duration(0.1, "estimate: seconds"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": _IAM_GRANT,
}
DEFAULT_DURATION = Duration(0.5, "estimate: default for a type without a figure")

# The run after `pulumi up`: how long pipeline steps hold the GPU nodes, one row per step with a figure (steps
# without a row are not modeled here). Keyed by the pipeline's step names.
_GSM8K_EVALUATION = Duration(
    8.0, "estimate: 6-8 min per GSM8K evaluation of a 27B model on one 8-GPU node, mostly vLLM start-up (GKE sample)"
)
RUN_STEP_DURATIONS: Mapping[str, Duration] = {"eval-base": _GSM8K_EVALUATION, "eval-final": _GSM8K_EVALUATION}


def render_run_steps(step_names: Iterable[str]) -> str:
    """The modeled run steps of a pipeline, in its order, with their figures; "" when none has a row."""
    rows = [(name, RUN_STEP_DURATIONS[name]) for name in step_names if name in RUN_STEP_DURATIONS]
    if not rows:
        return ""
    lines = ["", "Run steps after `pulumi up` (modeled ones only):"]
    lines += [f"  {d.minutes:6.2f} min  {name}: {d.source}" for name, d in rows]
    lines.append(f"  {sum(d.minutes for _, d in rows):6.2f} min  in all")
    return "\n".join(lines) + "\n"


COMPONENT = Duration(0.0, "component: takes no time itself")


def lustre_tier(resource: ResourceLike) -> int:
    """The throughput tier a registered Lustre instance asks for (its perUnitStorageThroughput input)."""
    tier = resource.inputs.get("perUnitStorageThroughput")
    try:
        return int(str(tier))
    except ValueError:
        raise ValueError(f"a Lustre instance without a throughput tier: perUnitStorageThroughput={tier!r}") from None


def lustre_creation(tier: int) -> LustreCreation:
    if tier not in LUSTRE_CREATION:
        raise ValueError(f"no Managed Lustre creation time for tier {tier}: one of {sorted(LUSTRE_CREATION)}")
    return LUSTRE_CREATION[tier]


def duration_of(resource: ResourceLike, worst: bool = False) -> Duration:
    """A resource's creation time: Managed Lustre's by its tier (typical, or the worst case), others by type."""
    if resource.type == LUSTRE_TYPE:
        creation = lustre_creation(lustre_tier(resource))
        return creation.worst if worst else creation.typical
    if resource.type in DURATIONS:
        return DURATIONS[resource.type]
    return DEFAULT_DURATION if resource.custom else COMPONENT


def short_kind(type_token: str) -> str:
    """'gcp:compute/subnetwork:Subnetwork' -> 'Subnetwork'; providers -> 'Provider'."""
    if type_token.startswith("pulumi:providers:"):
        return "Provider"
    return type_token.rsplit(":", 1)[-1]


def label_of(resource: ResourceLike) -> str:
    """A short, readable name: 'Kind/name'."""
    return f"{short_kind(resource.type)}/{resource.name}"


@dataclass(frozen=True)
class Step:
    label: str
    type: str
    start: float
    end: float
    duration: Duration


@dataclass
class Timeline:
    steps: dict[str, Step]  # by label, every resource (components with zero duration) and the INFRA_DONE milestone
    critical_path: list[Step]  # from the first resource to the last to finish; zero-time components left out
    total: float  # minutes, the modeled parallel `pulumi up`
    sequential: float  # minutes, the same steps one after another
    waits: dict[str, list[str]] = field(default_factory=dict)  # label -> labels it waits for (parent included)
    parents: dict[str, str] = field(default_factory=dict)  # label -> its parent's label
    children: dict[str, list[str]] = field(default_factory=dict)  # label -> its children's labels

    def ancestors(self, label: str) -> set[str]:
        """Everything `label` waits for, directly or not; waiting for a component (other than one's parent) means
        waiting for everything inside it."""
        seen: set[str] = set()
        expanded: set[str] = set()
        todo = [(label, dep) for dep in self.waits.get(label, [])]
        while todo:
            waiter, current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo += [(current, dep) for dep in self.waits.get(current, [])]
            if self.parents.get(waiter) != current and current not in expanded:
                expanded.add(current)
                todo += [(current, child) for child in self.children.get(current, [])]
        seen.discard(label)
        return seen


@dataclass(frozen=True)
class _Node:
    label: str
    type: str
    duration: Duration
    component: bool
    parent: str | None  # label of the parent inside the same program
    waits: tuple[str, ...]  # labels it waits for (its parent included)


def provider_urn(reference: str) -> str:
    # The engine's provider reference is "<urn>::<id>"; a URN contains "::" itself.
    return reference.rsplit("::", 1)[0] if reference else ""


def _program_nodes(resources: Sequence[ResourceLike], after: str | None, worst: bool = False) -> list[_Node]:
    by_urn = {r.urn: r for r in resources}
    labels = [label_of(r) for r in resources]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"resource labels are not unique: {duplicates}")
    nodes = []
    for r in resources:
        urns = list(r.dependencies) + [u for deps in r.property_dependencies.values() for u in deps]
        if provider_urn(r.provider):
            urns.append(provider_urn(r.provider))
        waits = {label_of(by_urn[u]) for u in urns if u in by_urn}
        parent = label_of(by_urn[r.parent]) if r.parent in by_urn else None
        if parent:
            waits.add(parent)
        elif after:
            waits.add(after)
        waits.discard(label_of(r))
        nodes.append(_Node(label_of(r), r.type, duration_of(r, worst), not r.custom, parent, tuple(sorted(waits))))
    return nodes


class _Schedule:
    def __init__(self, nodes: Sequence[_Node]) -> None:
        self.nodes = {n.label: n for n in nodes}
        self.children: dict[str, list[str]] = {}
        for n in nodes:
            if n.parent:
                self.children.setdefault(n.parent, []).append(n.label)
        self._start: dict[str, float] = {}
        self._finish: dict[str, float] = {}
        self._visiting: set[str] = set()

    def constraint(self, label: str, dep: str) -> float:
        """When `dep` lets `label` start. Its parent: a component once it has started (registered), a custom
        resource once it has been created (its end) - never the parent's finish, which includes `label` itself.
        Anything else once it has finished (a component once everything under it has)."""
        node = self.nodes[dep]
        if self.nodes[label].parent == dep:
            return self.start(dep) if node.component else self.end(dep)
        return self.finish(dep)

    def start(self, label: str) -> float:
        if label not in self._start:
            if label in self._visiting:
                raise ValueError(f"dependency cycle through {label}")
            self._visiting.add(label)
            self._start[label] = max([0.0, *(self.constraint(label, d) for d in self.nodes[label].waits)])
            self._visiting.discard(label)
        return self._start[label]

    def end(self, label: str) -> float:
        return self.start(label) + self.nodes[label].duration.minutes

    def finish(self, label: str) -> float:
        if label not in self._finish:
            inside = [self.finish(child) for child in self.children.get(label, [])]
            self._finish[label] = max([self.end(label), *inside])
        return self._finish[label]

    def last_inside(self, label: str) -> str:
        """The resource whose end is the finish of `label` (itself, or the last to finish under a component)."""
        current = label
        while True:
            if abs(self.end(current) - self.finish(current)) < 1e-9:
                return current
            current = max(self.children[current], key=lambda c: (self.finish(c), c))

    def critical_path(self) -> list[str]:
        if not self.nodes:
            return []
        current = max(self.nodes, key=lambda label: (self.end(label), self.nodes[label].duration.minutes, label))
        path = [current]
        while True:
            node, begin = self.nodes[current], self.start(current)
            binding = [d for d in node.waits if abs(self.constraint(current, d) - begin) < 1e-9]
            if not binding:
                break
            dep = max(binding, key=lambda d: (self.nodes[d].duration.minutes, d))
            current = dep if node.parent == dep else self.last_inside(dep)
            if current in path:
                break
            path.append(current)
        path.reverse()
        return path


def build(programs: Sequence[Sequence[ResourceLike]], worst: bool = False) -> Timeline:
    """Schedule one program, or the infra program then the job program (which starts when the infra is up).
    `worst`: Managed Lustre takes its tier's worst-case creation time instead of the typical one."""
    nodes: list[_Node] = []
    after: str | None = None
    for index, resources in enumerate(programs):
        program = _program_nodes(resources, after, worst)
        clash = sorted({n.label for n in program} & {n.label for n in nodes})
        if clash:
            raise ValueError(f"resource labels are not unique across programs: {clash}")
        nodes += program
        if index < len(programs) - 1:
            # A milestone: the stack's `pulumi up` has returned, everything in it has finished.
            after = INFRA_DONE
            nodes.append(_Node(INFRA_DONE, "", COMPONENT, False, None, tuple(sorted(n.label for n in program))))
    schedule = _Schedule(nodes)
    steps = {
        n.label: Step(n.label, n.type, schedule.start(n.label), schedule.end(n.label), n.duration)
        for n in sorted(nodes, key=lambda n: (schedule.start(n.label), schedule.end(n.label), n.label))
    }
    path = [steps[label] for label in schedule.critical_path()]
    return Timeline(
        steps=steps,
        critical_path=[s for s in path if s.duration.minutes > 0 or s.label == INFRA_DONE],
        total=max((s.end for s in steps.values()), default=0.0),
        sequential=sum(s.duration.minutes for s in steps.values()),
        waits={n.label: list(n.waits) for n in nodes},
        parents={n.label: n.parent for n in nodes if n.parent},
        children={parent: sorted(children) for parent, children in schedule.children.items()},
    )


def _timed(timeline: Timeline, labels: Iterable[str]) -> list[str]:
    return sorted(label for label in labels if label in timeline.steps and timeline.steps[label].duration.minutes > 0)


def render(
    timeline: Timeline,
    *,
    lustre_label: str | None = None,
    cluster_label: str | None = None,
    lustre_tier: int | None = None,
) -> str:
    """The timeline as text: the critical path with start/end minutes, the totals, and where Lustre builds (with its
    tier's creation range when `lustre_tier` is given)."""
    lines = ["Modeled provisioning timeline (minutes; typical creation times from one table, not a measurement)", ""]
    lines.append("Critical path (start -> end):")
    for step in timeline.critical_path:
        lines.append(f"  {step.start:6.2f} -> {step.end:6.2f}  {step.label}")
    lines.append("")
    lines.append(f"Modeled total, in parallel as `pulumi up` runs it: {timeline.total:.1f} min")
    lines.append(f"Sum of the same steps one after another, as the tutorial runs them: {timeline.sequential:.1f} min")
    if lustre_label in timeline.steps and cluster_label in timeline.steps:
        assert lustre_label is not None and cluster_label is not None
        lustre, cluster = timeline.steps[lustre_label], timeline.steps[cluster_label]
        lines.append("")
        if cluster_label in timeline.ancestors(lustre_label):
            lines.append(f"Lustre waits for the cluster: {lustre.label} starts at {lustre.start:.1f} min.")
        else:
            lines.append(
                f"Lustre builds beside the cluster: {lustre.label} runs {lustre.start:.1f}-{lustre.end:.1f} min "
                f"while {cluster.label} runs {cluster.start:.1f}-{cluster.end:.1f} min; it waits only for "
                f"{', '.join(_timed(timeline, timeline.ancestors(lustre_label)))}."
            )
    if lustre_tier is not None:
        creation = lustre_creation(lustre_tier)
        lines.append(
            f"Managed Lustre creation at {lustre_tier} MB/s/TiB: {creation.typical.minutes:g} min modeled, up to "
            f"{creation.worst.minutes:g} min (worst case: {creation.worst.source})."
        )
    lines.append("")
    lines.append("Creation times used, per resource type:")
    used = {(s.type, s.duration) for s in timeline.steps.values() if s.type and s.duration.minutes > 0}
    for type_token, duration in sorted(used, key=lambda t: t[0]):
        lines.append(f"  {duration.minutes:5.2f} min  {type_token}: {duration.source}")
    lines.append("  Components and providers take no time of their own.")
    return "\n".join(lines) + "\n"
