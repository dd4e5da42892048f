#!/usr/bin/env bash
# Builds (once) and prints the path of csi-provisioner, which provisions the demo's and the
# end-to-end suite's PVCs through the reference driver, from the Go module proxy into the cache
# outside the clone. v6.3.0 is pinned: v6.4.0 needs sig-storage-lib-external-provisioner v13.1.0,
# which the proxy does not serve.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
cached_go_tool csi-provisioner "${CSI_PROVISIONER_VERSION:-v6.3.0}" github.com/kubernetes-csi/external-provisioner/v6 \
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner "about 3 min"
