#!/usr/bin/env bash
# The cost of libibverbs.so.1 over irpverbs (ulp/ibverbs) against irpverbs'
# own client: Debian's perftest (ib_send_lat, ib_send_bw, ib_write_bw, 8 B
# and 64 KiB) over the library, and `irpverbs perf` with the same test,
# size, depth, CQ moderation and path MTU, each as a server and a client
# process on their own loopback addresses (release builds, verifier off).
#
#   bash tools/irpverbs/ibverbs_cost.sh [--quick] [TEST:SIZE ...]
#
# Two figures per test (docs/ibverbs.md, "Cost against irpverbs perf"):
#
# - instructions per message of the client process, counted by callgrind:
#   the client runs under valgrind twice, with N1 and N2 iterations, and
#   each figure is (X(N2) - X(N1)) / (N2 - N1), so set-up, the out-of-band
#   exchange and tear-down cancel out. Each run's instructions are split by
#   layer (tools/irpverbs/callgrind_layers.py): the benchmark program's own
#   loop, the verbs layer it calls (libibverbs over irpverbs, or irpverbs
#   perf's irpverbs-verbs), and the host-mode driver and soft HCA below
#   both; the busy-wait (polls that found neither a completion nor a
#   datagram) is counted apart. The library's cost is layer + driver less
#   busy-wait, against the same of `irpverbs perf`. Both sides use a 4 s
#   ACK timeout (`-u 20`), so that the client slowed down by valgrind does
#   not exhaust its transport retries;
# - wall-clock figures (perftest's BW average in MB/s, latency t_typical in
#   us), perftest and `irpverbs perf` taking turns (perftest, perf,
#   perftest, perf): the better of each pair of runs, and their ratio.
#
# --quick: fewer iterations (a smoke run of the script itself). TEST:SIZE
# (e.g. write_bw:65536): only those of the six.
# Without perftest or valgrind it says so and exits 0.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
quick=0
cases=()
for a in "$@"; do
    case "$a" in
        --quick) quick=1 ;;
        send_lat:* | send_bw:* | write_bw:*) cases+=("${a%%:*} ${a#*:}") ;;
        *) echo "usage: $0 [--quick] [TEST:SIZE ...]" >&2; exit 2 ;;
    esac
done
if [[ ${#cases[@]} -eq 0 ]]; then
    cases=("send_lat 8" "send_lat 65536" "send_bw 8" "send_bw 65536" "write_bw 8" "write_bw 65536")
fi
for t in ib_send_lat ib_send_bw ib_write_bw valgrind; do
    if ! command -v "$t" >/dev/null; then
        echo "skipped: $t is not installed (apt-get install perftest valgrind)"
        exit 0
    fi
done

L="$(bash "$root/ulp/ibverbs/link.sh" --release)"
cargo build --quiet --release -p irpverbs-tools --bin irpverbs \
    --manifest-path "$root/Cargo.toml" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Each run gets its own TCP port (no TIME_WAIT between runs) and its own
# pair of loopback addresses.
port=19100
net=0
next() {
    port=$((port + 1))
    net=$(((net % 200) + 1))
    srv="127.0.$((40 + net % 50)).1"
    cli="127.0.$((40 + net % 50)).2"
}

# Waits until something listens on TCP $port (the server is ready).
wait_listen() {
    for _ in $(seq 1 200); do
        if ss -ltn "sport = :$port" | grep -q LISTEN; then
            return 0
        fi
        sleep 0.05
    done
    echo "no server on port $port" >&2
    return 1
}

# A client under valgrind is slow enough that its (native) peer's ACK
# timeout can expire and the connection fail on a loaded machine: a failed
# run is repeated, up to three times.
run() {
    local try
    for try in 1 2 3; do
        if run_once "$@"; then
            return 0
        fi
        echo "run $* failed (try $try)" >&2
        sleep 1
    done
    return 1
}

# run_once KIND TEST SIZE ITERS [valgrind-out-file]: one server and one client;
# the client's output in $work/cli. KIND: perftest or perf. (Not in a
# subshell: `next` counts the ports and addresses.)
run_once() {
    local kind="$1" test="$2" size="$3" iters="$4" vg="${5:-}"
    next
    # -u 20: a 4 s ACK timeout, so that a client slowed down by valgrind
    # does not exhaust its retries (the default is 14, 67 ms).
    local opts=(-s "$size" -n "$iters" -u 20)
    case "$test" in
        send_lat) ;;
        *) opts+=(-t 128 -Q 32) ;;
    esac
    local pre=()
    if [[ -n "$vg" ]]; then
        pre=(valgrind --tool=callgrind --callgrind-out-file="$vg" -q)
    fi
    if [[ "$kind" == perftest ]]; then
        opts+=(-m 1024)
        LD_LIBRARY_PATH=$L IRPVERBS_VERIFIER=0 IRPVERBS_ADDR=$srv \
            "ib_$test" -d irpverbs0 -x 0 -F -p "$port" "${opts[@]}" >"$work/srv" 2>&1 &
        local s=$!
        wait_listen
        LD_LIBRARY_PATH=$L IRPVERBS_VERIFIER=0 IRPVERBS_ADDR=$cli \
            "${pre[@]}" "ib_$test" -d irpverbs0 -x 0 -F -p "$port" "${opts[@]}" "$srv" \
            >"$work/cli" 2>&1 || { cat "$work/cli" "$work/srv" >&2; kill "$s" 2>/dev/null; wait "$s"; return 1; }
        wait "$s" || true
    else
        opts+=(-m 1024 --oob-port "$port")
        "$L/irpverbs" perf "$test" --server --bind "$srv" "${opts[@]}" >"$work/srv" 2>&1 &
        local s=$!
        wait_listen
        "${pre[@]}" "$L/irpverbs" perf "$test" --bind "$cli" "${opts[@]}" "$srv" \
            >"$work/cli" 2>&1 || { cat "$work/cli" "$work/srv" >&2; kill "$s" 2>/dev/null; wait "$s"; return 1; }
        wait "$s" || true
    fi
}

# The per-layer figures of a callgrind run: key=value words.
layers() {
    python3 "$root/tools/irpverbs/callgrind_layers.py" "$1"
}

# ipm KIND TEST SIZE N1 N2: sets F[key] to the per-message figures of the
# client (each key of callgrind_layers.py, differences over N2 - N1).
declare -A F
ipm() {
    local a b k
    run "$1" "$2" "$3" "$4" "$work/cg1"
    run "$1" "$2" "$3" "$5" "$work/cg2"
    a="$(layers "$work/cg1")"
    b="$(layers "$work/cg2")"
    F=()
    for k in total program layer driver system polls empty empty_ir; do
        F[$k]="$(awk -v k="$k" -v n="$(($5 - $4))" -v a="$a" -v b="$b" 'BEGIN {
            split(a, x, " "); split(b, y, " ")
            for (i in x) { split(x[i], p, "="); if (p[1] == k) va = p[2] }
            for (i in y) { split(y[i], p, "="); if (p[1] == k) vb = p[2] }
            printf (k == "polls" || k == "empty") ? "%.2f" : "%.0f", (vb - va) / n }')"
    done
}

# The wall-clock figure of a client's output: latency t_typical (us) or
# bandwidth average (MB/s), from the row that starts with the size.
figure() { # test size (output on stdin)
    awk -v s="$2" -v lat="$([[ "$1" == *_lat ]] && echo 1 || echo 0)" \
        '$1 == s && NF >= 5 { print (lat ? $5 : $4); exit }'
}

# best TEST A B: the better of two wall-clock figures (the lower latency,
# the higher bandwidth).
best() {
    awk -v lat="$([[ "$1" == *_lat ]] && echo 1 || echo 0)" -v a="$2" -v b="$3" \
        'BEGIN { print ((lat ? a < b : a > b) ? a : b) }'
}

echo "Instructions per message of the client (callgrind):"
echo
echo "| test | size | total perftest / perf | program's loop | verbs layer | driver + soft HCA | polls (empty) per message | busy-wait | library's cost perftest / perf | ratio | within 10 % |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
wall=()
for c in "${cases[@]}"; do
    read -r test size <<<"$c"
    # A ping-pong client under valgrind spins while its peer answers: fewer
    # round trips keep its run short on a loaded machine.
    if [[ "$size" -ge 65536 ]]; then
        n1=100 n2=300 wn=1000
    elif [[ "$test" == *_lat ]]; then
        n1=200 n2=600 wn=5000
    else
        n1=1000 n2=3000 wn=10000
    fi
    if [[ "$quick" == 1 ]]; then n1=$((n1 / 10)) n2=$((n2 / 10)) wn=$((wn / 10)); fi
    ipm perftest "$test" "$size" "$n1" "$n2"
    declare -A P=()
    for k in "${!F[@]}"; do P[$k]="${F[$k]}"; done
    ipm perf "$test" "$size" "$n1" "$n2"
    lp=$((P[layer] + P[driver] - P[empty_ir]))
    li=$((F[layer] + F[driver] - F[empty_ir]))
    ratio="$(awk -v a="$lp" -v b="$li" 'BEGIN { printf "%.3f", a / b }')"
    ok="$(awk -v r="$ratio" 'BEGIN { print (r <= 1.10) ? "yes" : "no" }')"
    echo "| ib_$test / perf $test | $size | ${P[total]} / ${F[total]} | ${P[program]} / ${F[program]} | ${P[layer]} / ${F[layer]} | ${P[driver]} / ${F[driver]} | ${P[polls]} (${P[empty]}) / ${F[polls]} (${F[empty]}) | ${P[empty_ir]} / ${F[empty_ir]} | $lp / $li | $ratio | $ok |"
    # Wall clock, taking turns.
    run perftest "$test" "$size" "$wn"
    wp1="$(figure "$test" "$size" <"$work/cli")"
    run perf "$test" "$size" "$wn"
    wi1="$(figure "$test" "$size" <"$work/cli")"
    run perftest "$test" "$size" "$wn"
    wp2="$(figure "$test" "$size" <"$work/cli")"
    run perf "$test" "$size" "$wn"
    wi2="$(figure "$test" "$size" <"$work/cli")"
    wp="$(best "$test" "$wp1" "$wp2")"
    wi="$(best "$test" "$wi1" "$wi2")"
    unit="MB/s"
    # The time ratio: above 1, the library's run took longer.
    if [[ "$test" == *_lat ]]; then
        unit="us"
        wr="$(awk -v a="$wp" -v b="$wi" 'BEGIN { printf "%.2f", a / b }')"
    else
        wr="$(awk -v a="$wp" -v b="$wi" 'BEGIN { printf "%.2f", b / a }')"
    fi
    wall+=("| ib_$test / perf $test | $size | $wp1, $wp2 $unit | $wi1, $wi2 $unit | $wr |")
done
echo
echo "Wall clock (perftest, perf, perftest, perf; 10000 iterations, 5000 for latency, 1000 at 64 KiB; a tenth with --quick):"
echo
echo "| test | size | perftest | irpverbs perf | time ratio (best of each) |"
echo "|---|---|---|---|---|"
printf '%s\n' "${wall[@]}"
