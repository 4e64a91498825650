#!/usr/bin/env bash
# `wait-nats-healthy.sh HOST:MONITOR_PORT...`: waits until every NATS node
# answers 200 on /healthz (JetStream enabled and current, the cluster's meta
# leader known), up to $ZOPU_NATS_READY_TIMEOUT seconds (120); exits 1 naming
# the nodes that never did. compose.yaml's `nats-ready` one-shot runs it in
# the zopu image (the nats image is FROM scratch: no shell for a healthcheck).
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: wait-nats-healthy.sh HOST:PORT..." >&2; exit 2; }
probe="$(dirname "$0")/http-probe.sh"
deadline=$((SECONDS + ${ZOPU_NATS_READY_TIMEOUT:-120}))
while :; do
  waiting=()
  for node in "$@"; do
    bash "$probe" "$node" /healthz || waiting+=("$node")
  done
  if [ ${#waiting[@]} -eq 0 ]; then
    echo "nats-ready: every node is healthy: $*"
    exit 0
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "nats-ready: not healthy within ${ZOPU_NATS_READY_TIMEOUT:-120}s: ${waiting[*]}" >&2
    exit 1
  fi
  sleep 1
done
