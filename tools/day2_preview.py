"""Preview a day-2 change offline: the day-2 guard (infra/day2.py) run on the record of the last deployment and the
record this stack's config would write, as `make plan STACK=mine PREVIOUS=outputs.json` prints it.

PREVIOUS is what `pulumi stack output --json --show-secrets` prints for the deployed infra stack (its
`deployedSettings` is all that is read, and it holds nothing secret), or the `outputs.json` of an earlier plan (its
`infra` part). The answer, per changed key: what it updates in place, rolls, replaces or refuses, and the lines the
guard would stop `pulumi up` with.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from infra import day2

VERBS = {
    day2.IN_PLACE: "updates in place",
    day2.ROLLS_NODES: "rolls",
    day2.REPLACES: "replaces",
    day2.REFUSED: "refuses",
}


class PreviousError(Exception):
    """PREVIOUS is not outputs this preview can read."""


def previous_record(path: Path) -> dict[str, Any]:
    """The last deployment's record from a `pulumi stack output --json` file or a plan's outputs.json."""
    try:
        outputs = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PreviousError(f"PREVIOUS={path}: not a JSON file ({error})") from error
    if isinstance(outputs, dict) and day2.DEPLOYED_SETTINGS_OUTPUT not in outputs and "infra" in outputs:
        outputs = outputs["infra"]  # a plan's outputs.json: {"infra": ..., "jobs": ...}
    record = outputs.get(day2.DEPLOYED_SETTINGS_OUTPUT) if isinstance(outputs, dict) else None
    if isinstance(record, str):  # an output printed as a JSON string
        try:
            record = json.loads(record)
        except ValueError:
            record = None
    if not isinstance(record, dict):
        raise PreviousError(
            f"PREVIOUS={path}: no '{day2.DEPLOYED_SETTINGS_OUTPUT}' object in it: give the JSON that "
            "`pulumi stack output --json --show-secrets` prints for the infra stack (a stack deployed before the "
            "guard has none: its next `pulumi up` compares nothing), or a plan's outputs.json"
        )
    return record


def allowed_keys(config: Mapping[str, Any], project: str) -> tuple[str, ...]:
    raw = config.get(f"{project}:{day2.ALLOW_REPLACE_KEY}")
    return tuple(str(item) for item in raw) if isinstance(raw, list) else ()


def _change_lines(change: day2.Change, indent: str = "  ") -> list[str]:
    mark = " (listed in allowReplace)" if change.allowed and change.needs_allowance else ""
    lines = [f"{indent}{VERBS.get(change.effect, change.effect):<17} {change.shown}: {change.what}{mark}"]
    for consequence in change.follows:
        lines += _change_lines(consequence, indent + "  + follows: ")
    return lines


def report(previous: Mapping[str, Any], current: Mapping[str, Any], allowed: Collection[str], source: str) -> str:
    """The preview: every changed key with what it does, then what the guard would answer `pulumi up`."""
    found = day2.changes(previous, current, allowed)
    lines = [f"day 2, against the last deployment's record in {source}:"]
    if not found:
        lines.append("  no recorded setting changes")
    for change in found:
        lines += _change_lines(change)
    refused = day2.refusals(previous, current, allowed)
    if refused:
        lines.append("pulumi up would stop before changing anything:")
        lines += [f"  {line}" for line in refused]
    else:
        lines.append("pulumi up: the guard lets this through")
        unused = day2.unused_allowances(previous, current, allowed)
        if unused:
            lines.append(f"  allowReplace lists {', '.join(unused)}, which does not change now")
    return "\n".join(lines)
