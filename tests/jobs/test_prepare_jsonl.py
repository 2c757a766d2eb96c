"""jobs/scripts/prepare_jsonl.py: the job setting dataset's rows into train.jsonl and test.jsonl, from a local file,
from a local stand-in of the GKE metadata server and Cloud Storage's JSON API (object metadata and `alt=media`), and
from a stand-in of the Hugging Face hub's resolve URL. Not verified against real Cloud Storage or the real hub: only
the request shapes documented for them, as these stand-ins implement them."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import ROOT

SCRIPT = ROOT / "jobs" / "scripts" / "prepare_jsonl.py"
ROWS = [{"question": f"What is {i} + {i}?", "final": 2 * i, "id": i} for i in range(60)]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(out: Path, source: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The script as the pipeline runs it: its own file, with prepare_gsm8k.py and export_gcs.py beside it."""
    fields = ["--problem-field=question", "--answer-field=final"]
    return subprocess.run(
        [sys.executable, str(SCRIPT), f"--output-dir={out}", f"--source={source}", *fields, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_a_local_file_is_split_into_train_and_held_out_test_rows_once(tmp_path: Path):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "out"
    first = run(out, str(source))
    assert first.returncode == 0, first.stderr
    train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
    assert len(test) == 3 and len(train) == 57  # 5% of 60 held out, none lost, none in both
    assert all(set(row) == {"input", "output"} for row in train + test)  # only the two fields NeMo RL reads
    assert sorted(r["input"] for r in train + test) == sorted(str(r["question"]) for r in ROWS)
    assert {r["input"]: r["output"] for r in train + test}["What is 7 + 7?"] == "14"  # a number becomes text
    manifest = json.loads((out / "_COMPLETE.json").read_text())
    assert manifest["splits"] == {
        "train": {"file": "train.jsonl", "rows": 57},
        "test": {"file": "test.jsonl", "rows": 3},
    }

    stamp = (out / "train.jsonl").stat().st_mtime_ns
    second = run(out, str(source))
    assert second.returncode == 0 and "is complete" in second.stdout and "skipping" in second.stdout
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp

    # The same rows in another order split the same way (the held-out rows are chosen by their problem's hash).
    shuffled = write_jsonl(tmp_path / "shuffled.jsonl", list(reversed(ROWS)))
    assert run(tmp_path / "again", str(shuffled)).returncode == 0
    assert sorted(map(str, read_jsonl(tmp_path / "again" / "test.jsonl"))) == sorted(map(str, test))

    # A changed file is prepared again.
    write_jsonl(source, ROWS[:40])
    third = run(out, str(source))
    assert third.returncode == 0 and "wrote train=38, test=2" in third.stdout


def test_a_test_source_gives_the_test_rows(tmp_path: Path):
    train_file = write_jsonl(tmp_path / "train.jsonl", ROWS[:50])
    test_file = write_jsonl(tmp_path / "test.jsonl", ROWS[50:])
    result = run(tmp_path / "out", str(train_file), f"--test-source={test_file}")
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(tmp_path / "out" / "train.jsonl")) == 50
    assert [r["input"] for r in read_jsonl(tmp_path / "out" / "test.jsonl")] == [r["question"] for r in ROWS[50:]]


@pytest.mark.parametrize(
    ("rows", "field", "setting", "line"),
    [
        ([{"prompt": "q", "final": 1}] * 5, "question", "dataset.problemField", 1),
        ([{"question": "q", "final": 1}] * 3 + [{"question": "q", "answer": 2}], "final", "dataset.answerField", 4),
    ],
)
def test_a_row_without_a_field_is_refused_in_one_line_naming_it(tmp_path: Path, rows, field, setting, line):
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    result = run(out, str(source))
    assert result.returncode == 1
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1
    assert errors[0].startswith(f"prepare_jsonl: error: {source} line {line} has no field {field!r} ({setting})")
    assert not (out / "_COMPLETE.json").exists() and not (out / "train.jsonl").exists()  # nothing half-made


def test_a_missing_source_is_refused_in_one_line(tmp_path: Path):
    result = run(tmp_path / "out", str(tmp_path / "nowhere.jsonl"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"prepare_jsonl: error: {tmp_path / 'nowhere.jsonl'}: no such file"]


def test_a_refused_source_leaves_the_earlier_complete_output_as_it_was(tmp_path: Path):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "out"
    assert run(out, str(source)).returncode == 0
    write_jsonl(source, [*ROWS, {"question": "no answer"}])
    assert run(out, str(source)).returncode == 1
    assert (out / "_COMPLETE.json").exists()  # the source was refused before anything was removed or written
    write_jsonl(source, ROWS)
    assert "is complete" in run(out, str(source)).stdout


# --- Cloud Storage and the hub, through local stand-ins ---------------------------------------------------------------


class _Stand_in(http.server.BaseHTTPRequestHandler):  # noqa: N801
    objects: ClassVar[dict[str, bytes]] = {}  # gs object name / hub path -> bytes
    seen: ClassVar[list[tuple[str, str]]] = []  # (path, Authorization)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        type(self).seen.append((url.path, self.headers.get("Authorization", "")))
        if url.path == "/token":
            assert self.headers["Metadata-Flavor"] == "Google"
            return self._send(200, json.dumps({"access_token": "ya29.fake", "expires_in": 3599}).encode())
        if url.path.startswith("/storage/v1/b/data-bkt/o/"):
            name = urllib.parse.unquote(url.path.removeprefix("/storage/v1/b/data-bkt/o/"))
            if name not in self.objects:
                return self._send(404, b'{"error": {"code": 404, "message": "No such object"}}')
            if query.get("alt") == "media":
                return self._send(200, self.objects[name])
            return self._send(200, json.dumps({"name": name, "generation": str(len(self.objects[name]))}).encode())
        if url.path.startswith("/datasets/org/maths/resolve/main/"):
            name = url.path.removeprefix("/datasets/org/maths/resolve/main/")
            if name not in self.objects:
                return self._send(404, b"Entry not found")
            # As the hub does: a redirect to another host for the file itself.
            port = self.headers["Host"].rsplit(":", 1)[1]
            return self._send(302, b"", {"Location": f"http://localhost:{port}/cdn/{name}"})
        if url.path.startswith("/cdn/"):
            return self._send(200, self.objects[url.path.removeprefix("/cdn/")])
        return self._send(404, b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[str]:
    _Stand_in.objects, _Stand_in.seen = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stand_in)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_gcs_object_is_read_with_the_metadata_servers_token(tmp_path: Path, stand_in: str):
    _Stand_in.objects["math/rows.jsonl"] = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    gcs = [f"--storage-api={stand_in}", f"--token-url={stand_in}/token"]
    result = run(tmp_path / "out", "gs://data-bkt/math/rows.jsonl", *gcs)
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(tmp_path / "out" / "train.jsonl")) + len(read_jsonl(tmp_path / "out" / "test.jsonl")) == 60
    object_calls = [auth for path, auth in _Stand_in.seen if path.startswith("/storage/")]
    assert object_calls and set(object_calls) == {"Bearer ya29.fake"}
    # Once: the second run asks only for the object's generation, and skips.
    _Stand_in.seen.clear()
    again = run(tmp_path / "out", "gs://data-bkt/math/rows.jsonl", *gcs)
    assert "skipping" in again.stdout
    assert [path for path, _ in _Stand_in.seen if path.startswith("/storage/")] == [
        "/storage/v1/b/data-bkt/o/math%2Frows.jsonl"
    ]

    missing = run(tmp_path / "other", "gs://data-bkt/math/nope.jsonl", *gcs)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "prepare_jsonl: error: gs://data-bkt/math/nope.jsonl: no such file (HTTP 404)"
    ]


def test_a_hub_file_is_read_with_hf_token_which_stays_on_the_hub(tmp_path: Path, stand_in: str):
    _Stand_in.objects["data/train.jsonl"] = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_secret"}
    result = run(tmp_path / "out", "hf://datasets/org/maths/data/train.jsonl", f"--hub-endpoint={stand_in}", env=env)
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(tmp_path / "out" / "test.jsonl")) == 3
    calls = dict(_Stand_in.seen)
    assert calls["/datasets/org/maths/resolve/main/data/train.jsonl"] == "Bearer hf_secret"
    assert calls["/cdn/data/train.jsonl"] == ""  # the redirect went to another host: no token there
    missing = run(tmp_path / "x", "hf://datasets/org/maths/nope.jsonl", f"--hub-endpoint={stand_in}", env=env)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "prepare_jsonl: error: hf://datasets/org/maths/nope.jsonl: no such file (HTTP 404)"
    ]
