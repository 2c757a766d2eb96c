"""Evaluate one model with NeMo RL's own evaluation: add the model to run_eval.py's arguments and run it.

Runs as a Ray job inside the NeMo RL image, from its source directory, with NeMo RL's environment (`uv run`):
    python eval_model.py (--model=NAME_OR_DIR | --model-of-recipe=RECIPE) [--cache-dir=DIR --image=IMAGE]
        [--dry-run] -- examples/run_eval.py ARGS...

Everything about the evaluation is in ARGS, written by the job stack; only the model is known here: a Hugging Face
name (the job setting model) or a directory (the converted model), or the recipe's policy.model_name read with NeMo
RL's own config loader (nemo_rl/utils/config.py, so `defaults:` chains resolve as in training). run_eval.py takes
`key=value` words merged by OmegaConf, so the model is one more word, generation.model_name=MODEL (the tokenizer
follows it in eval.yaml).

With --cache-dir (eval-base: the same base model evaluated the same way gives the same result in every run) the
result is reused across runs. Its key is a digest of everything that decides it: the resolved model and the
revision the Hugging Face cache holds of it, every run_eval.py argument except eval.save_path, the content of every
file an argument names (the GSM8K test file, the config, the prompt), and the image reference (--image). A complete
entry, `DIR/<digest>/` with `result/` and the marker `complete.json` (every file with its size), is copied into
eval.save_path and run_eval.py is not started. Otherwise run_eval.py runs, and when it exits 0 its output is stored:
copied into a temporary folder beside the entry, the marker written last, then renamed into place, so a failed,
killed or interrupted run never leaves an entry that looks complete. A model given as a local directory is never
cached (its files could change under the same name).

With --dry-run the command is printed as JSON and not run. Standard library only here: NeMo RL is imported only to
read a recipe. Exit codes: what run_eval.py exits with (128+N when it dies of signal N); 0 on a cache hit; 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

MODEL_KEY = "generation.model_name"
SAVE_PATH_KEY = "eval.save_path"
RESULT_DIR = "result"
MARKER = "complete.json"
KEY_VERSION = 1  # bump when what goes into the key changes


def recipe_model(nemo_rl_dir: str, recipe: str) -> str:
    """policy.model_name of a NeMo RL recipe, as NeMo RL's loader resolves it."""
    sys.path.insert(0, nemo_rl_dir)  # the sources are not an installed package in the image
    from nemo_rl.utils.config import load_config
    from omegaconf import OmegaConf

    model = OmegaConf.select(load_config(os.path.join(nemo_rl_dir, recipe)), "policy.model_name")
    if not model:
        raise SystemExit(f"eval_model: {recipe} sets no policy.model_name")
    return str(model)


def run_eval_command(run_eval_args: list[str], model: str) -> list[str]:
    """The run_eval.py command with the model added last (OmegaConf merges the words in order)."""
    return [sys.executable, *run_eval_args, f"{MODEL_KEY}={model}"]


# ---------------------------------------------------------------------------------------------------------------
# The cache key


def save_path_of(run_eval_args: list[str]) -> str | None:
    """eval.save_path as run_eval.py will see it (the last word wins)."""
    values = [w.split("=", 1)[1] for w in run_eval_args if w.split("=", 1)[0] == SAVE_PATH_KEY and "=" in w]
    return values[-1] if values else None


def hub_revision(model: str, environ: Mapping[str, str]) -> str:
    """The commit of `model` the Hugging Face cache resolves `main` to (what vLLM then loads), "" when not cached."""
    hub = environ.get("HF_HUB_CACHE") or os.path.join(
        environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    ref = Path(hub) / f"models--{model.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text().strip()
    except OSError:
        return ""


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_key(model: str, run_eval_args: list[str], image: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """Everything that decides the evaluation's result, as JSON-able data."""
    args = [w for w in run_eval_args if w.split("=", 1)[0] != SAVE_PATH_KEY]
    files: dict[str, str] = {}
    for word in args:  # files named by an argument (relative ones from the NeMo RL sources, the working dir)
        value = word.split("=", 1)[-1]
        if value and Path(value).is_file():
            files[value] = file_digest(Path(value))
    return {
        "version": KEY_VERSION,
        "model": model,
        "revision": hub_revision(model, environ),
        "run_eval": args,
        "files": files,
        "image": image,
    }


def digest_of(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


# ---------------------------------------------------------------------------------------------------------------
# Entries: <cache>/<digest>/result/... and complete.json, written last


def files_of(folder: Path) -> dict[str, int]:
    if not folder.is_dir():
        return {}
    return {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*")) if path.is_file()}


def is_complete(entry: Path) -> bool:
    """The marker exists, is readable, and every file it lists is in result/ at its size."""
    try:
        listed = json.loads((entry / MARKER).read_text())["files"]
        return bool(listed) and files_of(entry / RESULT_DIR) == listed
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_marker(folder: Path, key: dict[str, Any]) -> None:
    marker = folder / MARKER
    with marker.open("w") as stream:
        json.dump({"key": key, "files": files_of(folder / RESULT_DIR)}, stream, indent=1, sort_keys=True)
        stream.flush()
        os.fsync(stream.fileno())


def store(save_path: Path, entry: Path, key: dict[str, Any]) -> None:
    """Copy a finished evaluation into the cache: a temporary folder beside the entry, the marker last, one rename."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    try:
        shutil.copytree(save_path, temporary / RESULT_DIR)
        write_marker(temporary, key)
        if entry.exists():  # an older entry that no longer checks out (is_complete said so): replace it
            shutil.rmtree(entry)
        os.rename(temporary, entry)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def restore(entry: Path, save_path: Path) -> None:
    """The cached result into this run's save path, whole: copied beside it, then moved into place."""
    save_path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{save_path.name}.", suffix=".tmp", dir=save_path.parent))
    try:
        shutil.copytree(entry / RESULT_DIR, temporary / save_path.name)
        if save_path.exists():
            shutil.rmtree(save_path)
        os.rename(temporary / save_path.name, save_path)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# Running run_eval.py


def run(command: list[str]) -> int:
    """Run run_eval.py as a child; SIGTERM/SIGINT to this process (a stopped Ray job) go on to it. Its exit code,
    128+N when a signal N ended it."""
    child = subprocess.Popen(command)

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("eval_model: give run_eval.py and its arguments after '--'", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="eval_model.py")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a Hugging Face model name or a model directory")
    which.add_argument("--model-of-recipe", help="a NeMo RL recipe, relative to the NeMo RL sources")
    parser.add_argument("--cache-dir", type=Path, help="reuse the result across runs from this folder")
    parser.add_argument("--image", default="", help="the NeMo RL image reference (part of the cache key)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv[:cut])
    run_eval_args = argv[cut + 1 :]
    if not run_eval_args or any(word.startswith(f"{MODEL_KEY}=") for word in run_eval_args):
        print(f"eval_model: give run_eval.py's arguments, without {MODEL_KEY} (added here)", file=sys.stderr)
        return 2
    save_path = save_path_of(run_eval_args)
    if args.cache_dir and not (save_path and args.image):
        print(f"eval_model: --cache-dir needs --image and {SAVE_PATH_KEY} in run_eval.py's arguments", file=sys.stderr)
        return 2
    model = args.model or recipe_model(os.getcwd(), args.model_of_recipe)
    command = run_eval_command(run_eval_args, model)
    if args.dry_run:
        print(json.dumps(command))
        return 0
    entry = key = None
    if args.cache_dir and save_path:
        if os.path.isdir(model):
            print(f"eval_model: {model} is a local directory, its evaluation is not cached", flush=True)
        else:
            key = cache_key(model, run_eval_args, args.image, os.environ)
            entry = args.cache_dir / digest_of(key)
            if is_complete(entry):
                restore(entry, Path(save_path))
                print(f"eval_model: {model} evaluated before, result reused from {entry} (vLLM not started)")
                return 0
    print(f"eval_model: evaluating {model}", flush=True)
    code = run(command)
    if code == 0 and entry is not None and key is not None and save_path:
        if files_of(Path(save_path)):
            store(Path(save_path), entry, key)
            print(f"eval_model: result stored for later runs in {entry}", flush=True)
        else:
            print(f"eval_model: run_eval.py wrote nothing to {save_path}: nothing cached", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
