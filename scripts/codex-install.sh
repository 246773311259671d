#!/usr/bin/env bash
# Installs the OpenAI Codex CLI (npm package @openai/codex) into .codex-cli/, project-local and
# gitignored, so tests/gateway/test_codex_cli.py can drive it as a real Responses API client
# of the gateway. The npm package ships a prebuilt static binary for this platform (as an
# optional dependency, @openai/codex-linux-x64), so nothing is downloaded outside the registry.
#
# The version is pinned: the test module records the request shapes of this version (its
# tools, include/reasoning fields, retry behaviour); a newer CLI may send different ones.
#
# usage: scripts/codex-install.sh   (idempotent; a stamp skips reinstalls; needs node + npm)
set -euo pipefail
cd "$(dirname "$0")/.."
CODEX_VERSION=0.171.0
DIR=.codex-cli
STAMP="$DIR/.installed-$CODEX_VERSION"

if [ -f "$STAMP" ] && [ -x "$DIR/node_modules/.bin/codex" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "codex-install: npm not found (install node >= 18 and npm)" >&2
    exit 1
fi
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "@openai/codex@$CODEX_VERSION"
"$DIR/node_modules/.bin/codex" --version >/dev/null # fails loudly if the binary did not come
rm -f "$DIR"/.installed-*
touch "$STAMP"
echo "codex-install: $DIR ready ($("$DIR/node_modules/.bin/codex" --version))" >&2
