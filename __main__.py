"""nemo-rl-gke infra program: settings -> components -> stack outputs."""

from infra import settings as infra_settings
from infra.stack import build_infra, export_infra
from workloads.stack import build_workloads, export_workloads

settings, secrets = infra_settings.load()
infra = build_infra(settings)
workloads = build_workloads(settings, secrets, infra)
export_infra(settings, infra)
export_workloads(settings, workloads)
