#!/usr/bin/env bash
# Fetches (once) the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs from the Go module
# proxy into the cache outside the clone, for server-side dry-runs of config/prometheus, and prints
# the directory that holds them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
command -v go >/dev/null || { log "Go is needed to fetch the Prometheus Operator CRDs"; exit 1; }
mkdir -p "$CSI_ADDONS_CACHE"
exec 9>"$CSI_ADDONS_CACHE/.prometheus-crds.lock"
flock 9
dir="$CSI_ADDONS_CACHE/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
if [ ! -s "$dir/monitoring.coreos.com_prometheusrules.yaml" ]; then
  log "fetching the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRDs into $dir (once)"
  source_dir=$(go_module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
  mkdir -p "$dir.partial"
  for kind in servicemonitors prometheusrules; do
    cp "$source_dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$dir.partial/"
  done
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
fi
echo "$dir"
