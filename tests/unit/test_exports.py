"""Every module says what it offers: its ``__all__`` lists exactly the public names it defines.

A public name is a top-level function, class or assignment of the module's own source whose name
does not start with an underscore (loggers named ``log``, type variables and Celery's module-level
``app`` excepted). A package's ``__init__`` lists what it re-exports. So a name added, renamed or
removed without its ``__all__`` fails here, module by module.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

PACKAGES = ("shared", "worker", "producer")
NOT_EXPORTED = {"log", "app"}


def modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        names.extend(m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."))
    return sorted(names)


MODULES = modules()


def defined_public_names(module: ModuleType) -> set[str]:
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("TypeVar", "ParamSpec"):
                continue
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_") and n not in NOT_EXPORTED}


def test_every_package_is_walked() -> None:
    assert {
        "shared.fsm",
        "shared.store",
        "shared.llm.base",
        "producer.cli",
        "producer.api.app",
        "worker.runtime",
    } <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    module: ModuleType = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__ list"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names missing attributes: {missing}"
    if module.__file__ is not None and not module.__file__.endswith("__init__.py"):
        assert set(exported) == defined_public_names(module), name
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    assert set(exported) <= set(namespace)


def test_known_exports() -> None:
    import producer
    import shared.llm

    assert sorted(producer.__all__) == ["Client", "RunHandle", "RunTimeout"]
    assert {"LlmAdapter", "ModelRequest", "ModelResponse", "RawToolCall", "ToolSpec", "Usage"} <= set(
        shared.llm.__all__
    )
