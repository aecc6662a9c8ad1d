"""Every module of the packages imports, and every ``__all__`` lists only names that exist."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

PACKAGES = ("shared", "worker", "producer")


def modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        names.extend(m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."))
    return sorted(names)


MODULES = modules()


def test_every_package_is_walked() -> None:
    assert {"shared.fsm", "shared.store", "shared.llm.base", "producer.cli", "worker.runtime"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_existing_names(name: str) -> None:
    module: ModuleType = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        return
    assert isinstance(exported, list | tuple)
    assert all(isinstance(n, str) for n in exported)
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names missing attributes: {missing}"


def test_star_imports_work() -> None:
    for name in MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "__all__"):
            namespace: dict[str, object] = {}
            exec(f"from {name} import *", namespace)
            assert set(module.__all__) <= set(namespace)


def test_known_exports() -> None:
    import producer
    import shared.llm

    assert sorted(producer.__all__) == ["Client", "RunHandle", "RunTimeout"]
    assert {"LlmAdapter", "ModelRequest", "ModelResponse", "RawToolCall", "ToolSpec", "Usage"} <= set(
        shared.llm.__all__
    )
