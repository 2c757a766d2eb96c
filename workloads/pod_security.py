"""Pod Security Admission for the Ray namespace: which level each workload in it allows, and the labels that follow.

What runs in the namespace, and the strictest Pod Security Standard each passes (tests/test_pod_security.py evaluates
the standards' rules on the pods the real chart renders, and on the submitter Job's pod):
- the Ray head (and KubeRay's autoscaler beside it): Baseline. Not Restricted: it runs as the image's user, root.
- the job submitter: Baseline, for the same reason (the run's files on Lustre are root's); TensorBoard (tensorboard:
  true) likewise.
- the GPU workers: Privileged, for one reason only: two hostPath volumes, read-only, the node's NVIDIA driver
  (/home/kubernetes/bin/nvidia) and the gIB NCCL plugin the installer DaemonSet puts on the node
  (/home/kubernetes/bin/gib). Baseline forbids every hostPath volume. Nothing else in them goes beyond Baseline: no
  privileged mode, no added capability (RDMA needs no IPC_LOCK here), no host network, PID or IPC namespace, no host
  port.
So `enforce` can be no stricter than privileged. `audit` and `warn` are baseline: any pod that goes beyond Baseline is
recorded in the API server's audit log and warned about to whoever creates it, so the workers' hostPath volumes are
the one known, reviewed exception and anything new shows. The version is pinned to the cluster's minor, so an upgrade
does not change the rules under a running cluster. Inside `privileged`, workloads/admission_policy.py is the finer
fence: no privilege, host namespace or port, and hostPath only the workers' two directories, read-only.
"""

from __future__ import annotations

ENFORCE_LEVEL = "privileged"
AUDIT_LEVEL = "baseline"
WARN_LEVEL = "baseline"
LABEL_PREFIX = "pod-security.kubernetes.io"


def namespace_labels(kubernetes_minor: str) -> dict[str, str]:
    """Labels of the Ray namespace, e.g. for Kubernetes '1.35'."""
    version = f"v{kubernetes_minor}"
    labels = {}
    for mode, level in (("enforce", ENFORCE_LEVEL), ("audit", AUDIT_LEVEL), ("warn", WARN_LEVEL)):
        labels[f"{LABEL_PREFIX}/{mode}"] = level
        labels[f"{LABEL_PREFIX}/{mode}-version"] = version
    return labels
