"""ray_submit.py's command line: options, the entrypoint after ``--``, the runtime env, what is secret."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from submitter.attempts import DEFAULT_MAX_RESUBMITS, MAX_ATTEMPTS_SCANNED, MAX_RESUBMITS
from submitter.errors import UsageError
from submitter.ray_auth import AUTH_TOKEN_ENV
from submitter.stop_on_delete import SERVICE_ACCOUNT_DIR

DEFAULT_CONNECT_TIMEOUT_S = 600.0
DEFAULT_STOP_TIMEOUT_S = 30.0

SUBMISSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], dict[str, Any] | None]:
    """Split ``argv`` at the first ``--``; return options, entrypoint words and the runtime env (or None)."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        own, entrypoint = argv[:cut], argv[cut + 1 :]
    else:
        own, entrypoint = argv, []

    parser = argparse.ArgumentParser(
        prog="ray_submit.py",
        description="Submit (or re-attach to) a Ray job under a fixed submission id and wait for it.",
        usage="%(prog)s --address http://HOST:8265 --submission-id ID [--connect-timeout SECONDS] "
        "[--runtime-env-json JSON] [--max-retries N] [--max-resubmits N] "
        "[--record FILE [--extendable KEY]] [--place-of RUN] "
        "[--k8s-job NAME --k8s-run-marker NAME --k8s-namespace NS [--k8s-api URL] [--stop-timeout SECONDS]] "
        "-- ENTRYPOINT...",
    )
    parser.add_argument("--address", required=True, help="Ray dashboard / Jobs API URL, e.g. http://head:8265")
    parser.add_argument("--submission-id", required=True, help="Ray submission id; the same id re-attaches")
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        help="seconds to wait for the Jobs API, and longest tolerated outage while waiting (default: 600)",
    )
    parser.add_argument("--runtime-env-json", default=None, help="Ray runtime environment as a JSON object")
    parser.add_argument(
        "--max-retries", type=int, default=0, help="submit a FAILED job again as ID-r1 ... ID-rN (default: 0)"
    )
    parser.add_argument(
        "--max-resubmits",
        type=int,
        default=DEFAULT_MAX_RESUBMITS,
        help="submit a job lost in a head restart again under its own id, this often, once no retries remain "
        f"(default: {DEFAULT_MAX_RESUBMITS})",
    )
    parser.add_argument(
        "--record",
        default=None,
        help="step outcome record (JSON): read before Ray, written when the job SUCCEEDED; a recorded step is "
        "not run again",
    )
    parser.add_argument(
        "--extendable",
        default=None,
        metavar="KEY",
        help="with --record: a run whose command differs only by a larger KEY=N (e.g. grpo.max_num_steps) goes on "
        "as new attempts ID-stepsN, once its old attempts ended, instead of being refused",
    )
    parser.add_argument(
        "--place-of",
        default=None,
        metavar="RUN",
        help="submit no attempt until the run's place on the GPU nodes is RUNNING (submitter/admission.py)",
    )
    parser.add_argument(
        "--k8s-job", default=None, help="this pod's Kubernetes Job: stop the Ray job when it is deleted"
    )
    parser.add_argument("--k8s-run-marker", default=None, help="ConfigMap that exists as long as the run should")
    parser.add_argument("--k8s-namespace", default=None, help="namespace of the Job and the marker")
    parser.add_argument("--k8s-api", default=None, help="Kubernetes API URL (default: the in-cluster address)")
    parser.add_argument(
        "--k8s-token-dir", default=SERVICE_ACCOUNT_DIR, help=f"holds token and ca.crt (default: {SERVICE_ACCOUNT_DIR})"
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_S,
        help="seconds to wait for STOPPED after stopping a deleted run's job (default: 30)",
    )
    args = parser.parse_args(own)  # exits 2 on unknown or missing flags

    try:
        if not entrypoint:
            raise UsageError("no entrypoint: give the command to run after '--'")
        if not re.match(r"https?://[^/\s]+", args.address):
            raise UsageError(f"--address must be an http:// or https:// URL, got {args.address!r}")
        if not SUBMISSION_ID_RE.fullmatch(args.submission_id):
            raise UsageError(
                "--submission-id must be 1-255 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if not args.connect_timeout > 0:
            raise UsageError("--connect-timeout must be a positive number of seconds")
        if not 0 <= args.max_retries < MAX_ATTEMPTS_SCANNED:
            raise UsageError(f"--max-retries must be 0..{MAX_ATTEMPTS_SCANNED - 1}")
        if not 0 <= args.max_resubmits <= MAX_RESUBMITS:
            raise UsageError(f"--max-resubmits must be 0..{MAX_RESUBMITS}")
        if args.record is not None and (not args.record or args.record.endswith("/")):
            raise UsageError(f"--record must be a file path, got {args.record!r}")
        k8s = (args.k8s_job, args.k8s_run_marker, args.k8s_namespace)
        if any(k8s) and not all(k8s):
            raise UsageError("--k8s-job, --k8s-run-marker and --k8s-namespace go together")
        if args.extendable is not None and not (args.record and re.fullmatch(r"[A-Za-z_][\w.]*", args.extendable)):
            raise UsageError("--extendable needs --record and a key such as grpo.max_num_steps")
        if not args.stop_timeout > 0:
            raise UsageError("--stop-timeout must be a positive number of seconds")
        runtime_env = parse_runtime_env(args.runtime_env_json)
    except UsageError as exc:
        parser.error(str(exc))  # prints usage and exits 2
    args.address = args.address.rstrip("/")
    return args, entrypoint, runtime_env


def parse_runtime_env(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        # The exception text quotes no input beyond a position, so no secret can leak through it.
        raise UsageError(f"--runtime-env-json is not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, dict):
        raise UsageError("--runtime-env-json must be a JSON object")
    env_vars = value.get("env_vars")
    if env_vars is not None and not (isinstance(env_vars, dict) and all(isinstance(v, str) for v in env_vars.values())):
        raise UsageError("--runtime-env-json: env_vars must be an object of string values")
    return value


def secret_values(runtime_env: dict[str, Any] | None) -> list[str]:
    """What must never be printed: the runtime env's values and the Ray token."""
    found = [os.environ.get(AUTH_TOKEN_ENV, "")]
    env_vars = (runtime_env or {}).get("env_vars") or {}
    return [v for v in [*found, *env_vars.values()] if isinstance(v, str) and v]
