#!/usr/bin/env bash
# Builds libibverbs.so.1 over irpverbs: the irpverbs-ibverbs staticlib,
# linked into a shared library with rdma-core's symbol versions
# (ulp/ibverbs/libibverbs.map) and soname; from the same archive the
# stand-ins libmlx5.so.1 and libefa.so.1 that perftest's binaries load;
# and librdmacm.so.1 from the irpverbs-rdmacm staticlib
# (ulp/rdmacm/librdmacm.map), linked against that libibverbs.so.1.
#
#   bash ulp/ibverbs/link.sh [--release] [--target-dir DIR] [--windows]
#
# prints the directory holding the libraries (DIR/debug or DIR/release;
# DIR defaults to the workspace's target directory). Run a program with
#   LD_LIBRARY_PATH=<that directory> ibv_devinfo
# (docs/ibverbs.md, docs/rdmacm.md). Honours $CARGO and $CC.
#
# With --windows it builds the same crates for Windows x64
# (x86_64-pc-windows-gnu) and links them with MinGW ($MINGW_CC, default
# x86_64-w64-mingw32-gcc) into libibverbs.dll and librdmacm.dll, each
# exporting exactly the symbols of its Linux version script (without
# versions: the .def files are made from the .map files), with the import
# libraries libibverbs.dll.a and librdmacm.dll.a, in
# DIR/x86_64-pc-windows-gnu/<profile>. librdmacm.dll imports libibverbs.dll;
# both need only system DLLs (KERNEL32, WS2_32, msvcrt, ...) besides.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
profile=debug
target_dir="$root/target"
cargo_args=()
windows=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --release) profile=release; cargo_args+=(--release) ;;
        --target-dir) target_dir="$2"; shift ;;
        --windows) windows=1 ;;
        *) echo "usage: $0 [--release] [--target-dir DIR] [--windows]" >&2; exit 2 ;;
    esac
    shift
done

if [[ $windows -eq 1 ]]; then
    triple=x86_64-pc-windows-gnu
    "${CARGO:-cargo}" build --quiet --target "$triple" -p irpverbs-ibverbs -p irpverbs-rdmacm \
        --lib "${cargo_args[@]}" --manifest-path "$root/Cargo.toml" --target-dir "$target_dir" >&2
    out="$target_dir/$triple/$profile"
    # The libraries' exports: every name of the version script, unversioned.
    def() { # dll map
        echo "LIBRARY $1"
        echo "EXPORTS"
        sed -n 's/^[[:space:]]*\([A-Za-z_][A-Za-z0-9_]*\);$/    \1/p' "$root/$2" | sort -u
    }
    # The whole archive, as on Linux; the .def decides what is exported.
    # libgcc is linked in (no libgcc_s DLL to ship); the system libraries are
    # what `rustc --print native-static-libs` names for this target. PE
    # images carry no DWARF (ld cannot place it below the image base).
    link_dll() { # dll archive [more objects]
        "${MINGW_CC:-x86_64-w64-mingw32-gcc}" -shared -static-libgcc -o "$out/$1.dll" \
            "$out/$1.def" -Wl,--whole-archive "$out/$2" -Wl,--no-whole-archive "${@:3}" \
            -Wl,--out-implib,"$out/$1.dll.a" -Wl,--gc-sections -Wl,--strip-debug \
            -lkernel32 -lntdll -luserenv -lws2_32 -ldbghelp >&2
    }
    def libibverbs.dll ulp/ibverbs/libibverbs.map >"$out/libibverbs.def"
    def librdmacm.dll ulp/rdmacm/librdmacm.map >"$out/librdmacm.def"
    link_dll libibverbs libirpverbs_ibverbs.a
    link_dll librdmacm libirpverbs_rdmacm.a "$out/libibverbs.dll.a"
    echo "$out"
    exit 0
fi

"${CARGO:-cargo}" build --quiet -p irpverbs-ibverbs -p irpverbs-rdmacm --lib "${cargo_args[@]}" \
    --manifest-path "$root/Cargo.toml" --target-dir "$target_dir" >&2
out="$target_dir/$profile"
# The whole archive: every exported function is in it whether or not another
# object refers to it; a version script keeps all but one library's API
# local, and --gc-sections drops what that API does not reach.
link() { # soname map [linker options] (archive: $archive)
    "${CC:-cc}" -shared -o "$out/$1" \
        -Wl,--whole-archive "$out/$archive" -Wl,--no-whole-archive "${@:3}" \
        -Wl,--version-script="$root/$2" \
        -Wl,-soname,"$1" -Wl,-z,now -Wl,--gc-sections \
        -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc >&2
}
archive=libirpverbs_ibverbs.a
link libibverbs.so.1 ulp/ibverbs/libibverbs.map
# Stand-ins for the provider libraries perftest is linked with (calls only
# for mlx5 or EFA devices; src/standin.rs).
link libmlx5.so.1 ulp/ibverbs/mlx5.map -Wl,--strip-debug
link libefa.so.1 ulp/ibverbs/efa.map -Wl,--strip-debug
# librdmacm.so.1 calls the libibverbs.so.1 just linked (DT_NEEDED, as
# rdma-core's does): one device, one libibverbs per process.
archive=libirpverbs_rdmacm.a
link librdmacm.so.1 ulp/rdmacm/librdmacm.map -Wl,--no-undefined "$out/libibverbs.so.1"
echo "$out"
