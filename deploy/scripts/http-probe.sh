#!/usr/bin/env bash
# `http-probe.sh HOST:PORT PATH`: exits 0 when GET PATH answers 200 within
# 3 s, 1 otherwise. Plain bash (/dev/tcp) and coreutils, so it runs in the
# zopu image, which has no curl or wget: the gateway's compose healthcheck.
set -uo pipefail
target=${1:?usage: http-probe.sh HOST:PORT PATH}
path=${2:?usage: http-probe.sh HOST:PORT PATH}
host=${target%:*}
port=${target##*:}
status=$(timeout 3 bash -c '
  exec 3<>"/dev/tcp/$0/$1" || exit 1
  printf "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n" "$2" "$0" >&3
  head -n 1 <&3' "$host" "$port" "$path" 2>/dev/null) || exit 1
case $status in
  "HTTP/1."[01]" 200"*) exit 0 ;;
  *) exit 1 ;;
esac
