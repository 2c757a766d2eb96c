"""Convert the newest NeMo RL checkpoint (PyTorch DCP) of a run to Hugging Face format.

Runs as a Ray job inside the NeMo RL image, from its source directory:
    python convert_checkpoint.py --checkpoint-dir /data/RUN --output-dir /data/RUN/hf
Finds the highest step_N under the checkpoint dir and runs NeMo RL's examples/converters/convert_dcp_to_hf.py on
it. Skips when the output already holds a conversion of that same step. Exit codes: 0 done or skipped, 1 no
checkpoint or the converter failed, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

CONVERTER = "examples/converters/convert_dcp_to_hf.py"
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
    if marker.is_file() and json.loads(marker.read_text()).get("step_dir") == str(step_dir):
        print(f"convert_checkpoint: {args.output_dir} already holds {step_dir.name}; skipping")
        return 0
    command = converter_command(step_dir, args.output_dir)
    print("convert_checkpoint: " + " ".join(command), flush=True)
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        print(f"convert_checkpoint: converter exited {result.returncode}", file=sys.stderr)
        return 1
    args.output_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"step_dir": str(step_dir)}))
    print(f"convert_checkpoint: {step_dir.name} -> {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
