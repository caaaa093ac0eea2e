#!/usr/bin/env bash
# Checks that libibverbs.dll and librdmacm.dll (link.sh --windows) export
# exactly the functions libibverbs.so.1 and librdmacm.so.1 (link.sh)
# export, versions aside: prints each name one has and the other lacks and
# fails when there is one.
#
#   bash ulp/ibverbs/check-exports.sh LINUX_DIR WINDOWS_DIR
#
# Honours $NM (nm) and $MINGW_OBJDUMP (x86_64-w64-mingw32-objdump).
set -euo pipefail

[[ $# -eq 2 ]] || { echo "usage: $0 LINUX_DIR WINDOWS_DIR" >&2; exit 2; }
linux="$1"
windows="$2"

# The defined dynamic symbols of a shared object, without versions (the
# version nodes themselves are absolute symbols: left out).
elf_exports() {
    "${NM:-nm}" -D --defined-only "$1" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | sort -u
}

# The names of a DLL's export table.
pe_exports() {
    "${MINGW_OBJDUMP:-x86_64-w64-mingw32-objdump}" -p "$1" |
        sed -n '/^\[Ordinal\/Name Pointer\] Table/,/^$/s/^[[:space:]]*\[[[:space:]]*[0-9]*\][[:space:]]*//p' |
        sort -u
}

status=0
for lib in libibverbs librdmacm; do
    so="$linux/$lib.so.1"
    dll="$windows/$lib.dll"
    for f in "$so" "$dll"; do
        [[ -f $f ]] || { echo "error: $f is missing" >&2; exit 1; }
    done
    want="$(elf_exports "$so")"
    have="$(pe_exports "$dll")"
    n="$(wc -l <<<"$want")"
    if [[ $n -lt 20 ]]; then
        echo "error: only $n exports read from $so" >&2
        exit 1
    fi
    missing="$(comm -23 <(echo "$want") <(echo "$have"))"
    extra="$(comm -13 <(echo "$want") <(echo "$have"))"
    if [[ -n $missing ]]; then
        echo "error: $lib.dll lacks what $lib.so.1 exports:" >&2
        sed 's/^/    /' <<<"$missing" >&2
        status=1
    fi
    if [[ -n $extra ]]; then
        echo "error: $lib.dll exports what $lib.so.1 does not:" >&2
        sed 's/^/    /' <<<"$extra" >&2
        status=1
    fi
    [[ $status -ne 0 ]] || echo "ok: $lib.dll exports the $n functions of $lib.so.1"
done
exit $status
