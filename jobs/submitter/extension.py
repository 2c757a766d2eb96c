"""Extending a run (``--extendable KEY``): the step's command changed only by a larger ``KEY=N`` (the train step's
``grpo.max_num_steps``), so the run goes on from where it stopped instead of being refused as a changed command.

A run that finished (its record), was stopped or spent its retries (Ray's table, the attempt ledger) with
``KEY=10`` and is now asked for ``KEY=20`` continues as new attempts under ``ID-steps20`` (``-steps20-r1`` ...), with
a ledger of their own and a fresh retry budget; NeMo RL resumes from the newest checkpoint in its checkpoint dir, so
training goes on at step 11. On success the step's record names the extension's attempt and the new command (the
old record is kept beside it as ``<step>.json.before-<KEY>-<N>``). Before the first extension attempt, every job of
the step still live in Ray (an attempt of the old command still training) is waited for: two attempts never write
one checkpoint dir. Any other change (recipe, model, data, a smaller ``KEY``) is refused with the words that
changed: NeMo RL would resume a checkpoint that does not match it.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from submitter.output import Output
from submitter.ray_api import is_job_of, live_submission_ids

POLL_S = 5.0


def _value(words: list[str], key: str) -> tuple[int, int] | None:
    """(index, value) of the single word ``KEY=N`` in ``words``, or None."""
    found = [(i, w.split("=", 1)[1]) for i, w in enumerate(words) if w.startswith(f"{key}=")]
    if len(found) != 1 or not found[0][1].isdigit():
        return None
    return found[0][0], int(found[0][1])


def extendable_value(command: str, key: str) -> int | None:
    """N of the single ``KEY=N`` in the command, or None."""
    found = _value(_words(command), key)
    return found[1] if found else None


def extended_to(old_command: str, new_command: str, key: str) -> int | None:
    """The new ``KEY`` value when ``new_command`` is ``old_command`` with only a larger ``KEY=N``; else None.
    Commands are compared word by word (``bash -c`` scripts split into their words too)."""
    old, new = _words(old_command), _words(new_command)
    if len(old) != len(new):
        return None
    old_value, new_value = _value(old, key), _value(new, key)
    if old_value is None or new_value is None or old_value[0] != new_value[0] or new_value[1] <= old_value[1]:
        return None
    index = new_value[0]
    if old[:index] + old[index + 1 :] != new[:index] + new[index + 1 :]:
        return None
    return new_value[1]


def changed_words(old_command: str, new_command: str, limit: int = 3) -> str:
    """What differs between two commands, word by word, for the refusal: ``a -> b; ...``."""
    old, new = _words(old_command), _words(new_command)
    pairs = [(a, b) for a, b in zip(old, new, strict=False) if a != b]
    if len(old) != len(new):
        pairs.append((f"{len(old)} words", f"{len(new)} words"))
    shown = "; ".join(f"{a} -> {b}" for a, b in pairs[:limit])
    return shown + (f"; and {len(pairs) - limit} more" if len(pairs) > limit else "")


def _words(command: str) -> list[str]:
    words = []
    for word in shlex.split(command):
        # A `bash -c SCRIPT` entrypoint: the script's own words are the command's.
        words.extend(shlex.split(word) if " " in word else [word])
    return words


def extension_id(submission_id: str, value: int) -> str:
    return f"{submission_id}-steps{value}"


def live_jobs_of(address: str, submission_id: str) -> list[str]:
    """The step's jobs (its id, retries, extensions) Ray lists as PENDING or RUNNING."""
    return [job for job in live_submission_ids(address) if is_job_of(job, submission_id)]


def wait_until_none_live(
    address: str, submission_id: str, out: Output, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Before the first attempt of an extension: every live job of the step has ended."""
    said: list[str] = []
    while True:
        try:
            live = live_jobs_of(address, submission_id)
        except Exception as exc:  # the head restarting: ask again
            live = said or ["(Ray not answering)"]
            out.say(f"could not list the step's jobs ({type(exc).__name__}); asking again")
        if not live:
            return
        if live != said:
            out.say(
                f"{', '.join(live)} still runs with the old command; the extension starts when it ends (stop it with "
                f"`ray job stop --address {address} {live[0]}` to extend at once from its last checkpoint)"
            )
            said = live
        sleep(POLL_S)
