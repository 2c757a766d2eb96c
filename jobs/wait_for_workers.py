"""Wait until the Ray cluster has the GPU workers a run needs, before the pipeline submits anything.

    python wait_for_workers.py --address http://HOST:8265 --nodes N --gpus-per-node G [--timeout-s S] [--poll-s S]
                               [--request-address ray://HOST:10001]

Runs in the submitter pod, before the first Ray job. GPU nodes start from zero and can take long to arrive (a
reservation being filled, flex-start capacity, a tens-of-GB image pull); a Ray job submitted before them would
fail, and Ray never reruns a failed submission id, so the run's name would be spent on a start-up delay. Waiting
here costs nothing: a timeout exits 4, the Kubernetes Job starts a new pod, and the wait goes on.

It asks the head's State API (`ray.util.state.list_nodes`, over the same HTTP port as the Jobs API) for alive
nodes and counts those with at least G GPUs. Exit codes: 0 ready, 4 not ready in time or Ray unreachable,
2 usage or a refused token. Standard library and Ray's own client only.

Token authentication (Ray >= 2.52): Ray's client sends the token when RAY_AUTH_MODE=token and RAY_AUTH_TOKEN are set
(the submitter pod gets both from the infra stack's Secret). A head that refuses the client (no token, or not its
token) ends the wait at once with exit code 2 and a message that says which, never the token: waiting would not
change the answer.

With --request-address (the GPU group scales from zero under KubeRay's autoscaler), waiting alone would wait
forever: nothing asks for the nodes. So when fewer than N workers are up, it first asks for this run's N nodes as a
placement group of N bundles of G GPUs (one a node), held by a child process through Ray Client: the autoscaler
scales up for a pending placement group as for any demand, and adds up the runs' groups by itself, so no run's ask
replaces another's. The group is removed when the wait ends, ready or not (the run's own placement groups keep the
workers busy from then on; a retried pod asks again), and on SIGTERM (the pipeline's shell passes it on when the pod
is deleted or evicted), then it exits 143. Should the child be killed, Ray Client drops its group with its driver.
With --with-admitted-runs it waits for the GPU nodes of every admitted run (their places RUNNING in Ray's job
table, submitter/admission.py), since the workers other runs hold are not this run's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from submitter.ray_auth import auth_headers, auth_refusal

EXIT_READY = 0
EXIT_USAGE = 2
EXIT_NOT_READY = 4
EXIT_SIGTERM = 128 + signal.SIGTERM


class AuthRefusedError(Exception):
    """The Ray head refused this client's credentials; the message says why, without the token."""


def refused_status(exc: BaseException) -> int | None:
    """The HTTP status of the head's refusal of our credentials that `exc` reports, None for any other error. Ray
    2.52+ raises ray.exceptions.AuthenticationError ('Authentication required: Unauthorized' for 401, 'Authentication
    failed: Forbidden' for 403); without a status in its words, what this client sends tells which."""
    text = str(exc)
    if re.search(r"\b401\b|Unauthorized|Authentication required", text):
        return 401
    if re.search(r"\b403\b|Forbidden|Authentication failed", text):
        return 403
    if any(c.__name__ == "AuthenticationError" for c in type(exc).__mro__):
        return 403 if auth_headers() else 401
    return None


def gpu_workers(nodes: Iterable[Mapping[str, object]], gpus_per_node: int) -> int:
    """How many alive nodes offer at least `gpus_per_node` GPUs."""
    count = 0
    for node in nodes:
        resources = node.get("resources_total") or {}
        gpus = float(resources.get("GPU", 0)) if isinstance(resources, Mapping) else 0.0
        if node.get("state") == "ALIVE" and gpus >= gpus_per_node:
            count += 1
    return count


# Ray's State API returns at most `limit` entries, 100 unless told (ray.util.state.common.DEFAULT_LIMIT at Ray 2.49.2
# and 2.55.1): with 100 or more Ray nodes the wait would never see every worker. 10,000 is the most the API server
# returns (RAY_MAX_LIMIT_FROM_API_SERVER's default at both versions).
LIST_NODES_LIMIT = 10_000


def alive_nodes(address: str) -> list[dict[str, object]]:
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(
            address=address,
            filters=[("state", "=", "ALIVE")],
            limit=LIST_NODES_LIMIT,
            timeout=30,
            raise_on_missing_output=False,
        )
    except Exception as exc:
        status = refused_status(exc)
        if status:
            raise AuthRefusedError(auth_refusal(status)) from None
        raise
    return [{"state": node.state, "resources_total": dict(node.resources_total or {})} for node in nodes]


Bundles = list[dict[str, int]]  # placement group bundles: int values

HOLD_GROUP_FLAG = "--hold-placement-group"  # the child mode below; not for people
REQUEST_TIMEOUT_S = 180.0
RELEASE_TIMEOUT_S = 60.0
CHILD_FAILED = "request failed: "
CHILD_HELD = "placement group requested"


class RequestFailedError(Exception):
    """The child that asks for the workers did not; the message is the reason the child gave."""


def hold_placement_group(address: str, bundles: Bundles) -> None:
    """The child's work: through Ray Client, a placement group of this run's workers (one bundle of G GPUs a
    node), which the Ray autoscaler scales up for like any pending demand, held until the parent closes our stdin
    (or sends SIGTERM), then removed. Each run asks only for its own nodes: Ray's autoscaler adds up the runs."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    with ray.init(address=address, logging_level="WARNING"):
        group = placement_group(bundles, strategy="STRICT_SPREAD")
        print(CHILD_HELD, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.stdin.close())
        try:
            sys.stdin.read()
        except (OSError, ValueError):
            pass
        finally:
            remove_placement_group(group)


def ray_client_request(address: str, timeout_s: float = REQUEST_TIMEOUT_S) -> Callable[[Bundles], None]:
    """A function that asks for `bundles` (a child process holding a placement group on the cluster at `address`,
    ray://...) or, given [], withdraws the ask (the child removes its group and exits). A child of its own: a SIGTERM
    that interrupts a Ray Client connection mid-way leaves that process's client state half torn down."""
    holding: list[subprocess.Popen[str]] = []

    def release() -> None:
        for child in holding:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(RELEASE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()  # Ray Client drops its driver's group when the connection goes
                child.wait()
        holding.clear()

    def request(bundles: Bundles) -> None:
        release()
        if not bundles:
            return
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), HOLD_GROUP_FLAG, address, json.dumps(bundles)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        holding.append(child)
        assert child.stdout is not None
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(child.stdout.readline() if child.stdout else ""))
        reader.start()
        reader.join(timeout_s)
        if answer and answer[0].strip() == CHILD_HELD:
            return
        release()
        child.kill()
        _, errors = child.communicate()
        # Ray's own threads may still log after the child's reason: pick the reason by its prefix.
        lines = [line for line in (errors or "").splitlines() if line.strip()]
        reasons = [line.removeprefix(CHILD_FAILED) for line in lines if line.startswith(CHILD_FAILED)]
        raise RequestFailedError(reasons[-1] if reasons else (lines or [f"no answer within {timeout_s:g} s"])[-1])

    return request


def hold_placement_group_main(argv: list[str]) -> int:
    """The child mode: `wait_for_workers.py --hold-placement-group ray://HOST:10001 '[{"GPU": 8}]'`. Prints
    CHILD_HELD once the group is asked for; otherwise the error's type and message on stderr after CHILD_FAILED,
    exit 1."""
    try:
        address, bundles_json = argv
        hold_placement_group(address, json.loads(bundles_json))
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc)[:300]}".replace("\n", " ")
        print(f"{CHILD_FAILED}{reason}", file=sys.stderr, flush=True)
        return 1
    return 0


def wait(
    list_nodes: Callable[[], list[dict[str, object]]],
    nodes: int,
    gpus_per_node: int,
    timeout_s: float,
    poll_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    request: Callable[[Bundles], None] | None = None,
    needed: Callable[[], int] | None = None,
) -> bool:
    """Poll until `nodes` GPU workers are alive; say how many there are whenever that changes. With `request`,
    ask for the missing workers once the head answers and they are not all there, and withdraw it at the end. With
    `needed` (the admitted runs' GPU nodes, this run's included), wait for that many when it is more: the workers
    other runs hold are not this run's."""
    deadline = clock() + timeout_s
    last_seen: int | None = None
    requested = False
    last_problem = ""
    wanted = nodes
    try:
        while True:
            try:
                if needed is not None:
                    wanted = max(nodes, needed())
                ready = gpu_workers(list_nodes(), gpus_per_node)
            except AuthRefusedError:
                raise
            except Exception as exc:  # the head may be restarting: keep waiting, within the deadline
                ready = -1
                if last_seen != -1:
                    say(f"the Ray head does not answer yet ({type(exc).__name__}: {str(exc)[:200]})")
            else:
                if ready != last_seen:
                    say(f"{ready} of {wanted} Ray GPU workers ({gpus_per_node} GPUs each) are up")
            last_seen = ready
            if ready >= wanted:
                return True
            if request is not None and not requested and ready >= 0:
                # Counted as made from the moment it is sent: a SIGTERM during the call may land after the request
                # reached the cluster, and the `finally` below must withdraw it then too.
                requested = True
                try:
                    request([{"GPU": gpus_per_node}] * nodes)
                except Exception as exc:  # Ray Client not reachable yet: try again at the next look
                    requested = False
                    problem = f"could not ask the autoscaler yet ({type(exc).__name__}: {str(exc)[:200]})"
                    if problem != last_problem:
                        say(problem)
                    last_problem = problem
                else:
                    say(f"asked the Ray autoscaler for {nodes} workers of {gpus_per_node} GPUs (a placement group)")
            if clock() >= deadline:
                return False
            sleep(min(poll_s, max(0.0, deadline - clock())))
    finally:
        if requested and request is not None:
            withdraw(request, say)


WITHDRAW_ATTEMPTS = 3


def withdraw(request: Callable[[Bundles], None], say: Callable[[str], None]) -> None:
    """Clear the standing request, trying again if a connection fails (a Ray Client connection can time out on a
    busy head): a request left standing keeps GPU nodes up for nobody."""
    for attempt in range(1, WITHDRAW_ATTEMPTS + 1):
        try:
            request([])
        except Exception as exc:
            say(
                f"could not withdraw the autoscaler request, attempt {attempt} of {WITHDRAW_ATTEMPTS} "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            )
        else:
            say("withdrew this run's autoscaler request (its placement group; idle workers may scale down)")
            return


def leave_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit(143), so that wait()'s `finally` withdraws the autoscaler request (a standing
    one keeps GPU nodes up for nobody). Python's default would end the process without it. Ray Client runs only in
    the child processes of ray_client_request, so ray.init's own handler never replaces this one."""

    def leave(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one exit; the withdrawal is not interrupted again
        raise SystemExit(EXIT_SIGTERM)

    signal.signal(signal.SIGTERM, leave)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the Ray dashboard/Jobs API, http://HOST:8265")
    parser.add_argument("--nodes", type=int, required=True, help="GPU workers needed")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs each worker must offer")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="give up (exit 4) after this long")
    parser.add_argument("--poll-s", type=float, default=15.0, help="seconds between looks")
    parser.add_argument(
        "--request-address", help="Ray Client address (ray://HOST:10001): ask the autoscaler for the workers first"
    )
    parser.add_argument(
        "--with-admitted-runs",
        action="store_true",
        help="wait for the GPU nodes of every admitted run (their places RUNNING in Ray's job table), this one's too",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_READY
    if args.nodes < 1 or args.gpus_per_node < 1 or args.timeout_s < 0 or args.poll_s <= 0:
        print("wait_for_workers: --nodes and --gpus-per-node must be 1 or more, the times positive", file=sys.stderr)
        return EXIT_USAGE

    def say(message: str) -> None:
        print(f"wait_for_workers: {message}", flush=True)

    leave_on_sigterm()
    say(f"waiting up to {args.timeout_s:g} s for {args.nodes} GPU workers at {args.address}")
    request = ray_client_request(args.request_address) if args.request_address else None
    needed: Callable[[], int] | None = None
    if args.with_admitted_runs:
        from submitter.admission import admitted_nodes_at

        needed = functools.partial(admitted_nodes_at, args.address.rstrip("/"))
    try:
        ready = wait(
            lambda: alive_nodes(args.address),
            args.nodes,
            args.gpus_per_node,
            args.timeout_s,
            args.poll_s,
            say,
            request=request,
            needed=needed,
        )
    except AuthRefusedError as exc:
        say(f"{exc}; not waiting")
        return EXIT_USAGE
    if ready:
        say("ready")
        return EXIT_READY
    say(
        f"not ready after {args.timeout_s:g} s: check the GPU node pool (reservation, quota, flex-start capacity) "
        "and the Ray worker pods (kubectl get pods -l ray.io/node-type=worker); the Job will try again"
    )
    return EXIT_NOT_READY


if __name__ == "__main__":
    if sys.argv[1:2] == [HOLD_GROUP_FLAG]:
        sys.exit(hold_placement_group_main(sys.argv[2:]))
    sys.exit(main())
