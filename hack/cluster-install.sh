#!/usr/bin/env bash
# Installs the product into the running one-node cluster (hack/cluster.sh), with the images of
# hack/images.sh from the cluster's registry:
#   hack/cluster-install.sh controller TAG   # deploy/controller/ into csi-addons-system (Pod Security: restricted)
#   hack/cluster-install.sh driver TAG       # deploy/reference-driver/ with the sidecars at their shipped defaults
# The shipped YAMLs are applied as users get them; only the image references change, to the registry
# at 127.0.0.1:5000 (ghcr.io/csi-addons-rs/… and registry.k8s.io/sig-storage/…).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
what=$1 tag=$2
REGISTRY=127.0.0.1:5000
kubectl() { "$here/cluster.sh" exec kubectl "$@"; }
local_images() {
  sed -e "s#ghcr.io/csi-addons-rs/\([a-z-]*\):[a-z0-9.]*#$REGISTRY/\1:$tag#g" \
      -e "s#registry.k8s.io/sig-storage/#$REGISTRY/#g"
}
case "$what" in
  controller)
    # In the README's order: the CRDs, the Namespace with the RBAC, then the Deployment.
    kubectl apply --server-side -f "$root/deploy/controller/crds.yaml" -f "$root/deploy/controller/rbac.yaml" >/dev/null
    local_images <"$root/deploy/controller/setup-controller.yaml" | kubectl apply --server-side -f - >/dev/null
    kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
    kubectl -n csi-addons-system rollout status deployment/csi-addons-controller-manager --timeout=180s >&2
    ;;
  driver)
    "$(KUSTOMIZE_QUIET=1 "$here/kustomize.sh")" build "$root/deploy/reference-driver" | local_images \
      | kubectl apply --server-side -f - >/dev/null
    kubectl -n csi-addons-reference rollout status daemonset/reference-driver-node --timeout=180s >&2
    kubectl -n csi-addons-reference rollout status statefulset/reference-driver-controller --timeout=180s >&2
    ;;
  *) log "usage: hack/cluster-install.sh controller|driver TAG"; exit 2 ;;
esac
