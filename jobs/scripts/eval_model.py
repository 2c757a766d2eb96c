"""Evaluate one model with NeMo RL's own evaluation: add the model to run_eval.py's arguments and run it.

Runs as a Ray job inside the NeMo RL image, from its source directory, with NeMo RL's environment (`uv run`):
    python eval_model.py (--model=NAME_OR_DIR | --model-of-recipe=RECIPE) [--dry-run] -- examples/run_eval.py ARGS...

Everything about the evaluation is in ARGS, written by the job stack; only the model is known here: a Hugging Face
name or a directory (the converted model), or the recipe's policy.model_name read with NeMo RL's own config loader
(nemo_rl/utils/config.py, so `defaults:` chains resolve as in training). run_eval.py takes `key=value` words merged
by OmegaConf, so the model is one more word, generation.model_name=MODEL (the tokenizer follows it in eval.yaml).
With --dry-run the command is printed as JSON and not run. Exit codes: what run_eval.py exits with; 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

MODEL_KEY = "generation.model_name"


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
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv[:cut])
    run_eval_args = argv[cut + 1 :]
    if not run_eval_args or any(word.startswith(f"{MODEL_KEY}=") for word in run_eval_args):
        print(f"eval_model: give run_eval.py's arguments, without {MODEL_KEY} (added here)", file=sys.stderr)
        return 2
    model = args.model or recipe_model(os.getcwd(), args.model_of_recipe)
    command = run_eval_command(run_eval_args, model)
    if args.dry_run:
        print(json.dumps(command))
        return 0
    print(f"eval_model: evaluating {model}", flush=True)
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
