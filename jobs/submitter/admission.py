"""Several runs on one Ray cluster: each is admitted by the GPU nodes it needs, first come first served.

The runs of a cluster share its Lustre file system, so their bookkeeping lives there, in one folder
(``<mount>/.run-admission``), with the mechanism that already keeps one submitter per run (run_lock.RunLock):

* ``<run>.json``, one per run: its GPU nodes, the submission ids of its steps, when it queued and, once admitted,
  when. The pipeline's admission holder (``admission.py hold``) renews it (its modification time) while the
  submitter pod lives, and marks it released when the pipeline ends.
* ``admission.lock``: a RunLock held for each decision, so that two runs never decide at once on the same picture.

A run counts (admitted or queued) while its holder renews its file, or, once the holder is gone (its pod deleted,
evicted or lost with its node), while Ray still lists one of its jobs as PENDING or RUNNING: a run's place follows
its training, not its submitter pod. Everything else is dropped at the next decision, so a deleted Job's place is
free at once (its pod releases it on SIGTERM, after stopping its Ray job) or, for a pod lost without a word, after
the ttl. A run is admitted when it is the first in the queue (by the time it queued) and its nodes fit beside those
of the admitted runs; it never times out while it waits.

The Ray autoscaler's request (``ray.autoscaler.sdk.request_resources``) is one cluster-wide value that each call
replaces. Under the admission lock the worker waits (wait_for_workers.py) set it to the GPU nodes of all admitted
runs while any of them waits for workers, and withdraw it when the last one stops waiting: never one run's request
in place of another's.

Why files on Lustre rather than Kubernetes Leases or Kueue: every pod that needs the bookkeeping (the submitter
pods, and the train step's own wait on the Ray head) already mounts the run's Lustre and runs the run lock there,
and none needs write access to the namespace's Leases (a Role that lets every run's pod update every other run's
Lease) or a queueing controller installed in the cluster (Kueue would admit the launcher Jobs by a quota in GPU-node
units of its own, which knows nothing of the Ray autoscaler's request, still to be summed by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from submitter.output import Output, short
from submitter.ray_api import is_job_of, live_submission_ids
from submitter.records import pod_name, utc_now
from submitter.run_lock import RunLock

ADMISSION_DIR = ".run-admission"  # under the Lustre mount, shared by every run of the cluster
MUTEX_NAME = "admission.lock"
DEFAULT_TTL_S = 60.0
# How often a queued run says again why it waits, when nothing changed.
REMIND_S = 300.0


@dataclass
class Entry:
    run: str
    nodes: int
    submission_ids: list[str]
    holder: str
    queued_at: str
    admitted_at: str | None = None
    waiting: bool = False  # a worker wait of this run wants the autoscaler's request
    released: bool = False  # its holder ended: only a live Ray job keeps it
    age_s: float = 0.0  # since its holder last renewed it

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run,
            "nodes": self.nodes,
            "submission_ids": self.submission_ids,
            "holder": self.holder,
            "queued_at": self.queued_at,
            "admitted_at": self.admitted_at,
            "waiting": self.waiting,
            "released": self.released,
        }

    def owns(self, submission_id: str) -> bool:
        """A job of this run: a job of one of its steps (ray_api.is_job_of)."""
        return any(is_job_of(submission_id, sid) for sid in self.submission_ids)


def entry_path(directory: str, run: str) -> str:
    return os.path.join(directory, f"{run}.json")


def read_entries(directory: str) -> list[Entry]:
    entries = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as entry_file:
                raw = json.load(entry_file)
            age = time.time() - os.stat(path).st_mtime
            entries.append(
                Entry(
                    run=str(raw["run"]),
                    nodes=int(raw["nodes"]),
                    submission_ids=[str(s) for s in raw["submission_ids"]],
                    holder=str(raw["holder"]),
                    queued_at=str(raw["queued_at"]),
                    admitted_at=raw.get("admitted_at"),
                    waiting=bool(raw.get("waiting")),
                    released=bool(raw.get("released")),
                    age_s=age,
                )
            )
        except FileNotFoundError:
            continue  # dropped meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written (entries are renamed into place) or foreign: not a run's entry
    return entries


def write_entry(directory: str, entry: Entry) -> None:
    """Whole or not at all: a temporary file renamed over the entry (which also renews it)."""
    path = entry_path(directory, entry.run)
    temporary = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(temporary, "w", encoding="utf-8") as entry_file:
        json.dump(entry.to_json(), entry_file)
    os.replace(temporary, path)


def live_ray_jobs(address: str) -> list[str] | None:
    """Submission ids Ray lists as PENDING or RUNNING; None when the Jobs API cannot be asked."""
    try:
        return live_submission_ids(address)
    except Exception:
        return None


def counted(entries: list[Entry], ttl_s: float, live_jobs: Iterable[str] | None) -> tuple[list[Entry], list[Entry]]:
    """(the entries that count, those to drop). An entry counts while its holder renews it, else while Ray lists a
    live job of its run; when Ray cannot be asked, a silent entry counts (a place is never freed on a guess)."""
    keep: list[Entry] = []
    drop: list[Entry] = []
    jobs = list(live_jobs) if live_jobs is not None else None
    for entry in entries:
        renewed = not entry.released and entry.age_s <= ttl_s
        training = jobs is None or any(entry.owns(sid) for sid in jobs)
        (keep if renewed or training else drop).append(entry)
    return keep, drop


def admitted_nodes(entries: list[Entry]) -> int:
    return sum(e.nodes for e in entries if e.admitted_at)


def queue(entries: list[Entry]) -> list[Entry]:
    return sorted((e for e in entries if not e.admitted_at), key=lambda e: (e.queued_at, e.run))


def why_queued(entry: Entry, entries: list[Entry], capacity: int) -> str:
    """One line: whom the run waits behind and what it needs."""
    free = capacity - admitted_nodes(entries)
    ahead = [e for e in queue(entries) if (e.queued_at, e.run) < (entry.queued_at, entry.run)]
    running = [e for e in entries if e.admitted_at]
    behind = ahead[0] if ahead else (running[0] if running else None)
    listed = ", ".join(f"{e.run} ({e.nodes})" for e in running) or "none"
    return (
        f"queued behind {behind.run if behind else '(nothing)'}: needs {entry.nodes} GPU node(s), {max(free, 0)} free "
        f"of {capacity} (admitted: {listed}; queued ahead: {len(ahead)})"
    )


class Admission:
    """One run's place in the cluster's admission folder."""

    def __init__(
        self,
        directory: str,
        run: str,
        out: Output,
        address: str,
        ttl_s: float = DEFAULT_TTL_S,
        live_jobs: Callable[[str], list[str] | None] = live_ray_jobs,
    ) -> None:
        self.directory, self.run, self.out, self.address, self.ttl_s = directory, run, out, address, ttl_s
        self._live_jobs = live_jobs
        self.holder = f"{pod_name()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"

    @contextlib.contextmanager
    def decision(self) -> Iterator[list[Entry]]:
        """Under the admission lock: the entries that count (the others removed)."""
        os.makedirs(self.directory, exist_ok=True)
        mutex = RunLock(
            os.path.join(self.directory, MUTEX_NAME), self.ttl_s, self.out, self.holder, "the admission lock"
        )
        mutex.acquire(wait_s=float("inf"))
        try:
            entries = read_entries(self.directory)
            silent = [e for e in entries if e.released or e.age_s > self.ttl_s]
            jobs = self._live_jobs(self.address) if silent else []
            keep, drop = counted(entries, self.ttl_s, jobs)
            for entry in drop:
                if entry.run != self.run:
                    self.out.say(f"{entry.run} no longer holds GPU nodes (its submitter ended and no job of it runs)")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry_path(self.directory, entry.run))
            yield keep
        finally:
            mutex.release()

    def mine(self, entries: list[Entry]) -> Entry | None:
        return next((e for e in entries if e.run == self.run), None)

    def join(self, nodes: int, submission_ids: list[str]) -> None:
        """Queue the run (or take over its entry: a new pod of a run keeps its place and its admission)."""
        with self.decision() as entries:
            entry = self.mine(entries)
            if entry is None:
                entry = Entry(self.run, nodes, submission_ids, self.holder, utc_now())
            else:
                entry.nodes, entry.submission_ids, entry.holder = nodes, submission_ids, self.holder
                entry.released = False
            write_entry(self.directory, entry)

    def try_admit(self, capacity: int) -> tuple[bool, str]:
        """(admitted, why not). First in the queue and fitting beside the admitted runs: admitted."""
        with self.decision() as entries:
            entry = self.mine(entries)
            if entry is None:
                raise RuntimeError(f"the admission entry of {self.run} disappeared from {self.directory}")
            if entry.admitted_at:
                return True, ""
            first = queue(entries)[0]
            if first.run == entry.run and admitted_nodes(entries) + entry.nodes <= capacity:
                entry.admitted_at = utc_now()
                write_entry(self.directory, entry)
                return True, ""
            return False, why_queued(entry, entries, capacity)

    def renew(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(entry_path(self.directory, self.run))

    def release(self) -> None:
        """The holder ends: the entry now counts only while a Ray job of the run is live."""
        with self.decision() as entries:
            entry = self.mine(entries)
            if entry is not None and entry.holder == self.holder:
                entry.released, entry.waiting = True, False
                write_entry(self.directory, entry)

    def set_waiting(
        self, waiting: bool, request: Callable[[list[dict[str, int]]], None], gpus_per_node: int
    ) -> tuple[int, bool]:
        """Mark this run's worker wait as wanting the autoscaler request (or not), then set the request to what the
        admitted runs need while any of them waits, or withdraw it; under the lock, so requests never cross.
        (GPU nodes of the admitted runs, whether the request stands.)"""
        with self.decision() as entries:
            entry = self.mine(entries)
            changed = entry is not None and entry.waiting != waiting
            if entry is not None:
                entry.waiting = waiting
            total = admitted_nodes(entries)
            wanted = any(e.waiting for e in entries if e.admitted_at)
            request([{"GPU": gpus_per_node}] * total if wanted else [])
            if changed and entry is not None:  # only once the cluster has it: a failed request changes nothing
                write_entry(self.directory, entry)
            return total, wanted

    def needed_nodes(self) -> int:
        """GPU nodes of every admitted run (this one's included): what a worker wait of this run waits for."""
        with self.decision() as entries:
            return admitted_nodes(entries)


def hold(
    admission: Admission,
    nodes: int,
    submission_ids: list[str],
    capacity: int,
    ready_file: str,
    poll_s: float,
    stop: threading.Event,
) -> bool:
    """Queue, wait for admission (saying why while queued), write ``ready_file``, then renew the entry until
    ``stop``; release it on the way out. False when stopped before admission."""
    out = admission.out
    admission.join(nodes, submission_ids)
    said, said_at = "", 0.0
    try:
        while not stop.is_set():
            admitted, why = admission.try_admit(capacity)
            if admitted:
                break
            if why != said or time.monotonic() - said_at >= REMIND_S:
                out.say(why)
                said, said_at = why, time.monotonic()
            stop.wait(poll_s)
            admission.renew()
        else:
            return False
        out.say(f"admitted: {admission.run} runs on {nodes} GPU node(s) of {capacity}")
        with open(ready_file, "w", encoding="utf-8") as ready:
            ready.write(utc_now())
        while not stop.wait(admission.ttl_s / 4):
            try:
                admission.renew()
            except OSError as exc:
                out.say(f"could not renew the admission of {admission.run} ({short(exc)}); trying again")
        return True
    finally:
        admission.release()


def status_lines(directory: str, capacity: int | None = None) -> list[str]:
    """What `admission.py status` prints: each run with its nodes and state, admitted first, then the queue."""
    entries = read_entries(directory)
    lines = []
    for entry in sorted(entries, key=lambda e: (e.admitted_at is None, e.admitted_at or e.queued_at, e.run)):
        state = f"admitted {entry.admitted_at}" if entry.admitted_at else f"queued since {entry.queued_at}"
        holder = "released" if entry.released else f"holder {entry.holder}, renewed {entry.age_s:.0f} s ago"
        lines.append(f"{entry.run}: {entry.nodes} GPU node(s), {state} ({holder})")
    if capacity is not None:
        lines.append(f"{admitted_nodes(entries)} of {capacity} GPU nodes admitted")
    return lines or ["no run holds or waits for GPU nodes"]
