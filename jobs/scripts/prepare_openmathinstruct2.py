#!/usr/bin/env python3
"""Write the data of NeMo RL's performance recipes as the two JSONL files NeMo RL's ResponseDataset reads.

The Llama 3.1 8B performance recipes train on `data.dataset_name: OpenMathInstruct-2`: NeMo RL (v0.5.0 and v0.7.0,
response_datasets/openmathinstruct2.py) loads the hub dataset nvidia/OpenMathInstruct-2, split train_1M, holds 5% out
for validation with `train_test_split(test_size=0.05, seed=grpo.seed)` (42), and asks `problem`, rewarding a match
with `expected_answer`. This script does the same once, on Lustre, like prepare_gsm8k.py does for GSM8K, so every
train step (and every retry) reads prepared files instead of downloading and splitting a million rows again.

    prepare_openmathinstruct2.py --output-dir DIR                  # the hub dataset
    prepare_openmathinstruct2.py --output-dir DIR --source ROWS.jsonl  # local rows with problem / expected_answer

Output, in DIR: train.jsonl and validation.jsonl, one object per line with the keys `input` (problem) and `output`
(expected_answer), then the manifest _COMPLETE.json (row counts, source), written last. A run that finds the
manifest matching its source and the files skips; anything else is rebuilt. One run at a time per DIR (flock), each
file written to a temporary name and renamed into place (prepare_gsm8k.py's helpers). Exit codes: 0 done or skipped,
1 bad data or no `datasets` package, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prepare_gsm8k import INPUT_KEY, OUTPUT_KEY, _write_atomic, count_rows, exclusive_lock

PROG = "prepare_openmathinstruct2"
HUB_DATASET = "nvidia/OpenMathInstruct-2"
HUB_SPLIT = "train_1M"  # OpenMathInstruct2Dataset's default split
VALIDATION_SIZE = 0.05  # its test_size
SEED = 42  # grpo.seed in the recipes' base config, which NeMo RL passes as the split's seed
SOURCE_KEYS = ("problem", "expected_answer")
SPLIT_FILES = {"train": "train.jsonl", "validation": "validation.jsonl"}
MANIFEST_FILE = "_COMPLETE.json"
MANIFEST_VERSION = 1

Rows = list[dict[str, Any]]
Splitter = Callable[[Rows], tuple[Rows, Rows]]


class DataError(Exception):
    """A source row that cannot become a training row."""


def convert(rows: Sequence[Mapping[str, Any]], where: str) -> list[dict[str, str]]:
    out = []
    for index, row in enumerate(rows):
        problem, answer = (row.get(key) for key in SOURCE_KEYS)
        if not isinstance(problem, str) or not problem.strip() or answer is None or not str(answer).strip():
            raise DataError(f"{where}[{index}]: needs a non-empty {SOURCE_KEYS[0]} and {SOURCE_KEYS[1]}")
        out.append({INPUT_KEY: problem, OUTPUT_KEY: str(answer)})
    return out


def hf_split(rows: Rows) -> tuple[Rows, Rows]:
    """NeMo RL's own split: the datasets library's train_test_split with its test size and seed."""
    import datasets  # in the NeMo RL image

    split = datasets.Dataset.from_list(rows).train_test_split(test_size=VALIDATION_SIZE, seed=SEED)
    return list(split["train"]), list(split["test"])


def load_rows(source: Path | None) -> Rows:
    if source is None:
        import datasets

        return [dict(row) for row in datasets.load_dataset(HUB_DATASET, split=HUB_SPLIT)]
    with source.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def identity(source: Path | None) -> dict[str, Any]:
    where = {"dataset": HUB_DATASET, "split": HUB_SPLIT} if source is None else {"file": str(source.resolve())}
    return {**where, "validation_size": VALIDATION_SIZE, "seed": SEED}


def is_complete(out_dir: Path, source_identity: Mapping[str, Any]) -> bool:
    try:
        manifest = json.loads((out_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        if manifest.get("version") != MANIFEST_VERSION or manifest.get("source") != dict(source_identity):
            return False
        return all(
            count_rows(out_dir / name) == int(manifest["splits"][split]["rows"]) for split, name in SPLIT_FILES.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prepare(out_dir: Path, source: Path | None, splitter: Splitter = hf_split) -> int:
    source_identity = identity(source)
    if is_complete(out_dir, source_identity):
        print(f"{PROG}: {out_dir} is complete (per {MANIFEST_FILE}); skipping")
        return 0
    try:
        train, validation = splitter(load_rows(source))
        converted = {
            "train": convert(train, f"{HUB_DATASET} train"),
            "validation": convert(validation, f"{HUB_DATASET} validation"),
        }
    except DataError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"{PROG}: error: needs the 'datasets' package ({exc})", file=sys.stderr)
        return 1
    # The manifest goes first and comes back last: an interrupted run leaves no manifest and is rebuilt.
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)
    for split, name in SPLIT_FILES.items():
        _write_atomic(out_dir / name, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in converted[split]))
    manifest = {
        "version": MANIFEST_VERSION,
        "keys": [INPUT_KEY, OUTPUT_KEY],
        "source": source_identity,
        "splits": {split: {"file": name, "rows": len(converted[split])} for split, name in SPLIT_FILES.items()},
    }
    _write_atomic(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    counts = ", ".join(f"{split}={len(rows)}" for split, rows in converted.items())
    print(f"{PROG}: wrote {counts} rows to {out_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--source", type=Path, help=f"local JSONL with {' and '.join(SOURCE_KEYS)} (default: hub)")
    args = parser.parse_args(argv)
    if args.source is not None and not args.source.is_file():
        parser.error(f"--source: no such file: {args.source}")
    with exclusive_lock(args.output_dir):
        return prepare(args.output_dir, args.source)


if __name__ == "__main__":
    sys.exit(main())
