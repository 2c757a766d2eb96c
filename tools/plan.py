"""`make plan STACK=<stack>`: what `pulumi up` of the infra stack, then of the job stack, would create, offline.

Runs the infra program under Pulumi's mocks, then the job program fed with the infra program's outputs, with
placeholder secrets (tools/plan_stacks.py, tools/plan_run.py); writes build/<stack>/ (tools/render.py names each
file) and prints a summary that fits one screen (tools/plan_summary.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pulumi

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/plan.py` puts tools/ first, not the repository
    sys.path.insert(0, str(ROOT))
# The job program's own modules (launcher.*), as its language host finds them: first_step reads its model sizes there.
if str(ROOT / "jobs") not in sys.path:
    sys.path.append(str(ROOT / "jobs"))

from tools import day2_preview, stack_check  # noqa: E402
from tools.offline import MissingConfigError, StackFileError, load_stack_config  # noqa: E402
from tools.plan_run import progress, run_plan  # noqa: E402
from tools.plan_stacks import PlanError, apply_overrides, infra_stack_of  # noqa: E402
from tools.plan_summary import display_path, summary  # noqa: E402
from tools.render import render_files, write_files  # noqa: E402

EXIT_CONFIG = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stack", default="dev", help="stack name: Pulumi.<stack>.yaml and jobs/Pulumi.<stack>.yaml")
    parser.add_argument("--out", default=str(ROOT / "build"), help="folder that gets <stack>/ (default build/)")
    parser.add_argument(
        "-c", "--config", action="append", default=[], metavar="KEY=VALUE", help="override an infra config key"
    )
    parser.add_argument(
        "-j", "--job-config", action="append", default=[], metavar="KEY=VALUE", help="override a job config key"
    )
    parser.add_argument(
        "--no-wandb", action="store_true", help="give no W&B key (the run logs to TensorBoard on Lustre)"
    )
    parser.add_argument("--quiet", action="store_true", help="no summary: the progress lines and the warnings only")
    parser.add_argument(
        "--nemo-rl-sources",
        type=Path,
        default=None,
        help="folder holding nemo-rl-<tag>/, NeMo RL's sources at the image's release, to check a recipe the index "
        f"(tools/nemo_rl_index.json) cannot know with its own loader (default {stack_check.default_sources_root()})",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="the deployed infra stack's outputs (pulumi stack output --json --show-secrets, or a plan's "
        "outputs.json): print what the day-2 guard makes of each changed key (tools/day2_preview.py)",
    )
    args = parser.parse_args(argv)
    out_dir = Path(args.out) / args.stack
    try:
        previous = day2_preview.previous_record(args.previous) if args.previous else None
        plan = run_plan(
            args.stack, args.config, args.job_config, wandb=not args.no_wandb, nemo_rl_sources=args.nemo_rl_sources
        )
        progress(4, f"render and write {display_path(out_dir)}/")
        files = render_files(plan)
        write_files(out_dir, files)
    except (PlanError, StackFileError, day2_preview.PreviousError) as error:
        print(f"plan: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except (pulumi.RunError, MissingConfigError) as error:  # ConfigError names key, value and what is allowed
        print(f"plan: invalid config for stack {args.stack!r}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if not args.quiet:
        print(summary(plan, out_dir, files))
    if previous is not None:
        project, config = load_stack_config(ROOT, infra_stack_of(args.stack) or args.stack)
        apply_overrides(project, config, args.config)
        current = plan.infra.outputs[day2_preview.day2.DEPLOYED_SETTINGS_OUTPUT]
        allowed = day2_preview.allowed_keys(config, project)
        print(day2_preview.report(previous, current, allowed, str(args.previous)))
    else:  # what `pulumi up` would warn about is never silent
        for warning in plan.warnings:
            print(f"warning: {warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
