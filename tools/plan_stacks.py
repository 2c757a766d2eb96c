"""The stacks `make plan` plans: stack files, the infra stack a job stack runs on, overrides, placeholder secrets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.offline import encrypted_keys, set_config_path

ROOT = Path(__file__).resolve().parent.parent
JOBS_DIR = ROOT / "jobs"
# Obviously fake: they must never show up in anything written (tests check), only "[secret]" does.
PLACEHOLDER_SECRETS = {"hfToken": "hf_PLACEHOLDER_not_a_token", "wandbApiKey": "wandb_PLACEHOLDER_not_a_key"}
# The stack files the repository ships as examples: the tests, golden plans and checkov hold these, and only these,
# so a user's own stack (Pulumi.<mine>.yaml, real values, encrypted secrets) never breaks `make test`.
INFRA_EXAMPLE_STACKS = ("dev", "h200", "b200", "h200-4node")
# Job stack files shipped beside those pairs, each running on one of their infra stacks (the stack its infraStack
# names): job stack -> infra stack. Planned, golden and checkov'd like the pairs.
JOB_EXAMPLE_STACKS = {"h200-benchmark": "h200", "smoke": "h200"}
EXAMPLE_STACKS = (*INFRA_EXAMPLE_STACKS, *JOB_EXAMPLE_STACKS)


class PlanError(Exception):
    """A problem with what was asked (unknown stack, bad override): printed alone, exit 2."""


def stack_names(folder: Path) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in folder.glob("Pulumi.*.yaml"))


def named_infra_stack(stack: str) -> str:
    """The job stack file's infraStack, as written ('' when the file or the key is missing)."""
    job_file = JOBS_DIR / f"Pulumi.{stack}.yaml"
    try:
        config = (yaml.safe_load(job_file.read_text()) or {}).get("config") or {}
    except (OSError, yaml.YAMLError):
        return ""
    return str(config.get("nemo-rl-jobs:infraStack") or "")


def infra_stack_of(stack: str) -> str | None:
    """The infra stack a job stack runs on: the infra stack file of the same name, else the one its infraStack
    names (organization/nemo-rl-gke/h200 -> h200) when that stack file exists; None when neither does."""
    if (ROOT / f"Pulumi.{stack}.yaml").is_file():
        return stack
    named = named_infra_stack(stack).rpartition("/")[2]
    return named if named and (ROOT / f"Pulumi.{named}.yaml").is_file() else None


def stacks_available() -> list[str]:
    """Job stack files with an infra stack to run on: one of the same name, or the one its infraStack names."""
    return [stack for stack in stack_names(JOBS_DIR) if infra_stack_of(stack)]


def apply_overrides(project: str, config: dict[str, Any], overrides: Sequence[str]) -> None:
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


def placeholders_for_encrypted(project: str, config: dict[str, Any], stack_file: str) -> dict[str, str]:
    """Secrets the stack file holds encrypted (`secure:`): the plan cannot decrypt them, so each is replaced by a
    placeholder, and says so."""
    secrets = {}
    for full in encrypted_keys(config):
        del config[full]
        key = full.rpartition(":")[2]
        secrets[full] = PLACEHOLDER_SECRETS.get(key, f"PLACEHOLDER_for_encrypted_{key}")
        print(f"      {full}: encrypted in {stack_file}; planned with a placeholder (only the CLI can decrypt it)")
    return secrets
