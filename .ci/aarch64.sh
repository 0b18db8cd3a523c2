#!/usr/bin/env bash
# aarch64 under emulation: cross-compiles nq-core's tests and the `nq` binary
# for aarch64-unknown-linux-gnu and runs them under qemu-aarch64 (user mode),
# so the NEON kernel is checked on every CI run by a machine without ARM.
#
# What it checks: nq-core's test suite (which compares the NEON kernel with
# the scalar kernel on thousands of plans and runs check_kernel), and
# `nq count 13` on the NEON kernel and on the scalar kernel, each against the
# published values (Q = 73712, U = 9233).
#
# What it cannot check: speed. qemu translates every instruction, so times
# here say nothing about an ARM CPU. To measure NEON, run on an ARM machine:
#     cargo bench -p nq-core --bench count
# (BENCHMARKS.md, "ARM").
#
# Only nq-core's tests and the nq-cli binary are built for aarch64: the gRPC
# and sled crates add minutes of cross-compiling and have no ARM-specific
# code. Run from anywhere; installs what is missing (Debian packages and the
# Rust target), so it needs root on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

echo "== aarch64: install the cross linker, qemu and the Rust target"
qemu() { command -v qemu-aarch64-static || command -v qemu-aarch64 || true; }
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || [ -z "$(qemu)" ] \
    || [ ! -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static >/dev/null
fi
QEMU=$(qemu)
[ -n "$QEMU" ] || { echo "qemu-aarch64 could not be installed" >&2; exit 1; }
if ! rustup target list --installed | grep -qx "$TARGET"; then
    rustup target add "$TARGET"
fi

# Environment instead of a committed .cargo/config: native builds stay as
# they are, and only this script cross-compiles.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# -L: where qemu finds the aarch64 dynamic loader and libc.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -L $SYSROOT"

echo "== aarch64: clippy on nq-core (the NEON module only compiles there)"
cargo clippy -p nq-core --all-targets --locked --target "$TARGET" -- -D warnings

echo "== aarch64: nq-core's tests under $(basename "$QEMU")"
cargo test -p nq-core --locked --target "$TARGET"

echo "== aarch64: nq count 13 under $(basename "$QEMU"), NEON and scalar kernels"
cargo build -p nq-cli --bin nq --locked --target "$TARGET"
NQ=target/$TARGET/debug/nq
for kernel in neon scalar; do
    out=$($CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER "$NQ" count 13 --kernel "$kernel" --json)
    echo "$kernel: $out"
    # The kernel name checks that the kernel asked for is the one that ran,
    # not a fallback to another.
    for want in '"total":73712' '"unique":9233' "\"kernel\":\"$kernel\"" '"published_match":true'; do
        case "$out" in
            *"$want"*) ;;
            *) echo "nq count 13 --kernel $kernel under qemu: expected $want" >&2; exit 1 ;;
        esac
    done
done
echo "aarch64: all checks passed (under emulation: correctness only, not speed)"
