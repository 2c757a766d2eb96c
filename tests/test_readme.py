"""README.md against the code it documents: every config key the programs read is in a configuration table with its
declared default, every stack output is in an outputs table, and every in-page link has a target. Five people edit
the README at once; these are the parts that go stale without anyone noticing."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import ROOT
from launcher import settings as job_settings

from infra import settings as infra_settings
from tools.plan import EXAMPLE_STACKS

README = (ROOT / "README.md").read_text()


def section(start: str, end: str) -> str:
    return README[README.index(start) : README.index(end, README.index(start))]


def table_rows(text: str) -> dict[str, str]:
    """First cell's backticked names -> the whole row, for every Markdown table row in `text`."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            for name in re.findall(r"`([^`]+)`", first_cell):
                rows[name] = line
    return rows


def declared_config(pulumi_yaml: str) -> dict[str, dict]:
    return yaml.safe_load((ROOT / pulumi_yaml).read_text())["config"]


def default_cell(row: str) -> str:
    return row.split("|")[2].strip()


def check_key_documented(key: str, declared: dict | None, rows: dict[str, str]) -> None:
    assert key in rows, f"config key {key!r} is read by the program but has no row in README's configuration table"
    if declared is None:
        return
    cell = default_cell(rows[key])
    if "default" not in declared:
        assert "required" in cell, f"{key}: declared without a default (so required), README says {cell!r}"
        return
    default = declared["default"]
    if default == "":
        # An empty default means "derived" or "none"; the row must say so.
        assert cell == '`""`' or "empty" in rows[key].lower(), f"{key}: default is empty, README says {cell!r}"
        return
    shown = json.dumps(default) if isinstance(default, bool | list) else str(default)
    assert cell == f"`{shown}`", f"{key}: Pulumi.yaml's default is {shown!r}, README's table says {cell!r}"


INFRA_KEYS = (*infra_settings._PLAIN_KEYS, *infra_settings._OBJECT_KEYS, *infra_settings._SECRET_KEYS)
JOB_KEYS = (*job_settings._PLAIN_KEYS, *job_settings._OBJECT_KEYS)


@pytest.mark.parametrize("key", INFRA_KEYS)
def test_every_infra_config_key_is_in_the_readme_with_its_default(key: str):
    rows = table_rows(section("### Infra stack (root project", "### Job stack"))
    declared = declared_config("Pulumi.yaml")
    check_key_documented(key, declared.get(key), rows)


@pytest.mark.parametrize("key", JOB_KEYS)
def test_every_job_config_key_is_in_the_readme_with_its_default(key: str):
    rows = table_rows(section("### Job stack (", "### NeMo RL versions"))
    declared = declared_config("jobs/Pulumi.yaml")
    check_key_documented(key, declared.get(key), rows)


def test_every_declared_key_is_one_the_program_reads():
    """The other direction: a key declared in a Pulumi.yaml (so documented above) that no settings module reads."""
    assert set(declared_config("Pulumi.yaml")) <= set(INFRA_KEYS)
    assert set(declared_config("jobs/Pulumi.yaml")) <= set(JOB_KEYS)


def golden_outputs(project: str) -> set[str]:
    names: set[str] = set()
    for stack in EXAMPLE_STACKS:
        names |= set(json.loads((ROOT / "tests" / "golden" / stack / "outputs.json").read_text())[project])
    return names


def test_every_stack_output_is_in_the_readme():
    """The golden plans hold what each program exports (infra/stack.py, workloads/stack.py, jobs/__main__.py)."""
    outputs = section("### Stack outputs", "## Design notes")
    infra_rows = table_rows(outputs[: outputs.index("Job stack (`jobs/__main__.py`)")])
    job_rows = table_rows(outputs[outputs.index("Job stack (`jobs/__main__.py`)") :])
    assert golden_outputs("infra") - set(infra_rows) == set()
    assert golden_outputs("jobs") - set(job_rows) == set()
    # And no row for an output that no longer exists.
    assert set(infra_rows) - golden_outputs("infra") == set()
    assert set(job_rows) - golden_outputs("jobs") == set()
    # The object outputs' rows name every field.
    for project, name, rows in (
        ("infra", "estimatedCost", infra_rows),
        ("infra", "nemoRlRelease", infra_rows),
        ("jobs", "estimatedRun", job_rows),
    ):
        value = json.loads((ROOT / "tests" / "golden" / "h200" / "outputs.json").read_text())[project][name]
        missing = [field for field in value if not re.search(rf"\b{field}\b", rows[name])]
        assert not missing, f"README's row for {name} does not name {missing}"


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_in_page_link_has_a_target():
    outside_code = re.sub(r"```.*?```", "", README, flags=re.S)
    targets = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", outside_code, flags=re.M)}
    targets |= set(re.findall(r'<a id="([^"]+)"></a>', README))
    links = set(re.findall(r"\]\(#([^)]+)\)", README))
    assert links, "the README links to its own sections"
    assert links - targets == set()


def test_every_component_is_in_the_design_notes_table_with_its_file():
    """Each `pulumi.ComponentResource` subclass in the three program trees has its row: class and file."""
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[2].strip(" `")
        for line in section("**One component per concern.**", "The NIC names").splitlines()
        if line.startswith("| `")
    }
    found = {}
    for tree in ("infra", "workloads", "jobs"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            for name in re.findall(r"^class (\w+)\(pulumi\.ComponentResource\)", path.read_text(), flags=re.M):
                found[name] = path.relative_to(ROOT).as_posix()
    assert len(found) >= 10, found  # the scan itself works
    assert found == rows


def test_object_keys_defaults_in_the_readme_are_the_settings_defaults():
    """`lustre`, `networkRanges`, `rayHead`, `rayWorker` have no Pulumi.yaml default: infra/settings.py holds them."""
    settings = infra_settings.build_settings(
        {"gcp:project": "p", "gcp:region": "europe-west1", "zone": "europe-west1-b", "gpuType": "nvidia-h200-141gb"}
        | {"gpuProvisioning": "spot"}  # nothing set for the objects: their defaults apply
    )
    rows = table_rows(section("### Infra stack (root project", "### Job stack"))
    ranges = settings.ranges
    expected = {
        "lustre.capacityGib": f"`{settings.lustre.capacity_gib}`",
        "lustre.perUnitStorageThroughput": f"`{settings.lustre.throughput_mbps_per_tib}`",
        "lustre.filesystem": f"`{settings.lustre.filesystem}`",
        "networkRanges.clusterSubnet": f"`{ranges.cluster_subnet}`",
        "networkRanges.pods": f"`{ranges.pods}`",
        "networkRanges.services": f"`{ranges.services}`",
        "networkRanges.gvnicSubnet": f"`{ranges.gvnic_subnet}`",
        "networkRanges.rdmaSubnets": f"`{ranges.rdma_subnets[0]}` … `{ranges.rdma_subnets[-1]}`",
        "networkRanges.lustrePeering": f"`{ranges.lustre_peering}`",
        "rayHead": f'`{{cpu: "{settings.ray_head.cpu}", memory: {settings.ray_head.memory}}}`',
        "rayWorker": f'`{{cpu: "{settings.ray_worker.cpu}", memory: {settings.ray_worker.memory}}}`',
    }
    assert {key: default_cell(rows[key]) for key in expected} == expected


def test_every_repository_file_the_readme_names_exists():
    """Paths into the repository's own folders (`infra/services.py`, `tests/jobs/test_ray_2_55_1.py`, ...)."""
    named = set(re.findall(r"`((?:infra|workloads|jobs|tools|tests|docs|\.ci)/[\w./-]+)`", README))
    named |= set(re.findall(r"`((?:requirements|Pulumi|constraints)[\w.-]*\.(?:txt|yaml))`", README))
    assert len(named) > 20, named  # the patterns still match what the README writes
    missing = sorted(name for name in named if "mine" not in name and not (ROOT / name).exists())
    assert missing == []
