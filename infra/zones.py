"""Which zones offer each GPU machine type and Managed Lustre. Pure: the facts are data in zone_table.json, dated and
sourced there; tools/update_zones.py rewrites that file from what Google's APIs list for a project today.

A zone the table says lacks the machine type, or lacks Lustre in a region the table has read whole, is refused before
anything is created: a node pool or Lustre instance in such a zone fails only after the cluster (and the wait) is paid
for. A zone the table cannot speak for (a region it has not read) is not refused: it gets a warning saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE_FILE = Path(__file__).with_name("zone_table.json")
UPDATE_HINT = "docs/configuration.md#zones (tools/update_zones.py refreshes infra/zone_table.json from Google's APIs)"


@dataclass(frozen=True)
class ZoneTable:
    gpu_zones: Mapping[str, frozenset[str]]  # machine type -> zones that list it
    gpu_source: str
    gpu_read: str
    # machine type -> regions a source lists it in, with no zone list read: a zone there is warned, not refused
    gpu_regions_without_zones: Mapping[str, frozenset[str]]
    lustre_complete: Mapping[str, frozenset[str]]  # region read whole -> its Lustre zones
    lustre_partial: Mapping[str, frozenset[str]]  # region read in part -> Lustre zones known
    lustre_source: str
    lustre_read: str


@dataclass(frozen=True)
class ZoneVerdict:
    refusal: str | None  # why the zone cannot work and how to fix it; None when the table does not refuse it
    notes: tuple[str, ...] = ()  # what the table cannot say about the zone


def table_from_json(data: Mapping[str, Any]) -> ZoneTable:
    gpu, lustre = data["gpu_machine_zones"], data["lustre_zones"]

    def zones(rows: Mapping[str, list[str]]) -> dict[str, frozenset[str]]:
        return {name: frozenset(listed) for name, listed in rows.items()}

    return ZoneTable(
        gpu_zones=zones(gpu["zones"]),
        gpu_source=gpu["source"],
        gpu_read=gpu["read"],
        gpu_regions_without_zones=zones(gpu.get("regions_without_zones", {})),
        lustre_complete=zones(lustre["complete"]),
        lustre_partial=zones(lustre.get("partial", {})),
        lustre_source=lustre["source"],
        lustre_read=lustre["read"],
    )


def load_table(path: Path | None = None) -> ZoneTable:
    return table_from_json(json.loads((path or TABLE_FILE).read_text()))


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def check_zone(zone: str, machine_type: str, table: ZoneTable | None = None) -> ZoneVerdict:
    """What the table says about GPU nodes of `machine_type` and a Lustre instance in `zone`."""
    table = table or load_table()
    offered = table.gpu_zones.get(machine_type)
    if offered is None:
        raise KeyError(f"infra/zone_table.json has no zones for {machine_type}: add them ({UPDATE_HINT})")
    notes: tuple[str, ...] = ()
    region = region_of(zone)
    if zone not in offered and region in table.gpu_regions_without_zones.get(machine_type, frozenset()):
        notes = (
            f"zone {zone}: {machine_type} is listed in {region}, but the zone table (read {table.gpu_read}) has no "
            f"zone list for it there; check it is offered in {zone}: gcloud compute machine-types list "
            f"--zones={zone} --filter=name={machine_type}",
        )
    elif zone not in offered:
        return ZoneVerdict(
            f"a zone that offers {machine_type}: {', '.join(sorted(offered))} (zone table read {table.gpu_read} from "
            f"{table.gpu_source.split(' (')[0]}); if Google lists {machine_type} in {zone} now "
            f"(gcloud compute machine-types list --zones={zone} --filter=name={machine_type}), refresh the table: "
            f"{UPDATE_HINT}"
        )
    if region in table.lustre_complete:
        if zone in table.lustre_complete[region]:
            return ZoneVerdict(None, notes)
        lustre_zones = ", ".join(sorted(table.lustre_complete[region])) or "none"
        return ZoneVerdict(
            f"a zone with Managed Lustre; in {region}: {lustre_zones} (Lustre locations read {table.lustre_read}), "
            f"and with {machine_type}: {', '.join(sorted(offered))}; if Google lists Lustre in {zone} now, refresh "
            f"the table: {UPDATE_HINT}"
        )
    if zone in table.lustre_partial.get(region, frozenset()):
        return ZoneVerdict(None, notes)
    unknown = (
        f"zone {zone}: the zone table (Lustre locations read {table.lustre_read}) does not say whether Managed "
        f"Lustre is offered there; if it is not, creating the Lustre instance fails after the cluster is created. "
        f"Check Google's Managed Lustre locations page, or refresh the table: {UPDATE_HINT}"
    )
    return ZoneVerdict(None, (*notes, unknown))
