"""One submitter per run: a lock file beside the run's step records (``<record dir>/submitter.lock``, on Lustre in
the pipeline), held while a submitter works and renewed by it.

Every submitter of a run (each step's, one after another, and any other pod of the same Job or a second Job made by
hand) takes the lock before it asks Ray anything. The holder renews it (its modification time) every
``ttl / 4`` seconds from a background thread and removes it when it exits. A lock not renewed for ``ttl`` seconds
(its holder's pod was lost with its node, or is paused or cut off) is taken over: renamed aside, which only one
contender can do, then created anew. A second submitter that finds a live lock waits, saying who holds the run, and
gives up after ``--connect-timeout`` seconds (exit 4, so a Job's pod is retried). A holder that finds its lock taken
over (it was paused past the ttl) exits at once (exit 4) and submits nothing more: two submitters never run the same
run's steps at the same time. The lock file is created with O_EXCL, atomic on Lustre as on a local file system.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid

from submitter.errors import EXIT_UNREACHABLE, EndedError
from submitter.output import Output, short
from submitter.records import pod_name, utc_now

LOCK_NAME = "submitter.lock"
DEFAULT_LOCK_TTL_S = 60.0


class RunHeldError(EndedError):
    """Another submitter holds the run (it waited too long for it, or lost it to one that took over)."""

    exit_code = EXIT_UNREACHABLE
    final = ": not run here (another submitter holds the run)"


def lock_path(record_path: str) -> str:
    return os.path.join(os.path.dirname(record_path) or ".", LOCK_NAME)


class RunLock:
    def __init__(
        self, path: str, ttl_s: float, out: Output, holder: str | None = None, subject: str = "the run"
    ) -> None:
        self.path, self.ttl_s, self.out, self.subject = path, ttl_s, out, subject
        self.holder = holder or f"{pod_name()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"
        self.lost = threading.Event()
        self._released = threading.Event()

    def _read(self) -> tuple[str, float] | None:
        """(holder, seconds since last renewed) of the lock file, or None when there is none."""
        try:
            with open(self.path, encoding="utf-8") as lock_file:
                text = lock_file.read()
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None
        try:
            holder = str(json.loads(text)["holder"])
        except (ValueError, KeyError, TypeError):
            holder = "(unreadable lock)"  # a holder that died mid-write: its age decides, as any other's
        return holder, age

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as lock_file:
            json.dump({"holder": self.holder, "since": utc_now()}, lock_file)
        return True

    def acquire(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        said = ""
        while not self._create():
            found = self._read()
            if found is None:
                continue  # released between our create and read
            holder, age = found
            if age > self.ttl_s:
                aside = f"{self.path}.stale-{uuid.uuid4().hex[:8]}"
                with contextlib.suppress(FileNotFoundError):  # another contender moved it first
                    os.rename(self.path, aside)
                    os.unlink(aside)
                    self.out.say(
                        f"took over {self.subject} from {holder}, silent for {age:.0f} s (over {self.ttl_s:g} s)"
                    )
                continue
            if holder != said:
                self.out.say(
                    f"{self.subject} is held by another submitter, {holder} (renewed {age:.0f} s ago); waiting "
                    f"until it ends or is silent for {self.ttl_s:g} s"
                )
                said = holder
            if time.monotonic() > deadline:
                raise RunHeldError(
                    f"the run is still held by {holder} after {wait_s:g} s ({self.path}); a second submitter of the "
                    "same run does not start. If that submitter is gone, its lock expires by itself"
                )
            time.sleep(min(1.0, self.ttl_s / 4))
        threading.Thread(target=self._renew, name="run-lock", daemon=True).start()

    def holds(self) -> bool:
        found = self._read()
        return found is not None and found[0] == self.holder

    def check(self) -> None:
        """Raise RunHeldError when the lock was taken over (this submitter was silent past the ttl)."""
        if self.lost.is_set() or not self.holds():
            self.lost.set()
            raise RunHeldError(
                f"this submitter lost the run's lock ({self.path}) to another one while it was silent for over "
                f"{self.ttl_s:g} s; it submits nothing more"
            )

    def _renew(self) -> None:
        while not self._released.wait(self.ttl_s / 4):
            try:
                if not self.holds():
                    self.lost.set()
                    self.out.say(f"the run's lock {self.path} was taken over by another submitter; exiting")
                    os._exit(EXIT_UNREACHABLE)
                os.utime(self.path)
            except OSError as exc:
                self.out.say(f"could not renew the run's lock {self.path} ({short(exc)}); trying again")

    def release(self) -> None:
        if self._released.is_set():
            return
        self._released.set()
        with contextlib.suppress(OSError):
            if self.holds():
                os.unlink(self.path)
