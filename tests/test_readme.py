"""README.md and docs/ against the code they document: every config key the programs read is in a configuration table
(docs/configuration.md) with its declared default, every stack output is in an outputs table, every component is in
the design notes (docs/design.md), every relative link and #anchor resolves, and the README stays short. Five people
edit these files at once; these are the parts that go stale without anyone noticing."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from pathlib import PurePosixPath

import pytest
import yaml
from config_rules import keys_of, validated
from conftest import ROOT
from launcher import job_settings

from infra import settings as infra_settings
from tools.plan_stacks import EXAMPLE_STACKS

README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()
# The README and every guide: where links, anchors and repository paths are checked.
DOCUMENTS = {
    path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
}
README_MAX_LINES = 260


def section(text: str, start: str, end: str | None = None) -> str:
    """From `start` to `end` (or to the end of `text`)."""
    begin = text.index(start)
    return text[begin:] if end is None else text[begin : text.index(end, begin)]


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
    assert key in rows, f"config key {key!r} is read by the program but has no row in docs/configuration.md's tables"
    if declared is None:
        return
    cell = default_cell(rows[key])
    if "default" not in declared:
        assert "required" in cell, (
            f"{key}: declared without a default (so required), docs/configuration.md says {cell!r}"
        )
        return
    default = declared["default"]
    if default == "":
        # An empty default means "derived" or "none"; the row must say so.
        assert cell == '`""`' or "empty" in rows[key].lower(), (
            f"{key}: default is empty, docs/configuration.md says {cell!r}"
        )
        return
    shown = json.dumps(default) if isinstance(default, bool | list) else str(default)
    assert cell == f"`{shown}`", (
        f"{key}: Pulumi.yaml's default is {shown!r}, docs/configuration.md's table says {cell!r}"
    )


INFRA_KEYS = (*keys_of(infra_settings.MODEL), *infra_settings.SECRETS)
JOB_KEYS = tuple(keys_of(job_settings.MODEL))


@pytest.mark.parametrize("key", INFRA_KEYS)
def test_every_infra_config_key_is_documented_with_its_default(key: str):
    rows = table_rows(section(CONFIGURATION, "## Infra stack (root project", "## Job stack"))
    declared = declared_config("Pulumi.yaml")
    check_key_documented(key, declared.get(key), rows)


@pytest.mark.parametrize("key", JOB_KEYS)
def test_every_job_config_key_is_documented_with_its_default(key: str):
    rows = table_rows(section(CONFIGURATION, "## Job stack (", "## NeMo RL versions"))
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


def test_every_stack_output_is_documented():
    """The golden plans hold what each program exports (infra/stack.py, workloads/stack.py, jobs/__main__.py)."""
    outputs = section(CONFIGURATION, "## Stack outputs")
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
        assert not missing, f"docs/configuration.md's row for {name} does not name {missing}"


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: tags dropped, lowercase, punctuation but `-` and `_` dropped, spaces to `-`."""
    heading = re.sub(r"<[^>]+>", "", heading)
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def without_code(text: str) -> str:
    """`text` without fenced blocks (Mermaid, shell, plans) and inline code, where `](` and `#` mean nothing."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """Every anchor GitHub gives a Markdown file: heading slugs (a repeated one gets -1, -2, ...) and <a id>s."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M), re.M):
        slug = heading_anchor(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found | set(re.findall(r'<a id="([^"]+)"></a>', text))


def broken_links(documents: dict[str, str], exists: Callable[[str], bool]) -> list[str]:
    """`file: target` for every relative link whose file does not exist or whose #anchor is not in that file."""
    broken = []
    for name, text in documents.items():
        here = PurePosixPath(name).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", without_code(text)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check offline
                continue
            path, _, anchor = target.partition("#")
            resolved = posixpath.normpath((here / path).as_posix()) if path else name
            if resolved not in documents and not exists(resolved):
                broken.append(f"{name}: {target} (no file {resolved})")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(documents.get(resolved, "")):
                broken.append(f"{name}: {target} (no #{anchor} in {resolved})")
    return broken


def test_every_relative_link_and_anchor_resolves():
    """README.md and docs/*.md: links between them, to their sections and to repository files all land."""
    assert broken_links(DOCUMENTS, lambda path: (ROOT / path).exists()) == []
    # Enough links are seen for the check to mean something: the README links into every guide.
    readme_targets = set(re.findall(r"\]\((docs/[\w-]+\.md)", README))
    assert {
        f"docs/{name}" for name in ("operations.md", "configuration.md", "design.md", "security.md")
    } <= readme_targets


def test_the_link_check_finds_a_broken_file_an_anchor_and_a_repeated_heading():
    documents = {
        "README.md": '# T\n## Tear down\n<a id="creds"></a>\n[a](docs/x.md#b-1) [c](#tear-down) [d](#creds)\n',
        "docs/x.md": "# X\n## B\n## B\n[back](../README.md#tear-down) [gone](y.md) [bad](../README.md#nope)\n"
        "```sh\n[not a link](#in-code)\n```\n",
    }
    assert broken_links(documents, lambda path: False) == [
        "docs/x.md: y.md (no file docs/y.md)",
        "docs/x.md: ../README.md#nope (no #nope in README.md)",
    ]


def test_the_readme_stays_short():
    """Issue 22: a newcomer reads it in ten minutes; everything else lives in docs/."""
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}: move detail to docs/"


def test_every_component_is_in_the_design_notes_table_with_its_file():
    """Each `pulumi.ComponentResource` subclass in the three program trees has its row: class and file."""
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[2].strip(" `")
        for line in section(DESIGN, "**One component per concern.**", "The NIC names").splitlines()
        if line.startswith("| `")
    }
    found = {}
    for tree in ("infra", "workloads", "jobs"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            for name in re.findall(r"^class (\w+)\(pulumi\.ComponentResource\)", path.read_text(), flags=re.M):
                found[name] = path.relative_to(ROOT).as_posix()
    assert len(found) >= 10, found  # the scan itself works
    assert found == rows


def test_object_keys_defaults_documented_are_the_settings_defaults():
    """`lustre`, `networkRanges`, `rayHead`, `rayWorker` have no Pulumi.yaml default: infra/settings.py holds them."""
    settings = validated(
        infra_settings.InfraSettings,
        {"gcp:project": "p", "gcp:region": "europe-west1", "zone": "europe-west1-b", "gpuType": "nvidia-h200-141gb"}
        | {"gpuProvisioning": "spot"},  # nothing set for the objects: their defaults apply
    )
    rows = table_rows(section(CONFIGURATION, "## Infra stack (root project", "## Job stack"))
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


def test_every_repository_file_the_docs_name_exists():
    """Paths into the repository's own folders (`infra/services.py`, `tests/jobs/test_ray_2_55_1.py`, ...)."""
    everything = "\n".join(DOCUMENTS.values())
    named = set(re.findall(r"`((?:infra|workloads|jobs|tools|tests|docs|\.ci)/[\w./-]+)`", everything))
    named |= set(re.findall(r"`((?:requirements|Pulumi|constraints)[\w.-]*\.(?:txt|yaml))`", everything))
    assert len(named) > 20, named  # the patterns still match what the README writes
    missing = sorted(name for name in named if "mine" not in name and not (ROOT / name).exists())
    assert missing == []


# A kubectl command as the docs print it: in a code block line or a `code span`, `kubectl` and at least two words
# (`kubectl port-forward` alone names the tool, not a command to run).
_KUBECTL = re.compile(r"(?:^[ \t]*|`|\$ )(kubectl(?: +[^`\s|]+){2,}[^`\n]*)", re.MULTILINE)


def kubectl_commands(text: str) -> list[str]:
    return [match.group(1) for match in _KUBECTL.finditer(text)]


def names_a_namespace(command: str) -> bool:
    return bool(re.search(r"(?:^| )(?:--namespace[ =]\S+|-n \S+|--all-namespaces|-A)(?: |$)", command))


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
def test_every_kubectl_command_names_the_namespace(document: str):
    """The stack's kubeconfig sets no namespace: a command without one looks in `default` and shows nothing."""
    missing = [command for command in kubectl_commands(DOCUMENTS[document]) if not names_a_namespace(command)]
    assert not missing, f"{document}: kubectl without --namespace: {missing}"


def test_the_kubectl_check_finds_commands():
    text = (
        "run `kubectl get pods` or\n```sh\nkubectl --namespace nemo-rl logs -f job/x\n```\nsee `kubectl port-forward`"
    )
    assert kubectl_commands(text) == ["kubectl get pods", "kubectl --namespace nemo-rl logs -f job/x"]
    assert [names_a_namespace(c) for c in kubectl_commands(text)] == [False, True]
    assert kubectl_commands(DOCUMENTS["README.md"])  # the README prints some
