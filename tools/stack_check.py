"""What `make plan STACK=<yours>` checks before it renders, beyond what the programs check themselves: the mistakes
`pulumi up`, or the cluster after the GPUs were paid for, would catch in a user's own stack.

Pure functions over a stack file's config (as tools/offline.load_stack_config reads it) and, for the NeMo RL
checks, over the config NeMo RL's own loader resolved (tools/nemorl_config.py, run by tools/plan.py). Each problem is
one line naming the config key, its value and the command or setting that fixes it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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


def recipe_problem(sources: Path, tag: str, recipe: str) -> str | None:
    """The recipe must be a file of the release (the GRPO entrypoint loads it at train, after the GPUs are up)."""
    if (sources / recipe).is_file():
        return None
    recipes = sorted(str(p.relative_to(sources)) for p in (sources / "examples" / "configs").rglob("*.yaml"))
    close = difflib.get_close_matches(recipe, recipes, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "see examples/configs/recipes/llm/ at that tag"
    return (
        f"config '{JOBS_PROJECT}:recipe' = {recipe!r} is not a recipe of NeMo RL {tag} (the image's release): "
        f"{hint} (set it with: pulumi config set --cwd jobs recipe PATH)"
    )


def _dotted_keys(tree: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if isinstance(tree, Mapping):
        for name, value in tree.items():
            path = f"{prefix}{name}"
            keys.add(path)
            keys |= _dotted_keys(value, f"{path}.")
    return keys


def _has(tree: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return False
        tree = tree[part]
    return True


def override_key(item: str) -> tuple[str, str]:
    """('+', 'a.b') for '+a.b=1', ('', 'a.b') for 'a.b=1', ('~', ...) for a deletion ('++' is add-or-override)."""
    key = item.split("=", 1)[0]
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    return prefix, key[len(prefix) :]


def override_key_problems(resolved: Mapping[str, Any], extra: Iterable[str], recipe: str, tag: str) -> list[str]:
    """Each extraOverride's key against the config NeMo RL's loader built from the recipe and the pipeline's own
    overrides: a plain `key=` must exist (the loader runs in struct mode), a `+key=` must not (Hydra appends only
    new keys), a `~key` must exist."""
    known = sorted(_dotted_keys(resolved))
    problems = []
    for item in extra:
        prefix, key = override_key(item)
        exists = _has(resolved, key)
        if prefix in ("", "~") and not exists:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
            if close:
                hint = f"did you mean {close[0]}?"
            elif prefix == "~":
                hint = "there is nothing to remove: drop the item"
            else:
                hint = f"write +{key}=... to add a new key"
            problems.append(
                f"config '{JOBS_PROJECT}:extraOverrides' item {item!r}: {key} is not a key of {recipe} in NeMo RL "
                f"{tag}, and its loader refuses it at train: {hint}"
            )
        elif prefix == "+" and exists:
            problems.append(
                f"config '{JOBS_PROJECT}:extraOverrides' item {item!r}: {key} is already a key of {recipe} in "
                f"NeMo RL {tag} (Hydra refuses to append it): drop the '+' ({key}={item.split('=', 1)[1]})"
            )
    return problems


def backend_problem(resolved: Mapping[str, Any], words: Iterable[str], recipe: str, tag: str) -> str | None:
    """A recipe that trains with Megatron (policy.megatron_cfg.enabled) run as a DTensor one: the job stack knows the
    Megatron sizes of NeMo RL's performance recipes only (jobs/launcher/performance.py), and for any other recipe it
    writes policy.dtensor_cfg.tensor_parallel_size and checks the batch against DTensor's data-parallel size, neither
    of which that recipe trains with."""
    policy = resolved.get("policy") or {}
    megatron = (policy.get("megatron_cfg") or {}).get("enabled") is True
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
