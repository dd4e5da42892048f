#!/usr/bin/env bash
# Builds (once) and prints the path of csi-sanity, the CSI conformance suite, from the Go module
# proxy into the cache outside the clone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
cached_go_tool csi-sanity "${CSI_SANITY_VERSION:-v5.4.0}" github.com/kubernetes-csi/csi-test/v5 \
  github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity "about 15 s"
