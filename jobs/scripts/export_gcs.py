"""Copy a run's Hugging Face checkpoint to Cloud Storage, idempotently.

Runs as a Ray job on the cluster, where Workload Identity gives the Ray pods the Ray service account (the only
identity with object access on the export bucket):
    python export_gcs.py --source /data/RUN/hf --destination gs://BUCKET/RUN/

Only the standard library: the GKE metadata server hands out the access token, and the Cloud Storage JSON API
lists and uploads objects. A file whose object already exists with the same size and MD5 is skipped, so a rerun
copies only what is missing or changed; an object is replaced only at the generation that was compared
(ifGenerationMatch), so two exports never overwrite each other blindly. Exit 0 done, 1 failed, 2 usage.

archive_gcs.py (the archive step and its restore) imports the bucket calls and the comparison from here.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

STORAGE_API = "https://storage.googleapis.com"
TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
_GS_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,61}[a-z0-9])/(.*)$")
CHUNK = 8 * 2**20
TRIES = 3
TIMEOUT_S = 600.0


class Token:
    """An access token from the metadata server, fetched again shortly before it expires."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._value = ""
        self._expires = 0.0

    def __call__(self) -> str:
        if time.monotonic() > self._expires - 60:
            request = urllib.request.Request(self._url, headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(request, timeout=30) as resp:
                body = json.loads(resp.read())
            self._value = body["access_token"]
            self._expires = time.monotonic() + float(body.get("expires_in", 300))
        return self._value


def md5_base64(path: Path) -> str:
    """The file's MD5 as Cloud Storage's md5Hash spells it."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def split_uri(uri: str) -> tuple[str, str]:
    """gs://BUCKET/PREFIX -> (BUCKET, PREFIX ending in '/', or '' for the bucket's root)."""
    match = _GS_RE.match(uri)
    if not match:
        raise ValueError(f"expected gs://BUCKET/PREFIX/, got {uri!r}")
    prefix = match.group(2)
    return match.group(1), prefix + "/" if prefix and not prefix.endswith("/") else prefix


class Bucket:
    def __init__(self, api: str, bucket: str, token: Callable[[], str]) -> None:
        self.api, self.bucket, self.token = api.rstrip("/"), bucket, token

    def _call(self, method: str, url: str, body: Any = None, length: int | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token()}"}
        if length is not None:
            headers["Content-Length"] = str(length)
            headers["Content-Type"] = "application/octet-stream"
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            return dict(json.loads(resp.read() or b"{}"))

    def objects(self, prefix: str) -> dict[str, dict[str, Any]]:
        """name -> {size, md5Hash, generation} for every object under prefix."""
        found: dict[str, dict[str, Any]] = {}
        page = ""
        while True:
            query = {"prefix": prefix, "fields": "items(name,size,md5Hash,generation),nextPageToken"}
            if page:
                query["pageToken"] = page
            url = f"{self.api}/storage/v1/b/{self.bucket}/o?{urllib.parse.urlencode(query)}"
            body = self._call("GET", url)
            for item in body.get("items", []):
                found[item["name"]] = item
            page = body.get("nextPageToken", "")
            if not page:
                return found

    def upload(self, path: Path, name: str, if_generation: str) -> None:
        """Upload path as object name, only if the object's generation is still if_generation ('0': absent)."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name, "ifGenerationMatch": if_generation})
        url = f"{self.api}/upload/storage/v1/b/{self.bucket}/o?{query}"
        size = path.stat().st_size
        with path.open("rb") as handle:
            self._call("POST", url, body=handle, length=size)

    def download(self, name: str, generation: str, path: Path) -> tuple[int, str]:
        """Write that generation of object name to path; its size and MD5 (base64), computed as it is written."""
        query = urllib.parse.urlencode({"alt": "media", "generation": generation})
        url = f"{self.api}/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(name, safe='')}?{query}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token()}"})
        digest, size = hashlib.md5(usedforsecurity=False), 0
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp, path.open("wb") as handle:
            while chunk := resp.read(CHUNK):
                digest.update(chunk)
                handle.write(chunk)
                size += len(chunk)
        return size, base64.b64encode(digest.digest()).decode()


def plan(
    source: Path, prefix: str, existing: dict[str, dict[str, Any]], digest: Callable[[Path], str] = md5_base64
) -> list[tuple[Path, str, str]]:
    """(file, object name, generation to match) for each file whose object is missing or differs in size or MD5; the
    rest is skipped. Run on a fresh listing after the copy, an empty result is the verification."""
    todo = []
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        name = prefix + path.relative_to(source).as_posix()
        there = existing.get(name)
        if there is None:
            todo.append((path, name, "0"))
        elif int(there.get("size", -1)) != path.stat().st_size or there.get("md5Hash") != digest(path):
            todo.append((path, name, str(there["generation"])))
    return todo


def with_retries(action: Callable[[], object], what: str, say: Callable[[str], None], tag: str) -> bool:
    """Run action up to TRIES times (HTTP errors are OSErrors too: 412, the object changed since it was listed)."""
    for attempt in range(1, TRIES + 1):
        try:
            action()
            return True
        except OSError as exc:
            if attempt == TRIES:
                say(f"{tag}: {what}: {exc}; giving up after {TRIES} tries")
                return False
            say(f"{tag}: {what}: {exc}; trying again")
            time.sleep(2**attempt)
    return False


def upload_all(
    todo: list[tuple[Path, str, str]], bucket_api: Bucket, say: Callable[[str], None], tag: str = "export_gcs"
) -> bool:
    """Upload each (file, object name, generation to match) of plan(); False at the first file that keeps failing."""
    for path, name, generation in todo:
        if not with_retries(functools.partial(bucket_api.upload, path, name, generation), name, say, tag):
            return False
        say(f"{tag}: copied {path.name} ({path.stat().st_size} bytes) to gs://{bucket_api.bucket}/{name}")
    return True


def export(source: Path, destination: str, bucket_api: Bucket, say: Callable[[str], None] = print) -> int:
    _, prefix = split_uri(destination)
    files = [p for p in source.rglob("*") if p.is_file()] if source.is_dir() else []
    if not files:
        say(f"export_gcs: nothing to export: {source} holds no files (did the conversion run?)")
        return 1
    todo = plan(source, prefix, bucket_api.objects(prefix))
    say(f"export_gcs: {len(files) - len(todo)} of {len(files)} files already in {destination}; copying {len(todo)}")
    if not upload_all(todo, bucket_api, say):
        return 1
    say(f"export_gcs: {destination} holds the model")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the Hugging Face checkpoint folder")
    parser.add_argument("--destination", required=True, help="gs://BUCKET/PREFIX/")
    parser.add_argument("--storage-api", default=STORAGE_API, help=argparse.SUPPRESS)  # tests: a local fake
    parser.add_argument("--token-url", default=TOKEN_URL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        bucket, _ = split_uri(args.destination)
    except ValueError as exc:
        parser.error(f"--destination: {exc}")
    try:
        return export(args.source, args.destination, Bucket(args.storage_api, bucket, Token(args.token_url)))
    except (OSError, ValueError, KeyError) as exc:
        print(f"export_gcs: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
