#!/usr/bin/env bash
# Fetches the .proto files this project speaks from the Go module proxy into api/proto/, with each
# module's LICENSE and a VERSIONS note. The files are kept byte-for-byte as published; rerun this
# script to change a version, never edit them by hand.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

CSI_SPEC="github.com/container-storage-interface/spec@v1.12.0"
# The controller<->sidecar protocol: v0.14.0's services plus GetReplicationDestinationInfo.
INTERNAL="github.com/csi-addons/kubernetes-csi-addons@v0.14.1-0.20260528060322-2ed0ef956bd4"
# The CSI-Addons spec at the version the INTERNAL commit's go.mod pins.
ADDONS_SPEC="github.com/csi-addons/spec@v0.2.1-0.20260515055340-d4a373713b9a"
# The kubelet's plugin registration API, at the kubelet version the cluster suite runs: the
# reference driver's node registrar serves it.
KUBELET_API="k8s.io/kubelet@v0.${KUBERNETES_VERSION#v1.}"

command -v go >/dev/null || { log "Go is needed to fetch the protos"; exit 1; }
csi=$(go_module_dir "$CSI_SPEC")
internal=$(go_module_dir "$INTERNAL")
spec=$(go_module_dir "$ADDONS_SPEC")
kubelet=$(go_module_dir "$KUBELET_API")
pinned=$(sed -n 's#^\s*github.com/csi-addons/spec \(v[^ ]*\).*#\1#p' "$internal/go.mod" | head -n1)
[ "github.com/csi-addons/spec@$pinned" = "$ADDONS_SPEC" ] || {
  log "$INTERNAL pins github.com/csi-addons/spec@$pinned, this script says $ADDONS_SPEC"; exit 1; }

out="$root/api/proto"
rm -rf "$out"
# csi.proto must sit at the path the CSI-Addons files import it by.
csi_out="$out/github.com/container-storage-interface/spec/lib/go/csi"
mkdir -p "$csi_out" "$out/csi-addons" "$out/internal"
cp "$csi/csi.proto" "$csi/LICENSE" "$csi_out/"
for svc in identity reclaimspace fence replication volumegroup encryptionkeyrotation; do
  mkdir -p "$out/csi-addons/$svc"
  cp "$spec/$svc/$svc.proto" "$out/csi-addons/$svc/"
done
cp "$spec/LICENSE" "$out/csi-addons/"
cp "$internal"/internal/proto/*.proto "$out/internal/"
cp "$internal/LICENSE" "$out/internal/"
mkdir -p "$out/kubelet/pluginregistration/v1"
cp "$kubelet/pkg/apis/pluginregistration/v1/api.proto" "$out/kubelet/pluginregistration/v1/"
cp "$kubelet/LICENSE" "$out/kubelet/"
chmod -R u+w "$out"
cat > "$out/VERSIONS" <<NOTE
# Written by hack/update-protos.sh from the Go module proxy; do not edit the .proto files by hand.
github.com/container-storage-interface/spec/lib/go/csi/  $CSI_SPEC  (csi.proto from the module root)
csi-addons/                                              $ADDONS_SPEC
internal/                                                $INTERNAL  (internal/proto)
kubelet/pluginregistration/v1/                           $KUBELET_API  (pkg/apis/pluginregistration/v1)
NOTE
log "protos written to $out"
