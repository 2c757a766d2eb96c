"""Step outcome records (``--record FILE``), read before Ray is asked and written when a step SUCCEEDED.

A JSON file (on the run's Lustre directory in the pipeline) with the submission id, the attempt that succeeded and
the exact command. A recorded success with the same id and command is reported (exit 0) and nothing is run, even on
a head that no longer knows the job, or one that does not answer; another command or id is refused (exit 2), as an
id conflict in Ray's table is; an unreadable record also exits 2 (remove it to run the step again). It is written
when the job ends SUCCEEDED (also one found SUCCEEDED in Ray's table), atomically: a temporary file in the same
directory, flushed, then renamed over the record. Records are required: before anything else the submitter checks
that it can write in the record's directory, and refuses (exit 2, naming the directory and the fix) when it cannot.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from typing import Any

from submitter.errors import ConflictError, RecordError, UnwritableRecordsError
from submitter.output import Output, short, short_text

RECORD_FIELDS = ("submission_id", "job", "status", "command")


def read_record(path: str) -> dict[str, Any] | None:
    """The step's outcome record, or None when there is none. A record we cannot read is an error, never "none":
    running a step again because its record was unreadable is what the record exists to prevent."""
    try:
        with open(path, encoding="utf-8") as record_file:
            text = record_file.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RecordError(f"cannot read the step record {path} ({short(exc)}); fix its volume or remove it") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"the step record {path} is not valid JSON ({exc.msg} at position {exc.pos}); remove it to run the step "
            "again"
        ) from None
    if not (isinstance(record, dict) and all(isinstance(record.get(key), str) for key in RECORD_FIELDS)):
        raise RecordError(f"the step record {path} lacks {', '.join(RECORD_FIELDS)}; remove it to run the step again")
    if record["status"] != "SUCCEEDED":
        raise RecordError(f"the step record {path} says {record['status']}; only SUCCEEDED is ever recorded")
    return record


def check_writable(path: str) -> None:
    """Refuse before anything runs when the record's directory cannot be written (UnwritableRecordsError, exit 2):
    a step whose success cannot be recorded would run again after the next head restart, and so would every step
    after it. A probe file is created and removed there."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UnwritableRecordsError(
            f"cannot write the step records in {directory} ({short(exc)}). They are what keeps a finished step from "
            "running again after a Ray head restart, so no step runs without them. Make the directory writable by "
            "the submitter pod (the Lustre volume mounted read-write, the directory's owner and mode), then run again"
        ) from None


def check_record(record: dict[str, Any], path: str, submission_id: str, entrypoint: str) -> None:
    if record["submission_id"] != submission_id or record["command"] != entrypoint:
        raise ConflictError(
            f"the step record {path} says {record['submission_id']} SUCCEEDED with another command "
            f"({short_text(record['command'])}). A changed run needs a new submission id: a new run name, or a "
            "rerun of the step.",
            record["command"],
        )


def rerun_hint(record_path: str | None) -> str:
    """How the launcher runs a recorded step again: the job stack's rerun number for it, one above the one this
    record belongs to (``train.json`` is the first run, ``train.rerun2.json`` the second rerun)."""
    if not record_path:
        return ""
    name = os.path.basename(record_path).removesuffix(".json")
    step, _, number = name.partition(".rerun")
    following = int(number) + 1 if number.isdigit() else 1
    return (
        f" To run step {step} again under a new id, in jobs/: `pulumi config set --path 'rerun[\"{step}\"]' "
        f"{following}`, then `pulumi up`."
    )


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write the record atomically: a temporary file in the same directory, flushed to disk, renamed over the
    record. A reader sees the old state or the whole new record, never part of one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as temp_file:
            json.dump(record, temp_file, indent=2, sort_keys=True)
            temp_file.write("\n")
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the file system allows it
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def record_success(
    path: str,
    submission_id: str,
    job: str,
    entrypoint: str,
    session: str,
    out: Output,
    attempts: list[dict[str, Any]] | None = None,
) -> None:
    record = {
        "submission_id": submission_id,
        "job": job,
        "status": "SUCCEEDED",
        "command": entrypoint,
        "recorded_at": utc_now(),
        "ray_session": session,
        "attempts": attempts or [],
    }
    try:
        write_record(path, record)
    except OSError as exc:
        # The step did succeed: report it, but say that a rerun would not know.
        out.say(f"could not write the step record {path} ({short(exc)}); a rerun will ask Ray instead")
    else:
        out.say(f"recorded the outcome in {path}")


def ledger_path(record_path: str, variant: str = "") -> str:
    """The step's attempt ledger, beside its record: ``train.json`` -> ``train.attempts.json`` (an extension's:
    ``train.steps20.attempts.json``)."""
    stem = record_path[: -len(".json")] if record_path.endswith(".json") else record_path
    return f"{stem}.{variant}.attempts.json" if variant else f"{stem}.attempts.json"


class AttemptLedger:
    """Every attempt of one step, on Lustre beside its record (``<step>.attempts.json``): an entry is written before
    the attempt is submitted (attempt number, job id, pod, Ray session, start) and closed when it ends (end, outcome).
    It outlives the head's job table and the submitter pod, so the retry budget (``--max-retries``) and the
    resubmissions after head restarts (``--max-resubmits``) count every attempt any pod ever started; a write that
    fails ends the run (UnwritableRecordsError) rather than let an attempt go uncounted."""

    def __init__(self, path: str, submission_id: str, pod: str) -> None:
        self.path, self.submission_id, self.pod = path, submission_id, pod
        self.entries: list[dict[str, Any]] = []
        try:
            with open(path, encoding="utf-8") as ledger_file:
                text = ledger_file.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RecordError(f"cannot read the attempt ledger {path} ({short(exc)}); fix its volume") from None
        try:
            ledger = json.loads(text)
            entries = ledger["attempts"]
            valid = ledger.get("submission_id") == submission_id and all(
                isinstance(e, dict) and isinstance(e.get("attempt"), int) and isinstance(e.get("job"), str)
                for e in entries
            )
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            valid = False
        if not valid:
            raise RecordError(
                f"the attempt ledger {path} is not a ledger of {submission_id}'s attempts; it counts the run's retry "
                "budget, so it is never ignored: restore it, or remove it (and the budget starts again)"
            )
        self.entries = list(entries)

    def latest(self) -> int:
        """The highest attempt number ever started, or -1."""
        return max((e["attempt"] for e in self.entries), default=-1)

    def started(self, attempt: int) -> int:
        """How often this attempt number was submitted (more than once: resubmitted after head restarts)."""
        return sum(1 for e in self.entries if e["attempt"] == attempt)

    def last(self) -> dict[str, Any] | None:
        return self.entries[-1] if self.entries else None

    def begin(self, attempt: int, job: str, session: str, command: str = "") -> None:
        newest = self.last()
        if newest and (newest["job"], newest.get("pod"), newest.get("outcome")) == (job, self.pod, None):
            return  # this pod's submission of it is open already (a submit that did not get an answer, tried again)
        self.entries.append(
            {
                "attempt": attempt,
                "job": job,
                "pod": self.pod,
                "ray_session": session,
                "command": command,
                "started_at": utc_now(),
                "ended_at": None,
                "outcome": None,
            }
        )
        self._write()

    def end(self, job: str, outcome: str) -> None:
        """Close the newest open entry of this job (if any) with its outcome."""
        for entry in reversed(self.entries):
            if entry["job"] == job and entry.get("outcome") is None:
                entry["ended_at"], entry["outcome"] = utc_now(), outcome
                self._write()
                return

    def describe(self) -> str:
        return "; ".join(
            f"{e['job']} (pod {e.get('pod') or '?'}, from {e.get('started_at') or '?'}: {e.get('outcome') or 'open'})"
            for e in self.entries
        )

    def _write(self) -> None:
        try:
            write_record(self.path, {"submission_id": self.submission_id, "attempts": self.entries})
        except OSError as exc:
            raise UnwritableRecordsError(
                f"cannot write the attempt ledger {self.path} ({short(exc)}); an attempt it does not count could "
                "exceed the retry budget, so nothing more is submitted. Fix the volume, then run again"
            ) from None


def utc_now() -> str:
    """The time, as every record, ledger entry and lock says it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pod_name() -> str:
    """The submitter's pod (its hostname), as the ledger and the run lock name it."""
    return os.environ.get("HOSTNAME") or socket.gethostname()
