#!/usr/bin/env bash
# Prints the directory of upstream's generated CRDs (config/crd/bases of kubernetes-csi-addons at the
# commit whose protocol we speak), fetched through the Go module proxy into the Go module cache.
# The parity test compares our CRDs with them field by field; nothing of them is committed here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
UPSTREAM="${UPSTREAM_MODULE:-github.com/csi-addons/kubernetes-csi-addons@v0.14.1-0.20260528060322-2ed0ef956bd4}"
command -v go >/dev/null || { log "Go is needed to fetch upstream's CRDs"; exit 1; }
dir=$(go_module_dir "$UPSTREAM")
[ -d "$dir/config/crd/bases" ] || { log "no config/crd/bases in $UPSTREAM"; exit 1; }
echo "$dir/config/crd/bases"
