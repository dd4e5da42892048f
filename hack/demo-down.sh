#!/usr/bin/env bash
# `make demo-down`: stops a running (or interrupted) demo and everything it started, detaches the
# mounts it left under its directory and removes it. Safe to run when no demo runs.
set -euo pipefail
state="${DEMO_DIR:-/tmp/csi-addons-demo}"
pidfile="$state.pid"
quiet=${1:-}
say() { [ "$quiet" = --quiet ] || echo "$@"; }

if [ -f "$pidfile" ]; then
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping the demo (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    # Its children die with it (they are spawned with a parent-death signal).
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
fi
# Mounts an interrupted run left behind (loop-backed volumes, the kubelet paths), deepest first.
awk -v dir="$state" '$5 == dir || index($5, dir "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
  while read -r point; do umount -l "$point" 2>/dev/null || true; done
# Loop devices still holding a volume file of the demo (a lazily detached mount can keep one).
if command -v losetup >/dev/null; then
  losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v dir="$state" 'index($2, dir "/") == 1 { print $1 }' |
    while read -r device; do losetup -d "$device" 2>/dev/null || true; done
fi
rm -rf "$state"
say "demo stopped"
