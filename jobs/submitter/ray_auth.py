"""Ray's token authentication (Ray >= 2.52), the jobs project's one copy: launcher/job.py sets these variables on
the submitter pod; ray_submit.py, admission.py and wait_for_workers.py, shipped beside this package, read them.

With ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` in the environment, every request carries the token, as Ray's own
clients send it. A cluster that answers 401 (no token sent) or 403 (not its token) ends the run at once with exit
code 2 (AuthError, raised in ray_api.connect) and a message that says which; the token itself is never printed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Ray's token authentication (Ray >= 2.52): the client sends the token only when both are set.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"


def auth_headers(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The header Ray's own clients add under token authentication: only with RAY_AUTH_MODE=token and a token."""
    token = env.get(AUTH_TOKEN_ENV, "")
    if env.get(AUTH_MODE_ENV, "").lower() == "token" and token:
        return {"Authorization": f"Bearer {token}"}
    return {}


def auth_refusal(status: int, env: Mapping[str, str] = os.environ) -> str:
    """Why the cluster refused us, in words, from the HTTP status and what this client holds (never the token)."""
    if status == 401 or not auth_headers(env):
        held = [name for name in (AUTH_MODE_ENV, AUTH_TOKEN_ENV) if env.get(name)]
        return (
            f"the Ray cluster requires a token (HTTP {status}) and this client sent none: set both "
            f"{AUTH_MODE_ENV}=token and {AUTH_TOKEN_ENV} (the Secret named by the infra output rayAuthSecret)"
            + (f"; only {', '.join(held)} is set" if held else "")
        )
    return (
        f"the Ray cluster refused the token (HTTP {status}): {AUTH_TOKEN_ENV} is not this cluster's token "
        "(was the infra stack's token replaced? the Ray pods and the submitter must read the same Secret)"
    )
