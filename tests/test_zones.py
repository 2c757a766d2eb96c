"""The zone must offer the GPU machine type and Managed Lustre (infra/zones.py, infra/zone_table.json): refused in
one line before anything is registered where the table knows, warned where it cannot say; the table is refreshed
from Google's own API listings by tools/update_zones.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from config_rules import validated
from conftest import ROOT

from infra import zones
from infra.presets import GPU_PRESETS
from infra.settings import ConfigError, InfraSettings
from tools import plan, plan_stacks, update_zones
from tools.offline import load_stack_config

INFRA_STACKS = sorted(stack for stack in plan_stacks.EXAMPLE_STACKS if (ROOT / f"Pulumi.{stack}.yaml").is_file())


def stack_values(stack: str, **changes: Any) -> dict[str, Any]:
    project, config = load_stack_config(ROOT, stack)
    return {**{key.removeprefix(f"{project}:"): value for key, value in config.items()}, **changes}


def test_the_table_covers_every_preset_and_names_its_sources():
    table = zones.load_table()
    for preset in GPU_PRESETS.values():
        assert table.gpu_zones[preset.machine_type], preset.machine_type
    for text in (table.gpu_source, table.lustre_source):
        assert "github.com/" in text or "docs.cloud.google.com/" in text
    assert table.gpu_read and table.lustre_read
    for region, listed in {**table.lustre_complete, **table.lustre_partial}.items():
        assert all(zones.region_of(zone) == region for zone in listed), region


@pytest.mark.parametrize("stack", INFRA_STACKS)
def test_every_shipped_stack_zone_offers_its_gpu_and_lustre(stack: str):
    settings = validated(InfraSettings, stack_values(stack))
    assert settings.zone in zones.load_table().gpu_zones[settings.preset.machine_type]
    assert settings.zone_notes == ()


def test_a_zone_without_the_machine_type_is_refused_in_one_line_with_the_fix():
    with pytest.raises(ConfigError) as error:
        validated(InfraSettings, stack_values("b200", **{"gcp:region": "us-east5", "zone": "us-east5-a"}))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("config 'zone' = 'us-east5-a' is not allowed: a zone that offers a4-highgpu-8g: ")
    assert "us-central1-b" in message and "us-east5-a," not in message
    assert "gcloud compute machine-types list --zones=us-east5-a --filter=name=a4-highgpu-8g" in message
    assert "tools/update_zones.py" in message


def test_a_zone_the_table_cannot_speak_for_is_accepted_with_a_warning():
    # A3 Ultra is listed in us-east5-a; the Lustre rows read do not cover us-east5.
    settings = validated(InfraSettings, stack_values("h200", **{"gcp:region": "us-east5", "zone": "us-east5-a"}))
    (note,) = settings.zone_notes
    assert note.startswith("zone us-east5-a: ") and "Managed Lustre" in note


def test_a_region_listed_without_zones_warns_instead_of_refusing():
    settings = validated(
        InfraSettings, stack_values("b200", **{"gcp:region": "europe-west1", "zone": "europe-west1-b"})
    )
    assert any("a4-highgpu-8g is listed in europe-west1" in note for note in settings.zone_notes)


def _table(gpu: dict[str, list[str]], complete: dict[str, list[str]], partial: dict[str, list[str]]) -> zones.ZoneTable:
    section = {"source": "test", "read": "2026-12-02"}
    return zones.table_from_json(
        {
            "gpu_machine_zones": {**section, "zones": gpu},
            "lustre_zones": {**section, "complete": complete, "partial": partial},
        }
    )


def test_lustre_is_refused_only_where_the_region_was_read_whole():
    table = _table(
        {"m": ["asia-east1-b", "asia-east1-a", "us-west9-a", "us-west8-b"]},
        complete={"asia-east1": ["asia-east1-a", "asia-east1-c"]},
        partial={"us-west8": ["us-west8-a"]},
    )
    refused = zones.check_zone("asia-east1-b", "m", table).refusal
    assert refused and "in asia-east1: asia-east1-a, asia-east1-c" in refused
    assert zones.check_zone("asia-east1-a", "m", table) == zones.ZoneVerdict(None)
    # A zone missing from a region read in part, or from a region not read, is unknown: warned, not refused.
    for zone in ("us-west8-b", "us-west9-a"):
        verdict = zones.check_zone(zone, "m", table)
        assert verdict.refusal is None and len(verdict.notes) == 1


def test_the_plan_refuses_a_user_stack_in_such_a_zone(capsys: pytest.CaptureFixture[str]):
    code = plan.main(["--stack", "b200", "-c", "gcp:region=us-east5", "-c", "zone=us-east5-a", "--quiet"])
    assert code == plan.EXIT_CONFIG
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "config 'zone' = 'us-east5-a' is not allowed" in error[0]


MACHINE_TYPES = [  # what `gcloud compute machine-types list --format=json` prints: one item per zone
    {"name": "a3-ultragpu-8g", "zone": "us-east5-a", "guestCpus": 224},
    {"name": "a4-highgpu-8g", "zone": "us-central1-b", "guestCpus": 224},
    {"name": "a4-highgpu-8g", "zone": "us-east5-a", "guestCpus": 224},
    {"name": "a3-highgpu-8g", "zone": "us-west1-a", "guestCpus": 208},
]
LUSTRE_LOCATIONS = {  # the Lustre API's locations list: regions and zones
    "locations": [
        {"name": "projects/p/locations/us-east5", "locationId": "us-east5"},
        {"name": "projects/p/locations/us-east5-a", "locationId": "us-east5-a"},
        {"name": "projects/p/locations/us-central1-b", "locationId": "us-central1-b"},
    ]
}


def test_update_zones_rewrites_the_table_from_the_api_listings(tmp_path: Path):
    (tmp_path / "mt.json").write_text(json.dumps(MACHINE_TYPES))
    (tmp_path / "loc.json").write_text(json.dumps(LUSTRE_LOCATIONS))
    out = tmp_path / "zone_table.json"
    argv = ["--machine-types", str(tmp_path / "mt.json"), "--lustre-locations", str(tmp_path / "loc.json")]
    assert update_zones.main([*argv, "--out", str(out)]) == 0
    table = zones.load_table(out)
    assert table.gpu_zones == {
        "a3-ultragpu-8g": frozenset({"us-east5-a"}),
        "a4-highgpu-8g": frozenset({"us-central1-b", "us-east5-a"}),
    }
    assert table.lustre_complete == {"us-east5": frozenset({"us-east5-a"}), "us-central1": frozenset({"us-central1-b"})}
    # With the refreshed table the zone the shipped one refuses for A4 is accepted, with nothing left unknown.
    assert zones.check_zone("us-east5-a", "a4-highgpu-8g", table) == zones.ZoneVerdict(None)
    assert zones.check_zone("us-east5-b", "a4-highgpu-8g", table).refusal


def test_update_zones_refuses_a_listing_that_would_drop_a_preset(tmp_path: Path):
    (tmp_path / "mt.json").write_text(json.dumps(MACHINE_TYPES[:1]))
    (tmp_path / "loc.json").write_text(json.dumps(LUSTRE_LOCATIONS))
    out = tmp_path / "zone_table.json"
    with pytest.raises(SystemExit, match="a4-highgpu-8g"):
        update_zones.main(
            [
                "--machine-types",
                str(tmp_path / "mt.json"),
                "--lustre-locations",
                str(tmp_path / "loc.json"),
                "--out",
                str(out),
            ]
        )
    assert not out.exists()
