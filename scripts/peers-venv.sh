#!/usr/bin/env bash
# Creates .venv-peers: a separate venv for interop peers that cannot share .venv, today
# `python -m llama_cpp.server` (llama-cpp-python's OpenAI-compatible server). Its extras pin
# fastapi / sse-starlette / starlette-context versions that fight our starlette 1.x, so it
# lives apart; tests start it as a subprocess and skip when this venv is absent.
#
# No llama.cpp rebuild: the portable wheel ./dev built is installed first (by file, so pip
# cannot pick a native build from its cache), then the [server] extra's packages are named
# explicitly instead of asking for 'llama-cpp-python[server]' (which would make pip resolve,
# and possibly rebuild, llama-cpp-python itself).
#
# usage: scripts/peers-venv.sh [path-to-llama-wheel]   (idempotent; a stamp skips reinstalls)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-peers
WHEEL=${1:-$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/tokenwire/wheels/llama-0.3.36-*/llama_cpp_python-*.whl \
    2>/dev/null | head -n 1 || true)}
# The [server] extra of llama-cpp-python 0.3.36 (its METADATA), pinned to what it was tested with.
SERVER_DEPS=(
    "uvicorn>=0.22.0" "fastapi>=0.100.0" "pydantic-settings>=2.0.1" "sse-starlette>=1.6.1"
    "starlette-context>=0.3.6,<0.4" "PyYAML>=5.1"
)

if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
    echo "peers-venv: no portable llama-cpp-python wheel found (run ./dev once to build it)" >&2
    exit 1
fi
if [ -f "$VENV/.installed" ] && [ "$VENV/.installed" -nt "$0" ] && [ "$VENV/.installed" -nt "$WHEEL" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The wheel with its (pure-Python / binary-wheel) runtime deps: numpy, jinja2, diskcache, ...
"$VENV/bin/python" -m pip install -q --force-reinstall "$WHEEL"
"$VENV/bin/python" -m pip install -q "${SERVER_DEPS[@]}"
"$VENV/bin/python" -c "import llama_cpp.server.app" # fails loudly if an extra is missing
touch "$VENV/.installed"
echo "peers-venv: $VENV ready (llama_cpp.server)" >&2
