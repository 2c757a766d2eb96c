#!/usr/bin/env python3
"""Write the user's own JSONL rows (the job setting dataset) as the train.jsonl and test.jsonl that NeMo RL trains,
validates and evaluates on, in the row format and with the guarantees of prepare_gsm8k.py.

Usage::

    prepare_jsonl.py --output-dir DIR --source SRC [--test-source SRC] --problem-field F --answer-field F

SRC is one of:
  gs://BUCKET/OBJECT.jsonl    Cloud Storage's JSON API, with an access token from the GKE metadata server (as
                              export_gcs.py gets one): the Ray service account, by Workload Identity, needs read
                              access to the object.
  /data/.../FILE.jsonl        a file on the Lustre mount (any local path).
  hf://datasets/OWNER/NAME[@REVISION]/PATH.jsonl
                              a file of a Hugging Face dataset repository, through the hub's resolve URL, with
                              HF_TOKEN from the environment when it is set (never sent on to another host).
Standard library only (and prepare_gsm8k.py, export_gcs.py beside it).

Rows: one JSON object per line. The problem field holds a non-empty string; the answer field a string or a number,
the ground truth NeMo RL's math reward compares with the model's \\boxed{} answer, so it should be the final answer
only. The first SAMPLE_ROWS rows are checked for both fields before anything else is done: a row without one stops
the run with one line naming the field, the row and the fields it has. Any later row without them stops it the same
way. Output rows: {"input": problem, "output": answer}, every other field dropped.

Splits: with --test-source, its rows are test.jsonl (GRPO's validation set and both evaluations). Without it, a
HELD_OUT_SHARE of the rows (5%, the share NeMo RL's own configs split off for validation; at least one row) goes to
test.jsonl and the rest to train.jsonl; which rows is decided by a hash of each problem's text, so the same rows in
any order split the same way.

Once and complete-or-nothing, as prepare_gsm8k.py: under its lock, each file renamed into place, the manifest
_COMPLETE.json written last. A later run whose manifest matches the source identity (the URIs and fields; a local
file's sha256, an object's generation; a hub file by its URI, so pin @REVISION to follow a changed file) and the
files' row counts skips without reading the rows again.

Exit codes: 0 written or skipped, 1 a missing or unreadable source, or rows without the fields (one line on stderr),
2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from export_gcs import STORAGE_API, TOKEN_URL, Token
from prepare_gsm8k import INPUT_KEY, OUTPUT_KEY, Converted, check_complete, exclusive_lock, write_outputs

PROG = "prepare_jsonl"
# How the job stack names --problem-field and --answer-field: errors name the setting to change.
PROBLEM_SETTING, ANSWER_SETTING = "dataset.problemField", "dataset.answerField"
SAMPLE_ROWS = 20
HELD_OUT_SHARE = 0.05
HUB_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 300.0
_GS_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,61}[a-z0-9])/(.+)$")
_HF_RE = re.compile(r"^hf://datasets/([^/@\s]+/[^/@\s]+)(?:@([^/\s]+(?:/[^/\s]+)*?))?/(\S+)$")


class SourceError(Exception):
    """A source that is missing, unreadable, or holds rows without the fields; the message is one line."""


# ---------------------------------------------------------------------------------------------------------------
# Sources


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but send the Authorization header only to the host it was meant for (the hub redirects
    file downloads to a storage host)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _get(url: str, headers: Mapping[str, str], source: str) -> bytes:
    opener = urllib.request.build_opener(_SameHostRedirects)
    try:
        with opener.open(urllib.request.Request(url, headers=dict(headers)), timeout=TIMEOUT_S) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise SourceError(f"{source}: no such file (HTTP 404)") from None
        raise SourceError(f"{source}: not readable (HTTP {exc.code} {exc.reason})") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(f"{source}: not reachable ({exc})") from None


class Fetcher:
    """Reads a source's bytes and says which version of it that is (the identity's part that changes with it)."""

    def __init__(self, storage_api: str, token_url: str, hub_endpoint: str, environ: Mapping[str, str]) -> None:
        self.storage_api, self.hub_endpoint = storage_api.rstrip("/"), hub_endpoint.rstrip("/")
        self.token = Token(token_url)
        self.environ = environ

    def version(self, source: str) -> str:
        gs = _GS_RE.match(source)
        if gs:
            return str(self._gcs_metadata(source, gs[1], gs[2]).get("generation", ""))
        if _HF_RE.match(source):
            return ""
        return hashlib.sha256(self._local(source)).hexdigest()

    def read(self, source: str) -> bytes:
        gs = _GS_RE.match(source)
        if gs:
            url = f"{self._gcs_object_url(gs[1], gs[2])}?alt=media"
            return _get(url, {"Authorization": f"Bearer {self._token(source)}"}, source)
        hub = _HF_RE.match(source)
        if hub:
            repo, revision, path = hub[1], hub[2] or "main", hub[3]
            quoted = urllib.parse.quote(path)
            url = f"{self.hub_endpoint}/datasets/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/{quoted}"
            token = self.environ.get("HF_TOKEN", "")
            return _get(url, {"Authorization": f"Bearer {token}"} if token else {}, source)
        return self._local(source)

    def _local(self, source: str) -> bytes:
        path = Path(source)
        if not path.is_file():
            raise SourceError(f"{source}: no such file")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise SourceError(f"{source}: not readable ({exc.strerror})") from None

    def _token(self, source: str) -> str:
        try:
            return self.token()
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(f"{source}: no access token from the metadata server ({exc})") from None

    def _gcs_object_url(self, bucket: str, name: str) -> str:
        return f"{self.storage_api}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"

    def _gcs_metadata(self, source: str, bucket: str, name: str) -> dict[str, Any]:
        body = _get(self._gcs_object_url(bucket, name), {"Authorization": f"Bearer {self._token(source)}"}, source)
        try:
            return dict(json.loads(body))
        except ValueError:
            raise SourceError(f"{source}: the object's metadata is not JSON") from None


# ---------------------------------------------------------------------------------------------------------------
# Rows


def parse_rows(text: bytes, source: str) -> list[tuple[int, Any]]:
    """(line number, parsed JSON) for every non-blank line."""
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SourceError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise SourceError(f"{source} line {number}: not valid JSON ({exc.msg})") from None
    if not rows:
        raise SourceError(f"{source}: no rows")
    return rows


def _missing_field(data: Any, fields: Mapping[str, str]) -> str | None:
    """The option and field a row lacks, as a phrase; None when it has both."""
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not an object with the fields {', '.join(map(repr, fields.values()))}"
    for option, field in fields.items():
        if field not in data:
            shown = ", ".join(repr(key) for key in list(data)[:10]) or "none"
            return f"has no field {field!r} ({option}); its fields: {shown}"
    return None


def check_sample(rows: Sequence[tuple[int, Any]], fields: Mapping[str, str], source: str) -> None:
    """Refuse the source when one of its first SAMPLE_ROWS rows lacks the problem or the answer field."""
    for number, data in rows[:SAMPLE_ROWS]:
        missing = _missing_field(data, fields)
        if missing:
            raise SourceError(f"{source} line {number} {missing}")


def convert_rows(rows: Sequence[tuple[int, Any]], problem: str, answer: str, source: str) -> list[dict[str, str]]:
    fields = {PROBLEM_SETTING: problem, ANSWER_SETTING: answer}
    out = []
    for number, data in rows:
        missing = _missing_field(data, fields)
        if missing:
            raise SourceError(f"{source} line {number} {missing}")
        question, truth = data[problem], data[answer]
        if not isinstance(question, str) or not question.strip():
            raise SourceError(f"{source} line {number}: field {problem!r} ({PROBLEM_SETTING}) is not a non-empty text")
        if isinstance(truth, (int, float)) and not isinstance(truth, bool):
            truth = str(truth)
        if not isinstance(truth, str) or not truth.strip():
            raise SourceError(f"{source} line {number}: field {answer!r} ({ANSWER_SETTING}) is not a string or number")
        out.append({INPUT_KEY: question, OUTPUT_KEY: truth.strip()})
    return out


def hold_out(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test): HELD_OUT_SHARE of the rows (at least one) by the hash of their problem, the rest in order."""
    if len(rows) < 2:
        raise SourceError(f"{len(rows)} row: too few to hold one out for test.jsonl; give --test-source")
    count = max(1, round(len(rows) * HELD_OUT_SHARE))
    ranked = sorted(range(len(rows)), key=lambda i: (hashlib.sha256(rows[i][INPUT_KEY].encode()).hexdigest(), i))
    held = set(ranked[:count])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


# ---------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, type=Path, help="directory for train.jsonl and test.jsonl")
    parser.add_argument("--source", required=True, help="gs://, hf://datasets/ or a local JSONL file")
    parser.add_argument("--test-source", default="", help="rows for test.jsonl (default: 5%% of --source)")
    parser.add_argument("--problem-field", required=True, help="the field holding each row's problem")
    parser.add_argument("--answer-field", required=True, help="the field holding each row's final answer")
    parser.add_argument("--force", action="store_true", help="rebuild even when the output is complete")
    parser.add_argument("--storage-api", default=STORAGE_API, help=argparse.SUPPRESS)  # tests: a local stand-in
    parser.add_argument("--token-url", default=TOKEN_URL, help=argparse.SUPPRESS)
    parser.add_argument("--hub-endpoint", default=HUB_ENDPOINT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.problem_field == args.answer_field:
        parser.error("--problem-field and --answer-field must differ")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    fetcher = Fetcher(args.storage_api, args.token_url, args.hub_endpoint, os.environ)
    try:
        with exclusive_lock(args.output_dir):
            return prepare(args, fetcher)
    except SourceError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


def prepare(args: argparse.Namespace, fetcher: Fetcher) -> int:
    out_dir: Path = args.output_dir
    sources = [args.source, *([args.test_source] if args.test_source else [])]
    identity = {
        "kind": "jsonl",
        "source": args.source,
        "test_source": args.test_source,
        "problem_field": args.problem_field,
        "answer_field": args.answer_field,
        "held_out_share": "" if args.test_source else str(HELD_OUT_SHARE),
        "versions": " ".join(fetcher.version(source) for source in sources),
    }
    if not args.force:
        complete, detail = check_complete(out_dir, identity)
        if complete:
            print(f"{PROG}: {out_dir} is complete ({detail}); skipping")
            return 0
        print(f"{PROG}: preparing {out_dir}: {detail}")

    fields = {PROBLEM_SETTING: args.problem_field, ANSWER_SETTING: args.answer_field}
    digest = hashlib.sha256()
    parsed = {}
    for source in sources:
        text = fetcher.read(source)
        digest.update(text + b"\0")
        rows = parse_rows(text, source)
        check_sample(rows, fields, source)
        parsed[source] = convert_rows(rows, args.problem_field, args.answer_field, source)
    if args.test_source:
        train, test = parsed[args.source], parsed[args.test_source]
    else:
        train, test = hold_out(parsed[args.source])
    splits = {"train": Converted(train, None), "test": Converted(test, None)}
    write_outputs(out_dir, splits, identity, digest.hexdigest())
    held = "" if args.test_source else f" ({HELD_OUT_SHARE:.0%} held out of {args.source})"
    print(f"{PROG}: wrote train={len(train)}, test={len(test)} rows{held} to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
