#!/usr/bin/env bash
# Builds (once, into the cache outside the clone) the Kubernetes CSI sidecars the reference driver's
# manifests run, at versions the Go module proxy serves, and prints a directory holding them:
#   csi-provisioner v6.3.0   (hack/csi-provisioner.sh; v6.4.0 needs a library the proxy lacks)
#   csi-attacher    v4.13.0  (built with its go.mod's replace lines, as its own build is)
#   csi-resizer     v2.3.0
# node-driver-registrar is served at no version; the driver image's csi-node-registrar (Rust, the
# kubelet's plugin registration API) takes its place.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
provisioner=$("$here/csi-provisioner.sh")
attacher=$(GO_TOOL_REPLACES=1 cached_go_tool csi-attacher "${CSI_ATTACHER_VERSION:-v4.13.0}" \
  github.com/kubernetes-csi/external-attacher/v4 github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher "about 2 min")
resizer=$(cached_go_tool csi-resizer "${CSI_RESIZER_VERSION:-v2.3.0}" \
  github.com/kubernetes-csi/external-resizer/v2 github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer "about 2 min")
dir="$CSI_ADDONS_CACHE/csi-sidecars"
mkdir -p "$dir"
ln -sfn "$provisioner" "$dir/csi-provisioner"
ln -sfn "$attacher" "$dir/csi-attacher"
ln -sfn "$resizer" "$dir/csi-resizer"
echo "$dir"
