"""The modeled provisioning timeline: scheduling rules on small graphs, then the real dev plan."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from tools import timeline
from tools.plan_run import Plan, run_plan

STACK_URN = "urn:pulumi:t::p::pulumi:pulumi:Stack::p-t"
NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
CLUSTER = "gcp:container/cluster:Cluster"
POOL = "gcp:container/nodePool:NodePool"
LUSTRE = "gcp:lustre/instance:Instance"
SECRET = "kubernetes:core/v1:Secret"
PROVIDER = "pulumi:providers:kubernetes"


@dataclass
class Res:
    """The fields of tools.offline.Registered the timeline reads."""

    type: str
    name: str
    parent: str = STACK_URN
    dependencies: list[str] = field(default_factory=list)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    provider: str = ""
    custom: bool = True
    inputs: dict[str, str] = field(default_factory=lambda: {"perUnitStorageThroughput": "500"})

    @property
    def urn(self) -> str:
        return f"urn:pulumi:t::p::{self.type}::{self.name}"


def minutes(type_token: str) -> float:
    if type_token == LUSTRE:  # by tier: Res asks for 500 MB/s/TiB
        return timeline.LUSTRE_CREATION[500].typical.minutes
    return timeline.DURATIONS[type_token].minutes


def test_independent_resources_run_in_parallel_and_chains_add_up():
    net = Res(NETWORK, "net")
    subnet = Res(SUBNET, "sub", dependencies=[net.urn])
    cluster = Res(CLUSTER, "gke", property_dependencies={"subnetwork": [subnet.urn]})
    lustre = Res(LUSTRE, "lustre", dependencies=[net.urn])
    t = timeline.build([[net, subnet, cluster, lustre]])
    steps = t.steps
    assert steps["Network/net"].start == 0
    assert steps["Subnetwork/sub"].start == minutes(NETWORK)
    assert steps["Cluster/gke"].start == minutes(NETWORK) + minutes(SUBNET)
    assert steps["Instance/lustre"].start == minutes(NETWORK)  # beside the subnet and the cluster
    assert t.total == pytest.approx(minutes(NETWORK) + minutes(LUSTRE))
    assert t.sequential == pytest.approx(sum(minutes(x) for x in (NETWORK, SUBNET, CLUSTER, LUSTRE)))
    assert [s.label for s in t.critical_path] == ["Network/net", "Instance/lustre"]
    assert "Cluster/gke" not in t.ancestors("Instance/lustre")


def test_a_dependency_on_a_component_waits_for_everything_inside_it():
    component = Res("my:index:Networks", "networks", custom=False)
    net = Res(NETWORK, "net", parent=component.urn)
    subnet = Res(SUBNET, "sub", parent=component.urn, dependencies=[net.urn])
    cluster = Res(CLUSTER, "gke", dependencies=[component.urn])
    t = timeline.build([[component, net, subnet, cluster]])
    assert t.steps["Networks/networks"].end == 0  # components take no time themselves
    assert {"Networks/networks", "Network/net", "Subnetwork/sub"} <= t.ancestors("Cluster/gke")
    # A child waits for its parent's registration, not for its siblings.
    assert t.ancestors("Network/net") == {"Networks/networks"}
    assert t.steps["Cluster/gke"].start == pytest.approx(minutes(NETWORK) + minutes(SUBNET))
    # The path goes through the component to what finished last inside it.
    assert [s.label for s in t.critical_path] == ["Network/net", "Subnetwork/sub", "Cluster/gke"]


def test_children_wait_for_what_their_parent_component_depends_on():
    pool = Res(POOL, "gpu")
    installer = Res("my:index:Installer", "installer", custom=False, dependencies=[pool.urn])
    manifest = Res("kubernetes:apps/v1:DaemonSet", "manifest", parent=installer.urn)
    t = timeline.build([[pool, installer, manifest]])
    assert t.steps["DaemonSet/manifest"].start == pytest.approx(minutes(POOL))
    assert "NodePool/gpu" in t.ancestors("DaemonSet/manifest")


def test_a_child_of_a_custom_resource_starts_when_its_parent_is_created():
    cluster = Res(CLUSTER, "gke")
    pool = Res(POOL, "gpu", parent=cluster.urn)  # a custom resource as parent: no cycle through the parent's finish
    t = timeline.build([[cluster, pool]])
    assert t.steps["NodePool/gpu"].start == pytest.approx(minutes(CLUSTER))
    assert t.total == pytest.approx(minutes(CLUSTER) + minutes(POOL))
    assert [s.label for s in t.critical_path] == ["Cluster/gke", "NodePool/gpu"]
    assert t.ancestors("NodePool/gpu") == {"Cluster/gke"}


def test_kubernetes_objects_wait_for_the_cluster_through_their_provider():
    cluster = Res(CLUSTER, "gke")
    provider = Res(PROVIDER, "k8s", dependencies=[cluster.urn])
    secret = Res(SECRET, "tokens", provider=f"{provider.urn}::provider-id")
    t = timeline.build([[cluster, provider, secret]])
    assert t.steps["Secret/tokens"].start == pytest.approx(minutes(CLUSTER))
    assert [s.label for s in t.critical_path] == ["Cluster/gke", "Secret/tokens"]


def test_the_job_stack_starts_when_the_infra_stack_is_complete():
    lustre = Res(LUSTRE, "lustre")
    net = Res(NETWORK, "net")
    reference = Res("pulumi:pulumi:StackReference", "org/infra/dev")
    job = Res("kubernetes:batch/v1:Job", "pipeline", dependencies=[reference.urn])
    t = timeline.build([[lustre, net], [reference, job]])
    assert t.steps[timeline.INFRA_DONE].start == pytest.approx(minutes(LUSTRE))
    assert t.steps["StackReference/org/infra/dev"].start == pytest.approx(minutes(LUSTRE))
    assert t.total == pytest.approx(
        minutes(LUSTRE) + minutes("pulumi:pulumi:StackReference") + minutes("kubernetes:batch/v1:Job")
    )
    labels = [s.label for s in t.critical_path]
    assert labels == ["Instance/lustre", timeline.INFRA_DONE, "StackReference/org/infra/dev", "Job/pipeline"]


def test_unknown_types_get_the_default_and_components_nothing():
    custom = Res("gcp:foo/bar:Baz", "x")
    component = Res("my:index:Thing", "y", custom=False)
    assert timeline.duration_of(custom) == timeline.DEFAULT_DURATION
    assert timeline.duration_of(component).minutes == 0


def test_cycles_and_ambiguous_labels_are_errors():
    a = Res(NETWORK, "a")
    b = Res(SUBNET, "b", dependencies=[a.urn])
    a.dependencies.append(b.urn)
    with pytest.raises(ValueError, match="cycle"):
        timeline.build([[a, b]])
    first = Res(NETWORK, "same", parent=STACK_URN)
    second = Res(NETWORK, "same", parent="urn:pulumi:t::p::my:index:C::c")
    with pytest.raises(ValueError, match="not unique"):
        timeline.build([[first, second]])


def test_every_figure_has_a_source_or_says_it_is_an_estimate():
    for type_token, duration in timeline.DURATIONS.items():
        assert duration.minutes >= 0, type_token
        assert re.match(r"(https://\S+|estimate: \S|no cloud call)", duration.source), (type_token, duration.source)
    # The long poles are the ones that matter; keep them in the ranges the brief's sources give.
    assert 5 <= minutes(CLUSTER) <= 10
    # Managed Lustre by tier: over an hour at 125 and 250 MB/s/TiB, under it at 500 and 1000 (cluster-toolkit#5079),
    # the worst case the top of the P99 range (magic-modules#14878).
    assert sorted(timeline.LUSTRE_CREATION) == [125, 250, 500, 1000]
    for tier, creation in timeline.LUSTRE_CREATION.items():
        assert (creation.typical.minutes >= 60) == (tier in (125, 250)), tier
        assert creation.typical.minutes < creation.worst.minutes == 80
        assert "cluster-toolkit/pull/5079" in creation.typical.source
        assert creation.worst.source.startswith("https://github.com/GoogleCloudPlatform/magic-modules/pull/14878")
    assert LUSTRE not in timeline.DURATIONS  # one place for its figure


def test_the_lustre_creation_follows_the_tier():
    net = Res(NETWORK, "net")
    for tier, expected in ((125, 60), (250, 60), (500, 40), (1000, 40)):
        lustre = Res(LUSTRE, "lustre", dependencies=[net.urn], inputs={"perUnitStorageThroughput": str(tier)})
        assert timeline.build([[net, lustre]]).steps["Instance/lustre"].duration.minutes == expected
        assert timeline.build([[net, lustre]], worst=True).steps["Instance/lustre"].duration.minutes == 80
    with pytest.raises(ValueError, match="tier 300"):
        timeline.build([[Res(LUSTRE, "lustre", inputs={"perUnitStorageThroughput": "300"})]])


@pytest.fixture(scope="module")
def dev_plan() -> Plan:
    return run_plan("dev")


def test_every_registered_type_has_a_figure(dev_plan: Plan):
    for run in (dev_plan.infra, dev_plan.jobs):
        for resource in run.resources:
            if resource.custom and resource.type != LUSTRE:  # Lustre's is by tier: LUSTRE_CREATION
                assert resource.type in timeline.DURATIONS, f"add {resource.type} to timeline.DURATIONS"


def test_dev_lustre_builds_beside_the_cluster(dev_plan: Plan):
    t = dev_plan.timeline
    lustre, cluster = t.steps["Instance/lustre"], t.steps["Cluster/gke"]
    assert "Cluster/gke" not in t.ancestors("Instance/lustre")
    assert "Instance/lustre" not in t.ancestors("Cluster/gke")
    assert lustre.start < cluster.end and cluster.start < lustre.end  # they overlap
    path = [s.label for s in t.critical_path]
    assert "Instance/lustre" in path and "Cluster/gke" not in path
    assert path[-2:] == ["Job/pipeline", "ConfigMap/pipeline-run-marker"]  # the run marker follows the Job
    assert t.total < t.sequential
    # The critical path is a chain: each step starts when the one before it has ended.
    for before, after in zip(t.critical_path, t.critical_path[1:], strict=False):
        assert after.start == pytest.approx(before.end), (before.label, after.label)
    assert t.critical_path[-1].end == pytest.approx(t.total)


def test_dev_ray_release_waits_for_the_gpu_pool_and_the_volume(dev_plan: Plan):
    t = dev_plan.timeline
    release = t.steps["Release/ray"]
    for label in ("NodePool/gpu", "PersistentVolumeClaim/lustre-volume-pvc", "Instance/lustre", "Cluster/gke"):
        assert label in t.ancestors("Release/ray"), label
        assert release.start >= t.steps[label].end, label
    job = t.steps["Job/pipeline"]
    assert job.start >= max(s.end for s in t.steps.values() if s.label in t.ancestors(timeline.INFRA_DONE))


def test_rendered_timeline_names_the_path_and_the_totals(dev_plan: Plan):
    text = timeline.render(
        dev_plan.timeline, lustre_label="Instance/lustre", cluster_label="Cluster/gke", lustre_tier=1000
    )
    t = dev_plan.timeline
    assert "Lustre builds beside the cluster" in text
    assert f"{t.total:.1f} min" in text and f"{t.sequential:.1f} min" in text
    lustre = t.steps["Instance/lustre"]
    assert f"{lustre.start:6.2f} -> {lustre.end:6.2f}  Instance/lustre" in text
    assert timeline.LUSTRE_CREATION[1000].typical.source in text  # dev's tier
    assert "Managed Lustre creation at 1000 MB/s/TiB: 40 min modeled, up to 80 min" in text


def test_the_evaluations_are_modeled_as_the_run_estimate_counts_them(dev_plan: Plan):
    from launcher.cost import EVAL_MINUTES

    for step in ("eval-base", "eval-final"):
        assert timeline.RUN_STEP_DURATIONS[step].minutes == EVAL_MINUTES  # estimatedRun uses the same figure
        assert timeline.RUN_STEP_DURATIONS[step].source.startswith("estimate: ")
    text = timeline.render_run_steps([s["step"] for s in dev_plan.jobs.outputs["pipeline"]])
    assert "eval-base" in text and "eval-final" in text and f"{2 * EVAL_MINUTES:6.2f} min  in all" in text
    assert timeline.render_run_steps(["prepare-data", "train"]) == ""
