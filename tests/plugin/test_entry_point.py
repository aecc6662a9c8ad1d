"""The plugin as a user meets it: loaded by pytest from the installed package, in a project of theirs.

Each test writes a small project (the example of docs/testing.md, read from it) and runs pytest on
it in a subprocess, so the fixtures can only come from the ``pytest11`` entry point.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTING_DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
EXAMPLE_BLOCK = re.compile(r"<!-- testing-example: (\S+) -->\n```\w*\n(.*?)```", re.S)


def doc_example() -> dict[str, str]:
    """The files of the example in docs/testing.md ("Testing your agents"), by name."""
    files = {name: body for name, body in EXAMPLE_BLOCK.findall(TESTING_DOC.read_text())}
    assert set(files) == {"myagents.py", "pyproject.toml", "test_support.py"}, sorted(files)
    return files


def run_project(pytester: pytest.Pytester, files: dict[str, str]) -> pytest.RunResult:
    for name, body in files.items():
        pytester.path.joinpath(name).write_text(body)
    # -W error: the fixtures must not warn in a project that turns warnings into errors.
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "-ra")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WESICHAIN_AGENTS", "WESICHAIN_REDIS_URL", "WESICHAIN_PREFIX", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)


def test_the_package_registers_the_plugin() -> None:
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins["wesichain"] == "worker.pytest_plugin"


def test_loading_the_plugin_imports_nothing_of_the_runtime() -> None:
    # pytest imports the plugin in every run of every project that has wesichain installed.
    code = (
        "import sys, worker.pytest_plugin\n"
        "heavy = ('celery', 'kombu', 'redis', 'fakeredis', 'pydantic', 'shared', 'producer')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
        "print(sorted(m for m in sys.modules if m.startswith('worker')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "['worker', 'worker.pytest_plugin']"]


def test_the_documented_example_passes(pytester: pytest.Pytester) -> None:
    result = run_project(pytester, doc_example())
    result.assert_outcomes(passed=2)


def test_wrong_expectations_fail_with_readable_messages(pytester: pytest.Pytester) -> None:
    files = doc_example()
    files["test_support.py"] = """
from shared.llm.scripted import reply

def run_a7(wesichain_scripted, wesichain_run):
    wesichain_scripted("support", [reply(None, ("order_status", {"order_id": "A7"})), "Shipped."])
    return wesichain_run("support", "Where is A7?")

def test_kinds(wesichain_scripted, wesichain_run):
    run = run_a7(wesichain_scripted, wesichain_run)
    run.assert_kinds(["RunStarted", "StepStarted", "ModelResponded", "Completed"])

def test_tool_arguments(wesichain_scripted, wesichain_run):
    run_a7(wesichain_scripted, wesichain_run).assert_tool_calls([("order_status", {"order_id": "A8"})])

def test_answer(wesichain_scripted, wesichain_run):
    run_a7(wesichain_scripted, wesichain_run).assert_completed("Delivered.")

def test_script_too_short(wesichain_scripted, wesichain_run):
    wesichain_scripted("support", [reply(None, ("order_status", {"order_id": "A7"}))])
    wesichain_run("support", "Where is A7?").assert_completed()
"""
    result = run_project(pytester, files)
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(
        [
            "E *AssertionError: run * event kinds differ at #3 (expected Completed, got ToolDispatched)",
            "E *expected: RunStarted, StepStarted, ModelResponded, Completed",
            "E *actual:   RunStarted, StepStarted, ModelResponded, ToolDispatched, ToolCompleted,"
            " StepStarted, ModelResponded, Completed",
            "test_support.py:10: AssertionError",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "E *AssertionError: run * tool calls differ at #0",
            "E *expected: order_status({'order_id': 'A8'})",
            "E *actual:   order_status({'order_id': 'A7'})",
        ]
    )
    result.stdout.fnmatch_lines(
        ["E *AssertionError: run * answer differs", "E *expected: 'Delivered.'", "E *actual:   'Shipped.'"]
    )
    result.stdout.fnmatch_lines(
        [
            "E *AssertionError: run * ended failed, not completed:"
            " ModelTransport: scripted model has no reply for turn 1",
        ]
    )
    # The failures point at the user's lines, not into the plugin.
    assert "pytest_plugin.py" not in result.stdout.str()


def test_without_configuration_the_demo_agents_load(pytester: pytest.Pytester) -> None:
    files = {
        "test_demo.py": """
def test_demo(wesichain_agents_module, wesichain_run):
    assert wesichain_agents_module is None
    run = wesichain_run("research", "What is a lease?")
    run.assert_completed()
    assert run.answer.startswith("Leases: ")
    assert [tool for tool, _ in run.tool_calls] == ["search", "calculator", "current_time"]
    run.assert_invariants()
"""
    }
    result = run_project(pytester, files)
    result.assert_outcomes(passed=1)
