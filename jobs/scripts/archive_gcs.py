"""Archive a run's newest checkpoint (and its Hugging Face conversion) to Cloud Storage, verified; or restore it.

The pipeline's last step, with the job setting `archive`, runs on the Ray head (the Ray service account, through
Workload Identity, has object access on the export bucket):
    python archive_gcs.py --run-dir=/data/RUN --archive=gs://BUCKET/RUN.archive/ --hf
It copies the newest complete /data/RUN/step_N, and with --hf /data/RUN/hf, to gs://BUCKET/RUN.archive/step_N/ and
.../hf/, then lists the objects again and checks each one's size and MD5 (Cloud Storage's md5Hash) against the local
file: any object missing or different fails the step (exit 1). A rerun copies only what is missing or differs, so
an archive that is already complete and verified is not copied again. Nothing in the bucket is ever deleted.

Restore, into a run directory on a new Lustre instance, as a Ray job submitted from a workstation:
    python archive_gcs.py --restore --run-dir=/data/RUN --archive=gs://BUCKET/RUN.archive/
downloads every object under the archive into /data/RUN (a file already there with the same size and MD5 is kept),
each into a temporary file checked against the object's size and MD5 before it is renamed into place.

The uploads, listings and comparison are export_gcs.py's (standard library only, the token from the GKE metadata
server); the newest complete checkpoint is found as convert_checkpoint.py finds it. Exit 0 done, 1 failed, 2 usage.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from convert_checkpoint import last_step_dir
from export_gcs import STORAGE_API, TOKEN_URL, Bucket, Token, md5_base64, plan, split_uri, upload_all, with_retries

TAG = "archive_gcs"
HF_DIR = "hf"


def archive(run_dir: Path, uri: str, bucket: Bucket, with_hf: bool, say: Callable[[str], None] = print) -> int:
    """Copy, then verify, each folder the archive holds; 1 at the first folder that cannot be copied or verified."""
    _, prefix = split_uri(uri)
    step = last_step_dir(run_dir)
    if step is None:
        say(f"{TAG}: nothing to archive: {run_dir} holds no complete step_N checkpoint (did the training save one?)")
        return 1
    folders = [step]
    if with_hf:
        hf = run_dir / HF_DIR
        if not hf.is_dir() or not any(p.is_file() for p in hf.rglob("*")):
            say(f"{TAG}: {hf} holds no files (did the conversion run?)")
            return 1
        folders.append(hf)
    digest = functools.cache(md5_base64)  # each file read once for the copy and its verification
    for folder in folders:
        folder_prefix = f"{prefix}{folder.name}/"
        where = f"gs://{bucket.bucket}/{folder_prefix}"
        count = sum(1 for p in folder.rglob("*") if p.is_file())
        todo = plan(folder, folder_prefix, bucket.objects(folder_prefix), digest)
        say(f"{TAG}: {count - len(todo)} of {count} files of {folder} already in {where}; copying {len(todo)}")
        if not upload_all(todo, bucket, say, TAG):
            return 1
        wrong = plan(folder, folder_prefix, bucket.objects(folder_prefix), digest)
        for path, name, generation in wrong:
            state = "is missing" if generation == "0" else "differs from the local file in size or MD5"
            say(f"{TAG}: verification failed: gs://{bucket.bucket}/{name} {state} ({path})")
        if wrong:
            say(f"{TAG}: {len(wrong)} of {count} objects in {where} do not match; run the step again to copy them")
            return 1
        say(f"{TAG}: verified {count} objects in {where} (size and MD5 of each against {folder})")
    say(f"{TAG}: {uri} holds {', '.join(f.name for f in folders)}")
    return 0


def restore(run_dir: Path, uri: str, bucket: Bucket, say: Callable[[str], None] = print) -> int:
    """Download every object of the archive into run_dir, each checked against its size and MD5."""
    _, prefix = split_uri(uri)
    objects = {name: meta for name, meta in bucket.objects(prefix).items() if not name.endswith("/")}
    if not objects:
        say(f"{TAG}: nothing to restore: {uri} holds no objects")
        return 1
    kept = 0
    for name, meta in sorted(objects.items()):
        relative = PurePosixPath(name[len(prefix) :])
        if ".." in relative.parts or relative.is_absolute():
            say(f"{TAG}: refusing gs://{bucket.bucket}/{name}: it names a path outside {run_dir}")
            return 1
        target = run_dir / relative
        size, md5 = int(meta.get("size", -1)), meta.get("md5Hash")
        if target.is_file() and target.stat().st_size == size and md5_base64(target) == md5:
            kept += 1
            continue
        if not _download(bucket, name, meta, target, say):
            return 1
        say(f"{TAG}: restored {target} ({size} bytes)")
    say(f"{TAG}: {run_dir} holds the {len(objects)} files of {uri} ({kept} were already there)")
    return 0


def _download(bucket: Bucket, name: str, meta: dict[str, Any], target: Path, say: Callable[[str], None]) -> bool:
    """One object into a temporary file beside target, renamed into place once its size and MD5 match the object's
    metadata: an interrupted or corrupted download never takes the name."""
    expected = (int(meta.get("size", -1)), meta.get("md5Hash"))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.restoring")
    got: list[tuple[int, str]] = []
    fetched = with_retries(lambda: got.append(bucket.download(name, str(meta["generation"]), partial)), name, say, TAG)
    if fetched and got[-1] == expected:
        partial.replace(target)
        return True
    partial.unlink(missing_ok=True)
    if fetched:
        say(f"{TAG}: gs://{bucket.bucket}/{name}: downloaded (size, MD5) {got[-1]}, its metadata says {expected}")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's folder on Lustre, /data/RUN")
    parser.add_argument("--archive", required=True, help="gs://BUCKET/RUN.archive/")
    parser.add_argument("--hf", action="store_true", help="also archive RUN_DIR/hf, the converted model")
    parser.add_argument("--restore", action="store_true", help="download the archive into RUN_DIR instead")
    parser.add_argument("--storage-api", default=STORAGE_API, help=argparse.SUPPRESS)  # tests: a local fake
    parser.add_argument("--token-url", default=TOKEN_URL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        name, prefix = split_uri(args.archive)
    except ValueError as exc:
        parser.error(f"--archive: {exc}")
    if not prefix:
        parser.error("--archive: name a folder of the bucket, gs://BUCKET/RUN.archive/, not its root")
    bucket = Bucket(args.storage_api, name, Token(args.token_url))
    try:
        if args.restore:
            return restore(args.run_dir, args.archive, bucket)
        return archive(args.run_dir, args.archive, bucket, args.hf)
    except (OSError, ValueError, KeyError) as exc:
        print(f"{TAG}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
