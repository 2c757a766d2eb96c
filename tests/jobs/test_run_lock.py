"""The run lock (jobs/submitter/run_lock.py) by itself: a live holder makes a second submitter wait and give up with
the holder's name; a silent one is taken over; a holder whose lock was taken over refuses to submit."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from submitter import output
from submitter.run_lock import RunHeldError, RunLock


def _lock(path: Path, holder: str, ttl: float = 2.0) -> RunLock:
    return RunLock(str(path), ttl, output.Output([]), holder=holder)


def test_a_live_holder_keeps_the_run_and_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "submitter.lock"
    first = _lock(path, "pod-a")
    first.acquire(0)
    try:
        started = time.monotonic()
        with pytest.raises(RunHeldError, match=r"still held by pod-a after 1\.5 s"):
            _lock(path, "pod-b").acquire(1.5)
        assert 1.5 <= time.monotonic() - started < 4  # renewed meanwhile (every ttl/4): never silent long enough
        assert "the run is held by another submitter, pod-a" in capsys.readouterr().out
        assert first.holds()
    finally:
        first.release()
    assert not path.exists()


def test_a_silent_holder_is_taken_over_and_then_submits_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "submitter.lock"
    stale = _lock(path, "pod-a")
    assert stale._create()  # held, but nothing renews it: a paused or lost pod
    old = time.time() - 10
    os.utime(path, (old, old))
    second = _lock(path, "pod-b")
    second.acquire(5)
    try:
        assert second.holds() and not stale.holds()
        assert "took over the run from pod-a, silent for 10 s" in capsys.readouterr().out
        with pytest.raises(RunHeldError, match="lost the run's lock"):
            stale.check()
        second.check()  # the holder goes on
        stale.release()  # not its lock any more: left alone
        assert path.exists()
    finally:
        second.release()
    assert not path.exists()
