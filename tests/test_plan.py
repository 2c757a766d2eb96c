"""`make plan`: what it writes for every stack, that secrets never show, that every object validates, and that
the plan matches the checked-in golden copy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import ROOT

from infra.cost import dollar_range
from infra.gke_rules import MAINTENANCE_EXCLUSION_START
from tools import checkov_gate, plan, plan_run, plan_stacks, plan_summary, ray_pods, readme_cost, render
from tools.render import is_built_in

STACKS = sorted(plan_stacks.EXAMPLE_STACKS)  # never a user's own stack: it has no golden plan
GOLDEN = ROOT / "tests" / "golden"
PLACEHOLDERS = tuple(plan_stacks.PLACEHOLDER_SECRETS.values())
RELEASE = "kubernetes:helm.sh/v3:Release"


class Rendered:
    def __init__(self, stack: str, out: Path) -> None:
        self.stack = stack
        self.plan = plan_run.run_plan(stack)
        self.files = render.render_files(self.plan)
        self.dir = out / stack
        render.write_files(self.dir, self.files)

    def on_disk(self) -> dict[str, str]:
        return {p.relative_to(self.dir).as_posix(): p.read_text() for p in sorted(self.dir.rglob("*")) if p.is_file()}

    def manifests(self) -> list[tuple[str, dict[str, Any]]]:
        return [(p.name, yaml.safe_load(p.read_text())) for p in sorted((self.dir / "manifests").glob("*.yaml"))]

    def outputs(self) -> dict[str, Any]:
        return json.loads((self.dir / "outputs.json").read_text())


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan")


@pytest.fixture(scope="module", params=STACKS)
def rendered(request: pytest.FixtureRequest, out_dir: Path) -> Rendered:
    return Rendered(request.param, out_dir)


def test_every_stack_has_a_golden_plan_and_every_golden_plan_a_stack():
    assert {"dev", "h200", "b200"} <= set(STACKS)
    golden = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
    assert golden == STACKS, "run `make golden` and review the diff (git diff tests/golden)"
    assert set(STACKS) <= set(plan_stacks.stacks_available())  # each example has its infra and its job stack file
    # The Makefile's list (checkov, make golden) is the same one.
    [makefile_stacks] = re.findall(r"^STACKS := (.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert sorted(makefile_stacks.split()) == STACKS


def test_writes_every_part_of_the_plan(rendered: Rendered):
    on_disk = rendered.on_disk()
    assert on_disk == rendered.files
    for name in ("helm/ray-cluster.yaml", "pipeline.yaml", "resources.txt", "resources.json", "outputs.json"):
        assert on_disk[name].strip(), name
    assert "timeline.txt" in on_disk
    assert sum(1 for name in on_disk if name.startswith("manifests/")) == len(rendered.manifests())


def test_one_manifest_per_kubernetes_object_in_a_stable_order(rendered: Rendered):
    objects = [
        r
        for run in (rendered.plan.infra, rendered.plan.jobs)
        for r in run.resources
        if r.custom and r.type.startswith("kubernetes:") and not r.type.startswith("kubernetes:helm.sh/")
    ]
    files = rendered.manifests()
    assert len(files) == len(objects)
    kinds = [obj["kind"] for _, obj in files]
    for kind, count in {
        "Namespace": 1,  # the Ray namespace, with its Pod Security labels
        "NetworkPolicy": 7,  # every Ray pod's in and out, the Ray head's, the submitter's egress and no-ingress ones,
        # TensorBoard's deny-all one, the image holder's no-traffic one
        "Deployment": 1,  # TensorBoard
        "Service": 1,  # TensorBoard's (KubeRay creates the head's)
        "ServiceAccount": 3,  # the Ray head's, the GPU workers', and the submitter's (reads its Job: stopOnDelete)
        "Role": 1,
        "RoleBinding": 1,
        "Secret": 1,
        "ConfigMap": 3,  # Fluent Bit's, the scripts, the run marker
        "PersistentVolume": 1,
        "PersistentVolumeClaim": 1,
        "GKENetworkParamSet": 9,
        "Network": 9,
        "DaemonSet": 2,  # the gIB NCCL installer, the image pre-pull
        "Job": 1,
    }.items():
        assert kinds.count(kind) == count, kind
    # Numbered 01..N, named after kind and object name, grouped in apply order with the Job last.
    for index, (name, obj) in enumerate(files, start=1):
        assert name == f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
    ranks = [render.KIND_ORDER.index(kind) for kind in kinds]
    assert ranks == sorted(ranks)
    assert kinds[-1] == "Job"
    # Rendered as the provider would send them: integers stay integers.
    job = files[-1][1]
    assert job["spec"]["backoffLimit"] == 4 and isinstance(job["spec"]["backoffLimit"], int)


def test_secrets_show_only_as_redacted(rendered: Rendered):
    secret = rendered.plan.infra.one("kubernetes:core/v1:Secret")
    # The placeholders did reach the program, so not finding them below means something.
    assert sorted(secret.inputs["stringData"].values()) == sorted(PLACEHOLDERS)
    secrets = [obj for _, obj in rendered.manifests() if obj["kind"] == "Secret"]
    assert secrets[0]["stringData"] == {"HF_TOKEN": "[secret]", "WANDB_API_KEY": "[secret]"}
    assert rendered.outputs()["infra"]["kubeconfig"] == "[secret]"
    for name, content in rendered.on_disk().items():
        for placeholder in PLACEHOLDERS:
            assert placeholder not in content, f"{placeholder} written to {name}"
        assert "PLACEHOLDER" not in content, name


def test_no_absolute_paths_or_timestamps(rendered: Rendered):
    for name, content in rendered.on_disk().items():
        assert str(ROOT) not in content, name
        assert str(rendered.dir) not in content, name
        # The one date deployed on purpose: the maintenance exclusion's fixed start (not when the plan ran).
        content = content.replace(MAINTENANCE_EXCLUSION_START, "")
        assert not re.search(r"\b20\d\d-\d\d-\d\d[T ]\d\d:\d\d", content), name


def test_every_built_in_object_validates_strictly_for_the_cluster_version(rendered: Rendered):
    minor = rendered.outputs()["infra"]["kubernetesMinorVersion"]
    assert re.fullmatch(r"1\.\d+", minor)
    validated = []
    for _, obj in rendered.manifests():
        if is_built_in(obj):
            kubernetes_validate.validate(obj, minor, strict=True)
            validated.append(obj["kind"])
    assert {
        "Job", "Secret", "PersistentVolume", "PersistentVolumeClaim", "ConfigMap", "NetworkPolicy", "ServiceAccount",
        "Role", "RoleBinding", "Namespace", "DaemonSet",
    } <= set(validated)  # fmt: skip
    # The Ray pods the real chart renders (where it is at hand) are Pods of the same schema.
    for path in sorted((rendered.dir / render.RAY_PODS_DIR).glob("*.yaml")):
        kubernetes_validate.validate(yaml.safe_load(path.read_text()), minor, strict=True)


def test_strict_validation_would_catch_a_bad_job(rendered: Rendered):
    minor = rendered.outputs()["infra"]["kubernetesMinorVersion"]
    job = next(obj for _, obj in rendered.manifests() if obj["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicie"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, minor, strict=True)


def test_helm_file_holds_the_release_inputs(rendered: Rendered):
    release = rendered.plan.infra.one(RELEASE).inputs
    written = yaml.safe_load((rendered.dir / "helm" / "ray-cluster.yaml").read_text())
    assert written["chart"] == release["chart"] == "ray-cluster"
    assert written["repository"] == release["repositoryOpts"]["repo"]
    assert written["version"] == release["version"]
    assert written["releaseName"] == release["name"] == "ray-cluster"
    assert written["namespace"] == release["namespace"]
    # Values exactly as passed (YAML round trip: 1.0 from protobuf reads back as 1, equal in Python).
    assert written["values"] == release["values"]
    assert written["values"]["image"]["tag"] == "v0.5.0"


def test_pipeline_lists_the_ray_jobs_in_order(rendered: Rendered):
    written = yaml.safe_load((rendered.dir / "pipeline.yaml").read_text())
    expected = rendered.plan.jobs.outputs["pipeline"]
    assert written["steps"] == expected
    assert written["jobName"] == rendered.plan.jobs.outputs["jobName"]
    names = [s["step"] for s in written["steps"]]
    if rendered.stack == "h200-benchmark":  # the benchmark: the Llama 3.1 8B trio, nothing to convert or evaluate
        assert names[names.index("prepare-data") :] == [
            "prepare-data",
            "prefetch-weights",
            "train-grpo-llama3.1-8b-instruct-2n8g",
            "train-grpo-llama3.1-8b-instruct-2n8g-async-1off",
            "train-grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off",
        ]
    elif rendered.stack == "h200-4node":  # the 4-node example: NeMo RL's Qwen3-32B recipe as a benchmark
        assert names[names.index("prepare-data") :] == ["prepare-data", "prefetch-weights", "train-grpo-qwen3-32b-4n8g"]
    else:
        assert names[names.index("train") :] == [
            "train",
            "convert-hf",
            *(["export-gcs"] if rendered.plan.infra.outputs["exportBucket"] else []),
            "eval-final",
        ]
        assert names[names.index("prepare-data") + 1 : names.index("train")] == ["prefetch-weights", "eval-base"]
    ids = [s["submissionId"] for s in written["steps"]]
    assert len(set(ids)) == len(ids)


def test_resource_tree(rendered: Rendered):
    entries = json.loads((rendered.dir / "resources.json").read_text())
    assert len(entries) == len(rendered.plan.infra.resources) + len(rendered.plan.jobs.resources)
    labels = {(e["program"], e["label"]) for e in entries}
    assert len(labels) == len(entries)
    by_label = {e["label"]: e for e in entries}
    for entry in entries:
        if entry["parent"] is not None:
            assert (entry["program"], entry["parent"]) in labels, entry["label"]
        for dep in entry["dependsOn"]:
            assert (entry["program"], dep) in labels, (entry["label"], dep)
    lustre = by_label["Instance/lustre"]
    assert lustre["parent"] == "ManagedLustre/lustre"
    assert lustre["properties"]["protect"] is True
    assert int(lustre["properties"]["capacityGib"]) == rendered.outputs()["infra"]["lustreCapacityGib"]
    assert "Connection/lustre-peering" in lustre["dependsOn"]
    assert "Cluster/gke" not in lustre["dependsOn"]
    gpu = by_label["NodePool/gpu"]
    assert gpu["properties"]["nodeConfig.machineType"] == rendered.outputs()["infra"]["gpuMachineType"]
    assert "Cluster/gke" in gpu["dependsOn"]
    release = by_label["Release/ray"]["properties"]
    assert release["chart"] == "ray-cluster" and re.fullmatch(r"\d+\.\d+\.\d+", release["version"])
    subnet = by_label["Subnetwork/networks-cluster"]["properties"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+/\d+", subnet["ipCidrRange"])
    assert by_label["Job/pipeline"]["provider"] == "Provider/cluster"
    # The text tree: children indented under their parent.
    lines = (rendered.dir / "resources.txt").read_text().splitlines()
    parent_line = next(i for i, line in enumerate(lines) if line.strip().startswith("- ManagedLustre/lustre "))
    child_line = next(i for i, line in enumerate(lines) if line.strip().startswith("- Instance/lustre "))
    indent = len(lines[parent_line]) - len(lines[parent_line].lstrip())
    assert child_line > parent_line
    assert len(lines[child_line]) - len(lines[child_line].lstrip()) == indent + 2
    assert "<- Connection/lustre-peering, Network/networks-cluster" in lines[child_line + 1]


def test_outputs_of_both_stacks(rendered: Rendered):
    outputs = rendered.outputs()
    assert outputs["infra"].keys() == rendered.plan.infra.outputs.keys()
    assert outputs["jobs"].keys() == rendered.plan.jobs.outputs.keys()
    assert outputs["infra"]["gpuNodes"] * outputs["infra"]["gpusPerNode"] >= 8
    assert outputs["jobs"]["jobName"].endswith("-pipeline")


def test_plan_matches_the_golden_copy(rendered: Rendered):
    golden_dir = GOLDEN / rendered.stack
    golden = (
        {p.relative_to(golden_dir).as_posix(): p.read_text() for p in golden_dir.rglob("*") if p.is_file()}
        if golden_dir.is_dir()
        else {}
    )
    files = rendered.files
    if ray_pods.chart_problem():  # a clone without ../shared/reference renders no Ray pods: compare the rest
        golden = {name: text for name, text in golden.items() if not name.startswith(f"{render.RAY_PODS_DIR}/")}
    changed = sorted(name for name in files.keys() & golden.keys() if files[name] != golden[name])
    added, removed = sorted(files.keys() - golden.keys()), sorted(golden.keys() - files.keys())
    assert not (changed or added or removed), (
        f"the plan for {rendered.stack} differs from tests/golden/{rendered.stack}: changed {changed}, "
        f"new {added}, gone {removed}. If the change is intended, run `make golden` and review the diff "
        f"(git diff tests/golden) before committing."
    )


def test_plan_is_deterministic():
    first = render.render_files(plan_run.run_plan("dev"))
    second = render.render_files(plan_run.run_plan("dev"))
    assert first == second


def flat(text: str) -> str:
    """The summary with its line wrapping undone: one space between words."""
    return " ".join(text.split())


def test_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    assert plan.main(["--stack", "h200", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for phase in range(1, plan_run.STEPS + 1):
        assert f"[{phase}/{plan_run.STEPS}] " in out
    text = flat(out)
    assert "GPUs: 2 x a3-ultragpu-8g (8 x nvidia-h200-141gb each, 16 in all); Lustre 18000 GiB at 500 MB/s/TiB" in text
    # What would be created, counted by kind: the totals are the plan's own resources, counted here independently.
    h200 = plan_run.run_plan("h200")
    resources = [r for run in (h200.infra, h200.jobs) for r in run.resources if r.custom]
    cloud = sum(1 for r in resources if r.type.startswith("gcp:"))
    cluster = sum(1 for r in resources if r.type.startswith("kubernetes:"))
    assert f"Google Cloud ({cloud}): 9 APIs, 3 VPCs, 10 subnets, 2 firewall rules, router, NAT," in text
    assert "GKE cluster, 2 node pools, Lustre instance, bucket, 2 service accounts, 9 IAM grants" in text
    policies = sum(1 for r in resources if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy")
    assert policies >= 5
    assert f"Kubernetes ({cluster}): Helm release ray-cluster, Namespace, 3 ValidatingAdmissionPolicy," in text
    assert f"3 ValidatingAdmissionPolicyBinding, {policies} NetworkPolicy," in text
    assert "9 GKENetworkParamSet, 9 Network, Service, Deployment, 2 DaemonSet, Job" in text
    assert (
        "Run: preflight-nccl, preflight-lustre, prepare-data, prefetch-weights, eval-base, train (up to 3 retries), "
        "convert-hf, export-gcs, eval-final; the model goes to gs://my-gcp-project-nemo-rl-h200-models/gemma3-27b-gsm8k/"
    ) in text
    assert "Lustre beside the cluster" in text and "min one after another)" in text
    assert (tmp_path / "h200" / "manifests").is_dir()
    # The stack outputs stay in outputs.json: no wall of JSON on the screen.
    assert "deployedSettings" not in out and "kubeconfig" not in out
    for placeholder in PLACEHOLDERS:
        assert placeholder not in out


def test_created_counts_leave_out_what_creates_nothing():
    """Components, providers and stack references are not counted; every other resource is, once."""
    dev = plan_run.run_plan("dev")
    counts = plan_summary.created_counts(dev)
    counted = sum(n for group in counts.values() for n in group.values())
    resources = [r for run in (dev.infra, dev.jobs) for r in run.resources]
    assert any(not r.custom for r in resources) and any(r.type.startswith("pulumi:") for r in resources)
    assert counted == sum(1 for r in resources if r.custom and not r.type.startswith("pulumi:"))
    assert counts["Helm"] == {"ray-cluster": 1}
    assert counts["Google Cloud"]["Lustre instance"] == 1 and counts["Kubernetes"]["Job"] == 1
    assert list(counts["Kubernetes"])[-1] == "Job"  # apply order, as the manifests are numbered


CHART_MISSING = "it needs helm-python-sdk, which `make test` installs (requirements-dev.txt)"


@pytest.mark.parametrize("chart", ["chart at hand", "no helm-python-sdk"])
@pytest.mark.parametrize("stack", STACKS)
def test_make_plan_fits_one_screen_and_names_the_files_with_the_details(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stack: str, chart: str
):
    """Issue 28: everything `make plan` prints, progress lines included, fits one screen (SCREEN_LINES lines of at
    most SCREEN_WIDTH columns), also where the Ray pods cannot be rendered (a `.venv` that `make plan` built has no
    helm-python-sdk), and it names every file and folder under build/<stack>/ that holds the details."""
    if chart != "chart at hand":
        monkeypatch.setattr(ray_pods, "chart_problem", lambda *args: CHART_MISSING)
    # No NeMo RL sources at hand, as for a new user: the recipe is checked against the index, its values listed.
    sources = ["--nemo-rl-sources", str(tmp_path / "no-sources")]
    assert plan.main(["--stack", stack, "--out", str(tmp_path), *sources]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) <= plan_run.SCREEN_LINES, out
    assert max(len(line) for line in lines) <= plan_run.SCREEN_WIDTH, out
    assert plan_run.SCREEN_LINES <= 40 and plan_run.SCREEN_WIDTH <= 120  # one screen of an ordinary terminal window
    text = flat(out)
    written = sorted(p.name + ("/" if p.is_dir() else "") for p in (tmp_path / stack).iterdir())
    assert {"cost.txt", "timeline.txt", "resources.txt", "outputs.json", "manifests/"} <= set(written)
    details = text[text.index(f"Details in {tmp_path / stack}/: ") :]
    assert [name for name in written if name not in details] == []
    assert "Warnings" in text and "Estimated cost (USD" in text and "first GRPO step, cold:" in text
    if chart == "chart at hand" and ray_pods.chart_problem() is None:
        assert "ray-pods/" in written and "Note:" not in text
    else:  # information, not an error: not among the warnings, no alarm words
        note = text[text.index("Note: ray-pods/") : text.index(" Details in ")]
        assert note == f"Note: ray-pods/ (for checkov) left out: {CHART_MISSING}"
        assert text.index("Warnings") < text.index("Note: ray-pods/")
        assert not re.search(r"error|fail|NOT|missing", note)
        assert "ray-pods/" not in written


def test_the_programs_warnings_show_in_the_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """What `pulumi up` would warn about (pulumi.log.warn) is listed under Warnings, and still printed by --quiet."""
    assert plan.main(["--stack", "dev", "--out", str(tmp_path), "-j", "model=org/m"]) == 0
    text = flat(capsys.readouterr().out)
    warnings = text[text.index("Warnings") : text.index(" Details in ")]
    assert warnings.startswith("Warnings (3): ")  # the model's note, the cost's, and dev's unknown step time
    assert "model org/m: fit unchecked" in warnings and "the notes in cost.txt" in warnings
    assert "run estimate: seconds per step unknown for this recipe: set secondsPerStep" in warnings
    assert plan.main(["--stack", "dev", "--out", str(tmp_path), "-j", "model=org/m", "--quiet"]) == 0
    quiet = capsys.readouterr().out
    assert "warning: model org/m: fit unchecked" in quiet and "Warnings" not in quiet
    assert plan_run.run_plan("dev").warnings == []  # the shipped stack warns of nothing


def test_plan_without_a_wandb_key_logs_to_tensorboard_on_lustre(tmp_path: Path):
    assert plan.main(["--stack", "dev", "--no-wandb", "--out", str(tmp_path), "--quiet"]) == 0
    outputs = json.loads((tmp_path / "dev" / "outputs.json").read_text())
    assert outputs["infra"]["secretKeys"] == ["HF_TOKEN"]
    pipeline = yaml.safe_load((tmp_path / "dev" / "pipeline.yaml").read_text())
    train = next(step["entrypoint"] for step in pipeline["steps"] if step["step"] == "train")
    for override in ("logger.wandb_enabled=False", "logger.tensorboard_enabled=True", "logger.log_dir=/data/"):
        assert override in train


def test_write_files_replaces_an_earlier_plan_output(tmp_path: Path):
    out = tmp_path / "dev"
    render.write_files(out, {"pipeline.yaml": "old\n", "manifests/99-gone.yaml": "stale\n"})
    render.write_files(out, {"pipeline.yaml": "new\n", "resources.json": "[]\n"})
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["pipeline.yaml", "resources.json"]
    assert (out / "pipeline.yaml").read_text() == "new\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    render.write_files(empty, {"pipeline.yaml": "x\n"})  # an empty folder holds nothing to lose
    assert (empty / "pipeline.yaml").read_text() == "x\n"


def test_write_files_refuses_to_delete_a_folder_that_is_not_a_plan_output(tmp_path: Path):
    precious = tmp_path / "dev"  # what `--out <somewhere real>` points at
    (precious / "sub").mkdir(parents=True)
    (precious / "notes.txt").write_text("keep me")
    (precious / "sub" / "data.bin").write_bytes(b"\0")
    with pytest.raises(plan_stacks.PlanError, match="not a plan output"):
        render.write_files(precious, {"pipeline.yaml": "x\n"})
    assert (precious / "notes.txt").read_text() == "keep me" and (precious / "sub" / "data.bin").exists()
    assert not (precious / "pipeline.yaml").exists()
    a_file = tmp_path / "file"
    a_file.write_text("keep me too")
    with pytest.raises(plan_stacks.PlanError, match="not a folder"):
        render.write_files(a_file, {"pipeline.yaml": "x\n"})
    assert a_file.read_text() == "keep me too"


def test_a_wrong_out_exits_2_and_deletes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "notes.txt").write_text("keep me")
    assert plan.main(["--stack", "dev", "--out", str(tmp_path), "--quiet"]) == plan.EXIT_CONFIG
    assert "is not a plan output" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "dev").iterdir()] == ["notes.txt"]


def test_unknown_stack_exits_2_with_the_stacks_there_are(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    assert plan.main(["--stack", "nope", "--out", str(tmp_path)]) == plan.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "Pulumi.nope.yaml" in err and "jobs/Pulumi.nope.yaml" in err and "dev" in err
    assert not (tmp_path / "nope").exists()


def test_bad_job_config_exits_2_with_the_message(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    assert plan.main(["--stack", "dev", "--out", str(tmp_path), "-j", "numNodes=99"]) == plan.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "config 'numNodes' = 99 is not allowed" in err
    assert not (tmp_path / "dev").exists()


def test_bad_infra_config_exits_2_without_a_traceback(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "plan.py"), "--stack", "dev", "--out", str(tmp_path), "-c", "gpuNodes=0"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "config 'gpuNodes' = 0 is not allowed: 1 or more" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "[1/4] infra program (mocks)" in result.stdout
    assert not (tmp_path / "dev").exists()


# The checkov gate's own logic (the scan itself runs in `make checkov`).


def test_checkov_skip_list_is_the_reviewed_set_each_with_a_reason():
    """A change detector on purpose: adding or dropping a skip shows up here for review. Whether each skip is still
    needed is what `make checkov` checks (a skip that covers no finding fails it as STALE SKIP)."""
    skips = checkov_gate.load_skips()
    # (check, what it covers): the submitter Job, the Ray pods (ray-pods/), and Google's installer DaemonSet.
    covered = {(s.check, kind) for s in skips for r in s.resources for kind in ["Job", "Ray", "Installer"] if
               (kind == "Job" and r.startswith("Job.")) or (kind == "Ray" and r.startswith("Pod.*.*-ray"))
               or (kind == "Installer" and "nccl-rdma-installer" in r)}  # fmt: skip
    by_kind = {kind: sorted(c for c, k in covered if k == kind) for kind in ("Job", "Ray", "Installer")}
    assert by_kind == {
        "Job": ["CKV_K8S_15", "CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_43"],
        "Ray": sorted(
            [
                "CKV_K8S_15",
                "CKV_K8S_22",
                "CKV_K8S_23",
                "CKV_K8S_35",  # (CKV_K8S_28, NET_RAW, is no longer skipped: the Ray containers drop it)
                "CKV_K8S_37",
                "CKV_K8S_38",
                "CKV_K8S_40",
                "CKV_K8S_43",
                "CKV_K8S_8",
                "CKV_K8S_9",
            ]
        ),
        "Installer": sorted(
            [
                "CKV2_K8S_6",
                "CKV_K8S_11",
                "CKV_K8S_12",
                "CKV_K8S_13",
                "CKV_K8S_15",
                "CKV_K8S_16",
                "CKV_K8S_17",
                "CKV_K8S_19",
                "CKV_K8S_20",
                "CKV_K8S_22",
                "CKV_K8S_23",
                "CKV_K8S_28",
                "CKV_K8S_37",
                "CKV_K8S_40",
                "CKV_K8S_43",
                "CKV_K8S_8",
                "CKV_K8S_9",
            ]
        ),
    }
    # Nothing in the Ray namespace is waved through for being in `default` any more (CKV_K8S_21).
    assert "CKV_K8S_21" not in {s.check for s in skips}
    # The two reasons the issue found false say what is true now.
    reasons = {(s.check, s.resources[0]): s.reason for s in skips}
    assert "digest" in reasons[("CKV_K8S_43", "Job.*.*-pipeline")]
    assert "no service account token" not in reasons[("CKV_K8S_23", "Job.*.*-pipeline")]
    for skip in skips:
        assert len(skip.reason.split()) >= checkov_gate.MIN_REASON_WORDS, skip.check


def test_checkov_skip_reasons_shorter_than_the_minimum_are_rejected(tmp_path: Path):
    def skips_file(words: int) -> Path:
        path = tmp_path / f"skips-{words}.yaml"
        reason = " ".join(["because"] * words)
        path.write_text(yaml.safe_dump({"skips": [{"check": "CKV_K8S_1", "resources": ["Pod.*"], "reason": reason}]}))
        return path

    assert checkov_gate.MIN_REASON_WORDS >= 8
    with pytest.raises(ValueError, match="CKV_K8S_1 needs a reason"):
        checkov_gate.load_skips(skips_file(checkov_gate.MIN_REASON_WORDS - 1))
    [skip] = checkov_gate.load_skips(skips_file(checkov_gate.MIN_REASON_WORDS))
    assert skip.check == "CKV_K8S_1"


def test_checkov_gate_fails_on_findings_outside_the_skip_list():
    skips = [checkov_gate.Skip("CKV_K8S_23", ("Job.*.*-pipeline",), "the image runs as root for reasons " * 3)]
    report = json.dumps(
        {
            "check_type": "kubernetes",
            "results": {
                "failed_checks": [
                    {"check_id": "CKV_K8S_23", "check_name": "root", "resource": "Job.default.x-pipeline"},
                    {"check_id": "CKV_K8S_23", "check_name": "root", "resource": "Deployment.default.web"},
                    {"check_id": "CKV_K8S_16", "check_name": "privileged", "resource": "Job.default.x-pipeline"},
                ]
            },
            "summary": {"passed": 5},
        }
    )
    findings, passed = checkov_gate.parse_report("dev", report + "\n" + report)  # two documents, as checkov can
    assert passed == 10 and len(findings) == 6
    unexpected, skipped, unused = checkov_gate.judge(findings, skips)
    assert {(f.check_id, f.resource) for f in unexpected} == {
        ("CKV_K8S_23", "Deployment.default.web"),
        ("CKV_K8S_16", "Job.default.x-pipeline"),
    }
    assert len(skipped) == 2 and unused == []
    ok, lines = checkov_gate.report({"dev": (passed, findings)}, skips)
    assert not ok and any(line.startswith("FINDING dev: CKV_K8S_16") for line in lines)
    stale = [*skips, checkov_gate.Skip("CKV_K8S_8", ("Pod.*",), "no longer needed " * 4)]
    ok, lines = checkov_gate.report({"dev": (passed, findings[:1])}, stale)
    assert not ok and any(line.startswith("STALE SKIP: CKV_K8S_8") for line in lines)
    ok, _ = checkov_gate.report({"dev": (passed, findings[:1])}, skips)
    assert ok


def test_path_overrides_nest_as_the_cli_stores_them():
    """`-c lustre.capacityGib=36000` is `pulumi config set --path lustre.capacityGib 36000`: nested, validated."""
    config: dict[str, Any] = {"nemo-rl-gke:lustre": {"filesystem": "fs"}}
    plan_stacks.apply_overrides(
        "nemo-rl-gke", config, ["lustre.capacityGib=36000", "networkRanges.rdmaSubnets[1]=10.9.0.0/24"]
    )
    assert config == {
        "nemo-rl-gke:lustre": {"filesystem": "fs", "capacityGib": 36000},
        "nemo-rl-gke:networkRanges": {"rdmaSubnets": [None, "10.9.0.0/24"]},
    }


def test_an_empty_path_override_removes_only_that_field():
    """`-c lustre.capacityGib=` is `pulumi config rm --path lustre.capacityGib`: the default applies again."""
    config: dict[str, Any] = {"nemo-rl-gke:lustre": {"filesystem": "fs", "capacityGib": 9000}}
    plan_stacks.apply_overrides("nemo-rl-gke", config, ["lustre.capacityGib="])
    assert config == {"nemo-rl-gke:lustre": {"filesystem": "fs"}}
    with pytest.raises(plan_stacks.PlanError, match="a list element cannot be removed"):
        plan_stacks.apply_overrides("nemo-rl-gke", config, ["networkRanges.rdmaSubnets[1]="])


# --- Cost: exported by both stacks, printed by the summary, quoted by the README -----------------------------------


def test_cost_outputs_and_cost_file(rendered: Rendered):
    outputs = rendered.outputs()
    cost = outputs["infra"]["estimatedCost"]
    assert cost["currency"] == "USD" and cost["pricesReadOn"]
    for key in ("perHourWhileGpusRun", "perHourIdle", "gpuNodePerHour", "lustrePerMonth", "perMonthAfterDestroy"):
        assert key in cost
    assert cost["perHourWhileGpusRun"] >= cost["perHourIdle"] > 0  # the CPU node always runs and has a price
    assert cost["complete"] is True and cost["unpriced"] == []  # every shipped stack is priced in full
    assert cost["gkeClusterPerHour"] == 0.1 and cost["gpuNodePriceFrom"] == "table"
    run = outputs["jobs"]["estimatedRun"]
    assert (run["evalGpuHours"] > 0) == (run["evals"] > 0) and ("usd" in run)
    # The step time is the table's or the user's; without either, the steps and the total are unknown, not zero.
    assert (run["secondsPerStep"] is None) == (run["gpuHours"] is None) == (run["stepGpuHours"] is None)
    text = rendered.files["cost.txt"]
    assert rendered.on_disk()["cost.txt"] == text == render.cost_text(rendered.plan)  # written, not only rendered
    assert "per hour while the GPUs run:" in text and "GPU-hours" in text
    for note in cost["notes"]:
        assert f"note: {note}" in text
    # Every shipped stack is priced in full: only a run's step time may be unknown (no row for its recipe).
    priced = [line for line in text.splitlines() if "secondsPerStep" not in line and not line.startswith("one run")]
    assert "unknown" not in "\n".join(priced) and "at least" not in text
    if run["secondsPerStep"] is None:
        assert "one run, steps and evaluations: unknown GPU-hours, unknown" in text
    # How the GPU nodes are priced is named; a reservation's figures are ranges down to its published discount.
    assert "one GPU node per hour by how it is bought" in text
    if cost["gpuNodePriceBasis"] == "reservationRange":
        assert cost["perHourWhileGpusRunLow"] < cost["perHourWhileGpusRun"]
        assert f"per hour while the GPUs run: ${cost['perHourWhileGpusRunLow']:,.2f} to " in text
        assert (
            "(reservation: on-demand list less up to 53%" in text
            and f"{dollar_range(run['usdLow'], run['usd'])}" in text
        )
    else:
        assert cost["perHourWhileGpusRunLow"] == cost["perHourWhileGpusRun"] and run["usdLow"] == run["usd"]


def documents() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text() for path in readme_cost.documents()}


def test_docs_quote_the_golden_cost_of_every_stack():
    """Each stack's whole cost.txt is quoted once, in whichever of README.md and docs/*.md holds its block."""
    texts = documents()
    assert "docs/cost.md" in texts
    for stack in STACKS:
        golden = (GOLDEN / stack / "cost.txt").read_text()
        quotes = {name: readme_cost.quoted(text, stack) for name, text in texts.items()}
        quotes = {name: quote for name, quote in quotes.items() if quote is not None}
        assert list(quotes.values()) == [golden], (
            f"the cost block for {stack} ({list(quotes)}) is not tests/golden/{stack}/cost.txt: run `make golden`"
        )


def test_readme_cost_summary_is_the_goldens():
    """The README's one-line-per-stack summary: generated from the goldens, with every stack's four figures."""
    readme = (ROOT / "README.md").read_text()
    costs = {p.parent.name: p.read_text() for p in sorted(GOLDEN.glob("*/cost.txt"))}
    block = readme_cost.quoted_summary(readme)
    assert block == readme_cost.summary_block(costs), "README's cost summary is stale: run `make golden`"
    assert readme.index(block) > readme.index("## What it costs")
    for stack in STACKS:
        text = costs[stack]
        # Columns are two or more spaces apart; a cell may hold a range ("$A to $B").
        row = re.search(
            rf"^{re.escape(stack)} {{2,}}(\S+(?: to \S+)?) {{2,}}(\S+(?: to \S+)?) {{2,}}(\S+) {{2,}}(.+)$", block, re.M
        )
        assert row, stack
        assert f"per hour while the GPUs run: {row.group(1)}" in text
        assert re.search(rf"^per hour idle \(no run\): +{re.escape(row.group(2))}$", text, re.M), stack
        assert re.search(rf"^Lustre per month: +{re.escape(row.group(3))}$", text, re.M), stack
        total = rf"^one run, steps and evaluations: {re.escape(row.group(4))} \(not counted"
        assert re.search(total, text, re.M), stack
        # Each stack's GPU node rate is listed below the table with how it was priced and its sources' dates.
        (rate_line,) = [line for line in text.splitlines() if line.startswith("one GPU node per hour:")]
        rate = rate_line.removeprefix("one GPU node per hour:").strip().split(" (")[0]
        listed = [
            line
            for line in block.splitlines()
            if line.startswith("GPU node, ") and stack in line.split(": ", 1)[0].removeprefix("GPU node, ").split(", ")
        ]
        assert len(listed) == 1 and f": {rate}: " in listed[0] and "read 20" in listed[0], (stack, block)


def test_readme_cost_tool_replaces_only_the_blocks():
    readme = (
        "intro\n<!-- cost-summary -->\nold\n<!-- /cost-summary -->\nmiddle $1\n"
        "tear down\n<!-- after-destroy -->\nstale\n<!-- /after-destroy -->\nend\n"
    )
    guide = (
        "guide\n<!-- cost:dev -->\nold\n<!-- /cost:dev -->\nmiddle $1\n<!-- cost:b200 -->\n<!-- /cost:b200 -->\nend\n"
    )
    dev = (
        "per hour while the GPUs run: $63.50\nper hour idle (no run):      $13.34\n"
        "Lustre per month:            $5,400.00\nper month after destroy:     $5,400.00 (Lustre)\n"
        "one run, steps and evaluations: 2.75 GPU-hours, $17.24 (not counted: waiting)\n"
    )
    b200 = (
        "per hour while the GPUs run: $1.00\nper hour idle (no run):      \\1\nLustre per month:            $0.00\n"
        "per month after destroy:     $0.00 (nothing)\n"
        "one run, steps and evaluations: 8 GPU-hours, $9.00 (not counted)\n"
    )
    new = readme_cost.updated({"README.md": readme, "docs/cost.md": guide}, {"dev": dev, "b200": b200})
    assert readme_cost.quoted(new["docs/cost.md"], "dev") == dev
    assert readme_cost.quoted(new["docs/cost.md"], "b200") == b200  # taken literally, not as a regex template
    assert readme_cost.quoted(new["README.md"], "dev") is None  # each block stays in the file that holds it
    assert readme_cost.quoted_after_destroy(new["README.md"]) == (
        "<!-- after-destroy -->\n```text\ndev   $5,400.00 (Lustre)\nb200  $0.00 (nothing)\n```\n<!-- /after-destroy -->"
    )
    assert readme_cost.quoted_summary(new["README.md"]) == (
        "<!-- cost-summary -->\n```text\n"
        "stack  GPUs running, per hour  idle, per hour  Lustre per month  one run (steps + evaluations)\n"
        "dev    $63.50                  $13.34          $5,400.00         2.75 GPU-hours, $17.24\n"
        "b200   $1.00                   \\1              $0.00             8 GPU-hours, $9.00\n"
        "```\n<!-- /cost-summary -->"
    )
    assert new["README.md"].startswith("intro\n") and "middle $1\n" in new["README.md"]
    assert new["README.md"].endswith("<!-- /after-destroy -->\nend\n")
    assert new["docs/cost.md"].startswith("guide\n") and new["docs/cost.md"].endswith("<!-- /cost:b200 -->\nend\n")
    with pytest.raises(
        SystemExit, match=r"<!-- cost:h200 --> must be in exactly one of README.md, docs/cost.md; found in no file"
    ):
        readme_cost.updated({"README.md": readme, "docs/cost.md": guide}, {"h200": dev})
    with pytest.raises(
        SystemExit, match=r"<!-- cost:dev --> must be in exactly one .*; found in README.md, docs/cost.md"
    ):
        readme_cost.updated({"README.md": guide, "docs/cost.md": guide}, {"dev": dev})
    with pytest.raises(SystemExit, match="<!-- after-destroy --> must be in exactly one"):
        readme_cost.updated({"README.md": readme.split("tear down")[0], "docs/cost.md": guide}, {"dev": dev})
    with pytest.raises(SystemExit, match="<!-- cost-summary --> must be in exactly one"):
        readme_cost.updated({"README.md": readme.replace("cost-summary", "x"), "docs/cost.md": guide}, {"dev": dev})
    with pytest.raises(SystemExit, match="no single 'per month after destroy:' line"):
        readme_cost.updated({"README.md": readme, "docs/cost.md": guide}, {"dev": dev.replace("after destroy", "x")})
    with pytest.raises(SystemExit, match=r"no single 'Lustre per month:' line"):
        readme_cost.updated({"README.md": readme, "docs/cost.md": guide}, {"dev": dev.replace("Lustre", "x")})


def test_readme_cost_check_names_the_stale_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check exits 1 and names the file whose figures are stale; it writes nothing."""
    (tmp_path / "docs").mkdir()
    originals = documents()
    for name, text in originals.items():
        (tmp_path / name).write_text(text)
    fresh = (tmp_path / "docs" / "cost.md").read_text()
    stale = re.sub(r"(<!-- cost:dev -->\n```text\nper hour while the GPUs run: )\$", r"\1€", fresh)
    assert stale != fresh
    (tmp_path / "docs" / "cost.md").write_text(stale)
    monkeypatch.setattr(readme_cost, "ROOT", tmp_path)
    monkeypatch.setattr(readme_cost, "README", tmp_path / "README.md")
    monkeypatch.setattr(readme_cost, "DOCS", tmp_path / "docs")
    assert readme_cost.main(["--check"]) == 1
    assert "docs/cost.md quotes stale cost figures" in capsys.readouterr().err
    assert (tmp_path / "docs" / "cost.md").read_text() == stale  # --check writes nothing
    assert readme_cost.main([]) == 0
    assert (tmp_path / "docs" / "cost.md").read_text() == originals["docs/cost.md"]
    assert readme_cost.main(["--check"]) == 0


def test_readme_tear_down_quotes_what_every_stack_keeps_billing():
    """The tear-down section's figures are the goldens' "per month after destroy" lines, Lustre dollars included."""
    readme = (ROOT / "README.md").read_text()
    costs = {p.parent.name: p.read_text() for p in sorted(GOLDEN.glob("*/cost.txt"))}
    block = readme_cost.quoted_after_destroy(readme)
    assert block == readme_cost.after_destroy_block(costs), "README's after-destroy block is stale: run `make golden`"
    assert block is not None and readme.index(block) > readme.index("## Tear down")
    for stack in STACKS:
        assert re.search(rf"^{stack} +\$[0-9,]+\.[0-9]{{2}} \(the Lustre instance protectData keeps", block, re.M), (
            stack
        )


def test_summary_prints_the_cost(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """The totals and the run's cost are printed; each part's rate and the notes on the prices stay in cost.txt,
    which the summary names (the notes are counted among its warnings)."""
    assert plan.main(["--stack", "dev", "--out", str(tmp_path)]) == 0
    text = flat(capsys.readouterr().out)
    assert "Estimated cost (USD, list prices read on " in text and "each part and its source in cost.txt" in text
    cost = (tmp_path / "dev" / "cost.txt").read_text().splitlines()
    priced = cost[: next(i for i, line in enumerate(cost) if line.startswith("one run,"))]  # the run's notes follow
    notes = [line for line in priced if line.startswith("note: ")]
    assert notes and f"cost: {len(notes)} price(s) derived, borrowed or given by you" in text
    in_block = False
    for line in cost:
        in_block = line.startswith(plan_summary.COST_DETAIL_BLOCKS) or (in_block and line.startswith("  "))
        detail = in_block or line.startswith(plan_summary.COST_DETAIL_PREFIXES)
        assert (flat(line) in text) == (not detail), line
    assert "per hour idle (no run):" in text and "$" in text


def test_checkov_reports_are_reused_only_for_the_same_manifests(tmp_path: Path):
    """scan() keeps checkov's report per stack under a digest of what was scanned: the same files are not scanned
    again, a changed file is, and one stack's new report does not remove another's (h200 is a prefix of
    h200-benchmark)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "checkov"
    report = {"check_type": "kubernetes", "results": {"failed_checks": []}, "summary": {"passed": 3}}
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\necho '{json.dumps(report)}'\n")
    fake.chmod(0o755)
    manifests, cache = tmp_path / "manifests", tmp_path / "cache"
    manifests.mkdir()
    (manifests / "a.yaml").write_text("kind: ConfigMap\n")

    def scan(stack: str) -> tuple[list[checkov_gate.Finding], int]:
        return checkov_gate.scan(stack, manifests, checkov=fake, cache_dir=cache)

    def runs() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    assert scan("h200-benchmark") == ([], 3) and runs() == 1
    assert scan("h200") == ([], 3) and runs() == 2
    assert scan("h200") == ([], 3) and scan("h200-benchmark") == ([], 3) and runs() == 2
    (manifests / "a.yaml").write_text("kind: Secret\n")
    assert scan("h200") == ([], 3) and runs() == 3
    assert scan("h200-benchmark") == ([], 3) and runs() == 4
    assert len(list(cache.glob("h200-*.json"))) == 2  # one report each, the older ones replaced
    (manifests / "a.yaml").write_text("kind: ConfigMap\n")
    assert scan("h200") == ([], 3) and runs() == 5
