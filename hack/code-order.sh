#!/usr/bin/env bash
# Makes build/code-order/<binary>.txt, the functions the manager and the sidecar run in service,
# which hack/link-ordered.sh packs together at the front of the shipped binaries (see there why).
#
#   hack/code-order.sh        # about 10 min: the shipped build, then the benchmark parts at small sizes
#
# It builds the shipped binaries with their symbols kept, runs the benchmark's parts (jobs through
# the sidecar, an idle manager with CSIAddonsNodes, the annotation fan-out, the sidecar's own part)
# with the manager and sidecar under valgrind's callgrind, and lists every function either ran.
# Commit the lists; run it again after large changes to what the binaries do.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
command -v valgrind >/dev/null || { log "valgrind is needed (apt-get install valgrind)"; exit 1; }

target=$("$here/static-target.sh")
target_dir="$root/target/code-order"
# The shipped build itself, the same crates, features and profile, so the same symbol hashes; only
# its link keeps the symbols (see hack/link-ordered.sh).
log "building the shipped binaries with symbols into $target_dir"
CARGO_TARGET_DIR="$target_dir" CODE_ORDER_KEEP_SYMBOLS=1 make -C "$root" --no-print-directory ship-binaries
bin="$target_dir/$target/ship"

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-code-order.XXXXXX")
trap 'rm -rf "$work"' EXIT
for name in csi-addons-manager csi-addons-sidecar; do
  mkdir -p "$work/$name"
  # Periodic dumps as well as the one at exit: a process stopped by SIGKILL still leaves its profile.
  cat >"$work/$name.sh" <<EOF
#!/bin/sh
exec valgrind -q --tool=callgrind --dump-instr=no --compress-strings=no --demangle=no \
  --dump-every-bb=20000000 --callgrind-out-file="$work/$name/%p.out" "$bin/$name" "\$@"
EOF
  chmod +x "$work/$name.sh"
done

assets=$("$here/control-plane.sh")
for part in bench_jobs bench_manager_idle bench_manager_annotation bench_sidecar; do
  log "running $part under callgrind"
  KUBEBUILDER_ASSETS="$assets" TESTENV_AUDIT=1 BENCH_ONLY=ours BENCH_RESULTS="$work/results" \
  BENCH_JOBS=200 BENCH_NODES=50 BENCH_PVCS=200 BENCH_CALLS=200 \
  UPSTREAM_MANAGER="$("$here/upstream-binaries.sh" manager)" UPSTREAM_SIDECAR="$("$here/upstream-binaries.sh" sidecar)" \
  UPSTREAM_RBAC="$("$here/upstream-binaries.sh" rbac)" \
  CSI_ADDONS_MANAGER="$work/csi-addons-manager.sh" CSI_ADDONS_SIDECAR="$work/csi-addons-sidecar.sh" \
  REFERENCE_DRIVER="$bin/reference-driver" \
    cargo test --locked -p integration-tests --test integration "$part" -- --ignored --nocapture --test-threads=1
done

mkdir -p "$root/build/code-order"
for name in csi-addons-manager csi-addons-sidecar; do
  # Every function callgrind saw run (`fn=`) or called (`cfn=`), without its recursion depth (`'2`);
  # addresses without a symbol are left out. Sorted, so a crate's functions sit together; a name over
  # 240 characters is kept as its first 200 and its last 20, the hash (hack/link-ordered.sh).
  find "$work/$name" -type f -name '*.out*' -exec cat {} + \
    | sed -n -e 's/^c\{0,1\}fn=//p' | sed -e "s/'[0-9]*\$//" | grep -v -e '^0x' -e '^(below main)$' \
    | awk '{ print (length($0) > 240 ? substr($0, 1, 200) "..." substr($0, length($0) - 19) : $0) }' \
    | LC_ALL=C sort -u >"$root/build/code-order/$name.txt"
  log "$name: $(wc -l <"$root/build/code-order/$name.txt") functions listed"
done
