"""Stop the Ray job when the run is deleted (stopOnDelete: ``--k8s-job``, ``--k8s-run-marker``, ``--k8s-namespace``).

On SIGTERM the submitter asks the Kubernetes API (in-cluster address and the pod's projected service account token,
or ``--k8s-api``) whether its own Job is being deleted (gone, or carrying a deletionTimestamp) AND the run's marker
ConfigMap is too. The job stack creates the marker after the Job, so ``pulumi destroy`` deletes the marker first and
then the Job: both are gone, and the submitter stops the current attempt (``POST /api/jobs/ID/stop``) and waits until
Ray reports it STOPPED, within ``--stop-timeout`` seconds. A pod evicted or rescheduled (its Job is untouched), and a
Job replaced by ``pulumi up`` with changed settings (the marker stays), leave the Ray job running for the next pod to
re-attach. Any doubt (the API does not answer, or refuses) also leaves it running: training is never stopped on a
guess. Without these options SIGTERM (and always SIGINT) makes the submitter exit at once WITHOUT stopping the Ray
job.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn

from submitter.attempts import Current
from submitter.errors import EXIT_SIGINT, EXIT_SIGTERM
from submitter.output import Output, short
from submitter.ray_api import jobs_api

# Stopping a deleted run's job: each request's own limit (a head that accepts connections and never answers must not
# hold the pod past its grace period), the pause between two polls, and when a stop request is sent again to a job
# that still runs (the first may have reached a head that restarted).
STOP_REQUEST_TIMEOUT_S = 5.0
STOP_POLL_S = 0.5
STOP_AGAIN_S = 5.0
# Ray's final job statuses (ray.job_submission.JobStatus.is_terminal).
ENDED = ("STOPPED", "SUCCEEDED", "FAILED")
# In-cluster Kubernetes API access: the pod's projected service account token and the cluster's CA.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
K8S_TIMEOUT_S = 5.0


class K8sRun:
    """Where the submitter's own Job and the run's marker ConfigMap live, and how to ask the API about them."""

    def __init__(
        self, namespace: str, job: str, marker: str, api: str | None = None, sa_dir: str = SERVICE_ACCOUNT_DIR
    ):
        if api is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            api = f"https://{'[' + host + ']' if ':' in host else host}:{port}" if host else ""
        self.api = api.rstrip("/")
        self.namespace, self.job, self.marker, self.sa_dir = namespace, job, marker, sa_dir

    def get(self, path: str) -> dict[str, Any] | None:
        """One GET; None when the object does not exist (404). Other HTTP errors and timeouts raise."""
        if not self.api:
            raise OSError("no Kubernetes API address (KUBERNETES_SERVICE_HOST is not set)")
        with open(os.path.join(self.sa_dir, "token"), encoding="utf-8") as token_file:
            token = token_file.read().strip()
        request = urllib.request.Request(
            f"{self.api}{path}", headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
        )
        context = None
        if self.api.startswith("https://"):
            import ssl

            ca = os.path.join(self.sa_dir, "ca.crt")
            context = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        try:
            with urllib.request.urlopen(request, timeout=K8S_TIMEOUT_S, context=context) as resp:
                return dict(json.loads(resp.read().decode("utf-8")))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def run_deleted(self) -> tuple[bool, str]:
        """(True, why) only when both the Job and the marker are gone or being deleted; any doubt is False."""

        def deleting(obj: dict[str, Any] | None) -> bool:
            return obj is None or bool((obj.get("metadata") or {}).get("deletionTimestamp"))

        try:
            job = self.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{self.job}")
            if not deleting(job):
                return False, f"Job {self.namespace}/{self.job} is not being deleted (the pod was evicted or moved)"
            marker = self.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{self.marker}")
            if not deleting(marker):
                return False, (
                    f"Job {self.job} is being deleted but the run marker ConfigMap {self.marker} stays (the Job is "
                    "being replaced, or was deleted by hand)"
                )
        except Exception as exc:
            return False, f"could not ask the Kubernetes API whether the run is deleted ({short(exc)})"
        return True, f"Job {self.job} and the run marker {self.marker} are being deleted: the run is being destroyed"


def stop_and_wait(
    address: str, attempt: str, timeout_s: float, out: Output, clock: Callable[[], float] = time.monotonic
) -> bool:
    """Stop the job and wait until Ray reports it ended, within ``timeout_s``: every request has its own short limit,
    and a failed one (the head restarting, an API that does not answer) is tried again until the deadline. True only
    when Ray said the job ended (or does not exist); otherwise it says so, with the command that stops it by hand."""
    deadline = clock() + timeout_s
    problem = ""
    asked_at: float | None = None
    job_path = f"/api/jobs/{urllib.parse.quote(attempt, safe='')}"
    while (left := deadline - clock()) > 0:
        try:
            info = jobs_api(address, "GET", job_path, min(STOP_REQUEST_TIMEOUT_S, left))
            if info is None or info.get("submission_id", attempt) != attempt:  # not ours: a driver job id
                out.say(f"job {attempt} does not exist; nothing to stop")
                return True
            status = str(info.get("status"))
            if status in ENDED:
                out.say(f"job {attempt} is {status}")
                return True
            if asked_at is None or clock() - asked_at >= STOP_AGAIN_S:
                jobs_api(address, "POST", f"{job_path}/stop", min(STOP_REQUEST_TIMEOUT_S, max(deadline - clock(), 0.1)))
                if asked_at is None:
                    out.say(f"asked Ray to stop job {attempt}; waiting up to {timeout_s:g} s for STOPPED")
                asked_at = clock()
        except Exception as exc:
            if short(exc) != problem:
                problem = short(exc)
                out.say(f"stopping job {attempt}: {problem}; trying again until {timeout_s:g} s have passed")
        time.sleep(max(min(STOP_POLL_S, deadline - clock()), 0))
    why = f"the last request failed: {problem}" if problem else "Ray still reports it running"
    out.say(
        f"could NOT stop job {attempt} within {timeout_s:g} s ({why}); it may still be running: stop it by hand "
        f"with `ray job stop --address {address} {attempt}` (or the job stack's rayJobCommands)"
    )
    return False


def install_signal_handlers(
    out: Output, current: Current, k8s: K8sRun | None = None, address: str = "", stop_timeout_s: float = 0.0
) -> None:
    """Leave on SIGTERM/SIGINT. The Ray job is stopped first only on SIGTERM when ``k8s`` says the run is
    deleted."""

    def leave(signum: int, _frame: object) -> NoReturn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one decision per pod; kubelet's SIGKILL ends any overrun
        name = signal.Signals(signum).name
        try:
            if signum == signal.SIGTERM and k8s is not None:
                deleted, why = k8s.run_deleted()
                out.say(f"received {name}; {why}")
                if deleted:
                    if stop_and_wait(address, current.id, stop_timeout_s, out):
                        out.say(f"exiting after stopping Ray job {current.id}")
                    else:
                        out.say(f"exiting; Ray job {current.id} was NOT stopped (see above)")
                    os._exit(EXIT_SIGTERM)
            out.say(
                f"received {name}; exiting WITHOUT stopping Ray job {current.id} (run again with the same "
                "--submission-id to re-attach, or `ray job stop` it)"
            )
        finally:
            os._exit(EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
