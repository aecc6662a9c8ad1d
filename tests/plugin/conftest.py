"""The plugin's own tests load their agents module by overriding its fixture, as a user may."""

from __future__ import annotations

import pytest


@pytest.fixture
def wesichain_agents_module() -> str:
    return "tests.plugin.agents"
