"""Not collected by `make test` (no test_ prefix): tests/test_interrupted_run.py runs it in a pytest of its own with
two xdist workers (one of them idle) and interrupts that pytest once both heads are up: the worker's own head, and
the shared head its controller started."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ray_head import _LIVE_HEADS, RAY_BIN, SHARED_HEAD_ENV, _wait_for_shared_head, ray_head

READY_ENV = "NEMORL_TESTS_INTERRUPT_READY"


def test_two_heads_until_interrupted() -> None:
    shared_ready = Path(json.loads(os.environ[SHARED_HEAD_ENV])["ready"])
    _wait_for_shared_head({"ready": str(shared_ready)})
    with ray_head(RAY_BIN):
        (own,) = _LIVE_HEADS
        heads = [
            {"temp_dir": str(shared_ready.parent), "gcs": json.loads(shared_ready.read_text())["gcs"]},
            {"temp_dir": own.temp_dir, "gcs": own.gcs_address},
        ]
        ready = Path(os.environ[READY_ENV])
        ready.with_suffix(".tmp").write_text(json.dumps(heads))
        ready.with_suffix(".tmp").rename(ready)
        time.sleep(600)  # until the outer test interrupts this run
