"""Why TensorBoard runs as the NeMo RL image's root (workloads/tensorboard.py), read from both releases'
Dockerfiles (../shared/reference): the interpreter of the venv on PATH is uv's Python, installed by root under root's
home (no UV_PYTHON_INSTALL_DIR), and the venv's packages are symlinked into root's uv cache (`uv sync --link-mode
symlink`); nothing opens /root to other users. If a release changes that, this fails and the choice is to revisit.
What TensorBoard gets instead of another user: no capability at all (root without DAC_OVERRIDE cannot pass file
modes), a read-only root file system, the claim mounted read-only, no privilege escalation."""

from __future__ import annotations

import re

import pytest
from upstream import reference

from workloads.tensorboard import TensorBoardArgs, pod_spec

RELEASES = ("nemo-rl-v0.5.0", "nemo-rl-v0.7.0")


@pytest.mark.parametrize("release", RELEASES)
def test_the_image_keeps_its_python_under_roots_home(release: str):
    dockerfile = (reference(release) / "docker" / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and set(users) == {"root"}, users
    # uv is installed for root and installs Python into its default place, root's ~/.local/share/uv.
    assert 'ENV PATH="/root/.local/bin:$PATH"' in dockerfile
    assert re.search(r"uv python install", dockerfile)
    assert "UV_PYTHON_INSTALL_DIR" not in dockerfile
    # The venv's packages point into root's uv cache.
    assert re.search(r"uv sync --link-mode symlink", dockerfile)
    assert "/opt/nemo_rl_venv" in dockerfile and "ENV UV_PROJECT_ENVIRONMENT=/opt/nemo_rl_venv" in dockerfile
    assert not re.search(r"chmod\b[^\n]*/root", dockerfile)


def test_tensorboard_runs_as_the_images_user_with_nothing_else():
    args = TensorBoardArgs(
        name="tb",
        namespace="nemo-rl",
        image="nvcr.io/nvidia/nemo-rl:v0.5.0",
        cpu_pool_name="cpu",
        pvc_name="c",
        mount_path="/data",
    )
    spec = pod_spec(args)
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert "runAsUser" not in context and "runAsUser" not in spec["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert all(m["readOnly"] for m in container["volumeMounts"] if m["mountPath"] == "/data")
