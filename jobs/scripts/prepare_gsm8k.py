#!/usr/bin/env python3
"""Write GSM8K as the two JSONL files that NeMo RL's ResponseDataset reads for GRPO on math.

Why this exists: NeMo RL's math environment wraps each ground truth in ``\\boxed{...}`` and compares it with the
model's answer using math-verify. GSM8K's ``answer`` column is a worked solution ending in ``#### N``; used as the
ground truth unchanged, no response ever matches and every reward is 0. This script keeps only ``N``.

Usage::

    prepare_gsm8k.py --output-dir DIR                        # openai/gsm8k, config "main": train and test splits
    prepare_gsm8k.py --output-dir DIR --source ROWS.jsonl    # a local GSM8K-format file, used for BOTH splits
    prepare_gsm8k.py --output-dir DIR --source TRAIN.jsonl --source-test TEST.jsonl

Source semantics: ``--source`` is a local JSONL file whose rows look like GSM8K's
(``{"question": "...", "answer": "...reasoning...\\n#### 1,234"}``). On its own it feeds both splits with the same
rows (a smoke run then validates on what it trained on, and both row counts are known in advance); add
``--source-test`` to give the test split its own file. Without ``--source`` the Hugging Face dataset is loaded with
``datasets.load_dataset("openai/gsm8k", "main")``; ``datasets`` is imported only on that path.

Output, in DIR: ``train.jsonl`` and ``test.jsonl``, one JSON object per line with exactly the keys ``input`` (the
question) and ``output`` (the final answer: the text after ``####``, stripped, thousands separators removed, a
leading minus and decimals kept). Each file is written to a temporary name and renamed into place; the manifest
``_COMPLETE.json`` (row counts, source identity and a sha256 of the source) is written last. A later run whose
manifest matches the source and the files (row counts agree) prints that it skips and exits 0 without loading any
data; anything else (files without a manifest, counts that disagree, another source) is rebuilt.

Concurrent runs (two pipelines share DIR): each takes an exclusive lock on ``DIR/.lock`` (flock) before it checks
the manifest and holds it until its files are written, so the second run waits, then finds the output complete and
skips. A temporary file is removed only once it is older than STALE_TEMP_SECONDS (a crashed run's leftover), never
while another writer may still rename it into place. Where the file system refuses flock, the run says so and goes
on unlocked; the renames still keep every file whole.

Exit codes: 0 done or skipped, 1 bad data (the message names the row) or no ``datasets`` for the hub source,
2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Keys of each output row. The GRPO job passes them to NeMo RL as +data.input_key / +data.output_key.
INPUT_KEY = "input"
OUTPUT_KEY = "output"
TRAIN_FILE = "train.jsonl"
TEST_FILE = "test.jsonl"
MANIFEST_FILE = "_COMPLETE.json"
MANIFEST_VERSION = 1
LOCK_FILE = ".lock"
# A temporary file older than this is a crashed run's leftover; a live writer's is seconds old (GSM8K is a few MB).
STALE_TEMP_SECONDS = 6 * 3600

HUB_DATASET = "openai/gsm8k"
HUB_CONFIG = "main"
SPLIT_FILES = {"train": TRAIN_FILE, "test": TEST_FILE}
ANSWER_MARKER = "####"

# A final answer as GSM8K writes it: optional minus, digits either plain or grouped by commas in threes, optional
# decimals. "1,25" or "12 apples" are rejected rather than guessed at.
_NUMBER_RE = re.compile(r"-?(?:\d+|\d{1,3}(?:,\d{3})+)(?:\.\d+)?")

PROG = "prepare_gsm8k"


class DataError(Exception):
    """A source row that cannot become a training row; the message names the row."""


def extract_final_answer(answer: str) -> str:
    """Return the final answer of a GSM8K ``answer``: the text after the last ``####``, without thousands commas.

    Raises ValueError (with a reason, not a row name) when there is no ``####`` or what follows is not a number.
    """
    if ANSWER_MARKER not in answer:
        raise ValueError(f"no {ANSWER_MARKER!r} final answer")
    final = answer.rsplit(ANSWER_MARKER, 1)[1].strip()
    if not final:
        raise ValueError(f"nothing after {ANSWER_MARKER!r}")
    if not _NUMBER_RE.fullmatch(final):
        raise ValueError(f"final answer {final!r} is not a number")
    return final.replace(",", "")


@dataclass(frozen=True)
class SourceRow:
    where: str  # e.g. "rows.jsonl line 7" or "openai/gsm8k train[6]"
    data: Any


@dataclass(frozen=True)
class Converted:
    rows: list[dict[str, str]]
    example: tuple[str, str] | None  # (raw answer tail, extracted output) for the summary


def convert(rows: Iterable[SourceRow]) -> Converted:
    """Map source rows to {INPUT_KEY, OUTPUT_KEY} rows; raise DataError naming every bad row (up to 10)."""
    out: list[dict[str, str]] = []
    errors: list[str] = []
    example: tuple[str, str] | None = None
    for row in rows:
        data = row.data
        if not isinstance(data, Mapping):
            errors.append(f"{row.where}: expected a JSON object, got {type(data).__name__}")
            continue
        question, answer = data.get("question"), data.get("answer")
        if not isinstance(question, str) or not question.strip():
            errors.append(f"{row.where}: missing or empty 'question'")
            continue
        if not isinstance(answer, str):
            errors.append(f"{row.where}: missing 'answer'")
            continue
        try:
            final = extract_final_answer(answer)
        except ValueError as exc:
            errors.append(f"{row.where}: {exc}: {question[:60]!r}")
            continue
        tail = ANSWER_MARKER + answer.rsplit(ANSWER_MARKER, 1)[1]
        # Prefer an example that shows the separator removal.
        if example is None or ("," in tail and "," not in example[0]):
            example = (tail.strip(), final)
        out.append({INPUT_KEY: question, OUTPUT_KEY: final})
    if errors:
        shown = "\n  ".join(errors[:10])
        more = f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else ""
        raise DataError(f"{len(errors)} bad row(s):\n  {shown}{more}")
    return Converted(out, example)


# ---------------------------------------------------------------------------------------------------------------
# Sources


def _file_sha256(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def read_jsonl(path: Path) -> list[SourceRow]:
    """Rows of a local JSONL file, each named by its 1-based line number; blank lines are skipped."""
    rows: list[SourceRow] = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                rows.append(SourceRow(where, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg})") from exc
    return rows


def local_identity(train: Path, test: Path) -> dict[str, str]:
    return {
        "kind": "jsonl",
        "train": str(train.resolve()),
        "test": str(test.resolve()),
        "sha256": _file_sha256([train, test]),
    }


def hub_identity() -> dict[str, str]:
    # The hub dataset is named, not hashed, so the skip check needs no download; its content hash is recorded as
    # source_sha256 once loaded.
    return {"kind": "hub", "dataset": HUB_DATASET, "config": HUB_CONFIG}


def load_hub() -> dict[str, list[SourceRow]]:
    import datasets  # present in the NeMo RL image; imported here so that --source works without it

    loaded = datasets.load_dataset(HUB_DATASET, HUB_CONFIG)
    return {
        split: [SourceRow(f"{HUB_DATASET} {split}[{index}]", row) for index, row in enumerate(loaded[split])]
        for split in SPLIT_FILES
    }


def rows_sha256(splits: Mapping[str, Sequence[SourceRow]]) -> str:
    digest = hashlib.sha256()
    for split in SPLIT_FILES:
        for row in splits[split]:
            digest.update(json.dumps(row.data, sort_keys=True, ensure_ascii=False, default=str).encode())
            digest.update(b"\n")
        digest.update(b"\0")
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Output


def count_rows(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def check_complete(out_dir: Path, identity: Mapping[str, str]) -> tuple[bool, str]:
    """(True, summary) when the manifest matches the source and the files; else (False, why not)."""
    manifest_path = out_dir / MANIFEST_FILE
    if not manifest_path.is_file():
        return False, f"no {MANIFEST_FILE}"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        splits = manifest["splits"]
        if manifest.get("version") != MANIFEST_VERSION or manifest.get("keys") != [INPUT_KEY, OUTPUT_KEY]:
            return False, f"{MANIFEST_FILE} is from another format"
        if manifest.get("source") != dict(identity):
            return False, "the source differs from the one in the manifest"
        counts = {}
        for split, name in SPLIT_FILES.items():
            expected = int(splits[split]["rows"])
            path = out_dir / name
            if not path.is_file():
                return False, f"{name} is missing"
            found = count_rows(path)
            if found != expected:
                return False, f"{name} has {found} rows, the manifest says {expected}"
            counts[split] = found
    except (ValueError, KeyError, TypeError) as exc:
        return False, f"{MANIFEST_FILE} is unreadable ({exc!r})"
    return True, ", ".join(f"{split}={n}" for split, n in counts.items()) + " rows"


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def exclusive_lock(out_dir: Path) -> Iterator[bool]:
    """Hold an exclusive flock on out_dir/.lock (blocking until it is free); yields False where flock is refused.

    The lock file stays: removing it would let a run that opened it before the removal and one that opens the new
    file both hold "the" lock."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            print(f"{PROG}: warning: cannot lock {out_dir / LOCK_FILE} ({exc.strerror}); going on unlocked")
            locked = False
        yield locked
    finally:
        os.close(fd)  # releases the lock


def remove_stale_temps(out_dir: Path, now: float | None = None) -> list[Path]:
    """Remove this script's temporary files older than STALE_TEMP_SECONDS; return what was removed."""
    cutoff = (time.time() if now is None else now) - STALE_TEMP_SECONDS
    removed = []
    for name in (*SPLIT_FILES.values(), MANIFEST_FILE):
        for temp in out_dir.glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                if temp.stat().st_mtime < cutoff:
                    temp.unlink()
                    removed.append(temp)
    return removed


def write_outputs(out_dir: Path, converted: Mapping[str, Converted], identity: Mapping[str, str], sha: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # The manifest goes first, so a run interrupted from here on is seen as partial and rebuilt.
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)
    remove_stale_temps(out_dir)
    for split, name in SPLIT_FILES.items():
        lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in converted[split].rows)
        _write_atomic(out_dir / name, "".join(lines))
    manifest = {
        "version": MANIFEST_VERSION,
        "keys": [INPUT_KEY, OUTPUT_KEY],
        "source": dict(identity),
        "source_sha256": sha,
        "splits": {split: {"file": name, "rows": len(converted[split].rows)} for split, name in SPLIT_FILES.items()},
    }
    _write_atomic(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Write GSM8K as train/test JSONL with the final answer only, for NeMo RL's ResponseDataset.",
    )
    parser.add_argument("--output-dir", required=True, type=Path, help="directory for train.jsonl and test.jsonl")
    parser.add_argument(
        "--source",
        type=Path,
        help="local GSM8K-format JSONL used for both splits (default: the hub dataset openai/gsm8k, config main)",
    )
    parser.add_argument("--source-test", type=Path, help="with --source: a separate JSONL for the test split")
    parser.add_argument("--force", action="store_true", help="rebuild even when the output is complete")
    args = parser.parse_args(argv)
    if args.source_test is not None and args.source is None:
        parser.error("--source-test needs --source")
    for option, path in (("--source", args.source), ("--source-test", args.source_test)):
        if path is not None and not path.is_file():
            parser.error(f"{option}: no such file: {path}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The completeness check and the write happen under one lock: a run that waited for another one's build then
    # finds it complete and skips, instead of writing the same files again (or over files being written).
    with exclusive_lock(args.output_dir):
        return prepare(args)


def prepare(args: argparse.Namespace) -> int:
    out_dir: Path = args.output_dir

    if args.source is not None:
        train_path: Path = args.source
        test_path: Path = args.source_test or args.source
        identity = local_identity(train_path, test_path)
        description = f"{train_path}" if test_path == train_path else f"{train_path} + {test_path}"
    else:
        identity = hub_identity()
        description = f"{HUB_DATASET} ({HUB_CONFIG})"

    if not args.force:
        complete, detail = check_complete(out_dir, identity)
        if complete:
            print(f"{PROG}: {out_dir} is complete ({detail}, per {MANIFEST_FILE}); skipping")
            return 0
        if (out_dir / MANIFEST_FILE).exists() or any((out_dir / name).exists() for name in SPLIT_FILES.values()):
            print(f"{PROG}: rebuilding {out_dir}: {detail}")

    try:
        if args.source is not None:
            sources = {"train": read_jsonl(train_path), "test": read_jsonl(test_path)}
            sha = identity["sha256"]
        else:
            sources = load_hub()
            sha = rows_sha256(sources)
        converted = {}
        for split in SPLIT_FILES:
            try:
                converted[split] = convert(sources[split])
            except DataError as exc:
                raise DataError(f"{split} split: {exc}") from exc
            if not converted[split].rows:
                raise DataError(f"{split} split: no rows")
    except DataError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"{PROG}: error: the hub source needs the 'datasets' package ({exc}); or pass --source", file=sys.stderr)
        return 1

    write_outputs(out_dir, converted, identity, sha)

    counts = ", ".join(f"{split}={len(converted[split].rows)}" for split in SPLIT_FILES)
    print(f"{PROG}: wrote {counts} rows to {out_dir} from {description} (sha256 {sha[:12]})")
    example = converted["train"].example
    if example is not None:
        print(f"{PROG}: example answer: {example[0]!r} -> {OUTPUT_KEY} {example[1]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
