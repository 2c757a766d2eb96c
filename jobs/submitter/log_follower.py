"""Following a job: its log streamed to stdout while its status is polled until it is final.

Log streaming uses the client's websocket tail (``tail_job_logs``), which replays a job's log from its beginning and
then follows it. A count of the characters already written is kept, so when the stream has to be reopened (the
head's connection dropped) the replayed part is skipped and nothing is printed twice. When the job has finished, the
whole log is fetched once and whatever the stream missed (a stream that closed early ends without an error) is
printed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from submitter.head_restart import HeadIdentity
from submitter.output import Output, short
from submitter.ray_api import BACKOFF_FIRST_S, BACKOFF_MAX_S, Outage, lookup

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobSubmissionClient


STATUS_POLL_S = 2.0
# After the job reached a final status: how long the log stream may take to deliver the rest of the log.
LOG_DRAIN_S = 15.0


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
