"""nemo-rl-gke infra program: settings -> day-2 guard -> components -> stack outputs."""

import pulumi

from infra import day2
from infra import settings as infra_settings
from infra.stack import (
    build_infra,
    check_against_last_deployment,
    export_infra,
    record_once_built,
    what_the_record_describes,
)
from workloads.stack import build_workloads, export_workloads, ray_pod_template, what_the_workloads_record_describes

settings, secrets = infra_settings.load()
has_wandb_key = secrets.wandb_api_key is not None
deployed = day2.deployed_settings(settings, ray_pod_template(settings, has_wandb_key), has_wandb_key)


async def main() -> None:
    # Before anything is registered: refuse a change that would replace what the last deployment built.
    await check_against_last_deployment(deployed, settings.allow_replace)
    infra = build_infra(settings)
    workloads = build_workloads(settings, secrets, infra)
    export_infra(settings, infra)
    export_workloads(settings, workloads)
    # Recorded only once what it describes exists: a failed `up` keeps the last deployment's record.
    described = [*what_the_record_describes(infra), *what_the_workloads_record_describes(workloads)]
    pulumi.export(day2.DEPLOYED_SETTINGS_OUTPUT, record_once_built(deployed, described))


pulumi.run(main)
