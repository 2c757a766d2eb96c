"""The index of each NeMo RL release the project runs (tools/nemo_rl_index.json): every recipe under
examples/configs/, the config keys it has once its `defaults:` chain is resolved, each key's type, and the few values
`make plan` shows. `make plan` checks a job stack's recipe and overrides against it (tools/stack_check.py), with no
NeMo RL sources and no second virtualenv.

    python3 tools/nemo_rl_index.py --list v0.5.0 [WORD]     the release's recipes (those whose path holds WORD)
    python3 tools/nemo_rl_index.py --write [--sources DIR]  regenerate the index (needs .venv-nemorl)

--write resolves every recipe of each release with the release's own loader (tools/nemorl_config.py in
.venv-nemorl, as the GRPO entrypoint does: `load_config`, then `OmegaConf.to_container(resolve=True)`) on DIR's
nemo-rl-<tag>/ (default ../shared/reference). A recipe the loader cannot resolve there (its `defaults:` chain names
a file DIR lacks, or an interpolation needs the cluster's environment) is listed with the loader's reason instead of
keys. A key's type is the type of the value the release's recipe gives it (bool, int, float, str, list, dict); a
null value declares none. To keep the file small a recipe is stored as what differs from the first file of its
`defaults:` (`base`): the keys added or retyped, and those dropped. Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "tools" / "nemo_rl_index.json"
REFERENCE = ROOT.parent / "shared" / "reference"
NEMORL_PYTHON = ROOT / ".venv-nemorl" / "bin" / "python"
# The releases the infra's table runs (infra/nemo_rl_releases.py; a test holds the two together).
TAGS = ("v0.5.0", "v0.7.0")
# What `make plan` shows of a recipe, as it prints them ({} the value): the values a user most often means to change.
SHOWN = {
    "grpo.max_num_steps": "steps {}",
    "grpo.num_prompts_per_step": "prompts/step {}",
    "grpo.num_generations_per_prompt": "generations/prompt {}",
    "policy.max_total_sequence_length": "sequence length {}",
    "policy.model_name": "model {}",
    "checkpointing.save_period": "checkpoint every {} steps",
}
# Values the plan's checks read (tools/stack_check.py backend_problem), kept beside SHOWN's.
CHECKED_VALUES = ("policy.megatron_cfg.enabled",)
TYPES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}
LIST_COMMAND = "python3 tools/nemo_rl_index.py --list"
WRITE_COMMAND = "python3 tools/nemo_rl_index.py --write"


def flat_keys(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str | None]:
    """Every dotted key of a resolved config, with its value's type (None for null)."""
    keys: dict[str, str | None] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        keys[key] = None if value is None else TYPES[type(value)]
        if isinstance(value, dict):
            keys.update(flat_keys(value, f"{key}."))
    return keys


def _value(tree: Mapping[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


# ---------------------------------------------------------------------------------------------------------------
# Reading the index (what `make plan` does)


@cache
def load(path: Path = INDEX) -> dict[str, Any]:
    return json.loads(path.read_text())


def recipes(tag: str) -> dict[str, Any]:
    """The release's recipes: path -> entry ({} for an unknown release)."""
    recipes: dict[str, Any] = (load().get(tag) or {}).get("recipes") or {}
    return recipes


def keys_of(tag: str, recipe: str) -> dict[str, str | None] | None:
    """The recipe's resolved keys and their types; None when the index lists no keys for it (unknown, or not
    resolvable where the index was made: unindexed_reason says why)."""
    entry = recipes(tag).get(recipe)
    if entry is None or "unindexed" in entry:
        return None
    keys = (keys_of(tag, entry["base"]) or {}) if "base" in entry else {}
    for key in entry.get("drop", []):
        keys.pop(key, None)
    keys.update(entry["keys"])
    return keys


def unindexed_reason(tag: str, recipe: str) -> str | None:
    return (recipes(tag).get(recipe) or {}).get("unindexed")


def values_of(tag: str, recipe: str) -> dict[str, Any]:
    """The recipe's own values of SHOWN and CHECKED_VALUES (those it has)."""
    return dict((recipes(tag).get(recipe) or {}).get("values") or {})


def nearest(tag: str, recipe: str, n: int = 3) -> list[str]:
    return difflib.get_close_matches(recipe, sorted(recipes(tag)), n=n, cutoff=0.5)


# ---------------------------------------------------------------------------------------------------------------
# Writing it (with the release's own loader)


def _defaults_file(path: Path) -> str | None:
    """The first file a recipe's `defaults:` names (the string form or a list's first item), as a path relative to
    the release; None if it names none. Only to pick what the entry is stored against: the keys are the loader's."""
    text = path.read_text()
    one_or_list = r"^defaults:[ \t]*(?:(?P<one>[^\s#]+)|\n(?:[ \t]*#.*\n)*[ \t]*-[ \t]*(?P<first>[^\s#]+))"
    match = re.search(one_or_list, text, re.M)
    if not match:
        return None
    named = (match.group("one") or match.group("first")).strip("'\"")
    return str(Path(path.parent, named).resolve())


def _resolve_all(sources: Path, paths: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each recipe through tools/nemorl_config.py --serve in .venv-nemorl: (path, its one-line answer)."""
    server = subprocess.Popen(
        [str(NEMORL_PYTHON), str(ROOT / "tools" / "nemorl_config.py"), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for path in paths:
            server.stdin.write(json.dumps(["--nemo-rl", str(sources), "--", f"--config={path}"]) + "\n")
            server.stdin.flush()
            yield path, json.loads(server.stdout.readline())
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def release_index(sources: Path) -> dict[str, Any]:
    """One release's entry: its SOURCE line and every recipe's keys (or why the loader could not resolve it)."""
    configs = sources / "examples" / "configs"
    paths = sorted(str(p.relative_to(sources)) for p in configs.rglob("*.yaml"))
    resolved: dict[str, dict[str, str | None]] = {}
    entries: dict[str, Any] = {}
    for path, answer in _resolve_all(sources, paths):
        if answer["code"] != 0:
            lines = answer["stderr"].strip().splitlines()
            reason = (lines[-1] if lines else f"exit {answer['code']}").split(": ", 2)[-1]
            reason = f"the loader could not resolve it from the sources the index was made from: {reason}"
            entries[path] = {"unindexed": reason.replace(f"{sources}/", "")}
            continue
        config = json.loads(answer["stdout"])
        resolved[path] = flat_keys(config)
        values = {key: _value(config, key) for key in (*SHOWN, *CHECKED_VALUES) if key in resolved[path]}
        entries[path] = {"keys": resolved[path], **({"values": values} if values else {})}
    for path, keys in resolved.items():
        parent, inside = _defaults_file(sources / path), f"{sources.resolve()}/"
        base = parent.removeprefix(inside) if parent and parent.startswith(inside) else None
        if base in resolved and base != path:
            old = resolved[base]
            entries[path]["base"] = base
            entries[path]["keys"] = {k: t for k, t in keys.items() if k not in old or old[k] != t}
            dropped = sorted(set(old) - set(keys))
            if dropped:
                entries[path]["drop"] = dropped
    source = (sources / "SOURCE").read_text().strip() if (sources / "SOURCE").is_file() else ""
    return {"source": source, "recipes": entries}


def build(sources_root: Path) -> dict[str, Any]:
    return {tag: release_index(sources_root / f"nemo-rl-{tag}") for tag in TAGS}


def dump(index: Mapping[str, Any]) -> str:
    return json.dumps(index, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--list", metavar="TAG", help="print the release's recipes")
    parser.add_argument("word", nargs="?", default="", help="with --list: only the recipes whose path holds it")
    parser.add_argument("--write", action="store_true", help=f"regenerate {INDEX.relative_to(ROOT)}")
    parser.add_argument("--sources", type=Path, default=REFERENCE, help="folder holding nemo-rl-<tag>/")
    args = parser.parse_args(argv)
    if args.list:
        if args.list not in load():
            print(f"nemo_rl_index: no release {args.list!r} in the index: {', '.join(load())}", file=sys.stderr)
            return 2
        for path, entry in recipes(args.list).items():
            if args.word in path:
                print(path + (f"  (keys not indexed: {entry['unindexed']})" if "unindexed" in entry else ""))
        return 0
    if args.write:
        if not NEMORL_PYTHON.is_file():
            print("nemo_rl_index: no .venv-nemorl: create it with: make .venv-nemorl/.installed", file=sys.stderr)
            return 2
        INDEX.write_text(dump(build(args.sources)))
        return 0
    parser.print_usage(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
