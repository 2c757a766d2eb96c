"""Both programs under Pulumi's mocks, each GRPO step's recipe checked against NeMo RL, and the progress lines."""

from __future__ import annotations

import json
import logging.handlers
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools import nemo_rl_index, stack_check, timeline
from tools.offline import ProgramRun, load_stack_config, run_program
from tools.plan_stacks import (
    EXAMPLE_STACKS,
    JOBS_DIR,
    PLACEHOLDER_SECRETS,
    ROOT,
    PlanError,
    apply_overrides,
    infra_stack_of,
    named_infra_stack,
    placeholders_for_encrypted,
    stack_names,
    stacks_available,
)

NEMORL_PYTHON = ROOT / ".venv-nemorl" / "bin" / "python"
STEPS = 4
# What `make plan` prints, progress lines included, fits one terminal screen (tests hold every shipped stack to it).
SCREEN_LINES = 40
SCREEN_WIDTH = 120


@dataclass
class Plan:
    stack: str
    infra: ProgramRun
    jobs: ProgramRun
    timeline: timeline.Timeline
    # What the programs warned about (pulumi.log.warn), in order, each once: `pulumi up` would show these.
    warnings: list[str] = field(default_factory=list)


def run_plan(
    stack: str,
    infra_overrides: Sequence[str] = (),
    job_overrides: Sequence[str] = (),
    wandb: bool = True,
    nemo_rl_sources: Path | None = None,
) -> Plan:
    """Both programs under mocks; raises PlanError for an unknown stack, pulumi.RunError for bad config. With
    wandb=False no W&B key is given, as for a user without one: the run logs to TensorBoard instead. What the
    programs warn about is kept in Plan.warnings (printed before the error when a program fails)."""
    named = named_infra_stack(stack)
    if stack not in stacks_available() and (JOBS_DIR / f"Pulumi.{stack}.yaml").is_file() and named:
        raise PlanError(
            f"config 'nemo-rl-jobs:infraStack' = {named!r} in jobs/Pulumi.{stack}.yaml names no infra stack file "
            f"here (neither Pulumi.{stack}.yaml nor Pulumi.{named.rpartition('/')[2]}.yaml exists): name one of "
            f"{', '.join(stack_names(ROOT))}: pulumi config set --cwd jobs --stack {stack} infraStack "
            "organization/nemo-rl-gke/<infra stack>"
        )
    # Under mocks, pulumi.log.warn goes to the root logger (Pulumi's MockEngine): kept here for the summary.
    kept = logging.handlers.BufferingHandler(capacity=sys.maxsize)
    kept.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(kept)
    try:
        plan = _run_programs(stack, infra_overrides, job_overrides, wandb, named, nemo_rl_sources)
    except Exception:
        for message in dict.fromkeys(record.getMessage() for record in kept.buffer):
            print(f"warning: {message}", file=sys.stderr)
        raise
    finally:
        root.removeHandler(kept)
    plan.warnings = list(dict.fromkeys(record.getMessage() for record in kept.buffer))  # each once, in order
    return plan


def _run_programs(
    stack: str,
    infra_overrides: Sequence[str],
    job_overrides: Sequence[str],
    wandb: bool,
    named: str | None,
    nemo_rl_sources: Path | None,
) -> Plan:
    if stack not in stacks_available():
        raise PlanError(
            f"no stack {stack!r}: STACK must name jobs/Pulumi.{stack}.yaml and an infra stack file, "
            f"Pulumi.{stack}.yaml or the one its infraStack names; "
            f"available: {', '.join(stacks_available())}"
        )
    progress(1, "infra program (mocks)")
    infra_stack = infra_stack_of(stack) or stack
    _refuse([stack_check.infra_stack_problem(stack, infra_stack, named) if named else None])
    project, config = load_stack_config(ROOT, infra_stack)
    apply_overrides(project, config, infra_overrides)
    infra_file = f"Pulumi.{infra_stack}.yaml"
    if stack not in EXAMPLE_STACKS:  # a user's stack: what `pulumi up` would refuse, or run with a stand-in
        _refuse(
            stack_check.infra_secret_problems(infra_stack, config, infra_file)
            + stack_check.placeholder_problems(infra_stack, config, infra_file)
        )
        secrets = {}  # only the secrets the stack holds (encrypted): without a W&B key the run logs to TensorBoard
    else:  # the examples hold no secrets: planned as for a user who set both
        secrets = {f"{project}:{key}": value for key, value in PLACEHOLDER_SECRETS.items()}
    secrets.update(placeholders_for_encrypted(project, config, infra_file))
    if not wandb:  # as for a user without a W&B key, whatever the stack file holds
        secrets.pop(f"{project}:wandbApiKey", None)
    infra = run_program(ROOT, config, secrets=secrets, stack=infra_stack)

    progress(2, "job program (mocks), fed with the infra outputs")
    job_project, job_config = load_stack_config(JOBS_DIR, stack)
    apply_overrides(job_project, job_config, job_overrides)
    job_secrets = placeholders_for_encrypted(job_project, job_config, f"jobs/Pulumi.{stack}.yaml")
    reference = str(job_config.get(f"{job_project}:infraStack") or "")
    jobs = run_program(
        JOBS_DIR,
        job_config,
        secrets=job_secrets,
        stack=stack,
        stack_outputs={reference: infra.outputs} if reference else {},
        stack_secret_outputs={reference: infra.secret_outputs} if reference else {},
    )

    for line in check_with_nemo_rl(infra, jobs, job_config.get(f"{job_project}:extraOverrides") or [], nemo_rl_sources):
        print("\n".join(wrapped(line, "      ", "        ")))

    progress(3, "timeline model")
    model = timeline.build([infra.resources, jobs.resources])
    return Plan(stack=stack, infra=infra, jobs=jobs, timeline=model)


def _nemo_rl_loader(sources: Path, words: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    """NeMo RL's own loader (tools/nemorl_config.py in .venv-nemorl) on the release's sources: (resolved config,
    '') or (None, its one-line refusal)."""
    result = subprocess.run(
        [str(NEMORL_PYTHON), str(ROOT / "tools" / "nemorl_config.py"), "--nemo-rl", str(sources), "--", *words],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if result.returncode == 0:
        return json.loads(result.stdout), ""
    lines = result.stderr.strip().splitlines()
    return None, lines[-1] if lines else f"exit {result.returncode}"


def check_with_nemo_rl(
    infra: ProgramRun, jobs: ProgramRun, extra: Sequence[str], sources_root: Path | None
) -> list[str]:
    """Every GRPO step's recipe and overrides against the image's NeMo RL release, as its loader reads them (the
    first thing the entrypoint does at train, after the GPU nodes are up): against the release's index
    (tools/nemo_rl_index.json), or, for a recipe the index has no keys for, with the release's own loader on its
    sources when they are at hand. Raises PlanError for what it refuses; returns the lines to print (what was
    checked and the recipe's values a user most likely meant to change, or why nothing was checked)."""
    release = infra.outputs.get("nemoRlRelease") or {}
    tag, entrypoint = release.get("tag"), release.get("grpoEntrypoint")
    if not tag or not entrypoint:
        return ["recipe and override keys NOT checked: the image's NeMo RL release is not one the project knows"]
    root = sources_root or stack_check.default_sources_root()
    checked, loaded, notes, values = [], [], [], ""
    for step in jobs.outputs.get("pipeline") or []:
        words = shlex.split(str(step.get("entrypoint") or ""))
        if entrypoint not in words:
            continue
        words = words[words.index(entrypoint) + 1 :]
        recipe = words[0].removeprefix("--config=")
        tail = list(extra) if extra and words[-len(extra) :] == list(extra) else []
        ours = words[1 : len(words) - len(tail)]
        keys = nemo_rl_index.keys_of(tag, recipe)
        if keys is None:
            note = _check_with_loader(tag, recipe, ours, tail, stack_check.release_sources(root, tag))
            if note:
                notes.append(note)
            else:
                loaded.append(step["step"])
            continue
        elsewhere = {other: nemo_rl_index.keys_of(other, recipe) or {} for other in nemo_rl_index.TAGS if other != tag}
        sources = [(word, "stack") for word in ours] + [(word, "override") for word in tail]
        problems, set_by = stack_check.override_problems(keys, sources, recipe, tag, elsewhere)
        recipe_values = nemo_rl_index.values_of(tag, recipe)
        megatron = set_by.get("policy.megatron_cfg.enabled", (recipe_values.get("policy.megatron_cfg.enabled"),))[0]
        _refuse([*problems, stack_check.backend_problem(str(megatron).lower() == "true", ours, recipe, tag)])
        checked.append(step["step"])
        values = values or f"{step['step']}: {stack_check.shown_values(recipe_values, set_by)}"
    index = f"recipe and override keys checked against NeMo RL {tag}'s index (tools/nemo_rl_index.json): "
    lines = ([index + ", ".join(checked)] if checked else []) + ([values] if values else [])
    if loaded:
        lines.append(f"NeMo RL {tag}'s own loader accepted the recipe and overrides of: {', '.join(loaded)} ({root})")
    return lines + notes


def _check_with_loader(tag: str, recipe: str, ours: list[str], tail: list[str], sources: Path) -> str | None:
    """A recipe the index has no keys for, through the release's own loader on its sources: raises PlanError for
    what it refuses; returns None when it accepted, else the line that says why nothing was checked."""
    reason = nemo_rl_index.unindexed_reason(tag, recipe)
    if not (sources / recipe).is_file():
        if reason is None:  # not a recipe of the release at all
            raise PlanError(stack_check.recipe_problem(tag, recipe))
        missing = stack_check.sources_problem(sources.parent, tag)
        return f"{recipe}: keys not in the index ({reason}): {missing or 'the sources lack it'}"
    if not NEMORL_PYTHON.is_file():
        return (
            f"recipe and override keys NOT checked against NeMo RL {tag}: no {NEMORL_PYTHON.parent.parent.name} "
            "(NeMo RL's loader needs its own Python): create it with: make .venv-nemorl/.installed"
        )
    resolved, refusal = _nemo_rl_loader(sources, [f"--config={recipe}", *ours])
    if resolved is None:
        raise PlanError(f"NeMo RL {tag}'s loader refused the config ({recipe}): {refusal}")
    keys = nemo_rl_index.flat_keys(resolved)
    problems, _ = stack_check.override_problems(keys, [(word, "override") for word in tail], recipe, tag, {})
    megatron = (resolved.get("policy") or {}).get("megatron_cfg") or {}
    _refuse([*problems, stack_check.backend_problem(megatron.get("enabled") is True, ours, recipe, tag)])
    if tail:
        resolved, refusal = _nemo_rl_loader(sources, [f"--config={recipe}", *ours, *tail])
        if resolved is None:
            raise PlanError(
                f"config 'nemo-rl-jobs:extraOverrides' = {tail!r}: NeMo RL {tag}'s loader refused them on "
                f"{recipe}: {refusal}: fix or remove the item it names"
            )
    return None


def _refuse(problems: Sequence[str | None]) -> None:
    """Stop the plan on every problem found (None: none there), one `plan:` line each."""
    found = [problem for problem in problems if problem]
    if found:
        raise PlanError("\nplan: ".join(found))


def progress(step: int, what: str) -> None:
    print(f"[{step}/{STEPS}] {what}…", flush=True)


def wrapped(text: str, indent: str = "  ", hanging: str = "    ") -> list[str]:
    return textwrap.wrap(
        text,
        width=SCREEN_WIDTH,
        initial_indent=indent,
        subsequent_indent=hanging,
        break_on_hyphens=False,
        break_long_words=False,  # a path or URL stays whole, to copy
    )
