"""Run the suite repeatedly, and the chaos suite under a CPU hog, to prove it does not flake.

    python -m tests.stress                      # 5 whole-suite runs, then 5 chaos runs under load
    python -m tests.stress --suite 0 --chaos 10 # only the loaded chaos runs
    python -m tests.stress --report stress.json

The hog keeps every core busy for the whole of each loaded run: Debian's ``stress-ng --cpu N``
when it is installed, else N busy Python loops. Each run's outcome (passed, failed, the failing
test ids, wall time) is printed as it ends and written to ``--report`` as JSON; the exit status is
non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
SUMMARY = re.compile(r"\b\d+ (?:passed|failed|errors?)\b.* in [\d.]+s")


@contextmanager
def cpu_hog(cores: int) -> Iterator[str]:
    """Keep ``cores`` CPUs busy until the block ends; yields a description of the hog."""
    if shutil.which("stress-ng"):
        procs = [subprocess.Popen(["stress-ng", "--cpu", str(cores), "--quiet"], start_new_session=True)]
        what = f"stress-ng --cpu {cores}"
    else:
        loop = "while True: pass"
        procs = [subprocess.Popen([sys.executable, "-c", loop], start_new_session=True) for _ in range(cores)]
        what = f"{cores} busy Python loops"
    try:
        yield what
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()


def run_pytest(args: list[str]) -> dict[str, object]:
    started = time.monotonic()
    proc = subprocess.run([*PYTEST, *args], cwd=ROOT, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.MULTILINE)))
    # The last line pytest -q prints: "793 passed, 2 skipped in 254.12s (0:04:14)".
    summary = next((line for line in reversed(out.splitlines()) if SUMMARY.search(line)), "")
    return {
        "ok": proc.returncode == 0,
        "returncode": proc.returncode,
        "failed": failed,
        "summary": summary.strip("= "),
        "wall_s": round(time.monotonic() - started, 1),
        "tail": "" if proc.returncode == 0 else out[-4000:],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", type=int, default=5, help="whole-suite runs on a quiet machine")
    p.add_argument("--chaos", type=int, default=5, help="chaos-suite runs with every core kept busy")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="CPUs the hog keeps busy")
    p.add_argument("--report", help="write every run's outcome to this JSON file")
    args = p.parse_args(argv)

    runs: list[dict[str, object]] = []

    def record(kind: str, i: int, outcome: dict[str, object], load: str) -> None:
        outcome = {"kind": kind, "run": i, "load": load, **outcome}
        runs.append(outcome)
        status = "ok  " if outcome["ok"] else "FAIL"
        print(f"{status} {kind} #{i} ({load}) {outcome['wall_s']} s  {outcome['summary']}", flush=True)
        for test in outcome["failed"]:  # type: ignore[attr-defined]
            print(f"       {test}", flush=True)
        if args.report:
            Path(args.report).write_text(json.dumps(runs, indent=2) + "\n")

    for i in range(1, args.suite + 1):
        record("suite", i, run_pytest([]), "quiet")
    for i in range(1, args.chaos + 1):
        with cpu_hog(args.cores) as hog:
            record("chaos", i, run_pytest(["tests/chaos"]), hog)
    failures = [r for r in runs if not r["ok"]]
    print(f"{len(runs) - len(failures)}/{len(runs)} runs passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
