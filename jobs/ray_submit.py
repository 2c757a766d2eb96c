"""Submit a command to a Ray cluster as a Ray Job, idempotently, and wait for it.

Usage::

    python jobs/ray_submit.py --address http://HOST:8265 --submission-id ID \\
        [--connect-timeout SECONDS] [--runtime-env-json JSON] [--max-retries N] [--max-resubmits N] \\
        [--record FILE] [--k8s-job NAME --k8s-run-marker NAME --k8s-namespace NS [--k8s-api URL]] -- ENTRYPOINT...

The submitter is meant to run as the only container of a Kubernetes Job whose pod may be deleted or restarted at
any moment. Every run with the same ``--submission-id`` converges on one and the same Ray job:

* The Ray Jobs API is polled (``GET /api/version``) with a short backoff until it answers. If it has not answered
  after ``--connect-timeout`` seconds (default 600) the submitter gives up with exit code 4.
* If no job with that submission id exists, the words after ``--`` are joined shell-safely (each argument stays
  one word) and submitted under that id, with the optional runtime environment from ``--runtime-env-json``.
* If the job exists and is PENDING or RUNNING, the submitter attaches to it instead of submitting again.
* If two submitters race, Ray accepts only one submission; the other one's submit is answered "already exists"
  and it attaches to the winner's job. There is never more than one Ray job per submission id.
* While attached, the job's logs are streamed to stdout and the job's status is polled. A final line such as
  ``ray_submit: job ID SUCCEEDED`` states the outcome.

An id that already finished before this submitter started:

* SUCCEEDED: nothing is run again; the submitter says so and exits 0.
* FAILED or STOPPED: Ray never accepts a second submission under an id it has seen, so the earlier attempt cannot
  be retried under the same id (``--max-retries`` retries a FAILED one under the next attempt id, see below).
  The submitter reports the earlier outcome with its exit code (1 or 3) and tells the user how to retry: choose a
  new run name (hence a new submission id), or remove the old record with ``ray job delete ID`` and start again.
  A restarted pod therefore reproduces the earlier result instead of silently running the workload a second time.

Log streaming uses the client's websocket tail (``tail_job_logs``), which replays a job's log from its beginning
and then follows it. A count of the characters already written is kept, so when the stream has to be reopened
(the head's connection dropped) the replayed part is skipped and nothing is printed twice. When the job has
finished, the whole log is fetched once and whatever the stream missed (a stream that closed early ends without an
error) is printed.

Signals: SIGTERM (pod deletion) and SIGINT make the submitter exit at once (codes 143 and 130) WITHOUT stopping
the Ray job, unless the run itself is being deleted (see "Stop when the run is deleted" below). The job belongs to
the Ray cluster and outlives the submitter pod; a restarted pod with the same submission id re-attaches to it. To
stop a job use ``ray job stop ID``.

Secrets: the values of ``env_vars`` in the runtime environment are never printed; only their names are. Messages
that come back from Ray are scrubbed of those values before they are printed. (The job's own log output is
printed as the job wrote it.)

Token authentication (Ray >= 2.52): with ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` in the environment, every
request carries the token, as Ray's own clients send it. A cluster that answers 401 (no token sent) or 403 (not its
token) ends the run at once with exit code 2 and a message that says which; the token itself is never printed.

An id that exists with a different command (a changed run under an old name) is refused with exit code 2: the
old job is neither followed nor reported as this command's result.

Automatic retries (``--max-retries N``, default 0): when an attempt ends FAILED and fewer than N retries were used,
the same entrypoint is submitted again under the next attempt id: ``ID``, then ``ID-r1``, ``ID-r2``, ... up to
``ID-rN``. A submitter that starts (a new pod, the same arguments) first finds the latest attempt that exists
(``ID``, ``ID-r1``, ... up to the first id Ray does not know) and continues from it: it attaches if that attempt
runs, exits 0 if it SUCCEEDED, retries if it FAILED and retries remain, and otherwise reports the outcome. So no
attempt is ever run twice, and a submitter killed between two attempts submits the next one when it comes back.
STOPPED is a person's decision and is never retried. Every attempt must carry the same command: a different one
under any attempt id is refused (exit 2). Each retry is logged with the reason (the failed attempt's status, driver
exit code and Ray's message). The final line names the last attempt, e.g. ``ray_submit: job ID-r1 SUCCEEDED``.

A Ray head restart: a head restarted without GCS fault tolerance (a head pod recreated after an OOM kill or a
node repair) comes back at the same address with an empty job table, so the job being followed disappears. The
outage itself is waited out as any other (``--connect-timeout``). A job that is gone is then told apart by the
head's session name (``GET /api/version``), which a head gets anew each time it starts without fault tolerance
(see HeadIdentity):

* The session changed: the job was lost with the old head, which is no outcome of the job's own. With retries
  left (``--max-retries``) it counts as a failed attempt and the next attempt id is submitted (the train step:
  it waits for its GPU workers again and resumes from the newest checkpoint). Without, the same id is submitted
  again on the new head, at most ``--max-resubmits`` times (default 3; steps are idempotent or skip completed
  work). Past both, the run ends with exit code 1 and ``FAILED (lost in a Ray head restart, no retries left)``.
* The session is the same: someone deleted the job's record (``ray job delete``) while the head stayed up. The
  outcome is unknown, and the submitter ends with exit code 1 and
  ``FAILED (vanished: its record was deleted while the Ray head stayed up)``.

A new submitter after a head restart finds none of the earlier attempts: it looks at every attempt id of the
budget (the new head may know ``ID-r2`` and not ``ID``), and steps that already succeeded are known from their
outcome records (``--record``).

Step outcome records (``--record FILE``): a JSON file (on the run's Lustre directory in the pipeline) with the
submission id, the attempt that succeeded and the exact command. It is read before Ray is asked: a recorded
success with the same id and command is reported (exit 0) and nothing is run, even on a head that no longer
knows the job, or one that does not answer; another command or id is refused (exit 2), as an id conflict in
Ray's table is; an unreadable record also exits 2 (remove it to run the step again). It is written when the job
ends SUCCEEDED (also one found SUCCEEDED in Ray's table), atomically: a temporary file in the same directory,
flushed, then renamed over the record.

Stop when the run is deleted (``--k8s-job``, ``--k8s-run-marker``, ``--k8s-namespace``): on SIGTERM the submitter
asks the Kubernetes API (in-cluster address and the pod's projected service account token, or ``--k8s-api``)
whether its own Job is being deleted (gone, or carrying a deletionTimestamp) AND the run's marker ConfigMap is too.
The job stack creates the marker after the Job, so ``pulumi destroy`` deletes the marker first and then the Job:
both are gone, and the submitter stops the current attempt (``POST /api/jobs/ID/stop``) and waits until Ray reports
it STOPPED, within ``--stop-timeout`` seconds. A pod evicted or rescheduled (its Job is untouched), and a Job
replaced by ``pulumi up`` with changed settings (the marker stays), leave the Ray job running for the next pod to
re-attach. Any doubt (the API does not answer, or refuses) also leaves it running: training is never stopped on a
guess. Without these options SIGTERM never stops the Ray job.

Exit codes: 0 succeeded, 1 failed (or rejected by Ray; with retries, the last attempt failed; deleted while the
head stayed up; lost in head restarts past the budget), 2 usage error, id conflict or unreadable record, 3 stopped,
4 Ray unreachable (also when the connection is lost for longer than ``--connect-timeout`` while waiting), 130/143
interrupted by a signal (143 also after stopping the job because the run was deleted).
Unlike ``ray job submit``, a stopped job does not exit 0.

Only the standard library and Ray's own job submission client are used; Python 3.10 or newer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STOPPED = 3
EXIT_UNREACHABLE = 4
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM

PREFIX = "ray_submit:"
DEFAULT_CONNECT_TIMEOUT_S = 600.0
DEFAULT_STOP_TIMEOUT_S = 30.0
# Attempt k > 0 of a submission id runs as ID-r<k>; the scan for the latest attempt stops here at the latest.
MAX_ATTEMPTS_SCANNED = 1000
# A job lost in a head restart is submitted again under its own id this often (once no retry remains), so that a
# step which itself brings the head down (runs it out of memory) cannot loop forever.
DEFAULT_MAX_RESUBMITS = 3
MAX_RESUBMITS = 100
# In-cluster Kubernetes API access: the pod's projected service account token and the cluster's CA.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
K8S_TIMEOUT_S = 5.0
# Per-request limits for every HTTP call (connect, read), so that a silently vanished head cannot hang us.
REQUEST_TIMEOUT_S = (10.0, 60.0)
PROBE_TIMEOUT_S = 5.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0
STATUS_POLL_S = 2.0
# After the job reached a final status: how long the log stream may take to deliver the rest of the log.
LOG_DRAIN_S = 15.0
# A secret shorter than this is not scrubbed from messages (it would mangle ordinary words and numbers).
MIN_SCRUB_LEN = 4

# Ray's token authentication (Ray >= 2.52): the client sends the token only when both are set.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"

SUBMISSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

T = TypeVar("T")


class UsageError(Exception):
    """Bad command line; exit code 2."""


class EndedError(Exception):
    """The run ends without a job outcome: `exit_code` and `final` (the last line, after the job's id) say how."""

    exit_code = EXIT_FAILED
    final = ""


class ConflictError(EndedError):
    """The submission id belongs to a job with another command; exit code 2, like a usage error."""

    exit_code = EXIT_USAGE
    final = ": not run (the id is taken by another command)"


class AuthError(EndedError):
    """The Ray cluster refused this client's credentials (HTTP 401 or 403); exit code 2: a new pod with the same
    environment would be refused the same way."""

    exit_code = EXIT_USAGE
    final = ": not run (Ray refused the client's token)"


class UnreachableError(EndedError):
    """The Ray Jobs API did not answer for longer than the connect timeout; exit code 4."""

    exit_code = EXIT_UNREACHABLE
    final = ": Ray unreachable at {address}"


class RejectedError(EndedError):
    """Ray refused the submission for a reason other than a duplicate id; exit code 1."""

    final = " FAILED (not accepted)"


class VanishedError(EndedError):
    """The job we were waiting for was deleted from the cluster while its head stayed up; exit code 1."""

    final = " FAILED (vanished: its record was deleted while the Ray head stayed up)"


class LostError(EndedError):
    """The job was lost in a head restart and neither a retry nor a resubmission is left; exit code 1."""

    final = " FAILED (lost in a Ray head restart, no retries left)"


class RecordError(EndedError):
    """The step's outcome record cannot be read; exit code 2, like an id conflict."""

    exit_code = EXIT_USAGE
    final = ": not run (unreadable step record)"


class Output:
    """Serialises everything written to stdout; our own messages always start on a fresh line."""

    def __init__(self, secrets: Sequence[str] = ()) -> None:
        # Re-entrant: the signal handler may speak while the main thread is inside a write.
        self._lock = threading.RLock()
        self._at_line_start = True
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SCRUB_LEN}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def log(self, chunk: str) -> None:
        """Write job log text exactly as received."""
        if not chunk:
            return
        with self._lock:
            sys.stdout.write(chunk)
            sys.stdout.flush()
            self._at_line_start = chunk.endswith("\n")

    def say(self, message: str) -> None:
        """Write one message of ours, prefixed and scrubbed of secret values."""
        with self._lock:
            lead = "" if self._at_line_start else "\n"
            sys.stdout.write(f"{lead}{PREFIX} {self.scrub(message)}\n")
            sys.stdout.flush()
            self._at_line_start = True


# ---------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], dict[str, Any] | None]:
    """Split ``argv`` at the first ``--``; return options, entrypoint words and the runtime env (or None)."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        own, entrypoint = argv[:cut], argv[cut + 1 :]
    else:
        own, entrypoint = argv, []

    parser = argparse.ArgumentParser(
        prog="ray_submit.py",
        description="Submit (or re-attach to) a Ray job under a fixed submission id and wait for it.",
        usage="%(prog)s --address http://HOST:8265 --submission-id ID [--connect-timeout SECONDS] "
        "[--runtime-env-json JSON] [--max-retries N] [--max-resubmits N] [--record FILE] "
        "[--k8s-job NAME --k8s-run-marker NAME --k8s-namespace NS [--k8s-api URL] [--stop-timeout SECONDS]] "
        "-- ENTRYPOINT...",
    )
    parser.add_argument("--address", required=True, help="Ray dashboard / Jobs API URL, e.g. http://head:8265")
    parser.add_argument("--submission-id", required=True, help="Ray submission id; the same id re-attaches")
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        help="seconds to wait for the Jobs API, and longest tolerated outage while waiting (default: 600)",
    )
    parser.add_argument("--runtime-env-json", default=None, help="Ray runtime environment as a JSON object")
    parser.add_argument(
        "--max-retries", type=int, default=0, help="submit a FAILED job again as ID-r1 ... ID-rN (default: 0)"
    )
    parser.add_argument(
        "--max-resubmits",
        type=int,
        default=DEFAULT_MAX_RESUBMITS,
        help="submit a job lost in a head restart again under its own id, this often, once no retries remain "
        f"(default: {DEFAULT_MAX_RESUBMITS})",
    )
    parser.add_argument(
        "--record",
        default=None,
        help="step outcome record (JSON): read before Ray, written when the job SUCCEEDED; a recorded step is "
        "not run again",
    )
    parser.add_argument(
        "--k8s-job", default=None, help="this pod's Kubernetes Job: stop the Ray job when it is deleted"
    )
    parser.add_argument("--k8s-run-marker", default=None, help="ConfigMap that exists as long as the run should")
    parser.add_argument("--k8s-namespace", default=None, help="namespace of the Job and the marker")
    parser.add_argument("--k8s-api", default=None, help="Kubernetes API URL (default: the in-cluster address)")
    parser.add_argument(
        "--k8s-token-dir", default=SERVICE_ACCOUNT_DIR, help=f"holds token and ca.crt (default: {SERVICE_ACCOUNT_DIR})"
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_S,
        help="seconds to wait for STOPPED after stopping a deleted run's job (default: 30)",
    )
    args = parser.parse_args(own)  # exits 2 on unknown or missing flags

    try:
        if not entrypoint:
            raise UsageError("no entrypoint: give the command to run after '--'")
        if not re.match(r"https?://[^/\s]+", args.address):
            raise UsageError(f"--address must be an http:// or https:// URL, got {args.address!r}")
        if not SUBMISSION_ID_RE.fullmatch(args.submission_id):
            raise UsageError(
                "--submission-id must be 1-255 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if not args.connect_timeout > 0:
            raise UsageError("--connect-timeout must be a positive number of seconds")
        if not 0 <= args.max_retries < MAX_ATTEMPTS_SCANNED:
            raise UsageError(f"--max-retries must be 0..{MAX_ATTEMPTS_SCANNED - 1}")
        if not 0 <= args.max_resubmits <= MAX_RESUBMITS:
            raise UsageError(f"--max-resubmits must be 0..{MAX_RESUBMITS}")
        if args.record is not None and (not args.record or args.record.endswith("/")):
            raise UsageError(f"--record must be a file path, got {args.record!r}")
        k8s = (args.k8s_job, args.k8s_run_marker, args.k8s_namespace)
        if any(k8s) and not all(k8s):
            raise UsageError("--k8s-job, --k8s-run-marker and --k8s-namespace go together")
        if not args.stop_timeout > 0:
            raise UsageError("--stop-timeout must be a positive number of seconds")
        runtime_env = parse_runtime_env(args.runtime_env_json)
    except UsageError as exc:
        parser.error(str(exc))  # prints usage and exits 2
    args.address = args.address.rstrip("/")
    return args, entrypoint, runtime_env


def parse_runtime_env(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        # The exception text quotes no input beyond a position, so no secret can leak through it.
        raise UsageError(f"--runtime-env-json is not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, dict):
        raise UsageError("--runtime-env-json must be a JSON object")
    env_vars = value.get("env_vars")
    if env_vars is not None and not (isinstance(env_vars, dict) and all(isinstance(v, str) for v in env_vars.values())):
        raise UsageError("--runtime-env-json: env_vars must be an object of string values")
    return value


def secret_values(runtime_env: dict[str, Any] | None) -> list[str]:
    """What must never be printed: the runtime env's values and the Ray token."""
    found = [os.environ.get(AUTH_TOKEN_ENV, "")]
    env_vars = (runtime_env or {}).get("env_vars") or {}
    return [v for v in [*found, *env_vars.values()] if isinstance(v, str) and v]


def describe_runtime_env(runtime_env: dict[str, Any]) -> str:
    """Names of the fields (and of env vars), never values."""
    parts = []
    for key in sorted(runtime_env):
        if key == "env_vars":
            parts.append(f"env_vars=[{', '.join(sorted(runtime_env['env_vars'] or {}))}]")
        else:
            parts.append(key)
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Talking to Ray


def is_transient(exc: BaseException) -> bool:
    """Errors that mean "the API is (temporarily) not answering", as opposed to a definite answer."""
    if isinstance(exc, OSError):  # builtin ConnectionError, requests' RequestException, socket timeouts
        return True
    text = str(exc)
    if isinstance(exc, RuntimeError) and "already exists" not in text:
        return re.search(r"status code 5\d\d", text) is not None
    return False


def is_duplicate(exc: BaseException) -> bool:
    return "already exists" in str(exc)


def is_not_found(exc: BaseException) -> bool:
    text = str(exc)
    return "status code 404" in text or "does not exist" in text


class Outage:
    """Tracks how long the API has been failing in a row; raises UnreachableError past the limit."""

    def __init__(self, limit_s: float, address: str, out: Output, clock: Callable[[], float] = time.monotonic):
        self.limit_s = limit_s
        self.address = address
        self._out = out
        self._clock = clock
        self._since: float | None = None
        self._delay = BACKOFF_FIRST_S

    def ok(self) -> None:
        if self._since is not None:
            self._out.say(f"Ray at {self.address} answers again")
        self._since = None
        self._delay = BACKOFF_FIRST_S

    def failed(self, exc: BaseException, doing: str) -> float:
        """Record a failure; return how long to back off, or raise UnreachableError when the outage is too long."""
        now = self._clock()
        if self._since is None:
            self._since = now
            self._out.say(f"Ray at {self.address} is not answering ({doing}: {short(exc)}); retrying")
        if now - self._since >= self.limit_s:
            raise UnreachableError(
                f"Ray Jobs API at {self.address} did not answer for {self.limit_s:g} s ({doing}: {short(exc)})"
            )
        delay = min(self._delay, max(0.0, self._since + self.limit_s - now))
        self._delay = min(self._delay * 2, BACKOFF_MAX_S)
        return delay

    def call(self, fn: Callable[[], T], doing: str) -> T:
        """Run ``fn`` until it succeeds or fails with a non-transient error, within the outage limit."""
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                time.sleep(self.failed(exc, doing))
            else:
                self.ok()
                return result


def short_text(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


def auth_headers(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The header Ray's own clients add under token authentication: only with RAY_AUTH_MODE=token and a token."""
    token = env.get(AUTH_TOKEN_ENV, "")
    if env.get(AUTH_MODE_ENV, "").lower() == "token" and token:
        return {"Authorization": f"Bearer {token}"}
    return {}


def auth_refusal(status: int, env: Mapping[str, str] = os.environ) -> str:
    """Why the cluster refused us, in words, from the HTTP status and what this client holds (never the token)."""
    if status == 401 or not auth_headers(env):
        held = [name for name in (AUTH_MODE_ENV, AUTH_TOKEN_ENV) if env.get(name)]
        return (
            f"the Ray cluster requires a token (HTTP {status}) and this client sent none: set both "
            f"{AUTH_MODE_ENV}=token and {AUTH_TOKEN_ENV} (the Secret named by the infra output rayAuthSecret)"
            + (f"; only {', '.join(held)} is set" if held else "")
        )
    return (
        f"the Ray cluster refused the token (HTTP {status}): {AUTH_TOKEN_ENV} is not this cluster's token "
        "(was the infra stack's token replaced? the Ray pods and the submitter must read the same Secret)"
    )


def probe_version(address: str) -> str:
    """One GET /api/version; the head's session name. Raises OSError (or RuntimeError for a non-Ray answer) unless
    the Jobs API answers."""
    request = urllib.request.Request(f"{address}/api/version", headers=auth_headers())
    with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as resp:
        body = json.loads(resp.read().decode("utf-8", "replace") or "{}")
    if "ray_version" not in body:
        raise RuntimeError(f"status code 503: {address}/api/version answered without a ray_version")
    return str(body.get("session_name") or "")


def make_client(address: str) -> JobSubmissionClient:
    """A JobSubmissionClient whose HTTP requests all carry a timeout (Ray's own client sets none)."""
    from ray.job_submission import JobSubmissionClient

    class TimedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
            return super()._do_request(method, endpoint, **kwargs)

    return TimedClient(address)


def connect(address: str, outage: Outage) -> JobSubmissionClient:
    def attempt() -> JobSubmissionClient:
        try:
            probe_version(address)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):  # a definite answer: waiting would not change it
                raise AuthError(auth_refusal(exc.code)) from None
            # an HTTP answer, but not the Jobs API (yet): keep waiting
            raise RuntimeError(f"status code 503: {address}/api/version answered HTTP {exc.code}") from None
        except ValueError as exc:  # not JSON
            raise RuntimeError(f"status code 503: {address}/api/version answered non-JSON ({exc})") from None
        return make_client(address)

    return outage.call(attempt, "waiting for the Jobs API")


class HeadIdentity:
    """Which head the submitter's jobs live on, to tell a head restart from a deleted job record.

    The signal is the head's Ray session name (``session_name`` of ``GET /api/version``). Ray names the session
    when the head starts (``session_<start time to the microsecond>_<pid>``). A head that restarts without GCS fault
    tolerance starts a new session with an empty job table; with GCS fault tolerance (external Redis) it reads both
    its session name and its job table back. So the name changes exactly when the job table may have been lost, and
    stays the same as long as the head holding the table runs: a job missing under an unchanged session was removed
    from the table (``ray job delete``), not lost. An outage seen by the submitter is no such signal: a head can
    restart between two polls unseen, and a network blip proves no restart."""

    def __init__(self, address: str, outage: Outage) -> None:
        self.address = address
        self._outage = outage
        self.session = self.current()

    def current(self) -> str:
        return self._outage.call(lambda: probe_version(self.address), "asking the head's session")

    def check_lost(self, submission_id: str) -> NoReturn:
        """The job is gone: raise HeadRestartedError when the head's session changed since the job was seen, else
        VanishedError (its record was deleted while the head stayed up)."""
        now = self.current()
        if now != self.session:
            before, self.session = self.session, now
            raise HeadRestartedError(submission_id, before, now)
        raise VanishedError(
            f"job {submission_id} no longer exists on the Ray cluster, and the head did not restart (its session "
            f"{now or '(unnamed)'} is the one the job ran on): the job's record was deleted (`ray job delete`) while "
            "the head stayed up, so its outcome is unknown. Run the step again with a new run name, or replace the "
            "Job to submit it again"
        )


class HeadRestartedError(Exception):
    """The job was lost with the job table of a head that restarted: not a final failure (see run)."""

    def __init__(self, submission_id: str, before: str, after: str) -> None:
        super().__init__(f"job {submission_id} was lost in a Ray head restart (session {before} -> {after})")
        self.submission_id, self.before, self.after = submission_id, before, after


def lookup(client: JobSubmissionClient, submission_id: str) -> JobDetails | None:
    """The job with this submission id, or None if Ray has no such job."""
    try:
        info = client.get_job_info(submission_id)
    except RuntimeError as exc:
        if is_not_found(exc) and not is_transient(exc):
            return None
        raise
    if info.submission_id != submission_id:  # matched a driver job id, not our submission id
        return None
    return info


# ---------------------------------------------------------------------------------------------------------------
# Following a job


class LogFollower:
    """Streams a job's log to stdout through the websocket tail; reopening the stream never repeats text."""

    def __init__(self, client: JobSubmissionClient, submission_id: str, out: Output) -> None:
        self._client = client
        self._id = submission_id
        self._out = out
        self.written = 0  # characters of the log already written
        self.complete = False  # the stream ended by itself after the job finished

    def write_from(self, offset: int, chunk: str) -> None:
        """``chunk`` sits at ``offset`` in the log; write only the part beyond what was written."""
        end = offset + len(chunk)
        if end > self.written:
            self._out.log(chunk[max(0, self.written - offset) :])
            self.written = end

    async def follow_once(self) -> None:
        offset = 0
        async for chunk in self._client.tail_job_logs(self._id):
            self.write_from(offset, chunk)
            offset += len(chunk)

    async def run(self) -> None:
        """Keep the stream open until cancelled; returns when the stream ends by itself."""
        delay = BACKOFF_FIRST_S
        warned = False
        while True:
            try:
                await self.follow_once()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not warned:
                    self._out.say(f"log stream interrupted ({short(exc)}); reopening it")
                    warned = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def catch_up(self, full_log: str) -> None:
        self.write_from(0, full_log)


async def watch(
    client: JobSubmissionClient, submission_id: str, outage: Outage, out: Output, head: HeadIdentity
) -> JobDetails:
    """Stream logs and poll the status until the job reaches a final status; return its final details. A job that
    disappears raises HeadRestartedError or VanishedError (HeadIdentity.check_lost)."""
    follower = LogFollower(client, submission_id, out)
    tail: asyncio.Task[None] = asyncio.create_task(follower.run())
    try:
        while True:
            info = await asyncio.to_thread(outage.call, lambda: lookup(client, submission_id), "polling job status")
            if info is None:
                await asyncio.to_thread(head.check_lost, submission_id)
            if info.status.is_terminal():
                break
            if tail.done():  # the stream closed while the job still runs: reopen it (replay is skipped)
                tail = asyncio.create_task(follower.run())
                await asyncio.sleep(STATUS_POLL_S)
            else:  # wake early when the stream ends, which it does once the job has finished
                await asyncio.wait([tail], timeout=STATUS_POLL_S)

        if not tail.done():
            await asyncio.wait([tail], timeout=LOG_DRAIN_S)
        # A websocket that closes early ends the stream just like the job's end does, without an error, so the
        # stream alone cannot tell whether it delivered everything: compare with the whole log once.
        try:
            full = await asyncio.to_thread(client.get_job_logs, submission_id)
        except Exception as exc:
            out.say(f"could not check the end of the log ({short(exc)})")
        else:
            follower.catch_up(full)
        return info
    finally:
        tail.cancel()


# ---------------------------------------------------------------------------------------------------------------
# Attempts


def attempt_id(submission_id: str, attempt: int) -> str:
    """Attempt 0 runs under the submission id itself, attempt k > 0 under ``ID-r<k>``."""
    return submission_id if attempt == 0 else f"{submission_id}-r{attempt}"


class Current:
    """The attempt id the submitter works on; the SIGTERM handler stops this one when the run is deleted."""

    def __init__(self, submission_id: str) -> None:
        self.id = submission_id


def check_command(info: JobDetails, attempt: str, entrypoint: str) -> None:
    if getattr(info, "entrypoint", entrypoint) != entrypoint:
        # Following (or skipping) the old job would report a run this command never made.
        raise ConflictError(
            f"job {attempt} already exists with a different command ({short_text(info.entrypoint)}). A changed "
            f"run needs a new submission id (a new run name), or `ray job delete {attempt}` to discard the old one"
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
) -> bool:
    """Submit one attempt. True once Ray has it (ours, or a concurrent submitter's); False when unknown (retry)."""
    out.say(f"submitting job {aid}: {entrypoint}")
    if runtime_env is not None:
        out.say(f"runtime env: {describe_runtime_env(runtime_env)}")
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
) -> tuple[JobDetails, bool]:
    """Submit attempt ``aid`` unless Ray has it (``info``), or attach to it; return its final details and whether
    it had finished before this submitter came."""
    attached = False  # True once this process submitted the job or found it unfinished
    while True:
        if info is None:
            attached = submit(client, aid, entrypoint, runtime_env, outage, out) or attached
            info = outage.call(lambda: lookup(client, aid), "looking up the job")
            continue
        check_command(info, aid, entrypoint)
        if info.status.is_terminal() and not attached:
            return info, True
        if not attached:
            out.say(f"job {aid} exists and is {info.status}; attaching to it instead of submitting again")
        out.say(f"streaming the logs of job {aid}")
        return asyncio.run(watch(client, aid, outage, out, head)), False


# ---------------------------------------------------------------------------------------------------------------
# Step outcome records (--record)

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


def check_record(record: dict[str, Any], path: str, submission_id: str, entrypoint: str) -> None:
    if record["submission_id"] != submission_id or record["command"] != entrypoint:
        raise ConflictError(
            f"the step record {path} says {record['submission_id']} SUCCEEDED with another command "
            f"({short_text(record['command'])}). A changed run needs a new submission id (a new run name); to run "
            f"this step again under its id, remove {path}"
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


def record_success(path: str, submission_id: str, job: str, entrypoint: str, session: str, out: Output) -> None:
    record = {
        "submission_id": submission_id,
        "job": job,
        "status": "SUCCEEDED",
        "command": entrypoint,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ray_session": session,
    }
    try:
        write_record(path, record)
    except OSError as exc:
        # The step did succeed: report it, but say that a rerun would not know.
        out.say(f"could not write the step record {path} ({short(exc)}); a rerun will ask Ray instead")
    else:
        out.say(f"recorded the outcome in {path}")


# ---------------------------------------------------------------------------------------------------------------
# Main flow


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


def lost_advice(submission_id: str, attempt: str, max_retries: int, max_resubmits: int) -> str:
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
        "with a new run name."
    )


def first_line(message: str | None) -> str:
    """Ray's failure message ends with the last log lines, which were streamed already: keep its first clause."""
    if not message:
        return ""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line.split(", last available logs")[0].rstrip(":")


def failure_text(info: JobDetails) -> str:
    return f" (driver exit code {info.driver_exit_code})" if info.driver_exit_code is not None else ""


def outcome(info: JobDetails, attempt: str, out: Output, earlier: bool, advice: str = "") -> int:
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
        out.say(retry_advice(attempt))
        out.say(f"job {attempt} STOPPED{when}")
        return EXIT_STOPPED
    out.say(advice or retry_advice(attempt))
    out.say(f"job {attempt} FAILED{when}{failure_text(info)}")
    return EXIT_FAILED


def run(
    args: argparse.Namespace,
    entrypoint_words: list[str],
    runtime_env: dict[str, Any] | None,
    out: Output,
    current: Current,
) -> int:
    from ray.job_submission import JobStatus

    sid = args.submission_id
    max_retries = args.max_retries
    entrypoint = shlex.join(entrypoint_words)
    # The record comes first: it outlives the head's job table (and a head that is down), and it is the only
    # trace of a step that succeeded on a head which has restarted since.
    record = read_record(args.record) if args.record else None
    if record is not None:
        check_record(record, args.record, sid, entrypoint)
        current.id = record["job"]
        out.say(
            f"the step record {args.record} says job {record['job']} SUCCEEDED ({record.get('recorded_at', '')}); "
            "nothing was run again"
        )
        out.say(f"job {record['job']} SUCCEEDED")
        return EXIT_SUCCEEDED
    outage = Outage(args.connect_timeout, args.address, out)

    out.say(f"connecting to the Ray Jobs API at {args.address} (waiting up to {args.connect_timeout:g} s)")
    client = connect(args.address, outage)
    head = HeadIdentity(args.address, outage)

    attempt, info = latest_attempt(client, sid, entrypoint, outage, max_retries)
    if attempt:
        out.say(f"{attempt_id(sid, attempt)} is the latest attempt of {sid} on the cluster; continuing from it")
    resubmits = 0
    while True:
        aid = current.id = attempt_id(sid, attempt)
        try:
            final, earlier = settle(client, aid, entrypoint, runtime_env, outage, out, info, head)
        except HeadRestartedError as lost:
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
                raise LostError(lost_advice(sid, aid, max_retries, args.max_resubmits)) from None
            info = outage.call(functools.partial(lookup, client, attempt_id(sid, attempt)), "looking up the job")
            continue
        if final.status == JobStatus.SUCCEEDED and args.record:
            record_success(args.record, sid, aid, entrypoint, head.session, out)
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
        advice = retries_spent_advice(sid, max_retries) if max_retries else ""
        return outcome(final, aid, out, earlier, advice)


# ---------------------------------------------------------------------------------------------------------------
# Stopping the job when the run is deleted


class K8sRun:
    """Where the submitter's own Job and the run's marker ConfigMap live, and how to ask the API about them."""

    def __init__(
        self, namespace: str, job: str, marker: str, api: str | None = None, sa_dir: str = SERVICE_ACCOUNT_DIR
    ):
        if api is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            api = f"https://{'[' + host + ']' if ':' in host else host}:{port}" if host else ""
        self.api = api.rstrip("/")
        self.namespace, self.job, self.marker, self.sa_dir = namespace, job, marker, sa_dir

    def get(self, path: str) -> dict[str, Any] | None:
        """One GET; None when the object does not exist (404). Other HTTP errors and timeouts raise."""
        if not self.api:
            raise OSError("no Kubernetes API address (KUBERNETES_SERVICE_HOST is not set)")
        with open(os.path.join(self.sa_dir, "token"), encoding="utf-8") as token_file:
            token = token_file.read().strip()
        request = urllib.request.Request(
            f"{self.api}{path}", headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
        )
        context = None
        if self.api.startswith("https://"):
            import ssl

            ca = os.path.join(self.sa_dir, "ca.crt")
            context = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        try:
            with urllib.request.urlopen(request, timeout=K8S_TIMEOUT_S, context=context) as resp:
                return dict(json.loads(resp.read().decode("utf-8")))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def run_deleted(self) -> tuple[bool, str]:
        """(True, why) only when both the Job and the marker are gone or being deleted; any doubt is False."""

        def deleting(obj: dict[str, Any] | None) -> bool:
            return obj is None or bool((obj.get("metadata") or {}).get("deletionTimestamp"))

        try:
            job = self.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{self.job}")
            if not deleting(job):
                return False, f"Job {self.namespace}/{self.job} is not being deleted (the pod was evicted or moved)"
            marker = self.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{self.marker}")
            if not deleting(marker):
                return False, (
                    f"Job {self.job} is being deleted but the run marker ConfigMap {self.marker} stays (the Job is "
                    "being replaced, or was deleted by hand)"
                )
        except Exception as exc:
            return False, f"could not ask the Kubernetes API whether the run is deleted ({short(exc)})"
        return True, f"Job {self.job} and the run marker {self.marker} are being deleted: the run is being destroyed"


def stop_and_wait(address: str, attempt: str, timeout_s: float, out: Output) -> bool:
    """Stop the job and wait until Ray reports a final status; True when it has one within the timeout."""
    deadline = time.monotonic() + timeout_s
    asked = False
    try:
        client = make_client(address)
        while time.monotonic() < deadline:
            info = lookup(client, attempt)
            if info is None:
                out.say(f"job {attempt} does not exist; nothing to stop")
                return True
            if info.status.is_terminal():
                out.say(f"job {attempt} is {info.status}")
                return True
            if not asked:
                client.stop_job(attempt)
                out.say(f"asked Ray to stop job {attempt}; waiting up to {timeout_s:g} s for STOPPED")
                asked = True
            time.sleep(0.5)
    except Exception as exc:
        out.say(f"could not stop job {attempt} ({short(exc)}); stop it with `ray job stop {attempt}`")
        return False
    out.say(f"job {attempt} did not stop within {timeout_s:g} s; check it with `ray job status {attempt}`")
    return False


def install_signal_handlers(
    out: Output, current: Current, k8s: K8sRun | None = None, address: str = "", stop_timeout_s: float = 0.0
) -> None:
    """Leave on SIGTERM/SIGINT. The Ray job is stopped first only on SIGTERM when ``k8s`` says the run is
    deleted."""

    def leave(signum: int, _frame: object) -> NoReturn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one decision per pod; kubelet's SIGKILL ends any overrun
        name = signal.Signals(signum).name
        try:
            if signum == signal.SIGTERM and k8s is not None:
                deleted, why = k8s.run_deleted()
                out.say(f"received {name}; {why}")
                if deleted:
                    stop_and_wait(address, current.id, stop_timeout_s, out)
                    out.say(f"exiting after stopping Ray job {current.id}")
                    os._exit(EXIT_SIGTERM)
            out.say(
                f"received {name}; exiting WITHOUT stopping Ray job {current.id} (run again with the same "
                "--submission-id to re-attach, or `ray job stop` it)"
            )
        finally:
            os._exit(EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)


def main(argv: Sequence[str] | None = None) -> int:
    args, entrypoint, runtime_env = parse_args(sys.argv[1:] if argv is None else argv)
    out = Output(secret_values(runtime_env))
    current = Current(args.submission_id)
    k8s = None
    if args.k8s_job:
        k8s = K8sRun(args.k8s_namespace, args.k8s_job, args.k8s_run_marker, args.k8s_api, args.k8s_token_dir)
    install_signal_handlers(out, current, k8s, args.address, args.stop_timeout)
    try:
        import ray.job_submission  # noqa: F401  (fail early and clearly if Ray's client is missing)
    except ImportError as exc:
        out.say(f"Ray's job submission client is not importable ({exc}); install ray[default]")
        return EXIT_USAGE
    try:
        return run(args, entrypoint, runtime_env, out, current)
    except EndedError as exc:
        out.say(f"{exc}")
        out.say(f"job {current.id}" + exc.final.format(address=args.address))
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
