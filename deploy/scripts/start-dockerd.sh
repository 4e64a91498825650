#!/usr/bin/env bash
# Makes sure a Docker engine answers on the default socket: reuses one that
# already runs (`docker info` works), otherwise installs Debian's docker.io
# when dockerd is missing and apt-get can (as root), starts dockerd in the
# background with its log in $ZOPU_DOCKERD_LOG (/tmp/zopu-dockerd.log) and
# waits until it answers. Idempotent: running it twice starts one engine.
# Used by `make images` / `make test-deploy` (deploy/scripts/test-deploy.sh).
set -euo pipefail
log=${ZOPU_DOCKERD_LOG:-/tmp/zopu-dockerd.log}
wait_s=${ZOPU_DOCKERD_WAIT:-60}

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "start-dockerd: installing Debian's docker.io" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  else
    echo "start-dockerd: no dockerd: install Docker (Debian: apt-get install docker.io) or start your engine" >&2
    exit 1
  fi
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "start-dockerd: no Docker engine answers and starting dockerd needs root (or start your engine yourself)" >&2
  exit 1
fi

# A dockerd that runs but does not answer yet (started a moment ago by
# another caller) is waited for, not started twice.
if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "start-dockerd: starting dockerd (log: $log)" >&2
  nohup dockerd >"$log" 2>&1 </dev/null &
fi
for _ in $(seq 1 "$wait_s"); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "start-dockerd: dockerd did not answer within ${wait_s}s; its log ($log) ends:" >&2
tail -n 30 "$log" >&2 || true
exit 1
