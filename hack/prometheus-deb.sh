#!/usr/bin/env bash
# Debian's Prometheus 2.42 (server and promtool), unpacked from its .deb into the cache outside the
# clone without installing it (installing would start a server on the host's interfaces); prints the
# directory holding `prometheus` and `promtool` (dynamically linked against the host's glibc).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
version="${PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}"
dir="$CSI_ADDONS_CACHE/prometheus-deb-$version"
mkdir -p "$CSI_ADDONS_CACHE"
exec 9>"$CSI_ADDONS_CACHE/.prometheus-deb.lock"
flock 9
if [ ! -x "$dir/promtool" ]; then
  log "unpacking Debian's prometheus $version into $dir (once)"
  work=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-prometheus.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  (cd "$work" && apt-get download -q "prometheus=$version" >&2 2>/dev/null) || {
    apt-get update -qq >&2
    (cd "$work" && apt-get download -q "prometheus=$version" >&2)
  }
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  mkdir -p "$dir.partial"
  cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$dir.partial/"
  rm -rf "$dir"; mv "$dir.partial" "$dir"
fi
echo "$dir"
