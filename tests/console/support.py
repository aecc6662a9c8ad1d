"""What the console's browser tests share: the chromium they drive, a tab signed in with a key that
fails its test on any script error, request to another origin, dialog or planted script that ran,
tenant keys, submits, and the documentation's pictures (``WESICHAIN_SCREENSHOTS=DIR``)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, Dialog, Page

from shared.keys import Keys
from shared.tenants import Tenants
from tests.harness import RedisServer

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "UI_TIMEOUT_MS",
    "Console",
    "new_key",
    "screenshot",
    "signed_in",
    "submit",
    "wait_js",
]

#: Debian's chromium (``.ci/run`` installs it); without it the directory's tests are skipped.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]

#: Generous: the machine running the suite may be loaded.
UI_TIMEOUT_MS = 60_000


def wait_js(page: Page, expression: str, timeout: float = UI_TIMEOUT_MS) -> None:
    """Wait until the page's JavaScript ``expression`` is truthy (``timeout`` in ms).

    Playwright's ``wait_for_function`` evaluates its predicate with ``eval`` inside the page, which
    the pages' Content-Security-Policy forbids (no script but their own runs); a function called
    from outside, as ``evaluate`` does, is not page script and is allowed."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout / 1000:g} s waiting for {expression}")
        page.wait_for_timeout(50)


class Console:
    """A browser tab on the console at ``base_url``, signed in with ``key``. Every script error,
    every request to another origin and every dialog is kept, and asserted absent when the tab
    closes, as is ``window.__pwned`` (what the hostile texts of the test agents set if they ran).
    ``console_errors`` also counts the browser console's errors but for failed resource loads
    (the first request goes without a key, a missing favicon is a 404)."""

    def __init__(
        self,
        browser: Browser,
        base_url: str,
        key: str,
        *,
        width: int = 1280,
        height: int = 900,
        console_errors: bool = False,
    ) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.elsewhere: list[str] = []  # no CDN, no other origin: everything comes from the API
        self.dialogs: list[str] = []  # an alert() would be script that ran
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        if console_errors:
            self.page.on(
                "console",
                lambda m: (
                    None
                    if m.type != "error" or m.text.startswith("Failed to load resource")
                    else self.errors.append(m.text)
                ),
            )
        self.page.on(
            "request", lambda r: None if r.url.startswith(base_url) else self.elsewhere.append(r.url)
        )
        self.page.on("dialog", self._dialog)
        self.page.set_default_timeout(UI_TIMEOUT_MS)
        self.page.goto(base_url + "/")
        self.page.fill("#login-key", key)
        self.page.click("#login-form button")
        self.page.wait_for_selector("#list-view:not([hidden])")

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def close(self) -> None:
        pwned = self.page.evaluate("window.__pwned")
        self.context.close()
        assert self.errors == [], f"script errors in the console: {self.errors}"
        assert self.elsewhere == [], f"the console fetched from elsewhere: {self.elsewhere}"
        assert pwned is None and self.dialogs == [], f"a text ran as markup (dialogs: {self.dialogs})"


@contextmanager
def signed_in(browser: Browser, base_url: str, key: str, **options: Any) -> Iterator[Page]:
    """A :class:`Console` tab for the block, checked when it ends (not when the block raised)."""
    console = Console(browser, base_url, key, **options)
    try:
        yield console.page
    except BaseException:
        console.context.close()
        raise
    console.close()


def new_key(
    server: RedisServer, prefix: str, *, operator: bool = False, namespaces: list[str] | None = None
) -> str:
    """A key of a new tenant ``prefix-<random>``: an operator's if asked, with the namespaces given."""
    tenants = Tenants(server.client(), Keys())
    tenant = f"{prefix}-{uuid.uuid4().hex[:8]}"
    key, _ = tenants.create_key(tenant, "browser")
    if operator:
        tenants.set_operator(tenant, True)
    if namespaces is not None:
        tenants.set_namespaces(tenant, namespaces)
    return key


def submit(http: httpx.Client, agent: str, input: str = "go", **fields: Any) -> str:
    """Starts a run over the API; its id."""
    response = http.post("/v1/runs", json={"agent": agent, "input": input, **fields})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def screenshot(page: Page, name: str, selector: str | None = None) -> None:
    """The picture ``console-NAME.png`` of the page (or of one part of it, so that it stays a
    sensible size), when ``WESICHAIN_SCREENSHOTS`` names a directory."""
    if target := os.environ.get("WESICHAIN_SCREENSHOTS"):
        path = str(Path(target) / f"console-{name}.png")
        if selector:
            page.locator(selector).screenshot(path=path)
        else:
            page.screenshot(path=path, full_page=True)
