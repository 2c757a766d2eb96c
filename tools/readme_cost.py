"""Copy each golden plan's cost.txt (what `make plan` prints as the estimated cost) into the README and docs/.

    python tools/readme_cost.py [--check]

Three kinds of marked block, each held by exactly one of README.md and docs/*.md (whichever file it sits in):
- `<!-- cost:STACK -->` ... `<!-- /cost:STACK -->`: the stack's whole cost.txt (docs/cost.md holds them);
- `<!-- cost-summary -->` ... `<!-- /cost-summary -->`: one line per stack with its key figures (the README's cost
  summary);
- `<!-- after-destroy -->` ... `<!-- /after-destroy -->`: what each stack keeps billing after
  `pulumi destroy --exclude-protected` (the "per month after destroy" line of its cost.txt; the README's tear-down).
`make golden` runs this after refreshing the plans, so the quoted figures are generated, never typed;
tests/test_plan.py fails when they differ (--check exits 1 the same way, naming the stale files).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GOLDEN = ROOT / "tests" / "golden"


def documents() -> list[Path]:
    """The files that may hold a generated block: the README and every guide in docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _fenced(marker: str, body: str) -> str:
    return f"<!-- {marker} -->\n```text\n{body}\n```\n<!-- /{marker} -->"


def _pattern(marker: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- {re.escape(marker)} -->.*?<!-- /{re.escape(marker)} -->", re.DOTALL)


def _quoted_block(marker: str, text: str) -> str | None:
    match = _pattern(marker).search(text)
    return None if match is None else match.group(0)


def block(stack: str, text: str) -> str:
    return _fenced(f"cost:{stack}", text.rstrip())


def quoted_after_destroy(text: str) -> str | None:
    """The after-destroy block `text` holds, or None."""
    return _quoted_block("after-destroy", text)


def quoted_summary(text: str) -> str | None:
    """The cost-summary block `text` holds, or None."""
    return _quoted_block("cost-summary", text)


def quoted(text: str, stack: str) -> str | None:
    """The cost text `text` quotes for `stack`, or None when it has no block for it."""
    inner = re.search(r"```text\n(.*?)\n```", _quoted_block(f"cost:{stack}", text) or "", re.DOTALL)
    return None if inner is None else inner.group(1) + "\n"


AFTER_DESTROY_PREFIX = "per month after destroy:"
# Summary column -> the cost.txt line it is taken from (the text after the prefix, as the plan prints it).
SUMMARY_COLUMNS = {
    "GPUs running, per hour": "per hour while the GPUs run:",
    "idle, per hour": "per hour idle (no run):",
    "Lustre per month": "Lustre per month:",
    "one run (steps + evaluations)": "one run, steps and evaluations:",
}


def _line(stack: str, text: str, prefix: str) -> str:
    """The rest of the one line of `text` that starts with `prefix`."""
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    if len(found) != 1:
        raise SystemExit(f"readme_cost: {stack}'s cost.txt has no single '{prefix}' line")
    return found[0].removeprefix(prefix).strip()


def after_destroy_block(costs: dict[str, str]) -> str:
    """One line per stack: what it keeps billing after a destroy, from its cost.txt."""
    width = max(len(stack) for stack in costs) + 2
    lines = [f"{stack:<{width}}{_line(stack, text, AFTER_DESTROY_PREFIX)}" for stack, text in costs.items()]
    return _fenced("after-destroy", "\n".join(lines))


def summary_block(costs: dict[str, str]) -> str:
    """A table of every stack's key figures: per hour running and idle, Lustre per month, one run."""
    rows = [["stack", *SUMMARY_COLUMNS]]
    for stack, text in costs.items():
        run = _line(stack, text, SUMMARY_COLUMNS["one run (steps + evaluations)"])
        values = [_line(stack, text, prefix) for prefix in list(SUMMARY_COLUMNS.values())[:-1]]
        rows.append([stack, *values, run.split(" (not counted", 1)[0]])
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(len(rows[0]) - 1)]
    body = "\n".join("".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + row[-1] for row in rows)
    sources = gpu_rate_sources(costs)
    if sources:
        body += "\n" + "\n".join(sources)
    return _fenced("cost-summary", body)


GPU_RATE_PREFIX = "one GPU node per hour:"
# How the plan names the basis of its GPU node rate -> the "by how it is bought" line that holds its source.
_BASIS_PURCHASE = {
    "(reservation:": ("on-demand list (upper bound):", "committed-use reservation:"),
    "(the table's spot rate)": ("spot:",),
    "(the table's flexStart rate)": ("calendar mode / flex-start (DWS):",),
}


def gpu_rate_sources(costs: dict[str, str]) -> list[str]:
    """One line per GPU node rate (stacks with the same rate and sources share it): the rate, how it was priced and
    the source, with its date, of each figure it rests on, from the "by how it is bought" lines of the stacks'
    cost.txt. Stacks whose cost.txt has no GPU node line are left out."""
    groups: dict[str, list[str]] = {}
    for stack, text in costs.items():
        found = [line for line in text.splitlines() if line.startswith(GPU_RATE_PREFIX)]
        if len(found) != 1:
            continue
        value = found[0].removeprefix(GPU_RATE_PREFIX).strip()
        ranged = re.match(r"^(\S+ to \S+) \((.*)\)$", value) or re.match(r"^(\S+) \((.*)\)$", value)
        if ranged is None:
            groups.setdefault(value, []).append(stack)
            continue
        rate, basis = ranged.groups()
        names = next((names for key, names in _BASIS_PURCHASE.items() if f"({basis})".startswith(key)), ())
        parts = []
        for name in names:
            row = [line.strip() for line in text.splitlines() if line.strip().startswith(name)]
            if row:
                parts.append(f"{name.rstrip(':')} {row[0].removeprefix(name).strip()}")
        how = "; ".join(parts) if parts else basis
        groups.setdefault(f"{rate}: {how.replace(', derived (note below)', ', derived: see docs/cost.md')}", []).append(
            stack
        )
    return [f"GPU node, {', '.join(stacks)}: {line}" for line, stacks in groups.items()]


def _replace_in_one(texts: dict[str, str], marker: str, new: str) -> None:
    """Replace the `marker` block in the one text that holds it (in place, in `texts`)."""
    pattern = _pattern(marker)
    holders = [name for name, text in texts.items() if pattern.search(text)]
    if len(holders) != 1:
        where = "no file" if not holders else ", ".join(holders)
        raise SystemExit(
            f"readme_cost: <!-- {marker} --> must be in exactly one of {', '.join(texts)}; found in {where}"
        )
    # A function, not a string: the text must not be read as a regex replacement template.
    texts[holders[0]] = pattern.sub(lambda _: new, texts[holders[0]])


def updated(texts: dict[str, str], costs: dict[str, str]) -> dict[str, str]:
    """File name -> its text with every generated block refreshed from `costs` (stack -> cost.txt)."""
    texts = dict(texts)
    for stack, text in costs.items():
        _replace_in_one(texts, f"cost:{stack}", block(stack, text))
    if costs:
        _replace_in_one(texts, "cost-summary", summary_block(costs))
        _replace_in_one(texts, "after-destroy", after_destroy_block(costs))
    return texts


def golden_costs() -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted(GOLDEN.glob("*/cost.txt"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the quoted figures are up to date")
    args = parser.parse_args(argv)
    texts = {path.relative_to(ROOT).as_posix(): path.read_text() for path in documents()}
    new = updated(texts, golden_costs())
    stale = [name for name in texts if new[name] != texts[name]]
    if args.check:
        for name in stale:
            print(f"readme_cost: {name} quotes stale cost figures: run `make golden`", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        (ROOT / name).write_text(new[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
