"""Copy each golden plan's cost.txt (what `make plan` prints as the estimated cost) into README.md's cost section.

    python tools/readme_cost.py [--check]

The README holds one fenced block per stack between `<!-- cost:STACK -->` and `<!-- /cost:STACK -->`, and its
tear-down section one block between `<!-- after-destroy -->` and `<!-- /after-destroy -->` with what each stack
keeps billing after `pulumi destroy --exclude-protected` (the "per month after destroy" line of its cost.txt).
`make golden` runs this after refreshing the plans, so the quoted figures are generated, never typed;
tests/test_plan.py fails when they differ (--check exits 1 the same way).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GOLDEN = ROOT / "tests" / "golden"


def block(stack: str, text: str) -> str:
    return f"<!-- cost:{stack} -->\n```text\n{text.rstrip()}\n```\n<!-- /cost:{stack} -->"


def _pattern(stack: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- cost:{re.escape(stack)} -->.*?<!-- /cost:{re.escape(stack)} -->", re.DOTALL)


def quoted_after_destroy(readme: str) -> str | None:
    """The after-destroy block the README's tear-down section holds, or None."""
    match = AFTER_DESTROY.search(readme)
    return None if match is None else match.group(0)


def quoted(readme: str, stack: str) -> str | None:
    """The cost text the README quotes for `stack`, or None when it has no block for it."""
    match = _pattern(stack).search(readme)
    if not match:
        return None
    inner = re.search(r"```text\n(.*?)\n```", match.group(0), re.DOTALL)
    return None if inner is None else inner.group(1) + "\n"


AFTER_DESTROY = re.compile(r"<!-- after-destroy -->.*?<!-- /after-destroy -->", re.DOTALL)
AFTER_DESTROY_PREFIX = "per month after destroy:"


def after_destroy_block(costs: dict[str, str]) -> str:
    """One line per stack: what it keeps billing after a destroy, from its cost.txt."""
    width = max(len(stack) for stack in costs) + 2
    lines = []
    for stack, text in costs.items():
        found = [line for line in text.splitlines() if line.startswith(AFTER_DESTROY_PREFIX)]
        if len(found) != 1:
            raise SystemExit(f"readme_cost: {stack}'s cost.txt has no single '{AFTER_DESTROY_PREFIX}' line")
        lines.append(f"{stack:<{width}}{found[0].removeprefix(AFTER_DESTROY_PREFIX).strip()}")
    body = "\n".join(lines)
    return f"<!-- after-destroy -->\n```text\n{body}\n```\n<!-- /after-destroy -->"


def _constant(text: str) -> Callable[[re.Match[str]], str]:
    return lambda _: text


def updated(readme: str, costs: dict[str, str]) -> str:
    for stack, text in costs.items():
        if _pattern(stack).search(readme) is None:
            raise SystemExit(f"readme_cost: README.md has no <!-- cost:{stack} --> block")
        # A function, not a string: the text must not be read as a regex replacement template.
        readme = _pattern(stack).sub(_constant(block(stack, text)), readme)
    if costs:
        if AFTER_DESTROY.search(readme) is None:
            raise SystemExit("readme_cost: README.md has no <!-- after-destroy --> block")
        readme = AFTER_DESTROY.sub(_constant(after_destroy_block(costs)), readme)
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether README.md is up to date")
    args = parser.parse_args(argv)
    costs = {p.parent.name: p.read_text() for p in sorted(GOLDEN.glob("*/cost.txt"))}
    readme = README.read_text()
    new = updated(readme, costs)
    if args.check:
        return 0 if new == readme else 1
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
