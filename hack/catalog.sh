#!/usr/bin/env bash
# A file-based catalog (opm) of the package csi-addons with one channel, `stable`, holding the given
# versions in order (each replacing the one before), rendered from their bundle images in the one-node
# cluster's registry, validated with `opm validate`, and pushed there as a catalog image:
#   hack/catalog.sh CATALOG_TAG VERSION...    # e.g. hack/catalog.sh v0.1.1 0.1.0 0.1.1
# The catalog names the bundles as users pull them (ghcr.io/csi-addons-rs/csi-addons-bundle:vX.Y.Z);
# the image is ghcr.io/csi-addons-rs/csi-addons-catalog:CATALOG_TAG, the opm image of hack/olm.sh with
# the catalog in /configs (where its `opm serve` reads).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
tag=$1; shift
PACKAGE=csi-addons
BUNDLES=ghcr.io/csi-addons-rs/csi-addons-bundle
opm=$(opm_tool)
in_cluster() { "$here/cluster.sh" exec "$@"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-catalog.XXXXXX")
trap 'rm -rf "$work"' EXIT
index="$work/configs/$PACKAGE/index.yaml"
mkdir -p "$(dirname "$index")"
"$opm" init "$PACKAGE" --default-channel=stable --output=yaml >"$index"
entries="" previous=""
for version in "$@"; do
  # Rendered from the cluster's registry (its certificate is the cluster CA's), named as users pull it.
  in_cluster sh -c "SSL_CERT_FILE=\"\$CLUSTER_CA_FILE\" '$opm' render \"\$CLUSTER_REGISTRY/$BUNDLES:v$version\" --output=yaml" \
    | sed "s#^\(\s*\(image\|- image\): \)[0-9.]*:[0-9]*/ghcr.io/#\1ghcr.io/#" >>"$index"
  entries="$entries
- name: $PACKAGE.v$version${previous:+
  replaces: $PACKAGE.v$previous}"
  previous=$version
done
cat >>"$index" <<EOF
---
schema: olm.channel
package: $PACKAGE
name: stable
entries:${entries}
EOF
"$opm" validate "$work/configs"
log "catalog: package $PACKAGE, channel stable: $*; opm validate passed"

# The serving cache is built now, as `opm generate dockerfile` has it built: the image's
# `opm serve /configs --cache-dir=/tmp/cache` checks it against /configs and serves from it.
"$opm" serve "$work/configs" --cache-dir="$work/tmp/cache" --cache-only >&2 2>/dev/null
chmod -R a+rX "$work/configs" "$work/tmp"
layer="$work/layer.tar"
tar -C "$work" --owner=0 --group=0 -cf "$layer" configs tmp/cache
registry=$(in_cluster printenv CLUSTER_REGISTRY)
out=$(in_cluster crane append --insecure -b "$registry/quay.io/operator-framework/opm:$OPM_VERSION" -f "$layer" \
  -t "$registry/ghcr.io/csi-addons-rs/csi-addons-catalog:$tag" 2>&1) || { log "$out"; exit 1; }
log "image in $registry: ghcr.io/csi-addons-rs/csi-addons-catalog:$tag"
