#!/usr/bin/env bash
# Prints the Rust target the shipped binaries (manager, sidecar) are built for: static musl when this
# machine can build it, so no libc is mapped beside the binary (about 1.5 MiB of RSS) and musl's
# compact allocator holds less than glibc's; the host's glibc target otherwise, with a warning.
# Building for musl needs the target (`rustup target add x86_64-unknown-linux-musl`) and a C
# compiler for it (`musl-gcc`, Debian's musl-tools) for aws-lc's C and assembly; both are installed
# here when missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
arch=$(uname -m)
musl="$arch-unknown-linux-musl"
has_target() { rustup target list --installed 2>/dev/null | grep -qx "$musl"; }
# A fresh machine gets what is missing, once, so its builds and benchmarks measure the binaries that
# ship; where that cannot be installed, the glibc build stands in, said loudly.
if ! has_target; then
  log "adding the Rust target $musl (once per machine)"
  rustup target add "$musl" >&2 || true
fi
command -v musl-gcc >/dev/null || "$here/packages.sh" musl-tools || true
if has_target && command -v musl-gcc >/dev/null; then
  echo "$musl"
else
  log "static build unavailable (needs: rustup target add $musl; apt-get install musl-tools): using glibc, RSS figures will be higher"
  echo "$arch-unknown-linux-gnu"
fi
