"""nemo-rl-gke infra program: settings -> components -> stack outputs."""

from infra import settings as infra_settings
from infra.stack import build_infra, export_infra

settings, secrets = infra_settings.load()
infra = build_infra(settings)
export_infra(settings, infra)
