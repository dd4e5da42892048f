#!/usr/bin/env bash
# Builds (once) and prints the path of csi-sanity, the CSI conformance suite, from the Go module
# proxy into the cache outside the clone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
CSI_SANITY_VERSION="${CSI_SANITY_VERSION:-v5.4.0}"
command -v go >/dev/null || { log "Go is needed to build csi-sanity"; exit 1; }
mkdir -p "$CSI_ADDONS_CACHE"
exec 9>"$CSI_ADDONS_CACHE/.csi-sanity.lock"
flock 9
dir="$CSI_ADDONS_CACHE/csi-sanity-$CSI_SANITY_VERSION"
if [ ! -x "$dir/csi-sanity" ]; then
  log "building csi-sanity $CSI_SANITY_VERSION into $dir (about 15 s, once)"
  GO_MOD_EDITS=()
  go_wrapper_build "$dir" "github.com/kubernetes-csi/csi-test/v5@$CSI_SANITY_VERSION" "-s -w" \
    github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
fi
echo "$dir/csi-sanity"
