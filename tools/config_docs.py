"""Pulumi.yaml's config schema and docs/configuration.md's key tables, written from the settings models.

`make config-docs` rewrites them; tests/test_config_docs.py fails when either differs from what this writes, so a
key's default and description live in its model field alone. The tables sit between `<!-- config-table: NAME -->`
and `<!-- end config-table -->`; NAME is a project's model, or a field of it that is itself a model.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "jobs"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from config_rules import Secret, Shown, keys_of  # noqa: E402

DOCS = ROOT / "docs" / "configuration.md"


@dataclass(frozen=True)
class Project:
    pulumi_yaml: Path
    module: str  # holds MODEL (the settings model) and SECRETS (key -> Secret)
    table: str  # the NAME of its top-level table in the docs


PROJECTS = (
    Project(ROOT / "Pulumi.yaml", "infra.settings", "infra"),
    Project(ROOT / "jobs" / "Pulumi.yaml", "launcher.job_settings", "jobs"),
)
_TABLE_RE = re.compile(r"(<!-- config-table: ([\w.-]+) -->\n).*?(<!-- end config-table -->)", re.S)


def _loaded(project: Project) -> tuple[type[BaseModel], Mapping[str, Secret]]:
    module = importlib.import_module(project.module)
    return module.MODEL, module.SECRETS


def _text(description: str | None) -> str:
    return " ".join((description or "").split())


def _pulumi_type(annotation: Any) -> str | None:
    """Pulumi's schema type of a field (string, integer, boolean, array of strings), None for an object."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _pulumi_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        kinds = {_pulumi_type(arg) for arg in typing.get_args(annotation) if arg is not type(None)}
        if "array" in kinds and len(kinds) > 1:
            return None  # a list or one item: no schema type holds both, so it is read as an object
        return kinds.pop() if len(kinds) == 1 else "string"
    if origin in (list, tuple):
        return "array"
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return None
    return {bool: "boolean", int: "integer"}.get(annotation, "string")


def _default(field: Any) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def schema_entries(model: type[BaseModel], secrets: Mapping[str, Secret]) -> dict[str, dict[str, Any]]:
    """Pulumi.yaml's `config:` block: the keys Pulumi can type, in the model's order, then the required secrets
    (an optional secret is not declared: a declared key without a default is mandatory)."""
    entries: dict[str, dict[str, Any]] = {}
    for key, field in keys_of(model).items():
        kind = _pulumi_type(field.annotation)
        if kind is None or ":" in key:  # objects, and a provider's own keys (gcp:project)
            continue
        entry: dict[str, Any] = {"type": kind}
        if kind == "array":
            entry["items"] = {"type": "string"}
        entry["description"] = _text(field.description)
        default = _default(field)
        if default is None:  # unset: Pulumi's schema has no empty value but text's ""
            entry.update(type="string", default="")
        elif default is not PydanticUndefined:
            entry["default"] = list(default) if kind == "array" else str(default) if kind == "string" else default
        entries[key] = entry
    for key, secret in secrets.items():
        if secret.required:
            entries[key] = {"type": "string", "secret": True, "description": _text(secret.description)}
    return entries


def _shown(field: Any) -> str:
    shown = next((item.text for item in field.metadata if isinstance(item, Shown)), None)
    if shown:
        return shown
    default = _default(field)
    if default is PydanticUndefined:
        return "required"
    if isinstance(default, BaseModel):
        return "see below"
    if default is None or default == "":
        return '`""`'
    if isinstance(default, tuple | list):
        return f"`{json.dumps(list(default))}`"
    return f"`{json.dumps(default) if isinstance(default, bool) else default}`"


def _part_of(model: type[BaseModel], name: str) -> type:
    """The class of the model's parts (or the model itself) that declares field `name`."""
    return next(cls for cls in model.__mro__ if name in inspect.get_annotations(cls))


def table(model: type[BaseModel], secrets: Mapping[str, Secret], prefix: str = "") -> str:
    """A row per key; a model made of parts (infra/settings.py) gets a heading row before each part's keys."""
    rows = ["| Key | Default | Meaning and rules |", "|---|---|---|"]
    parts = [_part_of(model, name) for name in model.model_fields]
    for index, (name, field) in enumerate(model.model_fields.items()):
        part = parts[index]
        if len(set(parts)) > 1 and (index == 0 or part is not parts[index - 1]):
            rows.append(f"| **{part.__name__}** | | {_text((part.__doc__ or '').split(chr(10) * 2)[0])} |")
        rows.append(f"| `{prefix}{field.alias or name}` | {_shown(field)} | {_text(field.description)} |")
    for key, secret in secrets.items():
        default = "required secret" if secret.required else "none, optional secret"
        rows.append(f"| `{key}` | {default} | {_text(secret.description)} |")
    return "\n".join(rows) + "\n"


def tables(projects: Sequence[Project] = PROJECTS) -> dict[str, str]:
    """Every table the docs may hold for these projects: NAME -> its markdown."""
    found: dict[str, str] = {}
    for project in projects:
        model, secrets = _loaded(project)
        found[project.table] = table(model, secrets)
        for key, field in keys_of(model).items():
            inner = field.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                found[f"{project.table}.{key}"] = table(inner, {}, prefix=f"{key}.")
    return found


def docs_text(current: str, projects: Sequence[Project] = PROJECTS) -> str:
    """The docs with the tables of these projects rewritten (another project's are left as they are)."""
    known = tables(projects)
    ours = tuple(project.table for project in projects)

    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name.split(".")[0] not in ours:
            return match.group(0)
        if name not in known:
            raise SystemExit(f"{DOCS.name}: no settings model for the table {name!r} (known: {', '.join(known)})")
        return match.group(1) + known[name] + match.group(3)

    return _TABLE_RE.sub(replace, current)


def pulumi_yaml_text(project: Project, current: str) -> str:
    """The file with its `config:` block (its last) rewritten; what precedes it stays as written."""
    head, found, _ = current.partition("\nconfig:\n")
    if not found:
        raise SystemExit(f"{project.pulumi_yaml}: no top-level `config:` block to rewrite")
    entries = schema_entries(*_loaded(project))
    block = yaml.safe_dump({"config": entries}, sort_keys=False, width=10_000, allow_unicode=True)
    return head + "\n" + block


def expected_files(projects: Sequence[Project] = PROJECTS) -> dict[Path, str]:
    """What each generated file must hold: Pulumi.yaml of each project, and the docs."""
    files = {p.pulumi_yaml: pulumi_yaml_text(p, p.pulumi_yaml.read_text()) for p in projects}
    files[DOCS] = docs_text(DOCS.read_text(), projects)
    return files


def main(argv: Sequence[str]) -> int:
    """Rewrite the files of the projects named (by table name: infra, jobs), or of both."""
    projects = tuple(p for p in PROJECTS if p.table in argv) or PROJECTS
    for path, text in expected_files(projects).items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
