"""N upstreams + M APIs, never N x M translators (STYLE §6 item 9): an import-graph test."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import tokenwire.gateway

GATEWAY = Path(tokenwire.gateway.__file__).parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:  # relative: resolve against the package of the file
                pkg = ".".join(path.relative_to(GATEWAY.parent.parent).with_suffix("").parts[:-1])
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                names.add(f"{base}.{node.module}")
            else:
                names.add(node.module)
    return names


@pytest.mark.parametrize(("here", "forbidden"), [("apis", "upstreams"), ("upstreams", "apis")])
def test_apis_and_upstreams_never_import_each_other(here: str, forbidden: str) -> None:
    files = sorted((GATEWAY / here).rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            assert not name.startswith(f"tokenwire.gateway.{forbidden}"), (
                f"{path.name} imports {name}: {here}/ and {forbidden}/ meet only through ir"
            )


def test_ir_depends_on_nothing_in_the_gateway() -> None:
    for name in _imports(GATEWAY / "ir.py"):
        assert not name.startswith("tokenwire.gateway"), name


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages([str(GATEWAY)],
                                                              prefix="tokenwire.gateway."))


@pytest.mark.parametrize("name", [m for m in _modules() if not m.endswith("__init__")])
def test_gateway_modules_declare_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if isinstance(getattr(module, "__path__", None), list):
        return  # a package
    assert exported is not None, f"{name} has no __all__"
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"
