"""Exit codes of ray_submit.py and the errors that end a run without a job outcome of its own."""

from __future__ import annotations

import signal

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STOPPED = 3
EXIT_UNREACHABLE = 4
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM


class UsageError(Exception):
    """Bad command line; exit code 2."""


class EndedError(Exception):
    """The run ends without a job outcome: `exit_code` and `final` (the last line, after the job's id) say how."""

    exit_code = EXIT_FAILED
    final = ""


class ConflictError(EndedError):
    """The submission id belongs to a job with another command; exit code 2, like a usage error. ``old_command``:
    that other command, where known (an extension of the run may still go on from it)."""

    exit_code = EXIT_USAGE
    final = ": not run (the id is taken by another command)"

    def __init__(self, message: str, old_command: str = "") -> None:
        super().__init__(message)
        self.old_command = old_command


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


class UnwritableRecordsError(EndedError):
    """The step records' directory cannot be written: no step runs without its record (records.py)."""

    exit_code = EXIT_USAGE
    final = ": not run (its step record cannot be written)"
