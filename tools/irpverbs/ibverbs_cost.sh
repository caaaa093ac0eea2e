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
#   the client runs under valgrind twice, with N1 and N2 iterations, and the
#   figure is (Ir(N2) - Ir(N1)) / (N2 - N1), so set-up, the out-of-band
#   exchange and tear-down cancel out. The client under valgrind is the slow
#   side, so it rarely waits for its (native) server and the count hardly
#   depends on timing;
# - wall-clock figures (perftest's BW average in MB/s, latency t_typical in
#   us), perftest and `irpverbs perf` taking turns in the same minute.
#
# --quick: fewer iterations (a smoke run of the script itself). TEST:SIZE
# (e.g. write_bw:65536): only those of the five tests.
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
    cases=("send_lat 8" "send_bw 8" "send_bw 65536" "write_bw 8" "write_bw 65536")
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
    local opts=(-s "$size" -n "$iters")
    case "$test" in
        send_lat) ;;
        *) opts+=(-t 128 -Q 32) ;;
    esac
    local pre=()
    if [[ -n "$vg" ]]; then
        pre=(valgrind --tool=callgrind --callgrind-out-file="$vg" -q)
    fi
    if [[ "$kind" == perftest ]]; then
        # -u 20: a 4 s ACK timeout, so that a client slowed down by valgrind
        # does not exhaust its retries (perftest's default is 14, 67 ms).
        opts+=(-m 1024 -u 20)
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

# Instructions of a callgrind run.
instructions() {
    grep -E '^(summary|totals):' "$1" | head -1 | awk '{print $2}'
}

# Inclusive instructions of the function named $2 (with its object) in the
# callgrind run $1.
inclusive() {
    callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
        awk -v f=":$2 [" 'index($0, f) { gsub(",", "", $1); print $1; found = 1; exit }
            END { if (!found) print 0 }'
}

# The post path's own instructions in run $2 of KIND $1: the posting call
# the program makes (libibverbs' post_send op, or irpverbs-verbs'
# Qp::post_send) less the speed path's QpRings::post_send below it, which
# both share (it rings the soft HCA's doorbell).
post_layer() {
    local top=irpverbs_ibverbs::qp::post_send
    [[ "$1" == perf ]] && top=irpverbs_verbs::objects::Qp::post_send
    echo $(($(inclusive "$2" "$top") - $(inclusive "$2" irpverbs_kernel_table::speed::QpRings::post_send)))
}

# ipm KIND TEST SIZE N1 N2: sets IPM (instructions per message of the
# client) and POST (of them, the post path's own layer).
ipm() {
    local a b pa pb
    run "$1" "$2" "$3" "$4" "$work/cg1"
    run "$1" "$2" "$3" "$5" "$work/cg2"
    a="$(instructions "$work/cg1")"
    b="$(instructions "$work/cg2")"
    pa="$(post_layer "$1" "$work/cg1")"
    pb="$(post_layer "$1" "$work/cg2")"
    IPM=$(((b - a) / ($5 - $4)))
    POST=$(((pb - pa) / ($5 - $4)))
}

# The wall-clock figure of a client's output: latency t_typical (us) or
# bandwidth average (MB/s), from the row that starts with the size.
figure() { # test size (output on stdin)
    awk -v s="$2" -v lat="$([[ "$1" == *_lat ]] && echo 1 || echo 0)" \
        '$1 == s && NF >= 5 { print (lat ? $5 : $4); exit }'
}

echo "| test | size | instr/msg perftest | instr/msg irpverbs perf | ratio | post layer perftest | post layer irpverbs perf | wall perftest | wall irpverbs perf |"
echo "|---|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
    read -r test size <<<"$c"
    if [[ "$size" -ge 65536 ]]; then n1=100 n2=300 wn=2000; else n1=1000 n2=3000 wn=20000; fi
    if [[ "$quick" == 1 ]]; then n1=$((n1 / 10)) n2=$((n2 / 10)) wn=$((wn / 10)); fi
    ipm perftest "$test" "$size" "$n1" "$n2"
    ip=$IPM pp=$POST
    ipm perf "$test" "$size" "$n1" "$n2"
    ii=$IPM pi=$POST
    run perftest "$test" "$size" "$wn"
    wp="$(figure "$test" "$size" <"$work/cli")"
    run perf "$test" "$size" "$wn"
    wi="$(figure "$test" "$size" <"$work/cli")"
    ratio="$(awk -v a="$ip" -v b="$ii" 'BEGIN { printf "%.3f", a / b }')"
    unit="MB/s"
    [[ "$test" == *_lat ]] && unit="us"
    echo "| ib_$test / perf $test | $size | $ip | $ii | $ratio | $pp | $pi | $wp $unit | $wi $unit |"
done
