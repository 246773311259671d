"""``tokenwire serve`` in front of upstreams never imports llama.cpp (a static check).

llama_cpp and numpy are ~140 modules and 1-2 s of every process start; only the embedded
engine needs them, and it imports them when it loads (``gateway/server.py``,
``build_embedded_state``). The suite starts dozens of gateway processes in front of
upstreams (shared state, pools, usage), and so do deployments. This walks the module-level
imports (not those inside functions, not ``if TYPE_CHECKING:``) from what serve loads.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tokenwire

SRC = Path(tokenwire.__file__).parent.parent
#: What ``serve`` in front of upstreams imports: the CLI, what its command imports when it
#: runs (``cli/serve.py`` imports lazily) and every adapter but the embedded one.
ENTRIES = ("tokenwire.cli.main", "tokenwire.gateway.server", "tokenwire.gateway.config",
           "tokenwire.gateway.state.config", "tokenwire.gateway.observability.request_log",
           *(f"tokenwire.gateway.upstreams.{m}" for m in (
               "openai_compat", "anthropic_upstream", "codec_native", "responses_upstream")))


def _file(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements that run at import: the body, into ``if``/``try`` blocks, except
    ``if TYPE_CHECKING:``."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                todo += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            todo += [*node.body, *node.orelse, *node.finalbody,
                     *(s for h in node.handlers for s in h.body)]
        else:
            out.append(node)
    return out


def _imported(module: str, path: Path) -> set[str]:
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _top_level(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                root = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{root}.{base}" if base else root
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)  # submodules, if any
    return names


def _closure(entries: tuple[str, ...]) -> set[str]:
    """Every module importing ``entries`` imports (tokenwire's own followed, others kept)."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages
        path = _file(module) if parts[0] == "tokenwire" else None
        if path is not None:
            todo += sorted(_imported(module, path))
    return {m for m in seen if m.split(".")[0] != "tokenwire" or _file(m) is not None}


def test_serve_imports_neither_llama_cpp_nor_the_embedded_engine_at_start() -> None:
    reached = _closure(ENTRIES)
    assert "tokenwire.gateway.http.app" in reached  # the walk follows imports
    heavy = sorted(m for m in reached if m.split(".")[0] in ("llama_cpp", "numpy")
                   or m == "tokenwire.gateway.upstreams.embedded")
    assert heavy == []
