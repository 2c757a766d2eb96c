"""Attempts of one submission id: find the latest, submit or attach, retry, and report the outcome (``run``).

Automatic retries (``--max-retries N``, default 0): when an attempt ends FAILED and fewer than N retries were used,
the same entrypoint is submitted again under the next attempt id: ``ID``, then ``ID-r1``, ``ID-r2``, ... up to
``ID-rN``. A submitter that starts (a new pod, the same arguments) first finds the latest attempt that exists (``ID``,
``ID-r1``, ... up to the first id Ray does not know) and continues from it: it attaches if that attempt runs, exits 0
if it SUCCEEDED, retries if it FAILED and retries remain, and otherwise reports the outcome. So no attempt is ever
run twice, and a submitter killed between two attempts submits the next one when it comes back. STOPPED is a
person's decision and is never retried. Every attempt must carry the same command: a different one under any attempt
id is refused (exit 2). Each retry is logged with the reason (the failed attempt's status, driver exit code and Ray's
message). The final line names the last attempt, e.g. ``ray_submit: job ID-r1 SUCCEEDED``.

A job lost in a head restart (head_restart.py): with retries left it counts as a failed attempt and the next attempt
id is submitted (the train step: it waits for its GPU workers again and resumes from the newest checkpoint). Without,
the same id is submitted again on the new head, at most ``--max-resubmits`` times (default 3; steps are idempotent or
skip completed work). A new submitter after a head restart finds none of the earlier attempts: it looks at every
attempt id of the budget (the new head may know ``ID-r2`` and not ``ID``), and steps that already succeeded are known
from their outcome records (records.py).

With ``--record`` the attempts also live on Lustre: the attempt ledger beside the record (records.AttemptLedger)
gets each attempt before it is submitted, and a new submitter goes on from the larger of the ledger and Ray's table
(continue_after_ledger), so neither a new pod nor a head restart resets the budget. The ledger only records what Ray
holds: a second submitter of the same run (the Job controller starts none while the first pod lives, but a Job made
by hand could) computes the same attempt id, and Ray refuses the second submission of an id atomically, so it
follows the first. With ``--place-of RUN`` no attempt is submitted until the run's place is RUNNING
(submitter/admission.py): after a head restart the run waits for its place again before it trains.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from submitter.errors import (
    EXIT_FAILED,
    EXIT_STOPPED,
    EXIT_SUCCEEDED,
    ConflictError,
    EndedError,
    LostError,
    RejectedError,
)
from submitter.extension import (
    changed_words,
    extendable_value,
    extended_to,
    extension_id,
    wait_until_none_live,
)
from submitter.head_restart import HeadIdentity, HeadRestartedError
from submitter.log_follower import watch
from submitter.output import Output, describe_runtime_env, short, short_text
from submitter.ray_api import Outage, connect, is_duplicate, is_transient, lookup
from submitter.records import (
    AttemptLedger,
    check_record,
    check_writable,
    ledger_path,
    pod_name,
    read_record,
    record_success,
    rerun_hint,
    write_record,
)

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient


# Attempt k > 0 of a submission id runs as ID-r<k>; the scan for the latest attempt stops here at the latest.
MAX_ATTEMPTS_SCANNED = 1000
# A job lost in a head restart is submitted again under its own id this often (once no retry remains), so that a
# step which itself brings the head down (runs it out of memory) cannot loop forever.
DEFAULT_MAX_RESUBMITS = 3
MAX_RESUBMITS = 100


def attempt_id(submission_id: str, attempt: int) -> str:
    """Attempt 0 runs under the submission id itself, attempt k > 0 under ``ID-r<k>``."""
    return submission_id if attempt == 0 else f"{submission_id}-r{attempt}"


class Current:
    """The attempt id the submitter works on (the SIGTERM handler stops this one when the run is deleted)."""

    def __init__(self, submission_id: str) -> None:
        self.id = submission_id


def check_command(info: JobDetails, attempt: str, entrypoint: str) -> None:
    if getattr(info, "entrypoint", entrypoint) != entrypoint:
        # Following (or skipping) the old job would report a run this command never made.
        raise ConflictError(
            f"job {attempt} already exists with a different command ({short_text(info.entrypoint)}). A changed "
            f"run needs a new submission id (a new run name), or `ray job delete {attempt}` to discard the old one",
            info.entrypoint,
        )


def latest_attempt(
    client: JobSubmissionClient, submission_id: str, entrypoint: str, outage: Outage, max_retries: int
) -> tuple[int, JobDetails | None]:
    """The newest attempt Ray knows and its details, or (0, None) when there is none: every id of the budget (ID,
    ID-r1, ... ID-rN) is looked at, and past it up to the first id Ray does not know (a budget lowered since). Gaps
    are normal: a head restarted without GCS fault tolerance knows only the attempts submitted since, e.g. ID-r2
    without ID and ID-r1. Every attempt found must carry this command. Without retries only ID itself is looked at,
    as before retries existed."""
    found: tuple[int, JobDetails | None] = (0, None)
    for attempt in range(MAX_ATTEMPTS_SCANNED if max_retries else 1):
        aid = attempt_id(submission_id, attempt)
        info = outage.call(functools.partial(lookup, client, aid), "looking up the job")
        if info is None:
            if attempt < max_retries:
                continue
            break
        check_command(info, aid, entrypoint)
        found = (attempt, info)
    return found


def submit(
    client: JobSubmissionClient,
    aid: str,
    entrypoint: str,
    runtime_env: dict[str, Any] | None,
    outage: Outage,
    out: Output,
    on_submit: Callable[[], None] = lambda: None,
) -> bool:
    """Submit one attempt. True once Ray has it (ours, or a concurrent submitter's); False when unknown (retry).
    ``on_submit`` runs just before Ray is asked (the attempt ledger's entry)."""
    out.say(f"submitting job {aid}: {entrypoint}")
    if runtime_env is not None:
        out.say(f"runtime env: {describe_runtime_env(runtime_env)}")
    on_submit()
    try:
        client.submit_job(entrypoint=entrypoint, submission_id=aid, runtime_env=runtime_env)
    except Exception as exc:
        if is_duplicate(exc):
            out.say(f"job {aid} was submitted by another submitter at the same time; attaching to it")
            return True
        if is_transient(exc) or "No available agent" in str(exc):
            # Unknown whether Ray recorded the job: the next lookup tells.
            time.sleep(outage.failed(exc, "submitting the job"))
            return False
        raise RejectedError(f"Ray rejected job {aid}: {short(exc)}") from None
    outage.ok()
    return True


def settle(
    client: JobSubmissionClient,
    aid: str,
    entrypoint: str,
    runtime_env: dict[str, Any] | None,
    outage: Outage,
    out: Output,
    info: JobDetails | None,
    head: HeadIdentity,
    on_submit: Callable[[], None] = lambda: None,
) -> tuple[JobDetails, bool]:
    """Submit attempt ``aid`` unless Ray has it (``info``), or attach to it; return its final details and whether
    it had finished before this submitter came."""
    attached = False  # True once this process submitted the job or found it unfinished
    while True:
        if info is None:
            attached = submit(client, aid, entrypoint, runtime_env, outage, out, on_submit) or attached
            info = outage.call(lambda: lookup(client, aid), "looking up the job")
            continue
        check_command(info, aid, entrypoint)
        if info.status.is_terminal() and not attached:
            return info, True
        if not attached:
            out.say(f"job {aid} exists and is {info.status}; attaching to it instead of submitting again")
        out.say(f"streaming the logs of job {aid}")
        return asyncio.run(watch(client, aid, outage, out, head)), False


def retry_advice(submission_id: str) -> str:
    return (
        f"Ray will not run submission id {submission_id} again. To retry, start a run with a new run name "
        f"(a new submission id), or delete the old record first with `ray job delete {submission_id}`."
    )


def retries_spent_advice(submission_id: str, max_retries: int) -> str:
    return (
        f"all {max_retries + 1} attempts failed ({submission_id} ... {attempt_id(submission_id, max_retries)}). To "
        "go on, run again with a larger --max-retries (the job stack's maxRestarts): the next attempt resumes from "
        "the newest checkpoint. Or start a run with a new run name."
    )


def lost_advice(submission_id: str, attempt: str, max_retries: int, max_resubmits: int, rerun: str = "") -> str:
    if max_retries:
        spent = f"all {max_retries + 1} attempts are used ({submission_id} ... {attempt})"
    elif max_resubmits:
        spent = f"it was already submitted again {max_resubmits} times after head restarts"
    else:
        spent = "this step is not retried (--max-retries 0, --max-resubmits 0)"
    return (
        f"job {attempt} was lost in a Ray head restart and {spent}. If the head keeps restarting, check the head "
        "pod (`kubectl describe pod` for OOMKilled or a replaced node). To go on, run again with a larger "
        "--max-retries (the job stack's maxRestarts; training resumes from the newest checkpoint), or start a run "
        f"with a new run name.{rerun}"
    )


def first_line(message: str | None) -> str:
    """Ray's failure message ends with the last log lines, which were streamed already: keep its first clause."""
    if not message:
        return ""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line.split(", last available logs")[0].rstrip(":")


def failure_text(info: JobDetails) -> str:
    return f" (driver exit code {info.driver_exit_code})" if info.driver_exit_code is not None else ""


def outcome(info: JobDetails, attempt: str, out: Output, earlier: bool, advice: str = "", rerun: str = "") -> int:
    """The last lines: what Ray said, what to do, the outcome. ``rerun``: how the launcher runs the step again."""
    from ray.job_submission import JobStatus

    status = info.status
    detail = first_line(info.message)
    when = " in an earlier attempt" if earlier else ""
    if status == JobStatus.SUCCEEDED:
        if earlier:
            out.say(f"job {attempt} already SUCCEEDED in an earlier attempt; nothing was run again")
        out.say(f"job {attempt} SUCCEEDED")
        return EXIT_SUCCEEDED
    if detail:
        out.say(f"Ray says: {detail}")
    if status == JobStatus.STOPPED:
        out.say(retry_advice(attempt) + rerun)
        out.say(f"job {attempt} STOPPED{when}")
        return EXIT_STOPPED
    out.say((advice or retry_advice(attempt)) + rerun)
    out.say(f"job {attempt} FAILED{when}{failure_text(info)}")
    return EXIT_FAILED


def before_submitting(
    args: argparse.Namespace,
    out: Output,
    ledger: AttemptLedger | None,
    attempt: int,
    aid: str,
    session: str,
    command: str,
) -> None:
    """Just before Ray is asked to run an attempt: the run holds its place, and the ledger counts the attempt."""
    if args.place_of:
        from submitter.admission import wait_for_place

        wait_for_place(args.address, args.place_of, out)
    if ledger is not None:
        ledger.begin(attempt, aid, session, command)


class RecordedEndError(EndedError):
    """The newest attempt ended FAILED or STOPPED on a head that has restarted since: that outcome stands."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(message)
        self.exit_code = EXIT_STOPPED if outcome == "STOPPED" else EXIT_FAILED
        self.final = f" {outcome} (in an earlier attempt, recorded in the attempt ledger)"


def continue_after_ledger(
    ledger: AttemptLedger,
    attempt: int,
    info: JobDetails | None,
    head: HeadIdentity,
    args: argparse.Namespace,
    out: Output,
    entrypoint: str = "",
) -> tuple[int, bool, int]:
    """Where to go on from, by the larger of the ledger and Ray's table: (attempt, whether Ray's details of it still
    hold, resubmissions of it so far). The newest attempt the ledger started and Ray does not know went with a head
    that restarted (or never reached Ray): it counts as used, and the run goes on past it while the budget lasts."""
    sid, max_retries = args.submission_id, args.max_retries
    out.say(f"the attempt ledger {ledger.path} lists: {ledger.describe()}")
    # Every head restart the run met, not only the last: a new pod's log is the whole story.
    for before, after in zip(ledger.entries, ledger.entries[1:], strict=False):
        if before.get("ray_session") and after.get("ray_session") and before["ray_session"] != after["ray_session"]:
            out.say(
                f"the Ray head restarted between {before['job']} (session {before['ray_session']}) and "
                f"{after['job']} (session {after['ray_session']})"
            )
    newest = ledger.last()
    if newest and newest.get("ray_session") and newest["ray_session"] != head.session:
        out.say(
            f"the Ray head restarted since {newest['job']} was submitted (its session changed from "
            f"{newest['ray_session']} to {head.session})"
        )
    latest = ledger.latest()
    if latest < attempt or (latest == attempt and info is not None):
        return attempt, True, max(ledger.started(attempt) - 1, 0)
    lost = attempt_id(sid, latest)
    ended = next(e for e in reversed(ledger.entries) if e["attempt"] == latest)
    outcome = ended.get("outcome") or ""
    if outcome in ("FAILED", "STOPPED") and ended.get("command") and ended["command"] != entrypoint:
        # It ended under another command, on a head that no longer knows it: as if Ray had shown it.
        raise ConflictError(
            f"{lost} ended {outcome} with another command ({short_text(ended['command'])})", ended["command"]
        )
    if outcome in ("FAILED", "STOPPED"):
        if ended.get("ray_session") == head.session:
            # Ended, then removed from the table of the same head: a person's `ray job delete` (the resume recipe).
            out.say(f"{lost} ended {outcome} and was deleted from the Ray head's table since; submitting it again")
            return latest, False, 0
        if outcome == "FAILED" and latest < max_retries:
            out.say(f"{lost} FAILED on a head that has restarted since; retrying as {attempt_id(sid, latest + 1)}")
            return latest + 1, False, 0
        raise RecordedEndError(
            f"{lost} ended {outcome} (the attempt ledger {ledger.path}; the Ray head has restarted since). "
            + (retries_spent_advice(sid, max_retries) if outcome == "FAILED" and max_retries else retry_advice(lost))
            + rerun_hint(args.record),
            outcome,
        )
    if not outcome and ended.get("ray_session") == head.session:
        # Begun on this very head and not on it: its submitter has not reached Ray yet (paused between the ledger
        # and the submission, or failed before it). Only a head restart loses a job, so this id is not spent:
        # submit it (Ray takes one submission of an id, so two submitters of the run cannot both run the step).
        out.say(f"{lost} is in the ledger but not yet on this Ray head; submitting it under the same id")
        return latest, False, max(ledger.started(latest) - 1, 0)
    ledger.end(lost, "LOST (not on the Ray head: it restarted after the submission)")
    out.say(f"{lost} was submitted but the Ray head does not know it: lost with a head restart, and counted")
    if latest < max_retries:
        out.say(
            f"attempt {latest + 1} of {max_retries + 1} ({lost}) was lost; retrying as "
            f"{attempt_id(sid, latest + 1)} (retry {latest + 1} of {max_retries})"
        )
        return latest + 1, False, 0
    resubmitted = ledger.started(latest) - 1
    if resubmitted < args.max_resubmits:
        out.say(f"submitting {lost} again (resubmission {resubmitted + 1} of {args.max_resubmits})")
        return latest, False, resubmitted + 1
    raise LostError(lost_advice(sid, lost, max_retries, args.max_resubmits, rerun_hint(args.record)))


def run(
    args: argparse.Namespace,
    entrypoint_words: list[str],
    runtime_env: dict[str, Any] | None,
    out: Output,
    current: Current,
) -> int:
    entrypoint = shlex.join(entrypoint_words)
    if not args.record:
        return run_attempts(args, entrypoint, runtime_env, out, current, None)
    check_writable(args.record)
    try:
        try:
            return run_recorded(args, entrypoint, runtime_env, out, current)
        except ConflictError as exc:
            value = extended_to(exc.old_command, entrypoint, args.extendable) if args.extendable else None
            if value is None:
                raise
            return run_extension(args, entrypoint, runtime_env, out, current, exc.old_command, value)
    except ConflictError as exc:  # a changed command under a used id: the launcher's way out is a rerun
        changed = f" Changed: {changed_words(exc.old_command, entrypoint)}." if exc.old_command else ""
        only = f" Only a larger {args.extendable} extends a run." if args.extendable else ""
        raise ConflictError(f"{exc}{changed}{only}{rerun_hint(args.record)}", exc.old_command) from None


def run_recorded(
    args: argparse.Namespace, entrypoint: str, runtime_env: dict[str, Any] | None, out: Output, current: Current
) -> int:
    # The record comes first: it outlives the head's job table (and a head that is down), and it is the only
    # trace of a step that succeeded on a head which has restarted since.
    sid = args.submission_id
    record = read_record(args.record)
    if record is not None:
        if not _extensions_record(record, sid, entrypoint, args.extendable):
            check_record(record, args.record, sid, entrypoint)
        current.id = record["job"]
        out.say(
            f"the step record {args.record} says job {record['job']} SUCCEEDED ({record.get('recorded_at', '')}); "
            "nothing was run again"
        )
        out.say(f"job {record['job']} SUCCEEDED")
        return EXIT_SUCCEEDED
    ledger = AttemptLedger(ledger_path(args.record), sid, pod_name())
    return run_attempts(args, entrypoint, runtime_env, out, current, ledger)


def _extensions_record(record: dict[str, Any], sid: str, entrypoint: str, key: str | None) -> bool:
    """The record of an extension (ID-steps<N>) that succeeded with exactly this command."""
    value = extendable_value(entrypoint, key) if key else None
    return (
        value is not None
        and record.get("command") == entrypoint
        and record.get("submission_id") == extension_id(sid, value)
    )


def run_extension(
    args: argparse.Namespace,
    entrypoint: str,
    runtime_env: dict[str, Any] | None,
    out: Output,
    current: Current,
    old_command: str,
    value: int,
) -> int:
    """The run goes on with a larger ``--extendable`` value (submitter/extension.py): new attempts under
    ``ID-steps<value>``, with a ledger and a retry budget of their own, once no old attempt runs any more."""
    sid = args.submission_id
    new_sid = extension_id(sid, value)
    old = extendable_value(old_command, args.extendable)
    out.say(
        f"{sid} ran with {args.extendable}={old}; extending the run to {value}: its next attempts are {new_sid}, "
        f"{attempt_id(new_sid, 1)} ... ({args.max_retries} retries), resuming from the newest checkpoint"
    )
    wait_until_none_live(args.address, sid, out)
    record = read_record(args.record)
    if record is not None and record.get("submission_id") != new_sid:
        # The finished run's record stays beside the new one.
        history = f"{args.record}.before-{args.extendable}-{value}"
        write_record(history, record)
        out.say(f"kept the record of {record.get('job')} as {history}")
    extension = argparse.Namespace(**{**vars(args), "submission_id": new_sid})
    current.id = new_sid
    ledger = AttemptLedger(ledger_path(args.record, f"steps{value}"), new_sid, pod_name())
    return run_attempts(extension, entrypoint, runtime_env, out, current, ledger)


def run_attempts(
    args: argparse.Namespace,
    entrypoint: str,
    runtime_env: dict[str, Any] | None,
    out: Output,
    current: Current,
    ledger: AttemptLedger | None,
) -> int:
    """The attempts of the step, from the latest Ray or the ledger knows, until one ends the run."""
    from ray.job_submission import JobStatus

    sid = args.submission_id
    max_retries = args.max_retries
    outage = Outage(args.connect_timeout, args.address, out)

    out.say(f"connecting to the Ray Jobs API at {args.address} (waiting up to {args.connect_timeout:g} s)")
    client = connect(args.address, outage)
    head = HeadIdentity(args.address, outage)

    attempt, info = latest_attempt(client, sid, entrypoint, outage, max_retries)
    if attempt:
        out.say(f"{attempt_id(sid, attempt)} is the latest attempt of {sid} on the cluster; continuing from it")
    resubmits = 0
    if ledger is not None and ledger.entries:
        current.id = attempt_id(sid, max(attempt, ledger.latest()))  # what a spent budget's last line names
        attempt, still, resubmits = continue_after_ledger(ledger, attempt, info, head, args, out, entrypoint)
        if not still:
            info = outage.call(functools.partial(lookup, client, attempt_id(sid, attempt)), "looking up the job")
    while True:
        aid = current.id = attempt_id(sid, attempt)
        opened = functools.partial(before_submitting, args, out, ledger, attempt, aid, head.session, entrypoint)
        try:
            final, earlier = settle(client, aid, entrypoint, runtime_env, outage, out, info, head, opened)
        except HeadRestartedError as lost:
            if ledger is not None:
                ledger.end(aid, "LOST (the Ray head restarted)")
            out.say(
                f"the Ray head restarted while job {aid} ran (its session changed from {lost.before} to "
                f"{lost.after}): a head without GCS fault tolerance comes back with an empty job table, so {aid} "
                "was lost, not failed"
            )
            if attempt < max_retries:
                attempt += 1
                out.say(
                    f"attempt {attempt} of {max_retries + 1} ({aid}) was lost in the head restart; retrying as "
                    f"{attempt_id(sid, attempt)} (retry {attempt} of {max_retries})"
                )
            elif resubmits < args.max_resubmits:
                resubmits += 1
                out.say(
                    f"submitting {aid} again on the restarted head (resubmission {resubmits} of {args.max_resubmits})"
                )
            else:
                advice = lost_advice(sid, aid, max_retries, args.max_resubmits, rerun_hint(args.record))
                raise LostError(advice) from None
            info = outage.call(functools.partial(lookup, client, attempt_id(sid, attempt)), "looking up the job")
            continue
        if ledger is not None:
            ledger.end(aid, str(final.status))
        if final.status == JobStatus.SUCCEEDED and args.record:
            attempts = ledger.entries if ledger is not None else []
            record_success(args.record, sid, aid, entrypoint, head.session, out, attempts)
        if final.status == JobStatus.FAILED and attempt < max_retries:
            detail = first_line(final.message)
            attempt += 1
            out.say(
                f"attempt {attempt} of {max_retries + 1} ({aid}) FAILED{' in an earlier run' if earlier else ''}"
                f"{failure_text(final)}{': ' + detail if detail else ''}; retrying as {attempt_id(sid, attempt)} "
                f"(retry {attempt} of {max_retries})"
            )
            info = outage.call(functools.partial(lookup, client, attempt_id(sid, attempt)), "looking up the job")
            continue
        if ledger is not None and ledger.entries:
            out.say(f"attempts of {sid}: {ledger.describe()}")
        advice = retries_spent_advice(sid, max_retries) if max_retries else ""
        return outcome(final, aid, out, earlier, advice, rerun_hint(args.record))
