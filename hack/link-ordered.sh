#!/bin/sh
# The linker of the shipped static builds (.cargo/config.toml names it for the musl targets): the C
# compiler driver as rustc would call it, with two changes.
#
# 1. It links with the LLD that ships with the Rust toolchain (rust-lld, reached through the
#    toolchain's gcc-ld directory), the same on every machine and in every image.
# 2. Where build/code-order/<binary>.txt lists the functions a binary runs in service, LLD places
#    those functions first and together. A process's mapped code counts in its RSS by the page, and
#    the kernel maps the pages around each one it faults in, so the code a sidecar or manager runs
#    while idle and while serving, spread across a few MiB among error paths, help text and code it
#    never calls, kept most of the binary resident. Packed together, the same code takes far fewer
#    pages. Nothing else changes: every function is still there, and one not listed is paged in when
#    it first runs, as every function is without an order.
#
# The lists hold symbol names as the profiled build had them. Rust's trailing hash (`17h<16 hex>E`)
# changes with dependency versions, features and the compiler; a name whose hashes are all gone
# places every function of that name, so a list keeps working across ordinary changes, and
# `hack/code-order.sh` makes the lists again. A list gone stale only packs less: the link never fails
# for it.
set -eu

# hack/code-order.sh profiles the shipped build itself, which must keep its symbols for that: with
# CODE_ORDER_KEEP_SYMBOLS=1 the link leaves out the profile's `--strip-all` and nothing else changes
# (stripping in the profile instead would change every symbol's hash).
if [ "${CODE_ORDER_KEEP_SYMBOLS:-}" = 1 ]; then
  for arg in "$@"; do
    shift
    [ "$arg" = "-Wl,--strip-all" ] || set -- "$@" "$arg"
  done
fi

out=""
prev=""
sysroot=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  case "$arg" in
    */lib/rustlib/*/lib/self-contained/* | -B*/lib/rustlib/*/bin/gcc-ld)
      [ -n "$sysroot" ] || { sysroot=${arg%%/lib/rustlib/*}; sysroot=${sysroot#-B}; } ;;
  esac
  prev=$arg
done

gcc_ld=""
for dir in "$sysroot"/lib/rustlib/*/bin/gcc-ld; do
  [ -x "$dir/ld.lld" ] && { gcc_ld=$dir; break; }
done
if [ -z "$gcc_ld" ]; then
  echo "link-ordered.sh: no rust-lld beside the toolchain (sysroot '$sysroot'): linking with the system linker, unordered" >&2
  exec cc "$@"
fi

# target/<triple>/ship/deps/csi_addons_sidecar-0123456789abcdef → csi-addons-sidecar
binary=$(basename "$out" | sed -e 's/-[0-9a-f]\{16\}$//' | tr _ -)
list="$(cd "$(dirname "$0")/.." && pwd)/build/code-order/$binary.txt"
if [ ! -f "$list" ]; then
  exec cc "$@" -fuse-ld=lld -B"$gcc_ld"
fi

order=$(mktemp)
trap 'rm -f "$order"' EXIT
# The list's functions among the binary's objects, in the list's order. A name is taken as listed,
# hash and all; where none of the instances listed under a name (less its hash) is in the objects
# any more (the hashes changed with a dependency or the compiler), every instance under that name is
# taken instead. How many of the listed Rust names placed a function goes beside the binary
# (<binary>.code-order), so a list gone stale shows.
for arg in "$@"; do
  case "$arg" in *.o) nm --defined-only "$arg" 2>/dev/null || true ;; esac
done | awk -v list="$list" -v stats="$out.code-order" '
  function unhashed(name) { sub(/17h[0-9a-f]+E$/, "", name); return name }
  # Names over 240 characters (async state machines and stream adaptors run to kilobytes) are
  # kept as their first 200 and last 20 (the hash), as hack/code-order.sh writes them.
  function short(name) { return (length(name) > 240 ? substr(name, 1, 200) "..." substr(name, length(name) - 19) : name) }
  BEGIN {
    while ((getline name < list) > 0) {
      if (name in rank) continue
      rank[name] = ++listed
      key = unhashed(name)
      if (!(key in key_rank)) key_rank[key] = listed
    }
  }
  $2 ~ /^[tTwW]$/ {
    name = short($3)
    key = unhashed(name)
    if (name in rank) { print rank[name], $3; placed[name] = 1; exact[key] = 1 }
    else if (key in key_rank) others[key] = others[key] " " $3
  }
  END {
    for (key in others) {
      if (key in exact) continue
      n = split(others[key], names, " ")
      for (i = 1; i <= n; i++) print key_rank[key], names[i]
      placed_keys[key] = 1
    }
    found = 0
    judged = 0
    for (name in rank) {
      if ((name in placed) || (unhashed(name) in placed_keys)) { found++; judged++ }
      # A Rust function of the crates compiled here that no object has any more: the list is stale.
      else if (name ~ /^_ZN/) judged++
      # C functions (musl, aws-lc) and those of the standard library come from archives, whose
      # members are not read here; LLD is given them as listed, and they are not counted, so a
      # C library that grows does not make the list look stale.
      else print rank[name], name
    }
    printf "listed %d found %d\n", judged, found > stats
  }' | sort -n -s -k1,1 | cut -d' ' -f2 >"$order"
cc "$@" -fuse-ld=lld -B"$gcc_ld" -Wl,--symbol-ordering-file="$order" -Wl,--no-warn-symbol-ordering
