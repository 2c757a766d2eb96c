"""Pulumi.yaml's config blocks and docs/configuration.md's key tables are what the settings models say
(tools/config_docs.py writes them: `make config-docs`)."""

from __future__ import annotations

import pytest

from tools import config_docs


@pytest.mark.parametrize("project", config_docs.PROJECTS, ids=lambda p: p.table)
def test_generated_config_files_match_the_models(project: config_docs.Project) -> None:
    for path, text in config_docs.expected_files((project,)).items():
        assert path.read_text() == text, f"{path} drifted from the settings models: run make config-docs"


def test_the_docs_hold_each_projects_table_and_only_tables_of_a_model() -> None:
    named = {name for _, name, _ in config_docs._TABLE_RE.findall(config_docs.DOCS.read_text())}
    assert {project.table for project in config_docs.PROJECTS} <= named <= set(config_docs.tables())
