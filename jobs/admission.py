"""A run's place on the cluster's GPU nodes (submitter/admission.py says how runs are admitted).

    python admission.py hold --dir DIR --run NAME --nodes N --capacity C --address http://HOST:8265
                             --submission-id ID [--submission-id ID ...] --ready-file FILE [--ttl-s S] [--poll-s S]
    python admission.py status --dir DIR [--capacity C]

`hold` runs in the background of the submitter pod's pipeline for the pipeline's whole life: it queues the run,
says why while it waits ("queued behind <run>: needs 2 GPU node(s), 0 free of 2 ..."), writes FILE once the run is
admitted (the pipeline goes on then), renews the run's entry, and releases it on SIGTERM (the pipeline ends, or its
pod is deleted). It never gives up while queued: waiting for another run's nodes spends no retry and no timeout.
`status` prints every run that holds or waits for GPU nodes. Standard library only (Ray's Jobs API over HTTP).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from submitter.admission import DEFAULT_TTL_S, Admission, hold, status_lines
from submitter.output import Output
from submitter.ray_auth import AUTH_TOKEN_ENV

EXIT_SIGTERM = 128 + signal.SIGTERM


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="admission.py", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    held = verbs.add_parser("hold", help="queue the run, wait for admission, hold its place")
    held.add_argument("--dir", required=True, help="the cluster's admission folder on Lustre")
    held.add_argument("--run", required=True, help="the run's name")
    held.add_argument("--nodes", type=int, required=True, help="GPU nodes the run needs")
    held.add_argument("--capacity", type=int, required=True, help="GPU workers the cluster can have")
    held.add_argument("--address", required=True, help="Ray Jobs API, http://HOST:8265")
    held.add_argument("--submission-id", action="append", required=True, help="a step's Ray submission id")
    held.add_argument("--ready-file", required=True, help="written once the run is admitted")
    held.add_argument("--ttl-s", type=float, default=DEFAULT_TTL_S, help="a holder silent this long is gone")
    held.add_argument("--poll-s", type=float, default=5.0, help="seconds between looks while queued")
    shown = verbs.add_parser("status", help="print the runs that hold or wait for GPU nodes")
    shown.add_argument("--dir", required=True)
    shown.add_argument("--capacity", type=int, default=None)
    args = parser.parse_args(argv)

    if args.verb == "status":
        print("\n".join(status_lines(args.dir, args.capacity)))
        return 0
    if not 1 <= args.nodes <= args.capacity:
        parser.error(f"--nodes must be 1..--capacity ({args.capacity}), got {args.nodes}")
    if args.ttl_s <= 0 or args.poll_s <= 0:
        parser.error("--ttl-s and --poll-s must be positive")

    out = Output([os.environ.get(AUTH_TOKEN_ENV, "")], prefix="admission:")
    stop = threading.Event()
    stopped_by_signal = []

    def leave(signum: int, _frame: object) -> None:
        stopped_by_signal.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    admission = Admission(args.dir, args.run, out, args.address.rstrip("/"), args.ttl_s)
    admitted = hold(admission, args.nodes, args.submission_id, args.capacity, args.ready_file, args.poll_s, stop)
    out.say(f"released the place of {args.run}" + ("" if admitted else " in the queue"))
    return EXIT_SIGTERM if stopped_by_signal and not admitted else 0


if __name__ == "__main__":
    sys.exit(main())
