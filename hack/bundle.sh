#!/usr/bin/env bash
# Renders the OLM bundle (bundle/ and bundle.Dockerfile) from config/manifests into OUT (default: the
# repository), as upstream does: kustomize's output piped to `operator-sdk generate bundle`. Then pins
# what operator-sdk would otherwise date or leave as placeholders: createdAt (BUNDLE_CREATED_AT, the
# release date the Makefile fixes, so regenerating gives no diff) and the image tags (IMAGE_TAG).
# REPLACES, when set, names the CSV this bundle replaces (the previous release's, for OLM's upgrades).
# The same makes the driver operator's bundle: PACKAGE=reference-driver-operator with SOURCE (the
# directory holding PROJECT and config/manifests, default the repository), RELATED_IMAGES
# ("name=image ..."; default the manager's and the sidecar's) and DEPENDS ("package:range", written
# to metadata/dependencies.yaml, so OLM installs that package too).
# Usage: BUNDLE_CREATED_AT=… IMAGE_TAG=… VERSION=… [REPLACES=csi-addons.vX.Y.Z] hack/bundle.sh [OUT]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
: "${BUNDLE_CREATED_AT:?set BUNDLE_CREATED_AT (yyyy-mm-ddThh:mm:ssZ)}" "${IMAGE_TAG:?}" "${VERSION:?}"
PACKAGE=${PACKAGE:-csi-addons}
SOURCE=$(realpath "${SOURCE:-$root}")
out=$(realpath "${1:-$SOURCE}")
RELATED_IMAGES=${RELATED_IMAGES:-"csi-addons-manager=ghcr.io/csi-addons-rs/csi-addons-manager:$IMAGE_TAG csi-addons-sidecar=ghcr.io/csi-addons-rs/csi-addons-sidecar:$IMAGE_TAG"}
kustomize=$("$here/kustomize.sh")
operator_sdk="$("$here/operator-sdk.sh")/operator-sdk"

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
# operator-sdk reads ./PROJECT and writes ./bundle and ./bundle.Dockerfile: run it in a scratch directory.
cp "$SOURCE/PROJECT" "$work/"
"$kustomize" build "$SOURCE/config/manifests" >"$work/input.yaml"
# It takes manifests from stdin only when stdin is a pipe.
(cd "$work" && cat input.yaml | "$operator_sdk" generate bundle -q --overwrite --package "$PACKAGE" \
  --version "$VERSION" --channels stable --default-channel stable)

csv="$work/bundle/manifests/$PACKAGE.clusterserviceversion.yaml"
sed -i -e "s|^\(    createdAt: \).*|\1\"$BUNDLE_CREATED_AT\"|" \
  -e "s|\(ghcr.io/csi-addons-rs/[a-z-]*\):v[0-9][0-9a-z.-]*|\1:$IMAGE_TAG|" "$csv"
# operator-sdk fills relatedImages only from RELATED_IMAGE_* variables of the Deployment, which our
# operators do not use: list the images they run (for disconnected installs).
related="  relatedImages:"
for entry in $RELATED_IMAGES; do
  related="$related
  - image: ${entry#*=}
    name: ${entry%%=*}"
done
awk -v related="$related" '/^  version: / { print related } { print }' "$csv" >"$csv.new" && mv "$csv.new" "$csv"
if [ -n "${REPLACES:-}" ]; then
  sed -i "/^  version: /i\\
  replaces: $REPLACES" "$csv"
fi
if grep -q 'v0\.0\.0' "$csv"; then
  echo "hack/bundle.sh: a v0.0.0 placeholder is left in the CSV" >&2
  exit 1
fi

if [ -n "${DEPENDS:-}" ]; then
  cat >"$work/bundle/metadata/dependencies.yaml" <<EOF
dependencies:
- type: olm.package
  value:
    packageName: ${DEPENDS%%:*}
    version: "${DEPENDS#*:}"
EOF
fi

mkdir -p "$out/bundle"
rm -rf "$out/bundle/manifests" "$out/bundle/metadata" "$out/bundle/tests"
cp -r "$work/bundle/manifests" "$work/bundle/metadata" "$out/bundle/"
if [ -d "$work/bundle/tests" ]; then cp -r "$work/bundle/tests" "$out/bundle/"; fi
cp "$work/bundle.Dockerfile" "$out/bundle.Dockerfile"
