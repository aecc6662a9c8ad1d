"""``wesichain eval run examples/research-eval.toml`` right after install: no server, a report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness import ROOT


def test_the_bundled_example_runs_embedded_and_writes_a_report(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WESICHAIN_")}
    env["PYTHONPATH"] = str(ROOT)
    # A home of its own, as right after install: the example's run ids are fixed, and an archive
    # shared with earlier or concurrent runs of it already holds them (and may be locked by them).
    env["WESICHAIN_HOME"] = str(tmp_path / "home")
    report = tmp_path / "report.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "producer.cli",
            "eval",
            "run",
            "examples/research-eval.toml",
            "-o",
            str(report),
        ],
        cwd=tmp_path,  # no examples/ here: the bundled example is found
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "(embedded: no server)" in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("eval research-") and "completed, 104/104 case runs recorded" in lines[0]
    assert lines[1].startswith("  tools: 52/52 done, 0 failed, pass 90.4%")
    assert lines[2].startswith("  guess: 52/52 done, 0 failed, pass 48.1%")
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and 'id="eval-data"' in page
    # Nothing to fetch: it opens offline (the SVG namespace is a name its script gives the charts).
    fetchable = page.replace("http://www.w3.org/2000/svg", "")
    assert "http://" not in fetchable and "https://" not in fetchable
