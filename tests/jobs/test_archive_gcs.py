"""The archive step (jobs/scripts/archive_gcs.py) and its restore, against the local fake of the metadata server and
of the Cloud Storage JSON API that test_export_gcs.py serves (list, media upload with ifGenerationMatch), extended
here with media download and a way to corrupt what the bucket stores. Not verified against real Cloud Storage."""

from __future__ import annotations

import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import ROOT
from test_export_gcs import _FakeGcs, serve

SCRIPTS = ROOT / "jobs" / "scripts"
if str(SCRIPTS) not in sys.path:  # as on the Ray head: the scripts run from their folder and import each other
    sys.path.insert(0, str(SCRIPTS))

import archive_gcs  # noqa: E402

BUCKET = "models-bkt"
URI = f"gs://{BUCKET}/run1.archive/"


class _FakeGcsWithDownloads(_FakeGcs):
    """Also GET .../o/NAME?alt=media (a given generation), and `corrupt`: names whose next upload is stored with
    one byte changed, as a bad copy would leave them."""

    corrupt: ClassVar[set[str]] = set()
    downloads: ClassVar[list[str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        prefix = f"/storage/v1/b/{BUCKET}/o/"
        if query.get("alt") != "media":
            return super().do_GET()
        assert url.path.startswith(prefix) and self.headers["Authorization"] == "Bearer ya29.fake"
        name = urllib.parse.unquote(url.path[len(prefix) :])
        stored = self.objects.get(name)
        if stored is None or str(stored["generation"]) != query["generation"]:
            return self._json(404, {"error": {"code": 404, "message": "No such object"}})
        type(self).downloads.append(name)
        self.send_response(200)
        self.send_header("Content-Length", str(len(stored["data"])))
        self.end_headers()
        self.wfile.write(stored["data"])
        return None

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        super().do_POST()
        for name in list(self.corrupt):
            if name in self.objects:
                data = self.objects[name]["data"]
                self.objects[name]["data"] = bytes([data[0] ^ 0xFF]) + data[1:]
                type(self).corrupt.discard(name)


@pytest.fixture
def gcs() -> Iterator[str]:
    _FakeGcsWithDownloads.corrupt, _FakeGcsWithDownloads.downloads = set(), []
    yield from serve(_FakeGcsWithDownloads)


def _run_dir(root: Path) -> Path:
    """A finished run: two complete checkpoints, an incomplete newer one, the HF conversion and other output."""
    run = root / "run1"
    for step in (1, 2):
        weights = run / f"step_{step}" / "policy" / "weights"
        weights.mkdir(parents=True)
        (run / f"step_{step}" / "config.yaml").write_text(f"step: {step}\n")
        (weights / "__0_0.distcp").write_bytes(bytes([step]) * 4000)
        (run / f"step_{step}" / "policy" / "optimizer").mkdir()
        (run / f"step_{step}" / "policy" / "optimizer" / "__0_0.distcp").write_bytes(b"\x07" * 3000)
    (run / "tmp_step_3").mkdir()  # a save that never finished: never archived
    (run / "step_3").mkdir()  # no config, no weights: not a complete checkpoint
    (run / "hf").mkdir()
    (run / "hf" / "config.json").write_text('{"model_type": "qwen2"}')
    (run / "hf" / "model.safetensors").write_bytes(b"\x05" * 5000)
    (run / "logs").mkdir()
    (run / "logs" / "events.out").write_text("not archived")
    return run


def _main(gcs: str, *args: str) -> int:
    return int(archive_gcs.main([*args, "--archive", URI, "--storage-api", gcs, "--token-url", f"{gcs}/token"]))


NEWEST = [
    "run1.archive/hf/config.json",
    "run1.archive/hf/model.safetensors",
    "run1.archive/step_2/config.yaml",
    "run1.archive/step_2/policy/optimizer/__0_0.distcp",
    "run1.archive/step_2/policy/weights/__0_0.distcp",
]


def test_copies_the_newest_checkpoint_and_the_model_verifies_them_and_a_rerun_copies_nothing(
    gcs: str, tmp_path: Path, capsys: Any
) -> None:
    run = _run_dir(tmp_path)
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0
    assert sorted(_FakeGcs.uploads) == NEWEST
    assert _FakeGcs.objects["run1.archive/step_2/policy/weights/__0_0.distcp"]["data"] == b"\x02" * 4000
    out = capsys.readouterr().out
    assert f"verified 3 objects in gs://{BUCKET}/run1.archive/step_2/" in out
    assert f"verified 2 objects in gs://{BUCKET}/run1.archive/hf/" in out
    _FakeGcs.uploads.clear()
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0  # a rerun: everything there and verified
    assert _FakeGcs.uploads == []
    out = capsys.readouterr().out
    assert "3 of 3 files of" in out and "2 of 2 files of" in out and "copying 0" in out


def test_without_the_conversion_only_the_checkpoint_is_archived(gcs: str, tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert _main(gcs, "--run-dir", str(run)) == 0
    assert sorted(_FakeGcs.uploads) == [name for name in NEWEST if "/step_2/" in name]


def test_a_corrupted_copy_fails_the_step_and_a_rerun_repairs_it(gcs: str, tmp_path: Path, capsys: Any) -> None:
    run = _run_dir(tmp_path)
    bad = "run1.archive/step_2/policy/weights/__0_0.distcp"
    _FakeGcsWithDownloads.corrupt.add(bad)
    assert _main(gcs, "--run-dir", str(run), "--hf") == 1
    out = capsys.readouterr().out
    assert f"verification failed: gs://{BUCKET}/{bad} differs from the local file in size or MD5" in out
    assert "run1.archive/hf/" not in "".join(_FakeGcs.uploads)  # stopped at the folder that failed
    _FakeGcs.uploads.clear()
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0  # the rerun copies the bad object again, and the model
    assert _FakeGcs.uploads == [bad, "run1.archive/hf/config.json", "run1.archive/hf/model.safetensors"]
    assert _FakeGcs.objects[bad] == {"data": b"\x02" * 4000, "generation": 2}


def test_an_object_damaged_in_the_bucket_later_is_copied_again(gcs: str, tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0
    _FakeGcs.uploads.clear()
    _FakeGcs.objects["run1.archive/hf/config.json"]["data"] = b"{}"
    del _FakeGcs.objects["run1.archive/step_2/config.yaml"]
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0
    assert sorted(_FakeGcs.uploads) == ["run1.archive/hf/config.json", "run1.archive/step_2/config.yaml"]


def test_nothing_to_archive_fails(gcs: str, tmp_path: Path, capsys: Any) -> None:
    assert _main(gcs, "--run-dir", str(tmp_path / "missing"), "--hf") == 1
    assert "no complete step_N checkpoint" in capsys.readouterr().out
    run = _run_dir(tmp_path)
    for path in (run / "hf").iterdir():
        path.unlink()
    assert _main(gcs, "--run-dir", str(run), "--hf") == 1  # --hf and no conversion: nothing half-archived
    assert _FakeGcs.uploads == []


def test_restore_puts_the_archive_back_into_a_new_run_dir(gcs: str, tmp_path: Path, capsys: Any) -> None:
    run = _run_dir(tmp_path)
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0
    fresh = tmp_path / "new-lustre" / "run1"
    assert _main(gcs, "--restore", "--run-dir", str(fresh)) == 0
    restored = sorted(p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file())
    assert restored == [name.removeprefix("run1.archive/") for name in NEWEST]
    assert (fresh / "step_2" / "policy" / "weights" / "__0_0.distcp").read_bytes() == b"\x02" * 4000
    assert archive_gcs.last_step_dir(fresh) == fresh / "step_2"  # what NeMo RL resumes from
    _FakeGcsWithDownloads.downloads.clear()
    assert _main(gcs, "--restore", "--run-dir", str(fresh)) == 0  # again: every file is already there
    assert _FakeGcsWithDownloads.downloads == []
    assert "(5 were already there)" in capsys.readouterr().out


def test_restore_refuses_an_object_whose_bytes_do_not_match_its_metadata(gcs: str, tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert _main(gcs, "--run-dir", str(run), "--hf") == 0
    fresh = tmp_path / "fresh"
    original = _FakeGcs.objects["run1.archive/hf/model.safetensors"]
    # The listing reports the real object's size and MD5 (computed from the stored data by the fake), so a damaged
    # download is simulated by a server answering the media request with other bytes.
    real_get = _FakeGcsWithDownloads.do_GET

    def damaged_get(self: _FakeGcsWithDownloads) -> None:
        if "alt=media" in self.path and "model.safetensors" in self.path:
            self.send_response(200)
            self.send_header("Content-Length", str(len(original["data"])))
            self.end_headers()
            self.wfile.write(b"\x00" * len(original["data"]))
            return None
        return real_get(self)

    _FakeGcsWithDownloads.do_GET = damaged_get  # type: ignore[method-assign]
    try:
        assert _main(gcs, "--restore", "--run-dir", str(fresh)) == 1
    finally:
        _FakeGcsWithDownloads.do_GET = real_get  # type: ignore[method-assign]
    assert not (fresh / "hf" / "model.safetensors").exists()
    assert not list(fresh.rglob("*.restoring"))  # no partial file left behind
    assert (fresh / "hf" / "config.json").is_file()  # what came before it is kept


def test_restore_of_an_empty_archive_fails(gcs: str, tmp_path: Path) -> None:
    assert _main(gcs, "--restore", "--run-dir", str(tmp_path / "run1")) == 1


def test_it_runs_with_the_images_plain_python():
    """Like export-gcs, the step runs with `python` outside `uv run`: what it and the shipped scripts it imports
    import when loaded must be the standard library or another script shipped beside them (launcher.job)."""
    import ast

    from launcher.job import SCRIPT_FILES

    shipped = {Path(name).stem: ROOT / "jobs" / name for name in SCRIPT_FILES}
    seen, todo = set(), ["archive_gcs"]
    while todo:
        module = todo.pop()
        seen.add(module)
        tree = ast.parse(shipped[module].read_text())
        loaded = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        loaded |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
        top = {name.split(".")[0] for name in loaded}
        assert top <= {*sys.stdlib_module_names, "__future__", *shipped}, module
        todo += [name for name in top & set(shipped) if name not in seen]
    assert seen == {"archive_gcs", "export_gcs", "convert_checkpoint"}
