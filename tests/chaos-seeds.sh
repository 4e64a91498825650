#!/usr/bin/env bash
# Runs the chaos test over many seeded fault schedules in a row and names
# every seed that failed (`make chaos-seeds`, tests/README.md "Chaos").
#   SEEDS  how many schedules (default 20)
#   SCALE  ZOPU_CHAOS_SCALE of each: seeds (default, about a minute each),
#          ci (about three minutes) or nightly
#   FIRST  the first seed (default: drawn from the clock); the others follow
#          it, so `FIRST=<seed> SEEDS=1` replays one of them
# Each failing run keeps its directory (fleet logs, data dirs) and prints it.
set -uo pipefail
cd "$(dirname "$0")/.."
seeds="${SEEDS:-20}"
scale="${SCALE:-seeds}"
first="${FIRST:-$(date +%s%N)}"
case "$seeds" in ''|*[!0-9]*) echo "SEEDS=$seeds: a count of schedules, such as 20" >&2; exit 2 ;; esac
case "$first" in ''|*[!0-9]*) echo "FIRST=$first: a seed, a non-negative integer" >&2; exit 2 ;; esac
cargo="${CARGO:-cargo}"
"$cargo" build -q -p zopu-cli --bin zopu || exit 1
# The test binary, built once: a source edited during the runs changes none.
tests=$("$cargo" test -p zopu-tests --test it --no-run 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -1)
case "$tests" in /*) ;; ?*) tests="$PWD/$tests" ;; esac
if [ ! -x "$tests" ]; then
    echo "chaos-seeds: building the test binary failed: cargo test -p zopu-tests --test it --no-run" >&2
    exit 1
fi
failed=()
started=$(date +%s)
for ((i = 0; i < seeds; i++)); do
    # Seeds are u64: past bash's signed 64-bit arithmetic.
    seed=$(python3 -c "print(($first + $i) % 2**64)")
    log=$(mktemp "${TMPDIR:-/tmp}/zopu-chaos-$seed.XXXX.log")
    begun=$(date +%s)
    if (cd tests && ZOPU_CHAOS_SCALE="$scale" ZOPU_CHAOS_SEED="$seed" \
        "$tests" chaos::a_seeded_chaos_run_keeps_every_promise --exact) >"$log" 2>&1; then
        echo "chaos-seeds: $((i + 1))/$seeds seed $seed passed in $(( $(date +%s) - begun )) s"
        rm -f "$log"
    else
        echo "chaos-seeds: $((i + 1))/$seeds seed $seed FAILED in $(( $(date +%s) - begun )) s; its output: $log"
        grep -m 3 "chaos run with seed\|fleet logs in" "$log" | sed 's/^/    /'
        failed+=("$seed")
    fi
done
echo "chaos-seeds: $((seeds - ${#failed[@]})) of $seeds schedules (scale $scale) kept every promise in $(( $(date +%s) - started )) s"
if ((${#failed[@]})); then
    echo "chaos-seeds: failed seeds (replay one: ZOPU_CHAOS_SCALE=$scale ZOPU_CHAOS_SEED=<seed> cargo test -p zopu-tests --test it -- chaos:: --nocapture): ${failed[*]}"
    exit 1
fi
