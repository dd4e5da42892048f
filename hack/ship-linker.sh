#!/usr/bin/env bash
# Prints the linker `make ship-binaries` names for the musl targets: a stub at a path that is the
# same for every clone on this machine (in the cache), which runs the calling clone's
# hack/link-ordered.sh (CSI_ADDONS_LINK_ORDERED, set by the Makefile).
#
# Why not .cargo/config.toml's `linker = "hack/link-ordered.sh"` alone: cargo makes that path
# absolute, inside the clone, and counts the linker in every crate's fingerprint. Each fresh clone,
# and CI's are all fresh, then rebuilt the whole shipped build (some 25 minutes on two cores) though
# cargo's output is cached outside the clone. Container builds and a developer's plain
# `cargo build --target …-musl` still take the config's linker; the environment variable cargo
# reads first (CARGO_TARGET_<TRIPLE>_LINKER) overrides it only here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
stub="$CSI_ADDONS_CACHE/ship-linker/link-ordered"
body='#!/bin/sh
# Written by hack/ship-linker.sh: the shipped builds link through the clone'"'"'s hack/link-ordered.sh.
exec "${CSI_ADDONS_LINK_ORDERED:?set by the Makefile of csi-addons-rs: its hack/link-ordered.sh}" "$@"'
if [ ! -x "$stub" ] || [ "$(cat "$stub")" != "$body" ]; then
  mkdir -p "$(dirname "$stub")"
  printf '%s\n' "$body" >"$stub.tmp.$$"
  chmod +x "$stub.tmp.$$"
  mv "$stub.tmp.$$" "$stub"
fi
echo "$stub"
