"""Test accuracy before and after training (GSM8K, or the job setting dataset), from NeMo RL's own per-sample
evaluation output.

Runs in the submitter pod after the last step, with the image's plain python (standard library only):
    python eval_summary.py --dataset=/data/datasets/gsm8k/test.jsonl [--dataset-name=NAME] [--base=DIR]
        [--trained=DIR] --output=FILE

Each DIR is an evaluation's eval.save_path: run_eval.py (nemo_rl/evals/eval.py, the same at v0.5.0 and v0.7.0)
writes config.json there (model, metric, k, samples per prompt, sampling) and evaluation_data.json, one entry per
sample with its `reward` from the math environment (1.0 when the boxed answer matches, else 0.0). With one greedy
sample per problem, pass@1 is the mean reward. The summary is written as JSON to FILE and the last line printed is
    GSM8K test accuracy (pass@1, greedy, n=1319): base 0.xxx -> trained 0.yyy
with NAME (default GSM8K) first: the dataset the evaluations read.
Exit codes: 0 written, 1 an evaluation's output is missing or not what the line claims, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONFIG_FILE = "config.json"
SAMPLES_FILE = "evaluation_data.json"


class EvalOutputError(Exception):
    """An evaluation folder that does not hold what the summary needs; the message says what and where."""


def problems_in(dataset: Path) -> int:
    """Problems in the evaluated JSON-lines file (GSM8K's test split: 1,319)."""
    with dataset.open() as lines:
        return sum(1 for line in lines if line.strip())


def accuracy(folder: Path, problems: int) -> dict[str, object]:
    """pass@1 of one evaluation, checked to be greedy, one sample per problem, over every problem."""
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
        samples = json.loads((folder / SAMPLES_FILE).read_text())["evaluation_data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EvalOutputError(f"{folder}: no readable {CONFIG_FILE} and {SAMPLES_FILE} ({exc})") from None
    expected = {"metric": "pass@k", "k_value": 1, "num_tests_per_prompt": 1, "temperature": 0.0}
    wrong = {key: config.get(key) for key, value in expected.items() if config.get(key) != value}
    if wrong:
        raise EvalOutputError(f"{folder}: not a greedy pass@1 evaluation: {wrong} (wanted {expected})")
    if len(samples) != problems:
        raise EvalOutputError(f"{folder}: {len(samples)} samples for {problems} problems")
    rewards = [float(sample["reward"]) for sample in samples]
    if any(reward not in (0.0, 1.0) for reward in rewards):
        raise EvalOutputError(f"{folder}: rewards other than 0 and 1")
    correct = int(sum(rewards))
    return {"model": config.get("model_name"), "correct": correct, "accuracy": correct / problems, "dir": str(folder)}


def summary_line(problems: int, results: dict[str, dict[str, object]], dataset_name: str = "GSM8K") -> str:
    shown = [f"{name} {float(str(result['accuracy'])):.3f}" for name, result in results.items()]
    return f"{dataset_name} test accuracy (pass@1, greedy, n={problems}): {' -> '.join(shown)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--dataset-name", default="GSM8K", help="the dataset as the accuracy line names it")
    parser.add_argument("--base", type=Path, help="eval.save_path of the evaluation before training")
    parser.add_argument("--trained", type=Path, help="eval.save_path of the evaluation after training")
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)
    if not (args.base or args.trained):
        parser.error("give --base, --trained or both")
    try:
        problems = problems_in(args.dataset)
        results = {
            name: accuracy(folder, problems)
            for name, folder in (("base", args.base), ("trained", args.trained))
            if folder is not None
        }
    except (OSError, EvalOutputError) as exc:
        print(f"eval_summary: {exc}", file=sys.stderr)
        return 1
    summary: dict[str, object] = {
        "dataset": str(args.dataset),
        "datasetName": args.dataset_name,
        "problems": problems,
        "metric": "pass@1",
        "sampling": "greedy",
        **results,
    }
    if "base" in results and "trained" in results:
        summary["change"] = float(str(results["trained"]["accuracy"])) - float(str(results["base"]["accuracy"]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"eval_summary: written to {args.output}")
    print(summary_line(problems, results, args.dataset_name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
