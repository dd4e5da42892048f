#!/usr/bin/env bash
# A file-based catalog (opm) of the package csi-addons with one channel, `stable`, holding the given
# versions in order (each replacing the one before), rendered from their bundle images in the one-node
# cluster's registry, validated with `opm validate`, and pushed there as a catalog image:
#   hack/catalog.sh CATALOG_TAG VERSION...    # e.g. hack/catalog.sh v0.1.1 0.1.0 0.1.1
# With DRIVER_OPERATOR_VERSION set, the package reference-driver-operator too (that one version).
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
# add_package PACKAGE BUNDLE_IMAGE VERSION...: the package with one channel, `stable`, holding the
# versions in order, each replacing the one before.
add_package() {
  local package=$1 bundles=$2 entries="" previous="" version index; shift 2
  index="$work/configs/$package/index.yaml"
  mkdir -p "$(dirname "$index")"
  "$opm" init "$package" --default-channel=stable --output=yaml >"$index"
  for version in "$@"; do
    # Rendered from the cluster's registry (its certificate is the cluster CA's), named as users pull it.
    in_cluster sh -c "SSL_CERT_FILE=\"\$CLUSTER_CA_FILE\" '$opm' render \"\$CLUSTER_REGISTRY/$bundles:v$version\" --output=yaml" \
      | sed "s#^\(\s*\(image\|- image\): \)[0-9.]*:[0-9]*/ghcr.io/#\1ghcr.io/#" >>"$index"
    entries="$entries
- name: $package.v$version${previous:+
  replaces: $package.v$previous}"
    previous=$version
  done
  cat >>"$index" <<EOF
---
schema: olm.channel
package: $package
name: stable
entries:${entries}
EOF
}
add_package "$PACKAGE" "$BUNDLES" "$@"
# The driver operator's package too, when DRIVER_OPERATOR_VERSION names its version: its bundle
# depends on csi-addons, which OLM then resolves from this same catalog.
if [ -n "${DRIVER_OPERATOR_VERSION:-}" ]; then
  add_package reference-driver-operator ghcr.io/csi-addons-rs/reference-driver-operator-bundle "$DRIVER_OPERATOR_VERSION"
fi
"$opm" validate "$work/configs"
log "catalog: package $PACKAGE, channel stable: $*${DRIVER_OPERATOR_VERSION:+; package reference-driver-operator: $DRIVER_OPERATOR_VERSION}; opm validate passed"

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
