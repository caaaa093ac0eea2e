#!/usr/bin/env bash
# Type-checks and lints the Windows-only code on Linux, where it cannot be
# built for real:
#
#  0. driver/kmdf's formatting (rustfmt; the root workspace's `cargo fmt`
#     does not reach it).
#  1. driver/kmdf (irpverbs.sys), once per backend (the `soft` feature, the
#     default, and `model`), against mocks/, a hand transcription of the
#     wdk-sys 0.5 bindings it uses (bindgen's rendering of the KMDF and WDM
#     headers: ModuleConsts enums, Option<unsafe extern "C" fn> callbacks,
#     the same struct fields and function signatures) plus stand-ins for
#     wdk, wdk-panic and wdk-build (whose Config the build
#     script uses; it compiles the SEH shim src/seh.c only for Windows
#     targets). It catches Rust errors (types, borrows, a missing `unsafe`
#     or `// SAFETY:` comment, clippy lints);
#     whether the transcription matches the real bindings only a Windows
#     build can tell. A new WDF or kernel call in the glue needs its
#     signature added to mocks/wdk-sys from the header first.
#  2. tests/windows-runner's Windows module against the real windows-sys
#     (which compiles on any OS), with its cfg(windows) turned on in a copy.
#
# Nothing is linked or run. Needs the crates in Cargo.lock already fetched
# (or network access to crates.io). Usage: driver/kmdf/linux-check/check.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$scratch/target}"

# A copy of the repository's files, so that neither lockfile changes.
(cd "$root" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$scratch"
mkdir -p "$scratch/repo" && (cd "$scratch" && find . -mindepth 1 -maxdepth 1 ! -name repo ! -name target -exec mv {} repo/ \;)
repo="$scratch/repo"

echo "== driver/kmdf formatting"
(cd "$root/driver/kmdf" && rustfmt --edition 2024 --check src/lib.rs build.rs)

mocks="$repo/driver/kmdf/linux-check/mocks"
# crt-static is for the Windows target; on Linux it forbids proc-macros.
rm "$repo/driver/kmdf/.cargo/config.toml"
for features in "--features soft" "--no-default-features --features model"; do
    echo "== driver/kmdf ($features) against the wdk-sys mocks"
    (
        cd "$repo/driver/kmdf"
        # shellcheck disable=SC2086 # two words: the feature flags
        cargo clippy $features \
            --config "patch.crates-io.wdk-sys.path=\"$mocks/wdk-sys\"" \
            --config "patch.crates-io.wdk.path=\"$mocks/wdk\"" \
            --config "patch.crates-io.wdk-panic.path=\"$mocks/wdk-panic\"" \
            --config "patch.crates-io.wdk-build.path=\"$mocks/wdk-build\"" \
            -- -D warnings
    )
done

echo "== tests/windows-runner's Windows module against windows-sys"
runner="$repo/tests/windows-runner"
sed -i 's/cfg(windows)/cfg(unix)/g; s/cfg(not(windows))/cfg(not(unix))/g' "$runner/src/main.rs"
sed -i "s/^\[target.'cfg(windows)'.dependencies\]/[dependencies]/" "$runner/Cargo.toml"
# The runner now has two [dependencies] tables: merge them.
python3 - "$runner/Cargo.toml" <<'PY'
import sys
path = sys.argv[1]
lines = open(path).read().split("\n")
out, seen = [], False
for line in lines:
    if line.strip() == "[dependencies]":
        if seen:
            continue
        seen = True
    out.append(line)
open(path, "w").write("\n".join(out))
PY
(cd "$repo" && cargo clippy -p irpverbs-windows-runner -- -D warnings)
echo "linux-check: ok"
