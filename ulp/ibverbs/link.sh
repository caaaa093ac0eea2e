#!/usr/bin/env bash
# Builds libibverbs.so.1 over irpverbs: the irpverbs-ibverbs staticlib,
# linked into a shared library with rdma-core's symbol versions
# (ulp/ibverbs/libibverbs.map) and soname; and from the same archive the
# stand-ins libmlx5.so.1 and libefa.so.1 that perftest's binaries load.
#
#   bash ulp/ibverbs/link.sh [--release] [--target-dir DIR]
#
# prints the directory holding the libraries (DIR/debug or DIR/release;
# DIR defaults to the workspace's target directory). Run a program with
#   LD_LIBRARY_PATH=<that directory> ibv_devinfo
# (docs/ibverbs.md). Honours $CARGO and $CC.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
profile=debug
target_dir="$root/target"
cargo_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --release) profile=release; cargo_args+=(--release) ;;
        --target-dir) target_dir="$2"; shift ;;
        *) echo "usage: $0 [--release] [--target-dir DIR]" >&2; exit 2 ;;
    esac
    shift
done

"${CARGO:-cargo}" build --quiet -p irpverbs-ibverbs --lib "${cargo_args[@]}" \
    --manifest-path "$root/Cargo.toml" --target-dir "$target_dir" >&2
out="$target_dir/$profile"
# The whole archive: every exported function is in it whether or not another
# object refers to it; a version script keeps all but one library's API
# local, and --gc-sections drops what that API does not reach.
link() { # soname map [linker options]
    "${CC:-cc}" -shared -o "$out/$1" "${@:3}" \
        -Wl,--whole-archive "$out/libirpverbs_ibverbs.a" -Wl,--no-whole-archive \
        -Wl,--version-script="$root/ulp/ibverbs/$2" \
        -Wl,-soname,"$1" -Wl,-z,now -Wl,--gc-sections \
        -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc >&2
}
link libibverbs.so.1 libibverbs.map
# Stand-ins for the provider libraries perftest is linked with (calls only
# for mlx5 or EFA devices; src/standin.rs).
link libmlx5.so.1 mlx5.map -Wl,--strip-debug
link libefa.so.1 efa.map -Wl,--strip-debug
echo "$out"
