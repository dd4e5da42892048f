#!/usr/bin/env bash
# Builds (once) upstream's v0.14.0 manager, sidecar and CLI from the Go module proxy into the cache
# outside the clone, for interop tests and side-by-side benchmarks (never shipped), and prints the
# path of the one named: upstream-binaries.sh [manager|sidecar|csi-addons] (default: the directory);
# `upstream-binaries.sh rbac` prints the path of upstream's deploy/controller/rbac.yaml.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
UPSTREAM_VERSION="${UPSTREAM_VERSION:-v0.14.0}"
command -v go >/dev/null || { log "Go is needed to build upstream's binaries"; exit 1; }
if [ "${1:-}" = rbac ]; then
  # The manager's RBAC as upstream's users install it (deploy/controller/rbac.yaml), from the module
  # in the Go module cache: the benchmarks bind upstream's manager to it.
  module=$(go_module_dir "github.com/csi-addons/kubernetes-csi-addons@$UPSTREAM_VERSION")
  [ -f "$module/deploy/controller/rbac.yaml" ] || { log "no deploy/controller/rbac.yaml in upstream $UPSTREAM_VERSION"; exit 1; }
  echo "$module/deploy/controller/rbac.yaml"
  exit 0
fi
mkdir -p "$CSI_ADDONS_CACHE"
exec 9>"$CSI_ADDONS_CACHE/.upstream-csi-addons.lock"
flock 9
dir="$CSI_ADDONS_CACHE/upstream-csi-addons-$UPSTREAM_VERSION"
if [ ! -x "$dir/sidecar" ] || [ ! -x "$dir/manager" ] || [ ! -x "$dir/csi-addons" ]; then
  log "building upstream csi-addons $UPSTREAM_VERSION into $dir (about 2 min, once)"
  GO_MOD_EDITS=()
  go_wrapper_build "$dir" "github.com/csi-addons/kubernetes-csi-addons@$UPSTREAM_VERSION" "-s -w" \
    github.com/csi-addons/kubernetes-csi-addons/cmd/manager \
    github.com/csi-addons/kubernetes-csi-addons/sidecar \
    github.com/csi-addons/kubernetes-csi-addons/cmd/csi-addons
fi
case "${1:-}" in
  "") echo "$dir" ;;
  manager | sidecar | csi-addons) echo "$dir/$1" ;;
  *) log "unknown binary $1 (manager, sidecar, csi-addons)"; exit 2 ;;
esac
