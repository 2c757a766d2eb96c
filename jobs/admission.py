"""A run's place on the cluster's GPU nodes, held by Ray's scheduler (submitter/admission.py says how).

    python admission.py hold --address http://HOST:8265 --run NAME --nodes N --ready-file FILE [--capacity C]
                             [--poll-s S] [--k8s-job NAME --k8s-run-marker NAME --k8s-namespace NS]
    python admission.py status --address http://HOST:8265 [--capacity C]

`hold` runs in the background of the submitter pod's pipeline for the pipeline's whole life: it asks Ray for the
run's place (or follows the one it already has), says why while it is queued, writes FILE once Ray runs it (the
pipeline goes on then), and follows it. SIGUSR1 (the pipeline ended) stops the place. SIGTERM (the pod is going)
stops it when the run is being deleted (with --k8s-*: its Job and run marker are going, as for the steps) and
otherwise leaves it to the Job's next pod, which follows it; without --k8s-* SIGTERM stops it too. It exits 0 when
stopped by a signal once admitted, 143 when stopped while queued, 4 when the place ended by itself (a person
stopped it). `status` prints the runs that hold or wait for GPU nodes, from Ray's job table.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from submitter.admission import Holder, hold, status_lines
from submitter.errors import EXIT_SIGTERM, EXIT_UNREACHABLE
from submitter.output import Output
from submitter.ray_auth import AUTH_TOKEN_ENV
from submitter.stop_on_delete import K8sRun, stop_and_wait

STOP_TIMEOUT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="admission.py", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    held = verbs.add_parser("hold", help="queue the run, wait for admission, hold its place")
    held.add_argument("--address", required=True, help="Ray Jobs API, http://HOST:8265")
    held.add_argument("--run", required=True, help="the run's name")
    held.add_argument("--nodes", type=int, required=True, help="GPU nodes the run needs")
    held.add_argument("--capacity", type=int, default=None, help="GPU workers the cluster can have (for messages)")
    held.add_argument("--ready-file", required=True, help="written once the run is admitted")
    held.add_argument("--poll-s", type=float, default=5.0, help="seconds between looks")
    held.add_argument("--k8s-job", default=None, help="this pod's Kubernetes Job: stop the place when it is deleted")
    held.add_argument("--k8s-run-marker", default=None, help="ConfigMap that exists as long as the run should")
    held.add_argument("--k8s-namespace", default=None, help="namespace of the Job and the marker")
    shown = verbs.add_parser("status", help="print the runs that hold or wait for GPU nodes")
    shown.add_argument("--address", required=True)
    shown.add_argument("--capacity", type=int, default=None)
    args = parser.parse_args(argv)
    address = args.address.rstrip("/")

    if args.verb == "status":
        print("\n".join(status_lines(address, args.capacity)))
        return 0
    if args.nodes < 1 or (args.capacity is not None and args.nodes > args.capacity):
        parser.error(f"--nodes must be 1..--capacity ({args.capacity}), got {args.nodes}")
    if args.poll_s <= 0:
        parser.error("--poll-s must be positive")
    k8s_args = (args.k8s_job, args.k8s_run_marker, args.k8s_namespace)
    if any(k8s_args) and not all(k8s_args):
        parser.error("--k8s-job, --k8s-run-marker and --k8s-namespace go together")
    k8s = K8sRun(args.k8s_namespace, args.k8s_job, args.k8s_run_marker) if all(k8s_args) else None

    out = Output([os.environ.get(AUTH_TOKEN_ENV, "")], prefix="admission:")
    stop = threading.Event()
    signals: list[int] = []

    def leave(signum: int, _frame: object) -> None:
        signals.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, leave)
    holder = Holder(address, args.run, args.nodes, out, args.capacity)
    ended = hold(holder, args.ready_file, args.poll_s, stop)
    if not signals:  # the place ended by itself (a person stopped it): the pipeline stops
        return EXIT_UNREACHABLE
    keep = False
    if signals and signals[0] == signal.SIGTERM and k8s is not None:
        deleted, why = k8s.run_deleted()
        out.say(f"the pod is going; {why}")
        keep = not deleted
    if keep:
        out.say(f"left the place {holder.submission_id} to the Job's next pod")
    else:
        holder.release(stop_and_wait, STOP_TIMEOUT_S)
        out.say(f"released the place of {args.run}")
    return 0 if ended == "RUNNING" else EXIT_SIGTERM


if __name__ == "__main__":
    sys.exit(main())
