#!/usr/bin/env bash
# Builds the product's images from build/*.Dockerfile and the two bundle.Dockerfiles and pushes them, with the Kubernetes CSI sidecars
# built here, to the one-node cluster's registry:
#   hack/images.sh SHIP_DIR TAG
#   hack/images.sh --next-bundle DIR TAG NEXT_TAG
# The second form pushes the bundle made in DIR (`make bundle VERSION=… BUNDLE_OUT=DIR`) as NEXT_TAG,
# and the manager and sidecar images of TAG again as NEXT_TAG: the next version, from the same tree.
# SHIP_DIR holds the binaries of `make ship-binaries`. The Dockerfiles' final stages are built as
# users get them; their binaries come from an image holding SHIP_DIR's files in /out (BINARIES), and
# the driver's root filesystem from debootstrap (BASE, hack/driver-base.sh): Docker Hub is out of
# reach here. Builds with buildah (no daemon), its storage in the cache outside the clone with the vfs
# driver, so it leaves no mounts behind. Pushing happens inside the cluster's network namespace, to
# its registry, under the names the shipped manifests use (ghcr.io/csi-addons-rs/…,
# registry.k8s.io/sig-storage/…), which the cluster's containerd mirrors from it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
mode=all
if [ "${1:-}" = --next-bundle ]; then mode=next; shift; fi
NETNS="${CLUSTER_NETNS:-csi-addons-cluster}"
REGISTRY=$CLUSTER_REGISTRY
[ -e "/run/netns/$NETNS" ] || { log "no cluster is running (make cluster-up first)"; exit 1; }
"$here/packages.sh"
store="$CSI_ADDONS_CACHE/buildah"
bh() { buildah --storage-driver vfs --root "$store/storage" --runroot "$store/run" "$@"; }
# push IMAGE NAME: the local IMAGE to the registry as NAME (a whole name, such as ghcr.io/x/y:tag).
push() { nsenter --net="/run/netns/$NETNS" -- buildah --storage-driver vfs --root "$store/storage" --runroot "$store/run" \
  push --quiet --tls-verify=false "$1" "docker://$REGISTRY/$2" >/dev/null; }

# image_of NAME FILE...: an image of FILEs in /out (the Dockerfiles' BINARIES).
image_of() {
  local name=$1 c; shift
  c=$(bh from --quiet scratch)
  bh copy --quiet "$c" "$@" /out/ >/dev/null
  bh commit --quiet --rm "$c" "$name" >/dev/null
}

# bundle_image DIR TAG [NAME]: the bundle.Dockerfile of DIR (manifests and metadata on scratch), pushed
# as NAME (default csi-addons-bundle).
bundle_image() {
  local name=${3:-csi-addons-bundle}
  bh bud --quiet --layers=false -f "$1/bundle.Dockerfile" -t "localhost/$name:$2" "$1" >/dev/null
  push "localhost/$name:$2" "ghcr.io/csi-addons-rs/$name:$2"
}

if [ "$mode" = next ]; then
  dir=$1 tag=$2 next=$3
  bundle_image "$dir" "$next"
  for name in csi-addons-manager csi-addons-sidecar; do
    bh tag "localhost/$name:$tag" "localhost/$name:$next"
    push "localhost/$name:$next" "ghcr.io/csi-addons-rs/$name:$next"
  done
  log "images in $REGISTRY: ghcr.io/csi-addons-rs/{csi-addons-bundle,csi-addons-manager,csi-addons-sidecar}:$next"
  exit 0
fi
ship_dir=$1 tag=$2
log "building the images from build/*.Dockerfile with buildah"
image_of localhost/csi-addons-binaries:"$tag" "$ship_dir"/{csi-addons-manager,csi-addons-sidecar,csi-addons,reference-driver,csi-node-registrar,reference-driver-operator}
base=$("$here/driver-base.sh")
if ! bh inspect --type image localhost/reference-driver-base:bookworm >/dev/null 2>&1; then
  c=$(bh from --quiet scratch)
  bh add --quiet "$c" "$base" / >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  bh commit --quiet --rm "$c" localhost/reference-driver-base:bookworm >/dev/null
fi
for image in manager:csi-addons-manager sidecar:csi-addons-sidecar driver:reference-driver driver-operator:reference-driver-operator; do
  bh bud --quiet --layers=false --build-arg BINARIES=localhost/csi-addons-binaries:"$tag" \
    --build-arg BASE=localhost/reference-driver-base:bookworm \
    -f "build/${image%%:*}.Dockerfile" -t "localhost/${image#*:}:$tag" . >/dev/null
  push "localhost/${image#*:}:$tag" "ghcr.io/csi-addons-rs/${image#*:}:$tag"
done

bundle_image . "$tag"
bundle_image driver-operator "$tag" reference-driver-operator-bundle

# The Kubernetes CSI sidecars: one static binary each on scratch, run as root as their own images
# are (the driver's socket is root's).
sidecars=$("$here/csi-sidecars.sh")
for name in csi-provisioner csi-attacher csi-resizer; do
  version=$(basename "$(dirname "$(readlink -f "$sidecars/$name")")"); version=${version#"$name-"}
  c=$(bh from --quiet scratch)
  bh copy --quiet "$c" "$(readlink -f "$sidecars/$name")" "/$name" >/dev/null
  bh config --entrypoint "[\"/$name\"]" "$c"
  bh commit --quiet --rm "$c" "localhost/$name:$version" >/dev/null
  push "localhost/$name:$version" "registry.k8s.io/sig-storage/$name:$version"
done
log "images in $REGISTRY: ghcr.io/csi-addons-rs/{csi-addons-manager,csi-addons-sidecar,reference-driver,reference-driver-operator,csi-addons-bundle,reference-driver-operator-bundle}:$tag; registry.k8s.io/sig-storage/{csi-provisioner,csi-attacher,csi-resizer}"
