"""What the submitter prints: the job's log as written, its own messages prefixed and scrubbed of secrets.

Secrets: the values of ``env_vars`` in the runtime environment (and the Ray token) are never printed; only their names
are. Messages that come back from Ray are scrubbed of those values before they are printed. (The job's own log output
is printed as the job wrote it.)
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

PREFIX = "ray_submit:"
# A secret shorter than this is not scrubbed from messages (it would mangle ordinary words and numbers).
MIN_SCRUB_LEN = 4


class Output:
    """Serialises everything written to stdout; our own messages always start on a fresh line."""

    def __init__(self, secrets: Sequence[str] = (), prefix: str = PREFIX) -> None:
        self.prefix = prefix
        # Re-entrant: the signal handler may speak while the main thread is inside a write.
        self._lock = threading.RLock()
        self._at_line_start = True
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SCRUB_LEN}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def log(self, chunk: str) -> None:
        """Write job log text exactly as received."""
        if not chunk:
            return
        with self._lock:
            sys.stdout.write(chunk)
            sys.stdout.flush()
            self._at_line_start = chunk.endswith("\n")

    def say(self, message: str) -> None:
        """Write one message of ours, prefixed and scrubbed of secret values."""
        with self._lock:
            lead = "" if self._at_line_start else "\n"
            sys.stdout.write(f"{lead}{self.prefix} {self.scrub(message)}\n")
            sys.stdout.flush()
            self._at_line_start = True


def short_text(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


def describe_runtime_env(runtime_env: dict[str, Any]) -> str:
    """Names of the fields (and of env vars), never values."""
    parts = []
    for key in sorted(runtime_env):
        if key == "env_vars":
            parts.append(f"env_vars=[{', '.join(sorted(runtime_env['env_vars'] or {}))}]")
        else:
            parts.append(key)
    return ", ".join(parts)
