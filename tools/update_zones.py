"""Rewrite infra/zone_table.json from what Google's APIs list today, for a project you can read.

    gcloud compute machine-types list --filter="name=(a3-ultragpu-8g a4-highgpu-8g)" --format=json > machine-types.json
    curl -s -H "Authorization: Bearer $(gcloud auth print-access-token)" \\
        "https://lustre.googleapis.com/v1/projects/PROJECT/locations?pageSize=1000" > lustre-locations.json
    .venv/bin/python tools/update_zones.py --machine-types machine-types.json --lustre-locations lustre-locations.json

The first is Compute Engine's machineTypes list (each item names its zone); the second is the Managed Lustre API's
locations list (the standard Locations method: one item per location, `locationId` a region or a zone). Every region
with a Lustre zone in that list is recorded as read whole. A machine type of infra/presets.py missing from the first
file is refused: the table would lose it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.presets import GPU_PRESETS  # noqa: E402
from infra.zones import TABLE_FILE, region_of  # noqa: E402


def gpu_zones(machine_types: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    wanted = {preset.machine_type for preset in GPU_PRESETS.values()}
    found: dict[str, set[str]] = {name: set() for name in sorted(wanted)}
    for item in machine_types:
        if item.get("name") in wanted:
            found[item["name"]].add(str(item["zone"]).rsplit("/", 1)[-1])
    missing = [name for name, zones in found.items() if not zones]
    if missing:
        raise SystemExit(f"update_zones: no zone lists {', '.join(missing)} in the machine types given: not written")
    return {name: sorted(zones) for name, zones in found.items()}


def lustre_zones(locations: Mapping[str, Any]) -> dict[str, list[str]]:
    by_region: dict[str, set[str]] = {}
    for location in locations.get("locations", []):
        location_id = str(location.get("locationId") or str(location.get("name", "")).rsplit("/", 1)[-1])
        if location_id.count("-") == 2:  # a zone (us-central1-a), not a region (us-central1)
            by_region.setdefault(region_of(location_id), set()).add(location_id)
    if not by_region:
        raise SystemExit("update_zones: the Lustre locations list names no zone: not written")
    return {region: sorted(zones) for region, zones in sorted(by_region.items())}


def build_table(machine_types: list[Mapping[str, Any]], locations: Mapping[str, Any], today: str) -> dict[str, Any]:
    return {
        "gpu_machine_zones": {
            "source": "Compute Engine API machineTypes list (gcloud compute machine-types list), via "
            "tools/update_zones.py",
            "read": today,
            "zones": gpu_zones(machine_types),
            "regions_without_zones": {},
        },
        "lustre_zones": {
            "source": "Managed Lustre API locations list (lustre.googleapis.com/v1/projects/PROJECT/locations), via "
            "tools/update_zones.py",
            "read": today,
            "note": "Every region is read whole: a zone of a listed region that is not listed has no Managed Lustre.",
            "complete": lustre_zones(locations),
            "partial": {},
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine-types", type=Path, required=True, help="gcloud compute machine-types list JSON")
    parser.add_argument("--lustre-locations", type=Path, required=True, help="the Lustre API's locations list JSON")
    parser.add_argument("--out", type=Path, default=TABLE_FILE, help=f"default {TABLE_FILE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    table = build_table(
        json.loads(args.machine_types.read_text()),
        json.loads(args.lustre_locations.read_text()),
        datetime.date.today().isoformat(),
    )
    args.out.write_text(json.dumps(table, indent=2) + "\n")
    print(f"update_zones: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
