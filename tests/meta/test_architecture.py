"""House rules that a reviewer would otherwise have to check by eye (STYLE.md section 6)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import tokenwire

SRC = Path(tokenwire.__file__).parent
CODEC = SRC / "codec"

# codec/ is the sans-IO protocol core: no sockets, no event loop, no HTTP, no clock.
FORBIDDEN_IN_CODEC = {"socket", "asyncio", "anyio", "httpx", "starlette", "uvicorn", "time",
                      "urllib.request", "http.client", "selectors", "threading"}
FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"),
                   ("datetime", "now"), ("datetime", "utcnow")}

MAX_MODULE_LINES = 800


def _codec_modules() -> list[Path]:
    return sorted(CODEC.rglob("*.py"))


@pytest.mark.parametrize("path", _codec_modules(), ids=lambda p: p.name)
def test_codec_core_does_no_io(path: Path) -> None:
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            root_hit = name in FORBIDDEN_IN_CODEC or name.split(".")[0] in FORBIDDEN_IN_CODEC
            assert not root_hit, f"{path.name} imports {name}: codec/ must stay sans-IO"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name):
                assert (base.id, node.func.attr) not in FORBIDDEN_CALLS, (
                    f"{path.name} reads the clock ({base.id}.{node.func.attr}); pass `now` in"
                )


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: p.name)
def test_modules_stay_readable(path: Path) -> None:
    lines = path.read_text("utf-8").count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path} has {lines} lines; split it by responsibility"


def _public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages([str(CODEC)], prefix="tokenwire.codec."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _public_modules())
def test_codec_modules_declare_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"
