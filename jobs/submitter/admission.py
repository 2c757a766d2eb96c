"""Several runs on one Ray cluster: Ray's own scheduler admits each run, by a place job in Ray's job table.

The head offers a custom resource, ``gpu_node``, one unit per GPU worker the cluster may have (the infra stack sets
it with RAY_OVERRIDE_RESOURCES on the head container). A run's place is a Ray job that only sleeps and asks for its
GPU nodes' worth of that resource (``entrypoint_resources``): Ray starts it once that many units are free, so
RUNNING is admitted and PENDING is queued, decided atomically by Ray's scheduler. No lock, no file, no clock: two
runs cannot both hold units that are not there, and a paused submitter loses nothing, because the place lives in
Ray, not in the submitter.

The place's submission id is ``<run>.place-<k>``; a second submitter of the same run finds it (or collides on the same
id, which Ray refuses atomically) and follows it instead of queueing again. The place ends when the pipeline ends,
when its launcher Job is deleted (the submitter pod's SIGTERM, told apart from an eviction as stop_on_delete does),
or when a person stops it; a new pipeline of the run (a replaced Job, a rerun) takes the next k. A head restart
without GCS fault tolerance empties Ray's job table: each live holder submits its place again, and Ray orders the
queue anew by who asks first. Queued runs wait for up to the head's job start timeout (RAY_JOB_START_TIMEOUT_SECONDS,
set by the infra stack); a place that Ray failed for it is submitted again as the next k, at the end of the queue.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from submitter.errors import EndedError
from submitter.output import Output, short
from submitter.ray_api import LIST_TIMEOUT_S, jobs_api

PLACE_RESOURCE = "gpu_node"  # the head's custom resource: one unit per GPU worker the cluster may have
PLACE_METADATA = "nemo-rl-gke-place"  # metadata key of a place job: its run's name
# ... and its GPU nodes, as Ray's job list does not show entrypoint_resources (what Ray holds the place to).
NODES_METADATA = "nemo-rl-gke-nodes"
# The place's own process: nothing but a sleep (on the head, the only node that offers the resource).
PLACE_ENTRYPOINT = "sleep infinity"
# How often a queued run says again why it waits, when nothing changed.
REMIND_S = 300.0
ENDED = ("STOPPED", "SUCCEEDED", "FAILED")
START_TIMEOUT_MARK = "failed to start within"  # Ray's message for a job that stayed PENDING past the start timeout


@dataclass(frozen=True)
class Place:
    submission_id: str
    run: str
    attempt: int
    nodes: int
    status: str
    start_time: int  # ms, Ray's own clock: the queue's order
    message: str = ""


def place_id(run: str, attempt: int) -> str:
    return f"{run}.place-{attempt}"


def _place(job: dict[str, Any]) -> Place | None:
    metadata = job.get("metadata") or {}
    run = metadata.get(PLACE_METADATA)
    sid = str(job.get("submission_id") or "")
    found = re.fullmatch(rf"{re.escape(str(run))}\.place-(\d+)", sid) if run else None
    if found is None:
        return None
    return Place(
        sid,
        str(run),
        int(found.group(1)),
        int(metadata.get(NODES_METADATA) or 0),
        str(job.get("status")),
        int(job.get("start_time") or 0),
        str(job.get("message") or ""),
    )


def list_places(address: str) -> list[Place]:
    """Every place job Ray knows (one GET /api/jobs/); raises when the Jobs API cannot be asked."""
    jobs = jobs_api(address, "GET", "/api/jobs/", LIST_TIMEOUT_S) or []
    return [place for place in map(_place, jobs) if place is not None]


def latest(places: list[Place], run: str) -> Place | None:
    mine = [p for p in places if p.run == run]
    return max(mine, key=lambda p: p.attempt) if mine else None


def admitted_nodes(places: list[Place]) -> int:
    """GPU nodes of the admitted runs (their RUNNING places)."""
    return sum(p.nodes for p in places if p.status == "RUNNING")


def admitted_nodes_at(address: str) -> int:
    return admitted_nodes(list_places(address))


def why_queued(mine: Place, places: list[Place], capacity: int | None) -> str:
    """One line: whom the run waits behind and what it needs, from Ray's job table."""
    running = [p for p in places if p.status == "RUNNING"]
    ahead = [p for p in places if p.status == "PENDING" and (p.start_time, p.run) < (mine.start_time, mine.run)]
    listed = ", ".join(f"{p.run} ({p.nodes})" for p in running) or "none"
    free = f", {max(capacity - admitted_nodes(places), 0)} free of {capacity}" if capacity else ""
    return (
        f"queued ({mine.submission_id} is PENDING in Ray): needs {mine.nodes} GPU node(s){free} (admitted: {listed}; "
        f"queued ahead: {len(ahead)})"
    )


def status_lines(address: str, capacity: int | None = None) -> list[str]:
    """What `admission.py status` prints: admitted runs first, then the queue in Ray's order."""
    live = [p for p in list_places(address) if p.status in ("RUNNING", "PENDING")]
    lines = [
        f"{p.run}: {p.nodes} GPU node(s), {'admitted' if p.status == 'RUNNING' else 'queued'} ({p.submission_id})"
        for p in sorted(live, key=lambda p: (p.status != "RUNNING", p.start_time, p.run))
    ]
    if capacity is not None:
        lines.append(f"{admitted_nodes(live)} of {capacity} GPU nodes admitted")
    return lines or ["no run holds or waits for GPU nodes"]


def _job(address: str, sid: str) -> dict[str, Any] | None:
    info = jobs_api(address, "GET", f"/api/jobs/{urllib.parse.quote(sid, safe='')}", LIST_TIMEOUT_S)
    return info if info is not None and info.get("submission_id") == sid else None


def submit_place(address: str, run: str, attempt: int, nodes: int) -> None:
    """Ask Ray for the run's place; a second submitter of the same id is refused by Ray and follows the first."""
    body = {
        "entrypoint": PLACE_ENTRYPOINT,
        "submission_id": place_id(run, attempt),
        "entrypoint_resources": {PLACE_RESOURCE: nodes},
        "metadata": {PLACE_METADATA: run, NODES_METADATA: str(nodes)},
    }
    try:
        jobs_api(address, "POST", "/api/jobs/", LIST_TIMEOUT_S, body)
    except Exception as exc:
        if "already exists" not in getattr(exc, "ray_text", ""):
            raise


class Holder:
    """A run's place in Ray's queue, held for the pipeline's whole life by the submitter pod (admission.py hold)."""

    def __init__(self, address: str, run: str, nodes: int, out: Output, capacity: int | None = None) -> None:
        self.address, self.run, self.nodes, self.out, self.capacity = address, run, nodes, out, capacity
        self.attempt: int | None = None

    @property
    def submission_id(self) -> str:
        return place_id(self.run, self.attempt or 0)

    def join(self) -> None:
        """Follow the run's live place, or ask for a new one after the last that ended."""
        newest = latest(list_places(self.address), self.run)
        if newest is not None and newest.status not in ENDED:
            self.attempt = newest.attempt
            self.out.say(f"following the run's place {newest.submission_id} ({newest.status})")
            return
        self.attempt = newest.attempt + 1 if newest is not None else 1
        submit_place(self.address, self.run, self.attempt, self.nodes)
        self.out.say(f"asked Ray for {self.nodes} GPU node(s) as {self.submission_id}")

    def look(self) -> tuple[str, str]:
        """(status, why queued) of the place now; a place Ray lost (its head restarted) or failed for the start
        timeout is asked for again."""
        info = _job(self.address, self.submission_id)
        if info is None:
            self.out.say(f"Ray no longer knows {self.submission_id} (the head restarted): asking for the place again")
            submit_place(self.address, self.run, self.attempt or 1, self.nodes)
            return "PENDING", ""
        status = str(info.get("status"))
        if status == "FAILED" and START_TIMEOUT_MARK in str(info.get("message") or ""):
            self.out.say(f"{self.submission_id} waited past the head's job start timeout; queueing again")
            self.attempt = (self.attempt or 0) + 1
            submit_place(self.address, self.run, self.attempt, self.nodes)
            return "PENDING", ""
        if status == "PENDING":
            places = list_places(self.address)
            mine = next((p for p in places if p.submission_id == self.submission_id), None)
            return status, why_queued(mine, places, self.capacity) if mine else ""
        return status, str(info.get("message") or "")

    def release(self, stop: Callable[[str, str, float, Output], bool], timeout_s: float) -> None:
        if self.attempt is None:
            return
        info = _job(self.address, self.submission_id)
        if info is not None and info.get("status") == "PENDING":
            # Ray hands a stop to the place's process, which a queued place does not have yet: it ends the moment
            # its turn comes, holding nothing meanwhile. Waiting for that would outlast the pod's grace period.
            path = f"/api/jobs/{urllib.parse.quote(self.submission_id, safe='')}/stop"
            jobs_api(self.address, "POST", path, LIST_TIMEOUT_S)
            self.out.say(f"asked Ray to stop the queued {self.submission_id}; it ends when its turn comes")
            return
        stop(self.address, self.submission_id, timeout_s, self.out)


def hold(
    holder: Holder, ready_file: str, poll_s: float, stop: threading.Event, sleep: Callable[[float], Any] | None = None
) -> str:
    """Queue, wait for admission (saying why while queued), write ``ready_file``, then follow the place until ``stop``.
    Returns, when stopped, RUNNING (admitted) or PENDING (queued); otherwise the status the place ended with."""
    out = holder.out
    wait = sleep or stop.wait
    holder.join()
    said, said_at, admitted = "", 0.0, False
    while not stop.is_set():
        try:
            status, why = holder.look()
        except Exception as exc:  # the head restarting: its job table tells once it answers
            status, why = "UNKNOWN", f"the Ray Jobs API does not answer ({short(exc)}); asking again"
        if status == "RUNNING" and not admitted:
            admitted = True
            out.say(f"admitted: {holder.run} runs on {holder.nodes} GPU node(s) ({holder.submission_id} RUNNING)")
            with open(ready_file, "w", encoding="utf-8") as ready:
                ready.write(holder.submission_id)
        elif status in ENDED:
            out.say(f"the run's place {holder.submission_id} ended {status} {why}".rstrip())
            return status
        elif status == "PENDING" and admitted:
            admitted = False  # lost with a head restart: the steps wait for the place again (ray_submit.py)
            remove_ready(ready_file)
        if status != "RUNNING" and why and (why != said or time.monotonic() - said_at >= REMIND_S):
            out.say(why)
            said, said_at = why, time.monotonic()
        wait(poll_s)
    return "RUNNING" if admitted else "PENDING"


def remove_ready(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def wait_for_place(address: str, run: str, out: Output, poll_s: float = 5.0) -> None:
    """Before a step of the run is submitted: return once the run's newest place is RUNNING (admitted). After a head
    restart the holder asks for the place again, and the run's steps wait here while it is queued."""
    said = ""
    while True:
        newest = None
        try:
            newest = latest(list_places(address), run)
            state = newest.status if newest is not None else "absent"
        except Exception as exc:
            state = f"unknown ({short(exc)})"
        if state == "RUNNING":
            return
        if newest is not None and state == "STOPPED":
            raise EndedError(f"the run's place {newest.submission_id} was stopped: nothing more is submitted")
        if state != said:
            out.say(f"waiting for the run's place on the GPU nodes before submitting (it is {state})")
            said = state
        time.sleep(poll_s)
