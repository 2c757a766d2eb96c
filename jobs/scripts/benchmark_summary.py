"""The benchmark's verdict: seconds per step and tokens/s/GPU per recipe, from NeMo RL's own logged metrics, beside
NVIDIA's published figures.

Runs in the submitter pod after the benchmark's train steps, with the image's python (its tensorboard reads the
event files):
    python benchmark_summary.py --first-step=5 --last-step=9 --mode=NAME:LOG_DIR:SECONDS:TOKENS
        [--about=NAME:TEXT] [--published-by=NAME:TEXT] [--mode=...]

SECONDS and TOKENS are NVIDIA's figures for the recipe, or `unknown` where no summary has one (the line then gives
the measurement alone); --about describes the run (mode, precision, GPUs), --published-by whose figure it is.

Each LOG_DIR is a train step's logger.log_dir. NeMo RL's GRPO loops (algorithms/grpo.py, sync and async, v0.5.0 and
v0.7.0) log, per step, `timing/train/total_step_time` (the step's wall time) and `performance/tokens_per_sec_per_gpu`
(print_performance_metrics: every token of the step over its time and all GPUs, the "Tokens / sec / GPU" of NVIDIA's
performance summary); with TensorBoard on they land in LOG_DIR/exp_NNN/tensorboard/ (one exp_NNN per attempt: a
retried step's later value wins). Steps FIRST..LAST are averaged, as NVIDIA averages 5 steps. One line per recipe:
    benchmark grpo-llama3.1-8b-instruct-2n8g (on-policy, BF16, 16 GPUs): 95.1 s/step, 1,540 tokens/s/GPU (steps
    5-9) vs NVIDIA DGX-H100 (NeMo RL v0.5.0 performance summary) 92.8 s, 1,581: 0.97x tokens/s/GPU, 1.02x step time
(one line in the log). The ratios are measured over published: above 1 is more throughput, and a longer step.
Exit codes: 0 printed, 1 a mode's metrics are
missing (the message names the folder and the steps), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

STEP_TIME = "timing/train/total_step_time"
TOKENS_PER_GPU = "performance/tokens_per_sec_per_gpu"
UNKNOWN = "unknown"


class MetricsError(Exception):
    """A mode whose logged metrics do not cover the measured steps; the message says where and which."""


@dataclass(frozen=True)
class Mode:
    name: str
    log_dir: Path
    published_seconds: float | None  # None: no published figure
    published_tokens: float | None
    about: str = ""
    published_by: str = "NVIDIA"


def _figure(text: str) -> float | None:
    return None if text == UNKNOWN else float(text)


def parse_mode(text: str) -> Mode:
    name, rest = text.split(":", 1)
    folder, seconds, tokens = rest.rsplit(":", 2)
    if not name or not folder:
        raise ValueError(text)
    return Mode(name, Path(folder), _figure(seconds), _figure(tokens))


def by_name(texts: list[str], option: str) -> dict[str, str]:
    """--about / --published-by: NAME:TEXT each."""
    found = {}
    for text in texts:
        name, sep, value = text.partition(":")
        if not sep or not name or not value:
            raise ValueError(f"{option} is NAME:TEXT, got {text!r}")
        found[name] = value
    return found


def event_files(log_dir: Path) -> list[Path]:
    """Every TensorBoard event file of the log dir, oldest attempt first (exp_001 before exp_002)."""
    return sorted(log_dir.glob("exp_*/tensorboard/**/events.out.tfevents.*"))


def scalars(files: Iterable[Path], tags: set[str]) -> Iterator[tuple[str, int, float]]:
    """(tag, step, value) of every scalar with one of `tags`, in file order; simple values (torch's SummaryWriter,
    which NeMo RL's TensorboardLogger uses) and scalar tensors alike."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    for path in files:
        for event in EventFileLoader(str(path)).Load():
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.tag not in tags:
                    continue
                if value.HasField("simple_value"):
                    yield value.tag, int(event.step), float(value.simple_value)
                elif value.HasField("tensor"):
                    yield value.tag, int(event.step), float(tensor_util.make_ndarray(value.tensor).item())


def measure(mode: Mode, first: int, last: int) -> tuple[float, float]:
    """Mean seconds per step and tokens/s/GPU over steps first..last."""
    by_tag: dict[str, dict[int, float]] = {STEP_TIME: {}, TOKENS_PER_GPU: {}}
    for tag, step, value in scalars(event_files(mode.log_dir), set(by_tag)):
        by_tag[tag][step] = value  # a later attempt's value for the same step wins
    wanted = range(first, last + 1)
    for tag, values in by_tag.items():
        missing = [step for step in wanted if step not in values]
        if missing:
            raise MetricsError(
                f"{mode.name}: no {tag} for steps {missing} under {mode.log_dir}/exp_*/tensorboard "
                f"(logged steps: {sorted(values) or 'none'})"
            )
    seconds = sum(by_tag[STEP_TIME][step] for step in wanted) / len(wanted)
    tokens = sum(by_tag[TOKENS_PER_GPU][step] for step in wanted) / len(wanted)
    return seconds, tokens


def summary_line(mode: Mode, seconds: float, tokens: float, first: int, last: int) -> str:
    about = f" ({mode.about})" if mode.about else ""
    measured = f"benchmark {mode.name}{about}: {seconds:.1f} s/step, {tokens:,.0f} tokens/s/GPU (steps {first}-{last})"
    if mode.published_seconds is None or mode.published_tokens is None:
        return f"{measured} vs {mode.published_by}: no published figure for this recipe"
    return (
        f"{measured} vs {mode.published_by} {mode.published_seconds:g} s, {mode.published_tokens:,.0f}: "
        f"{tokens / mode.published_tokens:.2f}x tokens/s/GPU, {seconds / mode.published_seconds:.2f}x step time"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--first-step", type=int, required=True)
    parser.add_argument("--last-step", type=int, required=True)
    parser.add_argument("--mode", action="append", required=True, help="NAME:LOG_DIR:PUBLISHED_S:PUBLISHED_TOKENS")
    parser.add_argument("--about", action="append", default=[], help="NAME:TEXT, what the run is")
    parser.add_argument("--published-by", action="append", default=[], help="NAME:TEXT, whose figure it is")
    args = parser.parse_args(argv)
    if not 1 <= args.first_step <= args.last_step:
        parser.error("give 1 <= --first-step <= --last-step")
    try:
        modes = [parse_mode(text) for text in args.mode]
    except ValueError:
        parser.error("--mode is NAME:LOG_DIR:PUBLISHED_SECONDS:PUBLISHED_TOKENS (each figure a number or unknown)")
    try:
        about, published_by = by_name(args.about, "--about"), by_name(args.published_by, "--published-by")
    except ValueError as error:
        parser.error(str(error))
    modes = [
        replace(mode, about=about.get(mode.name, ""), published_by=published_by.get(mode.name, mode.published_by))
        for mode in modes
    ]
    lines = []
    for mode in modes:
        try:
            seconds, tokens = measure(mode, args.first_step, args.last_step)
        except MetricsError as exc:
            print(f"benchmark_summary: {exc}", file=sys.stderr)
            return 1
        lines.append(summary_line(mode, seconds, tokens, args.first_step, args.last_step))
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
