"""Submit a command to a Ray cluster as a Ray Job, idempotently, and wait for it.

Usage::

    python jobs/ray_submit.py --address http://HOST:8265 --submission-id ID \\
        [--connect-timeout SECONDS] [--runtime-env-json JSON] [--max-retries N] [--max-resubmits N] \\
        [--record FILE [--extendable KEY]] [--place-of RUN] \\
        [--k8s-job NAME --k8s-run-marker NAME --k8s-namespace NS [--k8s-api URL]] -- ENTRYPOINT...

The submitter is meant to run as the only container of a Kubernetes Job whose pod may be deleted or restarted at
any moment. Every run with the same ``--submission-id`` converges on one and the same Ray job:

* The Ray Jobs API is polled (``GET /api/version``) with a short backoff until it answers. If it has not answered
  after ``--connect-timeout`` seconds (default 600) the submitter gives up with exit code 4.
* If no job with that submission id exists, the words after ``--`` are joined shell-safely (each argument stays
  one word) and submitted under that id, with the optional runtime environment from ``--runtime-env-json``.
* If the job exists and is PENDING or RUNNING, the submitter attaches to it instead of submitting again.
* If two submitters race, Ray accepts only one submission; the other one's submit is answered "already exists"
  and it attaches to the winner's job. There is never more than one Ray job per submission id.
* While attached, the job's logs are streamed to stdout and the job's status is polled. A final line such as
  ``ray_submit: job ID SUCCEEDED`` states the outcome.

An id that already finished before this submitter started:

* SUCCEEDED: nothing is run again; the submitter says so and exits 0.
* FAILED or STOPPED: Ray never accepts a second submission under an id it has seen, so the earlier attempt cannot
  be retried under the same id (``--max-retries`` retries a FAILED one under the next attempt id, see below).
  The submitter reports the earlier outcome with its exit code (1 or 3) and tells the user how to retry: choose a
  new run name (hence a new submission id), rerun the step (the job stack's ``rerun`` gives it a new id; with
  ``--record`` the advice prints the command), or remove the old record with ``ray job delete ID`` and start again.
  A restarted pod therefore reproduces the earlier result instead of silently running the workload a second time.

An id that exists with a different command (a changed run under an old name) is refused with exit code 2: the
old job is neither followed nor reported as this command's result.

Signals: SIGTERM (pod deletion) and SIGINT make the submitter exit at once (codes 143 and 130) WITHOUT stopping
the Ray job, unless the run itself is being deleted (``--k8s-*``). The job belongs to the Ray cluster and outlives
the submitter pod; a restarted pod with the same submission id re-attaches to it. To stop a job use
``ray job stop ID``.

Each concern lives in its own module of the ``submitter`` package beside this file:

* retries (``--max-retries``) and the run of one submission id: submitter/attempts.py
* a Ray head restart told from a deleted job record (``--max-resubmits``): submitter/head_restart.py
* step outcome records and the attempt ledger (``--record``): submitter/records.py
* no attempt before the run holds its place on the GPU nodes (``--place-of``): submitter/admission.py
* extending a finished or stopped run by a larger value of one key (``--extendable``): submitter/extension.py
* following the job's log: submitter/log_follower.py
* stopping the Ray job when the run is deleted (``--k8s-*``, stopOnDelete): submitter/stop_on_delete.py
* Ray token authentication (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``): submitter/ray_auth.py
* secrets kept out of what is printed: submitter/output.py

Exit codes: 0 succeeded, 1 failed (or rejected by Ray; with retries, the last attempt failed; deleted while the
head stayed up; lost in head restarts past the budget), 2 usage error, id conflict, unreadable record or a token
the cluster refused, 3 stopped, 4 Ray unreachable (also when the connection is lost for longer than
``--connect-timeout`` while waiting), 130/143 interrupted by a signal (143 also after stopping the job because the
run was deleted). Unlike ``ray job submit``, a stopped job does not exit 0.

Only the standard library and Ray's own job submission client are used; Python 3.10 or newer.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from submitter.attempts import Current, run
from submitter.cli import parse_args, secret_values
from submitter.errors import EXIT_USAGE, EndedError
from submitter.output import Output
from submitter.stop_on_delete import K8sRun, install_signal_handlers


def main(argv: Sequence[str] | None = None) -> int:
    args, entrypoint, runtime_env = parse_args(sys.argv[1:] if argv is None else argv)
    out = Output(secret_values(runtime_env))
    current = Current(args.submission_id)
    k8s = None
    if args.k8s_job:
        k8s = K8sRun(args.k8s_namespace, args.k8s_job, args.k8s_run_marker, args.k8s_api, args.k8s_token_dir)
    install_signal_handlers(out, current, k8s, args.address, args.stop_timeout)
    try:
        import ray.job_submission  # noqa: F401  (fail early and clearly if Ray's client is missing)
    except ImportError as exc:
        out.say(f"Ray's job submission client is not importable ({exc}); install ray[default]")
        return EXIT_USAGE
    try:
        return run(args, entrypoint, runtime_env, out, current)
    except EndedError as exc:
        out.say(f"{exc}")
        out.say(f"job {current.id}" + exc.final.format(address=args.address))
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
