#!/usr/bin/env bash
# Debian packages the test suite starts itself: redis-server (the shared-state tests start a
# real server on a free port) and chromium with its driver (the playground's browser tests).
# Installs only what is missing; needs root (CI and the dev machines run as root). Without
# root or apt, it says so and exits 1: the caller decides whether that fails the run.
set -euo pipefail
want=()
command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
command -v chromium >/dev/null 2>&1 || want+=(chromium)
command -v chromedriver >/dev/null 2>&1 || want+=(chromium-driver)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: missing ${want[*]} (install them with your package manager)" >&2
    exit 1
fi
echo "installing ${want[*]} (apt)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${want[@]}" >/dev/null
