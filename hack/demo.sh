#!/usr/bin/env bash
# `make demo`: runs csi-addons-demo in the background (its own session, so it outlives make and
# keeps the cluster up), shows its output as it goes, and returns when the story is told: 0 with
# the cluster left running, or the demo's exit status when it failed or DEMO_KEEP=0 stopped it.
# Ctrl-C stops the demo and everything it started. A previous run is stopped first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
state="${DEMO_DIR:-/tmp/csi-addons-demo}"
pidfile="$state.pid" log="$state.log"
"$here/demo-down.sh" --quiet

: >"$log"
DEMO_DIR="$state" setsid "$root/target/debug/csi-addons-demo" >"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"
# shellcheck disable=SC2064
trap "echo; echo 'demo: interrupted; stopping it'; '$here/demo-down.sh' --quiet; exit 130" INT TERM

shown=0
show_new_lines() {
  local total
  total=$(wc -l <"$log")
  if [ "$total" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${total}p" "$log"
    shown=$total
  fi
}
while :; do
  show_new_lines
  if grep -qx 'demo: ready' "$log"; then
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    rc=0
    wait "$pid" || rc=$?
    show_new_lines
    rm -f "$pidfile"
    exit "$rc"
  fi
  sleep 0.3
done
