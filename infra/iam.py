"""Project-level role grants for the service accounts this program creates."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pulumi
import pulumi_gcp as gcp


def grant_project_roles(
    name_prefix: str,
    project: str,
    member: pulumi.Input[str],
    roles: Iterable[str],
    parent: pulumi.Resource,
    apis: Sequence[pulumi.Resource],
) -> list[gcp.projects.IAMMember]:
    """One IAMMember per role (additive: other bindings on the project stay as they are), after `apis` (the
    Resource Manager API's Service) exist."""
    return [
        gcp.projects.IAMMember(
            f"{name_prefix}-{role.split('/')[1].replace('.', '-')}",
            project=project,
            role=role,
            member=member,
            opts=pulumi.ResourceOptions(parent=parent, depends_on=list(apis)),
        )
        for role in roles
    ]
