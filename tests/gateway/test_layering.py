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


# -- layers: nothing imports upward, and the module graph has no cycle ------------------------

#: The gateway's layers, lowest first (DESIGN.md "Growing past one process"). A module may
#: import its own layer and any layer below; ``apis`` and ``upstreams`` share a rank but
#: never import each other (the test above). Modules directly in ``gateway/`` are named.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ir", "affinity", "stops", "defaults", "request_fields", "wakeups", "heap"),
    ("retokenize", "usage", "context_window", "supervision.retry", "state", "observability"),
    ("upstreams", "apis"),
    ("routing",),
    ("supervision",),
    ("settings",),
    ("config",),
    ("http",),
    ("server",),
)


def _layer_of(module: str) -> tuple[int, str]:
    rest = module.removeprefix("tokenwire.gateway.")
    best: tuple[int, str] | None = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (rest == name or rest.startswith(name + ".")) and (
                    best is None or len(name) > len(best[1])):
                best = (rank, name)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def _gateway_files() -> dict[str, Path]:
    out = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        parts = path.relative_to(GATEWAY.parent.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name != "tokenwire.gateway":
            out[name] = path
    return out


def _gateway_imports(path: Path) -> set[str]:
    return {n for n in _imports(path) if n.startswith("tokenwire.gateway.")}


@pytest.mark.parametrize(("name", "path"), sorted(_gateway_files().items()))
def test_no_module_imports_a_higher_layer(name: str, path: Path) -> None:
    rank, _ = _layer_of(name)
    for imported in _gateway_imports(path):
        other, layer = _layer_of(imported)
        assert other <= rank, (f"{name} imports {imported}: layer {layer!r} sits above this "
                               "one (tests/gateway/test_layering.py LAYERS)")


def test_the_gateway_import_graph_has_no_cycle() -> None:
    files = _gateway_files()
    graph = {}
    for name, path in files.items():
        deps = set()
        for imported in _gateway_imports(path):
            # "from pkg.mod import X" names the module; "from pkg import mod" the package
            deps.add(imported if imported in files else imported.rsplit(".", 1)[0])
        graph[name] = {d for d in deps if d in files and d != name}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = [*trail[trail.index(dep):], dep] if dep in trail else [node, dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
