#!/usr/bin/env bash
# Builds (once) and prints the directory holding etcd, kube-apiserver, kube-controller-manager and
# kubectl. KUBEBUILDER_ASSETS, when set, wins and nothing is built.
#
#   hack/control-plane.sh        # prints the assets directory, building what is missing
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  for b in etcd kube-apiserver; do
    [ -x "$KUBEBUILDER_ASSETS/$b" ] || { log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no $b"; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

command -v go >/dev/null || { log "Go is needed to build the test control plane (https://go.dev/dl)"; exit 1; }

mkdir -p "$CSI_ADDONS_CACHE"
# One build at a time: several test binaries may ask for the binaries at once.
exec 9>"$CSI_ADDONS_CACHE/.control-plane.lock"
flock 9

etcd_dir="$CSI_ADDONS_CACHE/etcd-$ETCD_VERSION"
kube_dir="$CSI_ADDONS_CACHE/kubernetes-$KUBERNETES_VERSION"
assets="$CSI_ADDONS_CACHE/assets-kubernetes-$KUBERNETES_VERSION-etcd-$ETCD_VERSION"

if [ ! -x "$etcd_dir/v3" ]; then
  log "building etcd $ETCD_VERSION into $etcd_dir (about a minute, once)"
  GO_MOD_EDITS=()
  go_wrapper_build "$etcd_dir" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "-s -w" go.etcd.io/etcd/server/v3
fi

if [ ! -x "$kube_dir/kube-apiserver" ] || [ ! -x "$kube_dir/kube-controller-manager" ] || [ ! -x "$kube_dir/kubectl" ]; then
  log "building Kubernetes $KUBERNETES_VERSION into $kube_dir (about 8 minutes on 2 cores, once)"
  kubernetes_build "$kube_dir" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
fi

mkdir -p "$assets"
ln -sf "$etcd_dir/v3" "$assets/etcd"
for b in kube-apiserver kube-controller-manager kubectl; do ln -sf "$kube_dir/$b" "$assets/$b"; done
echo "$assets"
