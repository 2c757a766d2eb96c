"""Stand-ins for running the launcher's pipeline.sh outside its pod (tests/jobs)."""

from __future__ import annotations

from pathlib import Path

# The admission holder's stand-in: admitted at once (its ready file written), then gone.
FAKE_ADMISSION = (
    'case "$1" in */admission.py)\n'
    '  for a; do case "$a" in --ready-file=*) touch "${a#*=}";; esac; done; exit 0;;\n'
    "esac\n"
)


def fake_tools(tmp_path: Path, python_body: str) -> Path:
    """A bin folder for running pipeline.sh outside the pod: `python` admits the run at once (admission.py) or runs
    python_body; mkdir and cp do nothing. Run the script with fake_env(): its TMPDIR keeps the ready file here."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool, body in (("python", FAKE_ADMISSION + python_body), ("mkdir", "exit 0\n"), ("cp", "exit 0\n")):
        (fake_bin / tool).write_text("#!/bin/bash\n" + body)
        (fake_bin / tool).chmod(0o755)
    return fake_bin


def fake_env(fake_bin: Path) -> dict[str, str]:
    return {"PATH": f"{fake_bin}:/usr/bin:/bin", "TMPDIR": str(fake_bin.parent)}
