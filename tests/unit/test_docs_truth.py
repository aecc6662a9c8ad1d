"""The docs name everything an operator or a client can use: every environment variable the code
reads is in the settings table of docs/operations.md, and every operation the HTTP API serves is in
the endpoint table of docs/api.md (and nothing in either table is gone from the code)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fastapi.routing
from fastapi.routing import APIRoute

import producer.api.config
import producer.api_client
import shared.llm.settings
import shared.settings
import worker.embedded
from producer.api.app import create_app, openapi_document
from producer.api.config import ApiConfig
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose processes read the environment (the tests and benchmarks are not settings).
SOURCES = ("shared", "worker", "producer")
#: Nor is the testing package: what its fault hooks read configures a test, not a deployment.
NOT_SETTINGS = ROOT / "worker" / "testing"
VARIABLE = re.compile(r"^WESICHAIN_[A-Z0-9_]+$")


def string_constants() -> dict[str, set[str]]:
    """Every string constant of the sources that starts with WESICHAIN_ -> the files holding it."""
    found: dict[str, set[str]] = {}
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(NOT_SETTINGS):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if node.value.startswith("WESICHAIN_"):
                        found.setdefault(node.value, set()).add(str(path.relative_to(ROOT)))
    return found


def variables_the_code_reads() -> set[str]:
    return {name for name in string_constants() if VARIABLE.match(name)}


def section(path: Path, heading: str) -> str:
    """The text of one ``## heading`` section of a Markdown file, up to the next ``## ``."""
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def documented_settings() -> set[str]:
    table = section(ROOT / "docs" / "operations.md", "Settings")
    return set(re.findall(r"^\| `(WESICHAIN_[A-Z0-9_]+)` \|", table, re.MULTILINE))


def test_the_scan_sees_every_variable_the_settings_modules_name() -> None:
    # Names are string literals, never built from parts (a prefix plus a field name would escape the
    # scan): every constant that starts with WESICHAIN_ (a name alone, or a message naming one)
    # starts with a whole name that the code reads as such.
    read = variables_the_code_reads()
    leading = {re.sub(r"[^A-Z0-9_].*", "", text, flags=re.DOTALL) for text in string_constants()}
    assert leading <= read, sorted(leading - read)
    # Settings.from_env reads exactly its table of (variable, field, parser); it derives no name
    # from a field's name. Every variable there, and every ENV_ constant of the modules that read
    # the environment, is found by the scan.
    table = {variable for variable, _field, _parse in shared.settings._ENVIRONMENT}
    assert table <= read
    for module in (
        shared.settings,
        shared.llm.settings,
        producer.api.config,
        producer.api_client,
        worker.embedded,
    ):
        constants = {v for k, v in vars(module).items() if k.startswith("ENV_") and isinstance(v, str)}
        assert {v for v in constants if v.startswith("WESICHAIN_")} <= read, module.__name__
    assert len(read) >= 50


def test_every_variable_the_code_reads_is_in_the_settings_table() -> None:
    read, documented = variables_the_code_reads(), documented_settings()
    assert not read - documented, (
        f"read by the code but not in docs/operations.md, Settings: {sorted(read - documented)}"
    )
    assert not documented - read, (
        f"in docs/operations.md, Settings, but read nowhere: {sorted(documented - read)}"
    )


def _operation(method: str, path: str) -> str:
    """``GET /v1/runs/{}``: the path without its query, every path parameter's name left out."""
    template = re.sub(r"\{[^}]*\}", "{}", path.split("?")[0])
    return f"{method.upper()} {template}"


def routes() -> dict[str, bool]:
    """Every method and path the app routes to an endpoint of its own -> in the OpenAPI document."""
    app = create_app(ApiConfig(settings=Settings()))
    # Recent FastAPI keeps an included router as one entry of app.routes and flattens it with
    # iter_route_contexts; earlier versions list every route in app.routes.
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    found: dict[str, bool] = {}
    for entry in flatten(app.routes) if flatten is not None else app.routes:
        route = getattr(entry, "original_route", entry)
        if isinstance(route, APIRoute):
            for method in getattr(entry, "methods", None) or route.methods or ():
                found[_operation(method, getattr(entry, "path", route.path))] = route.include_in_schema
    return found


def served_operations() -> set[str]:
    return {operation for operation, in_schema in routes().items() if in_schema}


def documented_operations() -> set[str]:
    table = section(ROOT / "docs" / "api.md", "Endpoints")
    rows = re.findall(r"^\| `([A-Z]+) (/[^`]*)` \|", table, re.MULTILINE)
    return {_operation(method, path) for method, path in rows}


def test_every_operation_the_api_serves_is_in_the_endpoint_table() -> None:
    served = served_operations()
    # The only endpoints left out of the OpenAPI document are the console's page (its static files
    # are a mount, not an endpoint) and the eval viewer's pages: a route hidden from the document
    # must be added here knowingly.
    hidden = {operation for operation, in_schema in routes().items() if not in_schema}
    assert hidden == {"GET /", "GET /evals", "GET /evals/", "GET /evals/{}"}
    document = {
        _operation(method, path) for path, item in openapi_document()["paths"].items() for method in item
    }
    assert served == document
    assert len(served) == 60
    documented = documented_operations()
    assert not served - documented, f"served but not in docs/api.md, Endpoints: {sorted(served - documented)}"
    assert not documented - served, (
        f"in docs/api.md, Endpoints, but not served: {sorted(documented - served)}"
    )


def test_the_backlog_figures_quote_the_settings_the_backlog_test_uses() -> None:
    # The full-length figures were once left from a run with another queued lease than the test's.
    source = (ROOT / "tests" / "chaos" / "test_backlog.py").read_text()
    (queued_lease,) = re.findall(r"^QUEUED_LEASE_S = (\d+)$", source, re.MULTILINE)
    text = " ".join(section(ROOT / "docs" / "guarantees.md", "The sweeper: crash, not backlog").split())
    quoted = re.findall(r"`queued_lease_s = (\d+)`", text)
    assert quoted == [queued_lease, queued_lease]
    assert "The full length, with the same settings (`queued_lease_s = " + queued_lease + "`" in text


POOL_BLOCK = re.compile(r"```bash\n(export WESICHAIN_REDIS_URL=.*?\nwesichain sweeper .*?)\n```", re.S)


def test_the_pool_commands_of_the_running_page_are_the_readmes() -> None:
    # tests/integration/test_pool_commands.py starts the README's block; docs/running.md shows it too.
    readme = (ROOT / "README.md").read_text()
    assert "<!-- pool-commands -->\n```bash\nexport WESICHAIN_REDIS_URL=" in readme
    (in_readme,) = POOL_BLOCK.findall(readme)
    (in_running,) = POOL_BLOCK.findall((ROOT / "docs" / "running.md").read_text())
    assert in_running == in_readme


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (outside code blocks)."""
    anchors, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_relative_link_of_the_readme_and_docs_reaches_its_file_and_heading() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
    assert (ROOT / "docs" / "index.md").exists()
