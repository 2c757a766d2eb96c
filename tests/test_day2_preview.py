"""`make plan STACK=... PREVIOUS=outputs.json`: the day-2 guard run offline against a deployed stack's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from infra import day2
from tools import day2_preview, plan

GOLDEN_DEV = ROOT / "tests" / "golden" / "dev" / "outputs.json"


def test_previous_outputs_are_read_from_either_file(tmp_path: Path):
    record = json.loads(GOLDEN_DEV.read_text())["infra"][day2.DEPLOYED_SETTINGS_OUTPUT]
    assert day2_preview.previous_record(GOLDEN_DEV) == record  # a plan's outputs.json
    flat = tmp_path / "stack-outputs.json"  # what `pulumi stack output --json` prints
    flat.write_text(json.dumps({"clusterName": "x", day2.DEPLOYED_SETTINGS_OUTPUT: record}))
    assert day2_preview.previous_record(flat) == record
    older = tmp_path / "older.json"
    older.write_text(json.dumps({"clusterName": "x"}))
    with pytest.raises(day2_preview.PreviousError, match=r"no 'deployedSettings'.*pulumi stack output --json"):
        day2_preview.previous_record(older)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(day2_preview.PreviousError, match="not a JSON file"):
        day2_preview.previous_record(broken)


def test_the_report_says_what_each_change_does():
    previous = day2_preview.previous_record(GOLDEN_DEV)
    current = {
        **previous,
        "lustre.capacityGib": previous["lustre.capacityGib"] * 2,
        "shmSize": "200Gi",
        "privateNodes": False,
    }
    text = day2_preview.report(previous, current, (), "prev.json")
    lines = text.splitlines()
    assert lines[0] == "day 2, against the last deployment's record in prev.json:"
    assert "  updates in place  lustre.capacityGib: 9000 -> 18000: it grows in place" in lines
    assert any(line.startswith("  replaces          shmSize: '240Gi' -> '200Gi'") for line in lines)
    assert any(line.startswith("  refuses           privateNodes: True -> False") for line in lines)
    assert "pulumi up would stop before changing anything:" in lines
    assert any("'allowReplace[0]' shmSize" in line for line in lines)
    # Listed: the replacement goes through, the refusal still stops it.
    allowed = day2_preview.report(previous, current, ("shmSize",), "prev.json")
    assert "(listed in allowReplace)" in allowed and "privateNodes: True -> False is refused" in allowed
    without = {**current, "privateNodes": True}
    assert day2_preview.report(previous, without, ("shmSize",), "prev.json").endswith(
        "pulumi up: the guard lets this through"
    )


def test_make_plan_with_previous_prints_the_change_list(tmp_path: Path, capsys):
    code = plan.main(
        [
            "--stack",
            "dev",
            "--out",
            str(tmp_path),
            "--quiet",
            "--previous",
            str(GOLDEN_DEV),
            "-c",
            "nemoRlImage=nvcr.io/nvidia/nemo-rl:v0.7.0",
            "-c",
            'allowReplace=["nemoRlImage"]',
            "-c",
            "gpuNodes=3",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "replaces          nemoRlImage: 'nvcr.io/nvidia/nemo-rl:v0.5.0' -> 'nvcr.io/nvidia/nemo-rl:v0.7.0'" in out
    assert "+ follows: replaces          rayVersion: '2.49.2' -> '2.55.1'" in out
    assert "  updates in place  gpuNodes: 1 -> 3: the autoscaler's limit: KubeRay deletes only the pods it names" in out
    assert out.rstrip().endswith("pulumi up: the guard lets this through")
    missing = tmp_path / "none.json"
    assert plan.main(["--stack", "dev", "--out", str(tmp_path), "--quiet", "--previous", str(missing)]) == 2
