#!/usr/bin/env bash
# The shared-tier tests start a real redis-server (Debian's package `redis-server`).
# Present: nothing to do. Absent: install it when running as root, else fail naming it.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server not found: installing the Debian package redis-server" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server
    command -v redis-server >/dev/null 2>&1 && exit 0
fi
echo "error: redis-server is not installed; install the Debian package redis-server" \
     "(as root: apt-get install redis-server)" >&2
exit 1
