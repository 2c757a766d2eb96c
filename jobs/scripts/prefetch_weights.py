"""Download every model a run reads into the Hugging Face cache on Lustre before training starts.

Runs as a Ray job inside the NeMo RL image, from its source directory, with the train step's own arguments:
    python prefetch_weights.py -- --config=RECIPE OVERRIDE...
The recipe and overrides are resolved with the image's own NeMo RL loader (nemo_rl.utils.config), exactly as the
GRPO entrypoint resolves them, and every model the resolved config names is fetched: each `model_name` and each
tokenizer `name` that is a hub id (local paths and nulls are left alone). Downloads use the image's own
huggingface_hub (`snapshot_download` into HF_HOME, the cache the Ray pods share), so train, vLLM and the policy
workers find the files in place instead of downloading them while they start (for Gemma, vLLM loads real weights
too, so both would wait).

Complete-or-nothing: huggingface_hub writes each file under a temporary name and renames it when whole; this script
writes a marker (`HF_HOME/prefetch/<org>--<name>.json`: the snapshot folder and every file with its size) only after
`snapshot_download` has returned, and last. A model is skipped only when its marker exists and every file it lists
is there at its size; a download that stopped halfway has no marker and is finished (huggingface_hub keeps the
files it completed) or redone, never taken as complete.

Speed: before huggingface_hub is imported, HF_XET_HIGH_PERFORMANCE=1 is set (unless the environment sets it) so
that the image's hf_xet, where it has that mode, uses all cores and larger buffers; the run says whether the image's
huggingface_hub and hf_xet have it. The Ray head this runs on has hundreds of GB of memory, well above the 64 GB
Hugging Face asks for that mode. The token comes from the pod's environment (HF_TOKEN, read by huggingface_hub
itself); it is never printed.

Exit codes: 0 every model complete (downloaded or skipped), 1 a download failed or the config could not be
resolved, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

MARKER_DIR = "prefetch"
HIGH_PERFORMANCE = "HF_XET_HIGH_PERFORMANCE"
# Files no NeMo RL reader loads (Meta's consolidated originals, other frameworks' formats): not worth the download.
IGNORE_PATTERNS = ["original/*", "*.gguf", "*.pth", "*.onnx", "*.msgpack", "*.h5", "*.ot", "*.tflite"]

Download = Callable[..., str]  # huggingface_hub.snapshot_download's shape: (repo_id, **options) -> snapshot folder


# ---------------------------------------------------------------------------------------------------------------
# Which models a run reads


def is_hub_id(value: object) -> bool:
    """'org/name' (or 'name'), not a local path, not a URL, not an interpolation left unresolved."""
    if not isinstance(value, str) or not value or value.startswith(("/", ".", "~", "$")) or "://" in value:
        return False
    return value.count("/") <= 1 and " " not in value


def models_in(config: Mapping[str, Any]) -> list[str]:
    """Every hub model the resolved config names, in a stable order: `model_name` anywhere, and `name` under a
    `tokenizer` (NeMo RL loads the tokenizer from its own repository when it differs from the model)."""
    found: list[str] = []

    def walk(node: Any, parent_key: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                is_model = key == "model_name" or (parent_key == "tokenizer" and key == "name")
                if is_model and is_hub_id(value) and value not in found:
                    found.append(value)
                walk(value, str(key))
        elif isinstance(node, list):
            for item in node:
                walk(item, parent_key)

    walk(config, "")
    return found


def resolve_config(nemo_rl_dir: Path, entry_args: list[str]) -> dict[str, Any]:
    """The run's config as the GRPO entrypoint resolves it, with the image's NeMo RL."""
    entry = argparse.ArgumentParser(prog="run_grpo")
    entry.add_argument("--config", type=str, required=True)
    args, overrides = entry.parse_known_args(entry_args)
    sys.path.insert(0, str(nemo_rl_dir))
    from nemo_rl.utils import config as nemo_config
    from omegaconf import OmegaConf

    register = getattr(nemo_config, "register_omegaconf_resolvers", None)
    if register is not None:
        register()
    elif not OmegaConf.has_resolver("mul"):  # v0.5.0's entrypoint registers `mul` itself
        OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
    config = nemo_config.load_config(str(nemo_rl_dir / args.config))
    if overrides:
        config = nemo_config.parse_hydra_overrides(config, overrides)
    resolved = OmegaConf.to_container(config, resolve=True)
    assert isinstance(resolved, dict)
    return resolved


# ---------------------------------------------------------------------------------------------------------------
# Complete or nothing


def marker_path(hf_home: Path, repo_id: str) -> Path:
    return hf_home / MARKER_DIR / f"{repo_id.replace('/', '--')}.json"


def snapshot_files(snapshot: Path) -> dict[str, int]:
    """Every file of a snapshot folder (relative path -> size), following the cache's links to its blobs."""
    files = {}
    for path in sorted(snapshot.rglob("*")):
        if path.is_file():
            files[path.relative_to(snapshot).as_posix()] = path.stat().st_size
    return files


def is_complete(marker: Path) -> bool:
    """The marker exists, is readable, and every file it lists is there at its size."""
    try:
        record = json.loads(marker.read_text())
        snapshot = Path(record["snapshot"])
        files: dict[str, int] = record["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not files:
        return False
    for name, size in files.items():
        path = snapshot / name
        try:
            if not path.is_file() or path.stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def write_marker(marker: Path, repo_id: str, snapshot: Path) -> None:
    """Written last, and atomically (a temporary name renamed into place)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    record = {"repo": repo_id, "snapshot": str(snapshot), "files": snapshot_files(snapshot)}
    temporary = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record, indent=2, sort_keys=True))
    os.replace(temporary, marker)


def prefetch(repo_id: str, hf_home: Path, download: Download, say: Callable[[str], None]) -> str:
    """'skipped' when the model is already complete, 'downloaded' after a download that returned; a download that
    raises leaves no marker (an older marker is removed first), so the next run finishes or redoes it."""
    marker = marker_path(hf_home, repo_id)
    if is_complete(marker):
        say(f"{repo_id}: complete in the cache, skipped ({marker})")
        return "skipped"
    marker.unlink(missing_ok=True)  # stale or partial: it must not outlive a download that fails now
    say(f"{repo_id}: downloading into {hf_home}")
    snapshot = Path(download(repo_id, ignore_patterns=IGNORE_PATTERNS))
    write_marker(marker, repo_id, snapshot)
    say(f"{repo_id}: complete ({len(snapshot_files(snapshot))} files in {snapshot})")
    return "downloaded"


# ---------------------------------------------------------------------------------------------------------------
# Transfer mode


def enable_high_performance(environ: MutableMapping[str, str]) -> bool:
    """Ask for hf_xet's high-performance mode unless the environment already decides; True if this set it."""
    if HIGH_PERFORMANCE in environ:
        return False
    environ[HIGH_PERFORMANCE] = "1"
    return True


def high_performance_status(constants: object, hf_xet_version: str | None) -> str:
    """What the image does with the request: huggingface_hub reads the variable (constants.HF_XET_HIGH_PERFORMANCE)
    and hands it to hf_xet only in releases that have the mode; without hf_xet, downloads go over plain HTTP."""
    if hf_xet_version is None:
        return "off: the image has no hf_xet (plain HTTP downloads)"
    if not hasattr(constants, HIGH_PERFORMANCE):
        return f"off: the image's huggingface_hub does not know {HIGH_PERFORMANCE} (hf_xet {hf_xet_version})"
    state = "on" if getattr(constants, HIGH_PERFORMANCE) else "off (set to false in the environment)"
    return f"{state} (hf_xet {hf_xet_version})"


def _hf_xet_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("hf_xet")
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# Fit, as far as the model's own config.json tells


def _nested(config: Mapping[str, Any], *keys: str) -> Any:
    node: Any = config
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def attention_heads(model_config: Mapping[str, Any]) -> int | None:
    """The model's attention heads (a multimodal model such as Gemma 3 keeps them in text_config)."""
    heads = model_config.get("num_attention_heads") or _nested(model_config, "text_config", "num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def fit_problems(run_config: Mapping[str, Any], model_config: Mapping[str, Any]) -> list[str]:
    """What the model's config.json rules out before any GPU works on it: vLLM splits the attention heads over its
    tensor-parallel ranks and refuses a size that does not divide them (at engine start, after the run has waited for
    its nodes and loaded the weights)."""
    heads = attention_heads(model_config)
    tp = _nested(run_config, "policy", "generation", "vllm_cfg", "tensor_parallel_size")
    if heads is None or not isinstance(tp, int) or tp < 1 or heads % tp == 0:
        return []
    fits = [n for n in range(1, heads + 1) if heads % n == 0 and n <= 8]
    return [
        f"{_nested(run_config, 'policy', 'model_name')} has {heads} attention heads, which vLLM's tensor parallel size "
        f"{tp} does not divide: set the job setting vllmTensorParallelSize to one of {', '.join(map(str, fits))}"
    ]


def check_fit(run_config: Mapping[str, Any], hf_home: Path, say: Callable[[str], None]) -> int:
    """After the downloads: the policy model's config.json (from its complete snapshot) against the run's sizes."""
    model = _nested(run_config, "policy", "model_name")
    if not isinstance(model, str) or not is_hub_id(model):
        return 0
    try:
        snapshot = Path(json.loads(marker_path(hf_home, model).read_text())["snapshot"])
        model_config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        say(f"{model}: no config.json in its snapshot; its fit to the run's sizes is not checked here")
        return 0
    problems = fit_problems(run_config, model_config)
    for problem in problems:
        say(f"does not fit: {problem}")
    return 1 if problems else 0


def run(models: Iterable[str], hf_home: Path, download: Download, say: Callable[[str], None]) -> int:
    failed = []
    for repo_id in models:
        try:
            prefetch(repo_id, hf_home, download, say)
        except Exception as exc:  # one message per model; the token never appears in what huggingface_hub raises
            say(f"{repo_id}: download failed: {type(exc).__name__}: {str(exc)[:300]}")
            failed.append(repo_id)
    if failed:
        say(f"not complete: {', '.join(failed)}; a rerun finishes them")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("prefetch_weights: give the train step's arguments after '--' (--config=RECIPE OVERRIDE...)")
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="prefetch_weights.py")
    parser.add_argument("--nemo-rl-dir", type=Path, default=Path.cwd(), help="NeMo RL's sources (default: here)")
    own = parser.parse_args(argv[:cut])
    hf_home = os.environ.get("HF_HOME")
    if not hf_home:
        print("prefetch_weights: HF_HOME is not set: the Ray pods set it to the cache on Lustre")
        return 2

    def say(message: str) -> None:
        print(message, flush=True)

    try:
        run_config = resolve_config(own.nemo_rl_dir.resolve(), argv[cut + 1 :])
        models = models_in(run_config)
    except Exception as exc:
        say(f"could not resolve the run's config with NeMo RL: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return 1
    if not models:
        say("the run's config names no hub model: nothing to fetch")
        return 0
    asked = enable_high_performance(os.environ)  # before huggingface_hub reads its environment
    from huggingface_hub import constants, snapshot_download

    say(f"models: {', '.join(models)}")
    say(
        f"Xet high-performance mode: {high_performance_status(constants, _hf_xet_version())}"
        + ("" if asked else " (as the environment sets it)")
    )
    return run(models, Path(hf_home), snapshot_download, say) or check_fit(run_config, Path(hf_home), say)


if __name__ == "__main__":
    sys.exit(main())
