"""Talking to the Ray Jobs API: the client with per-request timeouts, the version probe, job lookups, and the
outage window that tells "not answering for now" from "not answering for longer than --connect-timeout" (exit 4).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from submitter.errors import AuthError, UnreachableError
from submitter.output import Output, short
from submitter.ray_auth import auth_headers, auth_refusal

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient


# Per-request limits for every HTTP call (connect, read), so that a silently vanished head cannot hang us.
REQUEST_TIMEOUT_S = (10.0, 60.0)
PROBE_TIMEOUT_S = 5.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0

T = TypeVar("T")


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


def jobs_api(address: str, method: str, path: str, timeout_s: float, body: dict[str, Any] | None = None) -> Any:
    """One request to the Jobs API with its own time limit (connect and answer); the JSON answer, or None for 404
    (no such job). Another HTTP error keeps Ray's answer as ``ray_text`` (why it refused)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {**auth_headers(), **({"Content-Type": "application/json"} if data else {})}
    request = urllib.request.Request(f"{address}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8", "replace") or "{}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        exc.ray_text = exc.read().decode("utf-8", "replace")  # type: ignore[attr-defined]
        raise


# Job statuses of a job that has not ended (Ray's JobStatus values).
LIVE_STATUSES = ("PENDING", "RUNNING")
LIST_TIMEOUT_S = 10.0


def live_submission_ids(address: str) -> list[str]:
    """Submission ids of the jobs Ray lists as PENDING or RUNNING (one GET /api/jobs/); raises when it cannot ask."""
    jobs = jobs_api(address, "GET", "/api/jobs/", LIST_TIMEOUT_S) or []
    return [str(job.get("submission_id") or "") for job in jobs if str(job.get("status")) in LIVE_STATUSES]


def is_job_of(job_id: str, submission_id: str) -> bool:
    """A job of the step with this submission id: the id itself, a retry (-rK), a rerun (-rerunN) or an extension
    (-stepsN), and their retries."""
    return job_id == submission_id or job_id.startswith((f"{submission_id}-r", f"{submission_id}-steps"))


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
