"""The GCS export against a local fake of the metadata server and of the Cloud Storage JSON API (list, media
upload with ifGenerationMatch). Not verified against real Cloud Storage: only the request shapes documented for
the JSON API, as this fake implements them."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from script_loader import load_script

export = load_script("jobs/scripts/export_gcs.py", "export_gcs")


class _FakeGcs(http.server.BaseHTTPRequestHandler):
    objects: ClassVar[dict[str, dict[str, Any]]] = {}  # name -> {data, generation}
    uploads: ClassVar[list[str]] = []
    auth: ClassVar[set[str]] = set()

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/token":
            assert self.headers["Metadata-Flavor"] == "Google"
            return self._json(200, {"access_token": "ya29.fake", "expires_in": 3599, "token_type": "Bearer"})
        type(self).auth.add(self.headers.get("Authorization", ""))
        assert url.path == "/storage/v1/b/models-bkt/o", url.path
        names = sorted(n for n in self.objects if n.startswith(query["prefix"]))
        start = int(query.get("pageToken", "0"))
        page = names[start : start + 2]  # small pages, so paging is exercised
        items = [
            {
                "name": n,
                "size": str(len(self.objects[n]["data"])),
                "md5Hash": base64.b64encode(hashlib.md5(self.objects[n]["data"]).digest()).decode(),
                "generation": str(self.objects[n]["generation"]),
            }
            for n in page
        ]
        body: dict[str, Any] = {"items": items} if items else {}
        if start + 2 < len(names):
            body["nextPageToken"] = str(start + 2)
        return self._json(200, body)

    def do_POST(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        type(self).auth.add(self.headers.get("Authorization", ""))
        assert url.path == "/upload/storage/v1/b/models-bkt/o" and query["uploadType"] == "media"
        data = self.rfile.read(int(self.headers["Content-Length"]))
        current = self.objects.get(query["name"])
        if str(current["generation"] if current else 0) != query["ifGenerationMatch"]:
            return self._json(412, {"error": {"code": 412, "message": "Precondition Failed"}})
        generation = (current["generation"] if current else 0) + 1
        type(self).objects[query["name"]] = {"data": data, "generation": generation}
        type(self).uploads.append(query["name"])
        return self._json(200, {"name": query["name"], "generation": str(generation)})

    def log_message(self, *args: Any) -> None:
        pass


def serve(handler: type[_FakeGcs]) -> Iterator[str]:
    """An empty fake bucket served on a free local port, for the length of a fixture: its base URL."""
    _FakeGcs.objects, _FakeGcs.uploads, _FakeGcs.auth = {}, [], set()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def gcs() -> Iterator[str]:
    yield from serve(_FakeGcs)


def _hf(root: Path) -> Path:
    hf = root / "hf"
    (hf / "sub").mkdir(parents=True)
    (hf / "config.json").write_text('{"model_type": "qwen2"}')
    (hf / "model-00001-of-00002.safetensors").write_bytes(b"\x01" * 3000)
    (hf / "model-00002-of-00002.safetensors").write_bytes(b"\x02" * 2000)
    (hf / "sub" / "tokenizer.json").write_text("{}")
    return hf


def _main(gcs: str, source: Path, destination: str = "gs://models-bkt/run1/") -> int:
    return int(
        export.main(
            ["--source", str(source), "--destination", destination, "--storage-api", gcs, "--token-url", f"{gcs}/token"]
        )
    )


def test_first_run_copies_everything_a_rerun_nothing(gcs: str, tmp_path: Path, capsys: Any) -> None:
    hf = _hf(tmp_path)
    assert _main(gcs, hf) == 0
    assert sorted(_FakeGcs.uploads) == [
        "run1/config.json",
        "run1/model-00001-of-00002.safetensors",
        "run1/model-00002-of-00002.safetensors",
        "run1/sub/tokenizer.json",
    ]
    assert _FakeGcs.objects["run1/model-00001-of-00002.safetensors"]["data"] == b"\x01" * 3000
    assert _FakeGcs.auth == {"Bearer ya29.fake"}
    _FakeGcs.uploads.clear()
    assert _main(gcs, hf) == 0
    assert _FakeGcs.uploads == []
    assert "4 of 4 files already in gs://models-bkt/run1/; copying 0" in capsys.readouterr().out


def test_a_rerun_copies_only_what_changed_or_is_missing(gcs: str, tmp_path: Path) -> None:
    hf = _hf(tmp_path)
    assert _main(gcs, hf) == 0
    _FakeGcs.uploads.clear()
    # A newer conversion: one shard differs at the same size, and a file is new.
    (hf / "model-00002-of-00002.safetensors").write_bytes(b"\x03" * 2000)
    (hf / "generation_config.json").write_text("{}")
    del _FakeGcs.objects["run1/config.json"]  # and one object went missing
    assert _main(gcs, hf) == 0
    assert sorted(_FakeGcs.uploads) == [
        "run1/config.json",
        "run1/generation_config.json",
        "run1/model-00002-of-00002.safetensors",
    ]
    assert _FakeGcs.objects["run1/model-00002-of-00002.safetensors"] == {"data": b"\x03" * 2000, "generation": 2}


def test_an_object_changed_by_someone_else_meanwhile_is_not_overwritten(gcs: str, tmp_path: Path) -> None:
    hf = _hf(tmp_path)
    _FakeGcs.objects["run1/config.json"] = {"data": b"theirs", "generation": 7}
    stale = export.plan(hf, "run1/", {"run1/config.json": {"size": 6, "md5Hash": "x", "generation": "6"}})
    bucket = export.Bucket(gcs, "models-bkt", lambda: "ya29.fake")
    path, name, generation = next(item for item in stale if item[1] == "run1/config.json")
    with pytest.raises(OSError, match="412"):
        bucket.upload(path, name, generation)
    assert _FakeGcs.objects["run1/config.json"]["data"] == b"theirs"


def test_nothing_to_export_fails(gcs: str, tmp_path: Path) -> None:
    assert _main(gcs, tmp_path / "missing") == 1
    assert _FakeGcs.uploads == []
