"""Convert the newest NeMo RL checkpoint (PyTorch DCP) of a run to Hugging Face format.

Runs as a Ray job inside the NeMo RL image, from its source directory:
    python convert_checkpoint.py --checkpoint-dir /data/RUN --output-dir /data/RUN/hf
Finds the highest step_N under the checkpoint dir and runs NeMo RL's examples/converters/convert_dcp_to_hf.py on
it. Skips when the output already holds a conversion of that same step. Exit codes: 0 done or skipped, 1 no
checkpoint or the converter failed, 2 usage.

NeMo RL's converter refuses an output folder that exists, and a conversion killed halfway leaves a partial one.
So the converter writes into a fresh work folder beside the output (cleared of any leftover first), the marker is
written last, and only then does the work folder take the output's place by rename (atomic within one directory,
Lustre included). The output therefore either holds a complete, marked conversion or is not replaced; a retry
always starts clean.

The converter saves the model's config, weights and tokenizer, not its processor: vLLM loads Gemma 3 as the
multimodal Gemma3ForConditionalGeneration, which needs preprocessor_config.json. So the processor files the base
model has (policy.model_name of the checkpoint's config, from the Hugging Face cache or hub) are copied in too, also
into a conversion done before this was added.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CONVERTER = "examples/converters/convert_dcp_to_hf.py"
# What a multimodal model's processor needs beside the tokenizer, and NeMo RL's converter does not write.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
MARKER = "_CONVERTED_FROM.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


def last_step_dir(checkpoint_dir: Path) -> Path | None:
    """The step_N folder with the highest N that holds a complete checkpoint (config and weights)."""
    steps = []
    for child in checkpoint_dir.iterdir() if checkpoint_dir.is_dir() else []:
        match = _STEP_RE.match(child.name)
        if match and (child / "config.yaml").is_file() and (child / "policy" / "weights").is_dir():
            steps.append((int(match.group(1)), child))
    return max(steps)[1] if steps else None


def converter_command(step_dir: Path, output_dir: Path) -> list[str]:
    return [
        sys.executable,
        CONVERTER,
        f"--config={step_dir / 'config.yaml'}",
        f"--dcp-ckpt-path={step_dir / 'policy' / 'weights'}",
        f"--hf-ckpt-path={output_dir}",
    ]


def base_model(step_dir: Path) -> str | None:
    """policy.model_name of the checkpoint's config: the model training started from."""
    import yaml  # NeMo RL's environment has it; the rest of this script needs only the standard library

    config = yaml.safe_load((step_dir / "config.yaml").read_text()) or {}
    model = (config.get("policy") or {}).get("model_name")
    return str(model) if model else None


def fetch_model_file(model: str, filename: str) -> Path | None:
    """One file of a model (a directory or a Hugging Face name, through HF_HOME's cache), or None if it has none."""
    if Path(model).is_dir():
        found = Path(model) / filename
        return found if found.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError

    try:
        return Path(hf_hub_download(model, filename))
    except EntryNotFoundError:
        return None


def add_processor_files(
    model: str, output_dir: Path, fetch: Callable[[str, str], Path | None] = fetch_model_file
) -> list[str]:
    """Copy the base model's processor files the conversion lacks; the names copied."""
    added = []
    for name in PROCESSOR_FILES:
        if (output_dir / name).exists():
            continue
        source = fetch(model, name)
        if source is not None:
            shutil.copyfile(source, output_dir / name)
            added.append(name)
    return added


def work_dir(output_dir: Path) -> Path:
    """Where the converter writes before the result is moved into place: beside the output, so the rename stays
    within one directory."""
    return output_dir.with_name(f".{output_dir.name}.converting")


def put_in_place(work: Path, output_dir: Path) -> None:
    """Replace output_dir (an older or unfinished conversion, or nothing) with the finished work folder."""
    old = output_dir.with_name(f".{output_dir.name}.replaced")
    shutil.rmtree(old, ignore_errors=True)
    if output_dir.exists():
        output_dir.rename(old)
    work.rename(output_dir)
    shutil.rmtree(old, ignore_errors=True)


def report_processor_files(added: list[str], model: str) -> None:
    if added:
        print(f"convert_checkpoint: added {', '.join(added)} from {model}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--output-dir", required=True, type=Path)
    args = parser.parse_args(argv)

    step_dir = last_step_dir(args.checkpoint_dir)
    if step_dir is None:
        print(f"convert_checkpoint: no complete step_N checkpoint under {args.checkpoint_dir}", file=sys.stderr)
        return 1
    marker = args.output_dir / MARKER
    model = base_model(step_dir)
    if marker.is_file() and json.loads(marker.read_text()).get("step_dir") == str(step_dir):
        print(f"convert_checkpoint: {args.output_dir} already holds {step_dir.name}; skipping")
        if model:
            report_processor_files(add_processor_files(model, args.output_dir), model)
        return 0
    work = work_dir(args.output_dir)
    if work.exists():  # left by a conversion that was killed: the converter would refuse it
        print(f"convert_checkpoint: removing the unfinished conversion in {work}", flush=True)
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    command = converter_command(step_dir, work)
    print("convert_checkpoint: " + " ".join(command), flush=True)
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        print(f"convert_checkpoint: converter exited {result.returncode}", file=sys.stderr)
        return 1
    work.mkdir(exist_ok=True)
    if model:
        report_processor_files(add_processor_files(model, work), model)
    (work / MARKER).write_text(json.dumps({"step_dir": str(step_dir)}))
    put_in_place(work, args.output_dir)
    print(f"convert_checkpoint: {step_dir.name} -> {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
