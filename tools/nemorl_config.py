"""Resolve a NeMo RL recipe plus command-line overrides with NeMo RL's own loader, and print the result as JSON.

Runs in its own virtualenv (.venv-nemorl: the omegaconf and hydra-core versions NeMo RL locks; hydra's antlr4
runtime clashes with the project's), never in .venv, and imports nothing from the project:

    .venv-nemorl/bin/python tools/nemorl_config.py --nemo-rl DIR -- --config=RECIPE OVERRIDE...

DIR is a NeMo RL source tree (e.g. ../shared/reference/nemo-rl-v0.5.0); the words after `--` are exactly what the
pipeline passes to NeMo RL's GRPO entrypoint. They are taken the way the entrypoint takes them (argparse's
parse_known_args with a --config option, the recipe path relative to DIR), the recipe is loaded with DIR's
`nemo_rl.utils.config.load_config`, the overrides are applied with its `parse_hydra_overrides` (struct mode: an
unknown key without `+` is an error), and the config is resolved as the entrypoint resolves it
(`OmegaConf.to_container(resolve=True)`). Exit codes: 0 printed, 1 NeMo RL refused the overrides or the recipe,
2 usage.

With `--entrypoint run_eval` the words are taken as examples/run_eval.py takes them instead: --config defaults to
examples/configs/evals/eval.yaml, and when there are overrides, every word it was given is read with
`OmegaConf.from_cli` and merged into the loaded config with `OmegaConf.merge` (not struct: an unknown key is added,
not refused; a `+` prefix would become part of a key), then resolved the same way.

`--serve` answers many such calls from one process (the tests make over a hundred): each line on stdin is a JSON list
of the words a call would get, and each answer is one JSON line {"code", "stdout", "stderr"}. Every call runs in a
child forked from a server that has only imported omegaconf and hydra, so it starts from the state a fresh process
has (no NeMo RL tree on sys.path, no resolver registered, the server's working directory), without paying for
those imports again.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def load_nemo_rl_config_module(nemo_rl_dir: Path) -> ModuleType:
    """DIR's nemo_rl.utils.config (nemo_rl is a namespace package in a reference tree; only hydra and omegaconf
    are imported by that module)."""
    sys.path.insert(0, str(nemo_rl_dir))
    return importlib.import_module("nemo_rl.utils.config")


def register_resolvers(config_module: ModuleType) -> None:
    """The resolvers the entrypoint registers before loading: newer NeMo RL ships a function for it; v0.5.0's
    run_grpo_math.py registers `mul` itself."""
    from omegaconf import OmegaConf

    register = getattr(config_module, "register_omegaconf_resolvers", None)
    if register is not None:
        register()
    elif not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", lambda a, b: a * b)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("nemorl_config: give the entrypoint's arguments after '--'", file=sys.stderr)
        return 2
    cut = argv.index("--")
    own = argparse.ArgumentParser(prog="nemorl_config.py")
    own.add_argument("--nemo-rl", required=True, type=Path, help="a NeMo RL source tree")
    own.add_argument("--entrypoint", choices=("grpo", "run_eval"), default="grpo", help="whose way to read the words")
    args = own.parse_args(argv[:cut])
    nemo_rl_dir = args.nemo_rl.resolve()
    if not (nemo_rl_dir / "nemo_rl" / "utils" / "config.py").is_file():
        print(f"nemorl_config: {nemo_rl_dir} has no nemo_rl/utils/config.py", file=sys.stderr)
        return 2

    if args.entrypoint == "run_eval":
        return resolve_like_run_eval(nemo_rl_dir, argv[cut + 1 :])

    # The entrypoint's own command line: --config, everything else is an override.
    entry = argparse.ArgumentParser(prog="run_grpo")
    entry.add_argument("--config", type=str, default=None)
    entry_args, overrides = entry.parse_known_args(argv[cut + 1 :])
    if not entry_args.config:
        print("nemorl_config: the entrypoint's arguments have no --config", file=sys.stderr)
        return 2

    config_module = load_nemo_rl_config_module(nemo_rl_dir)

    register_resolvers(config_module)

    def build() -> Any:
        config = config_module.load_config(entry_args.config)
        if overrides:
            config = config_module.parse_hydra_overrides(config, overrides)
        return config

    return print_resolved(nemo_rl_dir, build)


def resolve_like_run_eval(nemo_rl_dir: Path, words: list[str]) -> int:
    """examples/run_eval.py's parse_args and main up to the resolved config (the same at v0.5.0 and v0.7.0)."""
    entry = argparse.ArgumentParser(prog="run_eval")
    entry.add_argument("--config", type=str, default=None)
    entry_args, remaining = entry.parse_known_args(words)
    config_module = load_nemo_rl_config_module(nemo_rl_dir)
    from omegaconf import OmegaConf

    def build() -> Any:
        overrides = OmegaConf.from_dotlist(remaining)
        config = config_module.load_config(entry_args.config or "examples/configs/evals/eval.yaml")
        if overrides:
            # run_eval.py reads sys.argv[1:] again here: all its words, --config=... included.
            config = OmegaConf.merge(config, OmegaConf.from_cli(list(words)))
        return config

    return print_resolved(nemo_rl_dir, build)


def print_resolved(nemo_rl_dir: Path, build: Callable[[], Any]) -> int:
    """Build the config from the NeMo RL directory (the pipeline runs the entrypoints from there) and print it
    resolved, as JSON; NeMo RL's own refusal is printed as one line and exits 1."""
    from omegaconf import OmegaConf

    os.chdir(nemo_rl_dir)
    try:
        resolved = OmegaConf.to_container(build(), resolve=True)
    except Exception as exc:  # NeMo RL's own refusal, one line
        message = " ".join(str(exc).split())
        print(f"nemorl_config: NeMo RL refused the config: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    json.dump(resolved, sys.stdout, sort_keys=True)
    print()
    return 0


# What every call imports (nemo_rl/utils/config.py imports these at both releases): the server imports them once.
PRELOADED = ("omegaconf", "hydra._internal.config_loader_impl", "hydra.core.override_parser.overrides_parser")


def exit_code(exc: SystemExit) -> int:
    """The status a process ending with this SystemExit has (None is 0; a message is printed and is 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def run_in_child(argv: list[str]) -> dict[str, object]:
    """main(argv) in a forked child, its stdout and stderr in files: its exit code and what it printed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                code = main(argv)
            except SystemExit as exc:
                code = exit_code(exc)
            except BaseException:  # as an uncaught exception ends a process: the traceback, status 1
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return {
            "code": os.waitstatus_to_exitcode(status),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def serve() -> int:
    """Answer one call per line of stdin until it closes (see the module's docstring)."""
    for name in PRELOADED:
        importlib.import_module(name)

    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run_in_child(json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main())
