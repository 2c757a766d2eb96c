"""`make checkov`: render every stack's plan, scan the manifests with checkov, fail on any finding not in the
reviewed skip list (checkov-skips.yaml), and on any skip that no longer matches anything.

What is scanned: every object the programs create (build/<stack>/manifests) and the Ray pods KubeRay creates from the
RayCluster the real chart renders (build/<stack>/ray-pods, tools/ray_pods.py). Without the chart (a clone without
../shared/reference) the Ray pods cannot be rendered: the gate says so, and fails under CI, where they must be scanned.

checkov lives in its own virtualenv (.venv-checkov, requirements-checkov.txt): its pins clash with the project's.
This script runs under the project's .venv and calls it as a program.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import plan, plan_stacks, ray_pods, render  # noqa: E402

SKIPS_FILE = ROOT / "checkov-skips.yaml"
# The fewest words a skip's reason may have: a sentence that says why the finding is accepted, not a label.
MIN_REASON_WORDS = 8
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CHECKOV_PINS = ROOT / "requirements-checkov.txt"
# checkov's reports of the manifests last scanned (scan()); `make clean` removes them with the rest of build/.
CACHE_DIR = ROOT / "build" / "checkov-reports"


@dataclass(frozen=True)
class Skip:
    check: str
    resources: tuple[str, ...]
    reason: str

    def covers(self, check_id: str, resource: str) -> bool:
        return check_id == self.check and any(fnmatch.fnmatchcase(resource, p) for p in self.resources)


@dataclass(frozen=True)
class Finding:
    stack: str
    check_id: str
    check_name: str
    resource: str
    file: str


def load_skips(path: Path = SKIPS_FILE) -> list[Skip]:
    """The reviewed skips; each must name a check, at least one resource pattern and a real reason."""
    data = yaml.safe_load(path.read_text()) or {}
    skips = []
    for index, entry in enumerate(data.get("skips") or []):
        check, resources, reason = entry.get("check"), entry.get("resources"), entry.get("reason")
        if not isinstance(check, str) or not check.startswith("CKV"):
            raise ValueError(f"{path.name}: skip {index} has no checkov check id")
        if not resources or not all(isinstance(r, str) and r for r in resources):
            raise ValueError(f"{path.name}: skip {check} names no resources")
        if not isinstance(reason, str) or len(reason.split()) < MIN_REASON_WORDS:
            raise ValueError(
                f"{path.name}: skip {check} needs a reason (a sentence or more, {MIN_REASON_WORDS}+ words)"
            )
        skips.append(Skip(check, tuple(resources), " ".join(reason.split())))
    return skips


def parse_report(stack: str, stdout: str) -> tuple[list[Finding], int]:
    """Failed checks and the number of passed checks from checkov's JSON output (one or more documents)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    index = 0
    while index < len(stdout):
        if stdout[index].isspace():
            index += 1
            continue
        doc, index = decoder.raw_decode(stdout, index)
        docs += doc if isinstance(doc, list) else [doc]
    findings, passed = [], 0
    for doc in docs:
        results = doc.get("results") or {}
        passed += int((doc.get("summary") or {}).get("passed", 0))
        for failed in results.get("failed_checks") or []:
            findings.append(
                Finding(
                    stack,
                    failed["check_id"],
                    failed.get("check_name", ""),
                    failed["resource"],
                    Path(failed.get("file_path", "")).name,
                )
            )
    return findings, passed


def judge(findings: Iterable[Finding], skips: Sequence[Skip]) -> tuple[list[Finding], list[Finding], list[Skip]]:
    """(findings not covered by a skip, covered findings, skips that covered nothing)."""
    unexpected, skipped, used = [], [], set()
    for finding in findings:
        covering = [s for s in skips if s.covers(finding.check_id, finding.resource)]
        if covering:
            skipped.append(finding)
            used.update(covering)
        else:
            unexpected.append(finding)
    return unexpected, skipped, [s for s in skips if s not in used]


def scan(
    stack: str, manifests_dir: Path | Sequence[Path], checkov: Path = CHECKOV, cache_dir: Path | None = CACHE_DIR
) -> tuple[list[Finding], int]:
    """Findings and passed checks over one folder, or several scanned as one (copied into a temporary folder:
    checkov's graph checks, such as "every pod has a NetworkPolicy", then see the Ray pods and the policies together;
    and checkov 3.3.30, given several --directory flags, scans the first one repeatedly and skips the rest).

    checkov's report is kept in `cache_dir` under a digest of everything it depends on (the checkov pins, the
    command, each scanned file's name and bytes): the same manifests are not scanned twice (2 CPU-s a stack). The
    skip list is applied afterwards, on every run."""
    if not checkov.exists():
        raise FileNotFoundError(f"{checkov} missing: run `make checkov` (it creates .venv-checkov)")
    dirs = [manifests_dir] if isinstance(manifests_dir, Path) else list(manifests_dir)
    with tempfile.TemporaryDirectory(prefix="checkov-") as together:
        for directory in dirs:
            for path in sorted(directory.glob("*.yaml")):
                if (Path(together) / path.name).exists():
                    raise ValueError(f"{path.name} is in more than one of {dirs}")
                shutil.copy(path, Path(together) / path.name)
        options = [
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--compact",
            "--soft-fail",  # this script decides, from the JSON, against the skip list
            "--skip-download",  # offline: no Prisma Cloud guidelines or policies
        ]
        cached = None if cache_dir is None else cache_dir / f"{stack}-{scan_digest(Path(together), options)}.json"
        if cached is not None and cached.is_file():
            return parse_report(stack, cached.read_text())
        result = subprocess.run(
            [str(checkov), "--directory", together, *options], capture_output=True, text=True, check=False
        )
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"checkov failed on {dirs} (exit {result.returncode}):\n{result.stderr[-4000:]}")
    findings = parse_report(stack, result.stdout)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        for old in cached.parent.iterdir():  # only the newest report of each stack is kept
            if re.fullmatch(rf"{re.escape(stack)}-[0-9a-f]{{32}}\.json", old.name):
                old.unlink()
        partial = cached.with_suffix(".tmp")
        partial.write_text(result.stdout)
        partial.rename(cached)
    return findings


def scan_digest(folder: Path, options: Sequence[str]) -> str:
    """What a checkov report over `folder` depends on: the pinned checkov, its options, each file's name and bytes."""
    digest = hashlib.sha256(CHECKOV_PINS.read_bytes())
    digest.update(json.dumps(list(options)).encode())
    for path in sorted(folder.iterdir()):
        digest.update(json.dumps([path.name, path.stat().st_size]).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def report(per_stack: Mapping[str, tuple[int, list[Finding]]], skips: Sequence[Skip]) -> tuple[bool, list[str]]:
    all_findings = [f for _, findings in per_stack.values() for f in findings]
    unexpected, skipped, unused = judge(all_findings, skips)
    lines = []
    for stack, (passed, findings) in per_stack.items():
        mine = [f for f in unexpected if f.stack == stack]
        lines.append(
            f"checkov {stack}: {passed} passed, {len(findings)} failed, "
            f"{len(findings) - len(mine)} of them skipped by {SKIPS_FILE.name}, {len(mine)} not"
        )
    for finding in unexpected:
        lines.append(
            f"FINDING {finding.stack}: {finding.check_id} {finding.check_name!r} on {finding.resource} "
            f"({finding.file}): fix the manifest, or add a skip with its reason to {SKIPS_FILE.name}"
        )
    for skip in unused:
        lines.append(
            f"STALE SKIP: {skip.check} {list(skip.resources)} matched nothing: remove it from {SKIPS_FILE.name}"
        )
    ok = not unexpected and not unused
    lines.append(f"checkov gate: {'passed' if ok else 'FAILED'} ({len(skipped)} findings skipped with a reason)")
    return ok, lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stacks", nargs="*", default=None, help="default: the example stacks")
    parser.add_argument("--out", default=str(ROOT / "build"))
    args = parser.parse_args(argv)
    skips = load_skips()
    per_stack: dict[str, tuple[int, list[Finding]]] = {}
    problem = ray_pods.chart_problem()
    if problem:
        print(f"checkov: the Ray pods are NOT scanned: {problem}")
        if os.environ.get("CI", "").lower() == "true":
            return 1
    # Each stack's scan runs while the next stack renders (checkov is a program of its own; the threads only wait).
    with ThreadPoolExecutor() as scans:
        pending: dict[str, Future[tuple[list[Finding], int]]] = {}
        for stack in args.stacks or plan_stacks.EXAMPLE_STACKS:
            if plan.main(["--stack", stack, "--out", args.out, "--quiet"]) != 0:
                return 1
            out = Path(args.out) / stack
            dirs = [out / "manifests", *([out / render.RAY_PODS_DIR] if not problem else [])]
            pending[stack] = scans.submit(scan, stack, dirs)
        for stack, scanned in pending.items():
            findings, passed = scanned.result()
            per_stack[stack] = (passed, findings)
    ok, lines = report(per_stack, skips)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
