"""Telling a Ray head restart from a deleted job record, by the head's session name.

A head restarted without GCS fault tolerance (a head pod recreated after an OOM kill or a node repair) comes back at
the same address with an empty job table, so the job being followed disappears. The outage itself is waited out as
any other (``--connect-timeout``). A job that is gone is then told apart by the head's session name
(``GET /api/version``), which a head gets anew each time it starts without fault tolerance (see HeadIdentity):

* The session changed: the job was lost with the old head, which is no outcome of the job's own (HeadRestartedError;
  attempts.run retries it, or submits the same id again, at most ``--max-resubmits`` times; past both the run ends
  with exit code 1 and ``FAILED (lost in a Ray head restart, no retries left)``).
* The session is the same: someone deleted the job's record (``ray job delete``) while the head stayed up. The
  outcome is unknown, and the submitter ends with exit code 1 and
  ``FAILED (vanished: its record was deleted while the Ray head stayed up)`` (VanishedError).
"""

from __future__ import annotations

from typing import NoReturn

from submitter.errors import VanishedError
from submitter.ray_api import Outage, probe_version


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
