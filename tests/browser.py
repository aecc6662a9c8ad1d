"""Debian's ``chromium``, headless: a page's DOM after its scripts ran, its console, a screenshot.

``.ci/run`` installs it when missing; locally a test without it is skipped (under CI it fails).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

#: A console line chromium logs with --enable-logging=stderr: level and message.
_CONSOLE = re.compile(r':(INFO|WARNING|ERROR):CONSOLE[^\]]*\] "(?P<message>.*)", source: ')


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed; .ci/run installs it")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return binary


@dataclass(frozen=True)
class Page:
    dom: str
    #: Every console message the page logged, uncaught exceptions included.
    console: list[str]

    @property
    def errors(self) -> list[str]:
        return [m for m in self.console if "Uncaught" in m or "Error" in m]


def _base(binary: str) -> list[str]:
    return [
        binary,
        "--headless",
        "--no-sandbox",  # tests may run as root in a container
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ]


def load(url: str, timeout: float = 60) -> Page:
    """The DOM once the page's scripts ran, and what it logged to the console."""
    done = subprocess.run(
        [*_base(chromium()), "--enable-logging=stderr", "--v=0", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    console = [m.group("message") for m in _CONSOLE.finditer(done.stderr)]
    return Page(done.stdout, console)


def screenshot(url: str, target: Path, width: int = 1280, height: int = 1600, timeout: float = 60) -> Path:
    done = subprocess.run(
        [*_base(chromium()), f"--window-size={width},{height}", f"--screenshot={target}", url],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return target
