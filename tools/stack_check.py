"""What `make plan STACK=<yours>` checks before it renders, beyond what the programs check themselves: the mistakes
`pulumi up`, or the cluster after the GPUs were paid for, would catch in a user's own stack.

Pure functions over a stack file's config (as tools/offline.load_stack_config reads it) and, for the NeMo RL
checks, over a recipe's keys: from the release's index (tools/nemo_rl_index.py), or from the config NeMo RL's own
loader resolved (tools/nemorl_config.py, run by tools/plan_run.py) for a recipe the index cannot know. Each problem is
one line naming the config key, its value and the command or setting that fixes it.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tools import nemo_rl_index

INFRA_PROJECT = "nemo-rl-gke"
JOBS_PROJECT = "nemo-rl-jobs"
# Secrets the infra program reads; the stack file must hold them as `secure:` ciphertexts (pulumi config set --secret).
SECRET_KEYS = {"hfToken": "hf_...", "wandbApiKey": "YOUR_WANDB_KEY"}
# The example stack files' stand-ins (Pulumi.dev.yaml, Pulumi.h200.yaml, Pulumi.b200.yaml): value -> (key, what to
# put there instead). tests/test_stack_check.py holds this against every `my-` value of the shipped stack files.
PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "my-gcp-project": ("gcp:project", "YOUR_PROJECT_ID"),
    "my-h200-reservation": (f"{INFRA_PROJECT}:reservation", "YOUR_RESERVATION"),
    "my-b200-reservation": (f"{INFRA_PROJECT}:reservation", "YOUR_RESERVATION"),
}


def _set_command(stack: str, key: str, value: str, secret: bool = False, jobs: bool = False) -> str:
    short = key.rpartition(":")[2] if key.startswith(f"{INFRA_PROJECT}:") or key.startswith(f"{JOBS_PROJECT}:") else key
    where = " --cwd jobs" if jobs else ""
    return f"pulumi config set{where} --stack {stack}{' --secret' if secret else ''} {short} {value}"


def _is_encrypted(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"secure"}


def infra_secret_problems(stack: str, config: Mapping[str, Any], file_name: str) -> list[str]:
    """A plain-text secret in the stack file (readable by anyone with the file, and in the state as plain text);
    a missing hfToken, which `pulumi up` refuses (the plan would otherwise plan with a placeholder)."""
    problems = []
    for key, example in SECRET_KEYS.items():
        full = f"{INFRA_PROJECT}:{key}"
        value = config.get(full)
        if value is None or _is_encrypted(value):
            continue
        shown = f"{str(value)[:3]}..." if value else "''"
        problems.append(
            f"config '{full}' = {shown} is plain text in {file_name}: store it encrypted instead: "
            f"{_set_command(stack, full, example, secret=True)} (this replaces the plain-text line)"
        )
    if f"{INFRA_PROJECT}:hfToken" not in config:
        problems.append(
            f"config '{INFRA_PROJECT}:hfToken' is not set in {file_name}: `pulumi up` needs your Hugging Face token, "
            f"stored encrypted: {_set_command(stack, 'hfToken', SECRET_KEYS['hfToken'], secret=True)}"
        )
    return problems


def placeholder_problems(stack: str, config: Mapping[str, Any], file_name: str) -> list[str]:
    """An example's stand-in left in a user's stack file: `pulumi up` would fail on a project or reservation that
    is not theirs."""
    problems = []
    for key, value in sorted(config.items()):
        if isinstance(value, str) and value in PLACEHOLDERS:
            _, instead = PLACEHOLDERS[value]
            problems.append(
                f"config '{key}' = '{value}' in {file_name} is the example's placeholder: set your own: "
                f"{_set_command(stack, key, instead)}"
            )
    return problems


def infra_stack_problem(job_stack: str, infra_file_stack: str, named: str) -> str | None:
    """The job stack's infraStack must name the infra stack whose file the plan renders it against
    (organization/nemo-rl-gke/<that stack>): else the plan shows one cluster and `pulumi up` targets another."""
    key = f"{JOBS_PROJECT}:infraStack"
    parts = named.split("/")
    wanted = f"ORGANIZATION/{INFRA_PROJECT}/{infra_file_stack}"
    fix = f"{_set_command(job_stack, key, f'organization/{INFRA_PROJECT}/{infra_file_stack}', jobs=True)}"
    used = f"the plan rendered jobs/Pulumi.{job_stack}.yaml against Pulumi.{infra_file_stack}.yaml"
    if len(parts) == 1:
        target = f"the job project's own stack {named!r} (organization/{JOBS_PROJECT}/{named})"
    elif len(parts) == 2:
        target = f"stack {parts[1]!r} of the job project in organization {parts[0]!r}"
    elif parts[1] != INFRA_PROJECT:
        target = f"project {parts[1]!r}, not the infra project {INFRA_PROJECT!r}"
    elif parts[2] != infra_file_stack:
        target = f"the infra stack {parts[2]!r}"
    else:
        return None
    return (
        f"config '{key}' = {named!r}: {used}, but `pulumi up` would read {target}: name it {wanted} "
        f"(on the self-managed backend ORGANIZATION is 'organization'): {fix}"
    )


# ---------------------------------------------------------------------------------------------------------------
# NeMo RL's own recipes and loader, at the image's release


def default_sources_root() -> Path:
    """Where a user's copies of NeMo RL's sources live, one folder per release tag (nemo-rl-<tag>)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nemo-rl-gke"


def release_sources(root: Path, tag: str) -> Path:
    return root / f"nemo-rl-{tag}"


def fill_command(root: Path, tag: str) -> str:
    """The one command that puts the release's sources where the plan looks (git, once per release)."""
    return (
        f"git clone --quiet --depth 1 --branch {tag} https://github.com/NVIDIA-NeMo/RL.git {release_sources(root, tag)}"
    )


def sources_problem(root: Path, tag: str) -> str | None:
    """Why the release's recipes cannot be read, with the command that fixes it; None when they can."""
    folder = release_sources(root, tag)
    if (folder / "nemo_rl" / "utils" / "config.py").is_file() and (folder / "examples" / "configs").is_dir():
        return None
    return (
        f"recipe and override keys NOT checked against NeMo RL {tag}: no sources of that release at {folder}; "
        f"fetch them once: {fill_command(root, tag)} (or point the plan at a copy: make plan NEMO_RL_SOURCES=DIR, "
        f"DIR holding nemo-rl-{tag}/)"
    )


def recipe_problem(tag: str, recipe: str) -> str:
    """A recipe the release's index does not list, and no sources at hand that hold it (the GRPO entrypoint loads
    it at train, after the GPUs are up): the nearest names and the command that lists them all."""
    close = nemo_rl_index.nearest(tag, recipe)
    hint = f"nearest: {', '.join(close)}" if close else "no recipe of that release has a name close to it"
    return (
        f"config '{JOBS_PROJECT}:recipe' = {recipe!r} is not a recipe of NeMo RL {tag} (the image's release; "
        f"tools/nemo_rl_index.json): {hint}; list them: {nemo_rl_index.LIST_COMMAND} {tag} grpo (a recipe of your "
        f"own: plan it with sources that hold it, make plan NEMO_RL_SOURCES=DIR with DIR/nemo-rl-{tag}/{recipe}; "
        "see docs/configuration.md)"
    )


def override_key(item: str) -> tuple[str, str]:
    """('+', 'a.b') for '+a.b=1', ('', 'a.b') for 'a.b=1', ('~', ...) for a deletion ('++' is add-or-override)."""
    key = item.split("=", 1)[0]
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    return prefix, key[len(prefix) :]


_INT = re.compile(r"[+-]?\d[\d_]*")
_FLOAT = re.compile(r"[+-]?(\d[\d_]*\.[\d_]*|\.\d[\d_]*|\d[\d_]*)([eE][+-]?\d+)?|[+-]?(inf|nan)")
# How a message names each type the index records.
TYPE_NAMES = {
    "int": "an integer",
    "float": "a floating-point number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list [...]",
    "dict": "a mapping {...}",
}


def value_type(text: str) -> str | None:
    """The type Hydra's override grammar gives a value, in the index's names: None for null, 'ref' for an
    interpolation (its type is the referenced key's)."""
    text = text.strip()
    lower = text.lower()
    if lower == "null":
        return None
    if "${" in text:
        return "ref"
    if lower in ("true", "false"):
        return "bool"
    if _INT.fullmatch(text):
        return "int"
    if _FLOAT.fullmatch(lower):
        return "float"
    return {"[": "list", "{": "dict"}.get(text[:1], "str")


def _fits(declared: str | None, given: str | None) -> bool:
    """A value of type `given` where the recipe has one of `declared` (a string takes any scalar: Hydra reads 1 as
    an integer where a name may be meant; null and an interpolation go anywhere)."""
    if declared is None or given in (None, "ref") or declared == given:
        return True
    return (declared == "float" and given == "int") or (declared == "str" and given in ("int", "float", "bool"))


def override_problems(
    keys: Mapping[str, str | None],
    words: Iterable[tuple[str, str]],
    recipe: str,
    tag: str,
    elsewhere: Mapping[str, Mapping[str, str | None]],
) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """Each override, in the order the entrypoint applies them, against the recipe's keys in the release's index,
    as Hydra applies them in struct mode: `key=` must exist and (where the recipe declares a type) get a value of
    it, `+key=` must not exist (unless null, or the value is a list or mapping, which Hydra merges), `~key` must
    exist (and not be null), `++key=` always goes. `words` are (override, source) with source 'stack' (the job
    stack's own) or 'override' (extraOverrides); `elsewhere` is the recipe's keys in the other releases, to say
    when a key is one there. Returns the problems (one line each) and the last override that set each key:
    key -> (value, source)."""
    release_keys, keys = keys, dict(keys)
    problems: list[str] = []
    set_by: dict[str, tuple[str, str]] = {}
    for item, source in words:
        prefix, key = override_key(item)
        value = item.split("=", 1)[1] if "=" in item else None
        declared = keys.get(key)
        if source == "override":
            where, fix = f"config '{JOBS_PROJECT}:extraOverrides' item {item!r}", ""
        else:  # not the user's to fix: the recipe (or the image's release) is
            where = f"config '{JOBS_PROJECT}:recipe' = {recipe!r}: the job stack's own override {item!r}"
            fix = f": the job stack cannot run this recipe on this release (others: {nemo_rl_index.LIST_COMMAND} {tag})"
        there = [other for other, theirs in sorted(elsewhere.items()) if key in theirs and key not in release_keys]
        also = f" (it is one in NeMo RL {', '.join(there)})" if there else ""
        if prefix == "~" and key in keys and declared is None:
            problems.append(
                f"{where}: {key} is null in {recipe} (NeMo RL {tag}), and Hydra deletes only a key that is set: "
                f"drop the item{fix}"
            )
            continue
        if prefix in ("", "~") and key not in keys:
            others = sorted(k for k in keys if not key.startswith(f"{k}."))  # not the key's own parents
            close = difflib.get_close_matches(key, others, n=3, cutoff=0.8)
            if close:
                hint = f"did you mean {' or '.join(close)}?"
            elif prefix == "~":
                hint = "there is nothing to remove: drop the item"
            else:
                hint = f"write +{key}=... to add a new key"
            problems.append(
                f"{where}: {key} is not a key of {recipe} in NeMo RL {tag}{also}, and its loader refuses it at "
                f"train: {fix[2:] if fix else hint}"
            )
            continue
        given = value_type(value) if value is not None else None
        if prefix == "+" and key in keys and declared is not None and given not in ("list", "dict"):
            problems.append(
                f"{where}: {key} is already a key of {recipe} in NeMo RL {tag} (Hydra refuses to append it): "
                f"drop the '+' ({key}={value}){fix}"
            )
            continue
        if prefix == "" and not _fits(declared, given):
            problems.append(
                f"{where}: {key} takes {TYPE_NAMES[str(declared)]} in {recipe} (NeMo RL {tag}: the type of the "
                f"recipe's value), and {value!r} is {TYPE_NAMES.get(str(given), given)}{fix}"
            )
            continue
        if prefix == "~":
            for name in [k for k in keys if k == key or k.startswith(f"{key}.")]:
                del keys[name]
            set_by[key] = ("deleted", source)
        else:
            if key not in keys:
                parts = key.split(".")
                for depth in range(1, len(parts)):
                    keys.setdefault(".".join(parts[:depth]), "dict")
                keys[key] = given if given != "ref" else None
            if value is not None:
                set_by[key] = (value, source)
    return problems, set_by


def shown_values(recipe_values: Mapping[str, Any], set_by: Mapping[str, tuple[str, str]]) -> str:
    """The values a user most likely meant to change, each with where it came from (the recipe, the stack's own
    settings, an extraOverride)."""
    parts = []
    for key, shown in nemo_rl_index.SHOWN.items():
        if key in set_by:
            value, source = set_by[key]
        elif key in recipe_values:
            value, source = recipe_values[key], "recipe"
        else:
            continue
        parts.append(f"{shown.format(value)} ({source})")
    return ", ".join(parts)


def backend_problem(megatron: bool, words: Iterable[str], recipe: str, tag: str) -> str | None:
    """A recipe that trains with Megatron (policy.megatron_cfg.enabled) run as a DTensor one: the job stack knows the
    Megatron sizes of NeMo RL's performance recipes only (jobs/launcher/performance.py), and for any other recipe it
    writes policy.dtensor_cfg.tensor_parallel_size and checks the batch against DTensor's data-parallel size, neither
    of which that recipe trains with."""
    dtensor_override = any(override_key(word)[1] == "policy.dtensor_cfg.tensor_parallel_size" for word in words)
    if not (megatron and dtensor_override):
        return None
    return (
        f"config '{JOBS_PROJECT}:recipe' = {recipe!r}: it trains with Megatron (policy.megatron_cfg.enabled) in NeMo "
        f"RL {tag}, but it is not one of the performance recipes whose Megatron sizes the job stack knows "
        "(jobs/launcher/performance.py), so dtensorTensorParallelSize and the batch check would not be what it trains "
        "with: use a recipe of examples/configs/recipes/llm/performance/ or a DTensor recipe, or add extraOverrides "
        "policy.megatron_cfg.enabled=false and policy.dtensor_cfg.enabled=true to train it with DTensor"
    )
