#!/usr/bin/env bash
# `make test-deploy`: deploy/ run for real on this machine's Docker engine.
#   1. images built locally (build-images.sh: nats:2.12 FROM scratch, the
#      debootstrap base, zopu:latest from the host's zopu binary);
#   2. compose.yaml up: the three-node cluster and every service as its own
#      containers, conversation scaled to 3; waits until every container
#      runs and the gateways are healthy;
#   3. a smoke scenario from outside with the zopu CLI (as the `operator`
#      NATS user, through the nodes' ports published on 127.0.0.1): create a
#      project from a local repository, send a message, read its artifact;
#   4. six more messages in flight while the node leading ZOPU_EVENTS is
#      killed (SIGKILL) and restarted (the conversation instances paused
#      from the sends to the kill, so the turns run across the fault
#      however fast the machine is): every message gets its final answer,
#      every event stored before the kill is still there on every node, and
#      `zopu audit verify` finds every project's chain whole;
#   5. the testcontainers harness tests (ZOPU_TEST_NATS=docker) against the
#      locally built nats image;
#   6. compose down (volumes included), also on failure unless
#      ZOPU_KEEP_DEPLOY=1, which keeps the stack and the work directory.
# Needs root (or a running Docker engine) and Debian's docker.io,
# docker-compose and debootstrap, which it installs with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="$root/tools/bin:$PATH"
started=$SECONDS
step() { echo "test-deploy [$((SECONDS - started))s]: $*" >&2; }
# The reason is said again after the stack's logs (cleanup), so a CI that
# keeps only the output's tail still shows why the run failed.
failure=""
die() { failure="$*"; echo "test-deploy FAILED: $*" >&2; exit 1; }
trap '[ -n "$failure" ] || failure="line $LINENO: $BASH_COMMAND"' ERR

# Debian's packages: the engine, a compose, debootstrap for the base image.
need=()
docker info >/dev/null 2>&1 || command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 \
    || die "missing ${need[*]}: install them (Debian: apt-get install ${need[*]})"
  step "installing ${need[*]} (Debian's packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's docker-compose (1.29) works with Debian's dockerd (20.10); a
# `docker compose` plugin is used where one is installed instead.
if docker compose version >/dev/null 2>&1; then
  compose_bin=(docker compose)
else
  compose_bin=(docker-compose)
fi

zopu=${ZOPU_BIN:-$root/target/debug/zopu}
if [ ! -x "$zopu" ]; then
  step "building $zopu"
  cargo build -p zopu-cli --bin zopu
fi
export ZOPU_BIN=$zopu

step "images"
./deploy/scripts/build-images.sh

work=$(mktemp -d /tmp/zopu-deploy.XXXXXX)
project_name=zopu-test-deploy
compose=("${compose_bin[@]}" -p "$project_name" --env-file "$work/deploy.env"
  -f deploy/compose.yaml -f deploy/compose.smoke.yaml)
cleanup() {
  local status=$?
  # shellcheck disable=SC2086 # a failure between pause and unpause
  [ -z "${conversation_ids:-}" ] || docker unpause $conversation_ids >/dev/null 2>&1 || true
  if [ "${ZOPU_KEEP_DEPLOY:-0}" = 1 ]; then
    echo "test-deploy: kept the stack (${compose[*]}) and $work" >&2
    return
  fi
  if [ "$status" -ne 0 ]; then
    "${compose[@]}" ps >&2 || true
    "${compose[@]}" logs --no-color --tail 30 >"$work/compose.log" 2>&1 || true
    tail -n 120 "$work/compose.log" >&2 || true
    echo "test-deploy FAILED (exit $status): ${failure:-a command failed; see above}" >&2
  fi
  "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  rm -rf "$work"
}

# Secrets for this run only; the smoke repository on the host. Each starts
# with a letter: nats-server parses a $VARIABLE's value as a config value,
# and a hex string starting with a digit is read as a broken number.
secret() { printf 'z'; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
{
  for user in setup dispatch conversation specialists artifacts executor gateway operator reader admin; do
    echo "ZOPU_$(echo "$user" | tr a-z A-Z)_PASSWORD=$(secret)"
  done
  echo "ZOPU_GATEWAY_LINK_KEY=$(secret)$(secret)"
  echo "ZOPU_SECRETS_KEY=$(secret)$(secret)"
  echo "ZOPU_LLM_API_KEY="
  echo "ZOPU_SMOKE_REPOS=$work/repos"
  echo "ZOPU_SMOKE_SANDBOX_ENV=$work/sandbox.env"
} >"$work/deploy.env"
# Local repositories allowed, under the smoke repositories' directory only
# (a TOML list).
{
  echo "ZOPU_SANDBOX__ALLOW_LOCAL_REPOSITORIES=true"
  echo "ZOPU_SANDBOX__LOCAL_REPOSITORY_ROOTS=[\"$work/repos\"]"
} >"$work/sandbox.env"
# A leftover stack of an interrupted run goes first.
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
trap cleanup EXIT

repo=$work/repos/greeter
mkdir -p "$repo/src"
cat >"$repo/README.md" <<'EOF'
# greeter
Prints a greeting. Run it with `cargo run`; set GREETING to change the text.
EOF
cat >"$repo/src/main.rs" <<'EOF'
fn main() {
    let greeting = std::env::var("GREETING").unwrap_or_else(|_| "hello".to_owned());
    println!("{greeting}, world");
}
EOF
printf '[package]\nname = "greeter"\nversion = "0.1.0"\nedition = "2021"\n' >"$repo/Cargo.toml"
printf 'GREETING=hello\n' >"$repo/.env.example"
git -C "$repo" init -q -b main
git -C "$repo" -c user.name=smoke -c user.email=smoke@localhost add -A
git -C "$repo" -c user.name=smoke -c user.email=smoke@localhost commit -q -m "greeter"
# The services run as uid 10001 (git refuses a repository another user owns).
chown -R 10001:10001 "$work/repos"

step "compose up: three NATS nodes, every service, conversation scaled to 3"
"${compose[@]}" up -d --scale conversation=3 >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; die "compose up"; }

# Every service container runs (none restarting) and every gateway is healthy.
expected() { # service replicas
  local count
  count=$("${compose[@]}" ps -q "$1" | wc -l)
  [ "$count" -eq "$2" ] || die "$1 has $count containers, expected $2"
}
expected nats-1 1; expected nats-2 1; expected nats-3 1
expected setup 2; expected dispatch 3; expected conversation 3
expected specialists 3; expected artifacts 3; expected executor 2; expected gateway 2
ready_deadline=$((SECONDS + 180))
while :; do
  not_ready=()
  for id in $("${compose[@]}" ps -q); do
    state=$(docker inspect -f '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}-{{end}} {{.State.ExitCode}} {{.RestartCount}}' "$id")
    read -r name status health code restarts <<<"$state"
    case $name in
      */"${project_name}"_nats-ready_* | */"${project_name}"_streams_*)
        [ "$status" = exited ] && [ "$code" = 0 ] && continue
        [ "$status" = exited ] && die "$name exited $code: $(docker logs "$id" 2>&1 | tail -5)"
        ;;
      *)
        [ "$status" = running ] && [ "$health" != starting ] && [ "$health" != unhealthy ] && continue
        ;;
    esac
    not_ready+=("$name:$status:$health:restarts=$restarts")
  done
  [ ${#not_ready[@]} -eq 0 ] && break
  [ "$SECONDS" -lt "$ready_deadline" ] || die "not up within 180s: ${not_ready[*]}"
  sleep 2
done
restarts=$(docker inspect -f '{{.Name}} {{.RestartCount}}' $("${compose[@]}" ps -q) | awk '$2 > 0')
step "stack up: $("${compose[@]}" ps -q | wc -l) containers${restarts:+ (restarted while NATS formed: $restarts)}"

# The nodes' published ports (looked up once per start: compose is slow to ask).
declare -A published
publish_ports() { # node...
  local node port mapped
  for node in "$@"; do
    for port in 4222 8222; do
      mapped=$("${compose[@]}" port "$node" "$port")
      case $mapped in
        127.0.0.1:*) published[$node:$port]=$mapped ;;
        *) die "$node:$port is published on '$mapped', not 127.0.0.1" ;;
      esac
    done
  done
}
publish_ports nats-1 nats-2 nats-3
host_port() { echo "${published[$1:$2]}"; }
nats_urls() {
  echo "nats://$(host_port nats-1 4222),nats://$(host_port nats-2 4222),nats://$(host_port nats-3 4222)"
}
password() { sed -n "s/^ZOPU_$1_PASSWORD=//p" "$work/deploy.env"; }
cli() { # as the operator, from outside (through $cli_urls when set)
  local settings
  mapfile -t settings <"$work/sandbox.env"
  env "${settings[@]}" ZOPU_NATS_USER=operator ZOPU_NATS_PASSWORD="$(password OPERATOR)" \
    ZOPU_DATA_DIR="$work/cli" "$zopu" --nats "${cli_urls:-$(nats_urls)}" --json "$@"
}
reader() { # as the read-only reader
  ZOPU_NATS_USER=reader ZOPU_NATS_PASSWORD=$(password READER) ZOPU_DATA_DIR="$work/cli" \
    "$zopu" --nats "$(nats_urls)" --json "$@"
}
json_field() { python3 -c 'import json,sys
for line in sys.stdin:
    line=line.strip()
    if not line: continue
    value=json.loads(line)
    for key in sys.argv[1].split("."):
        value=value.get(key) if isinstance(value, dict) else None
    if value is not None:
        print(value if not isinstance(value, list) else " ".join(value)); break' "$1"; }

step "smoke: project create --repo $repo"
cli project create --org smoke --repo "$repo" --timeout 180 >"$work/create.out" 2>"$work/create.err" \
  || die "project create: $(cat "$work/create.out" "$work/create.err")"
project=$(json_field project <"$work/create.out")
[ -n "$project" ] || die "no project id in: $(cat "$work/create.out")"
step "project $project is ready"

step "smoke: send a message and read the answer's artifact"
cli send --org smoke "$project" "How does main print the greeting?" --timeout 180 >"$work/send.out" 2>"$work/send.err" \
  || die "send: $(cat "$work/send.out" "$work/send.err")"
grep -q '"kind":"final"' "$work/send.out" || die "no final answer: $(cat "$work/send.out")"
# The setup artifact (published when the project became ready) and any the answer named.
artifacts=$(grep '"kind":"final"' "$work/send.out" | json_field artifact_ids)
if [ -z "$artifacts" ]; then
  artifacts=$(reader replay --org smoke --project "$project" 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    event=json.loads(line)
    if event.get("type")=="artifact.published":
        print(event.get("data",{}).get("artifact_id") or event.get("data",{}).get("artifactId") or ""); break')
fi
[ -n "$artifacts" ] || die "no artifact to read: $(cat "$work/send.out")"
for artifact in $artifacts; do
  cli artifact get "$artifact" -o "$work/$artifact.html" >/dev/null 2>"$work/artifact.err" \
    || die "artifact get $artifact: $(cat "$work/artifact.err")"
  grep -qi '<html' "$work/$artifact.html" || die "artifact $artifact is not HTML"
  step "artifact $artifact: $(wc -c <"$work/$artifact.html") bytes of verified HTML"
done

# Which node leads ZOPU_EVENTS, and what every node holds of it.
stream_state() { # service -> "leader messages last_seq" as that node's /jsz reports it
  local url
  url="http://$(host_port "$1" 8222)/jsz?streams=true"
  curl -fsS --max-time 3 "$url" | python3 -c 'import json,sys
jsz=json.load(sys.stdin)
for account in jsz.get("account_details") or []:
    for stream in account.get("stream_detail") or []:
        if stream["name"]=="ZOPU_EVENTS":
            print((stream.get("cluster") or {}).get("leader","-"), stream["state"]["messages"], stream["state"]["last_seq"]); sys.exit(0)
print("- 0 0")'
}
leader_name=$(stream_state nats-1 | cut -d' ' -f1)
case $leader_name in n1|n2|n3) ;; *) die "ZOPU_EVENTS has no leader (nats-1 reports '$leader_name')" ;; esac
victim=nats-${leader_name#n}

step "fault: six messages in flight, then kill -9 of $victim (the stream leader) and its restart"
# The sends follow their turns through the two other nodes: the fault is the
# services' (whose clients lose their server and the stream its leader), and
# a CLI whose own server dies needs $JS.API.CONSUMER.INFO, which the
# operator identity in nats/accounts.conf does not have yet (async-nats asks
# for it when a pull consumer's connection comes back).
cli_urls=$(for node in nats-1 nats-2 nats-3; do
  [ "$node" = "$victim" ] || echo "nats://$(host_port "$node" 4222)"
done | paste -sd, -)
# What the smoke left, read before the sends: six offline turns can all end
# before a slow `compose ps` returns, so reading it after them races.
victim_id=$("${compose[@]}" ps -q "$victim")
# The conversation instances are paused (cgroup freezer) until the node is
# killed, so the turns are still to run when it dies whatever the machine's
# speed: offline turns take milliseconds, and six of them once all ended
# before the kill (a CI run failed "not mid-run"). Their connections and
# consumers stay as they were; they resume with the stream leader gone.
conversation_ids=$("${compose[@]}" ps -q conversation)
# shellcheck disable=SC2086 # one id per word
docker pause $conversation_ids >/dev/null
before=$(stream_state nats-1 | cut -d' ' -f3)
case $before in ''|*[!0-9]*) die "cannot read ZOPU_EVENTS' last sequence from nats-1 ('$before')" ;; esac
pids=()
for n in 1 2 3 4 5 6; do
  cli send --org smoke "$project" "Question $n: where is the greeting read from the environment?" --timeout 240 \
    >"$work/send-$n.out" 2>"$work/send-$n.err" &
  pids+=($!)
done
unset cli_urls
# Mid-run: once the stream has grown past what the smoke left (the first
# messages are stored; a project's turns run one at a time, so the others
# are still to come).
grow_deadline=$((SECONDS + 60))
until [ "$(stream_state nats-1 | cut -d' ' -f3)" -gt "$before" ]; do
  [ "$SECONDS" -lt "$grow_deadline" ] || die "no new event within 60s of the sends"
  sleep 0.1
done
read -r _ kept_messages kept_last <<<"$(stream_state "$victim")"
docker kill -s KILL "$victim_id" >/dev/null
# shellcheck disable=SC2086
docker unpause $conversation_ids >/dev/null
in_flight=0
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && in_flight=$((in_flight + 1)); done
[ "$in_flight" -gt 0 ] || die "every send had finished before the kill: not mid-run"
step "killed $victim with $kept_messages events stored (last sequence $kept_last), $in_flight of 6 sends in flight"
"${compose[@]}" start "$victim" >/dev/null 2>&1
publish_ports "$victim"
step "restarted $victim"
failed=0
for i in "${!pids[@]}"; do
  n=$((i + 1))
  if ! wait "${pids[$i]}" || ! grep -q '"kind":"final"' "$work/send-$n.out"; then
    echo "send $n: $(cat "$work/send-$n.out" "$work/send-$n.err")" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] || die "a message sent across the node kill got no final answer"
step "all six messages got their final answer"

# Nothing lost: every node (the restarted one caught up) has at least every
# event that existed before the kill, and they agree with each other.
agree_deadline=$((SECONDS + 60))
while :; do
  states=$(for node in nats-1 nats-2 nats-3; do stream_state "$node" | cut -d' ' -f2-; done | sort -u)
  if [ "$(echo "$states" | wc -l)" -eq 1 ]; then
    read -r messages last <<<"$states"
    [ "$last" -ge "$kept_last" ] && [ "$messages" -ge "$kept_messages" ] && break
  fi
  [ "$SECONDS" -lt "$agree_deadline" ] || die "the nodes disagree or lost events: $(echo "$states" | tr '\n' ';') (before the kill: $kept_messages events, last $kept_last)"
  sleep 1
done
step "every node holds ZOPU_EVENTS with $messages events up to sequence $last (before the kill: $kept_messages, $kept_last)"
reader audit verify >"$work/audit.out" 2>&1 || die "audit verify: $(cat "$work/audit.out")"
step "audit verify: every project's chain is whole"

step "testcontainers: the harness on the locally built nats image (ZOPU_TEST_NATS=docker)"
if ! ZOPU_TEST_NATS=docker cargo test --workspace --features zopu-tests/docker --test it -- docker:: foundation:: \
    >"$work/testcontainers.log" 2>&1; then
  tail -n 60 "$work/testcontainers.log" >&2
  die "the testcontainers harness tests failed"
fi
grep -E '^test |test result' "$work/testcontainers.log" >&2

step "passed"
