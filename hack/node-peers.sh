#!/usr/bin/env bash
# Builds (once, cached outside the clone) what a one-node cluster needs beside the control plane, and
# prints a directory holding every binary:
#   kubelet, kube-scheduler, kube-proxy            k8s.io/kubernetes (KUBERNETES_VERSION)
#   containerd, ctr, containerd-shim-runc-v2       github.com/containerd/containerd/v2
#   runc                                           github.com/opencontainers/runc, with seccomp
#   bridge, host-local, loopback, portmap          github.com/containernetworking/plugins
#   registry                                       github.com/distribution/distribution/v3
#   crane                                          github.com/google/go-containerregistry
#   coredns                                        github.com/coredns/coredns
#   pause                                          a static C pause(), the Pods' sandbox process
# All are test peers: the cluster the suites install the product into. Nothing here ships.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.1.4}"
RUNC_VERSION="${RUNC_VERSION:-v1.3.0}"
CNI_PLUGINS_VERSION="${CNI_PLUGINS_VERSION:-v1.7.1}"
REGISTRY_VERSION="${REGISTRY_VERSION:-v3.0.0}"
CRANE_VERSION="${CRANE_VERSION:-v0.20.6}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"

command -v go >/dev/null || { log "Go is needed to build the cluster's node (https://go.dev/dl)"; exit 1; }
mkdir -p "$CSI_ADDONS_CACHE"
exec 9>"$CSI_ADDONS_CACHE/.node-peers.lock"
flock 9

# built DIR NAME... : true when every NAME is an executable in DIR.
built() {
  local dir=$1; shift
  for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

kube_dir="$CSI_ADDONS_CACHE/kubernetes-node-$KUBERNETES_VERSION"
if ! built "$kube_dir" kubelet kube-scheduler kube-proxy; then
  log "building kubelet, kube-scheduler, kube-proxy $KUBERNETES_VERSION into $kube_dir (about 5 min, once)"
  kubernetes_build "$kube_dir" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
fi

containerd_dir="$CSI_ADDONS_CACHE/containerd-$CONTAINERD_VERSION"
if ! built "$containerd_dir" containerd ctr containerd-shim-runc-v2; then
  log "building containerd $CONTAINERD_VERSION into $containerd_dir (about 2 min, once)"
  GO_MOD_EDITS=()
  # No btrfs headers here; the cluster uses the overlayfs snapshotter.
  GO_BUILD_TAGS="no_btrfs" go_wrapper_build "$containerd_dir" "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" \
    "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
fi

runc_dir="$CSI_ADDONS_CACHE/runc-$RUNC_VERSION"
if ! built "$runc_dir" runc; then
  # Without seccomp support every sandbox fails ("config provided but seccomp not supported"): runc
  # links libseccomp, statically so the binary runs wherever the cache is.
  # `make cluster-up` on a new machine comes here before .ci/run's package step would have run.
  [ -f /usr/include/seccomp.h ] || "$here/packages.sh" libseccomp-dev
  log "building runc $RUNC_VERSION with seccomp into $runc_dir (about 30 s, once)"
  GO_MOD_EDITS=()
  GO_CGO=1 GO_BUILD_TAGS="seccomp" go_wrapper_build "$runc_dir" "github.com/opencontainers/runc@$RUNC_VERSION" \
    "-s -w -X main.version=${RUNC_VERSION#v} -extldflags -static" github.com/opencontainers/runc
fi

cni_dir="$CSI_ADDONS_CACHE/cni-plugins-$CNI_PLUGINS_VERSION"
if ! built "$cni_dir" bridge host-local loopback portmap; then
  log "building the CNI plugins $CNI_PLUGINS_VERSION into $cni_dir (about 30 s, once)"
  GO_MOD_EDITS=()
  go_wrapper_build "$cni_dir" "github.com/containernetworking/plugins@$CNI_PLUGINS_VERSION" "-s -w" \
    github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/meta/portmap
fi

registry=$(cached_go_tool registry "$REGISTRY_VERSION" github.com/distribution/distribution/v3 \
  github.com/distribution/distribution/v3/cmd/registry "about 2 min")
crane=$(cached_go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry \
  github.com/google/go-containerregistry/cmd/crane "about 20 s")
coredns=$(cached_go_tool coredns "$COREDNS_VERSION" github.com/coredns/coredns github.com/coredns/coredns "about 3 min")

pause_dir="$CSI_ADDONS_CACHE/pause-1"
if [ ! -x "$pause_dir/pause" ]; then
  # The sandbox process of every Pod: it only waits for a signal. Static, so it runs on an empty root.
  mkdir -p "$pause_dir"
  printf '%s\n' '#include <signal.h>' '#include <unistd.h>' '#include <stdlib.h>' \
    'static void quit(int s) { (void)s; exit(0); }' \
    'int main(void) { signal(SIGINT, quit); signal(SIGTERM, quit); for (;;) pause(); }' > "$pause_dir/pause.c"
  cc -Os -static -o "$pause_dir/pause" "$pause_dir/pause.c"
fi

node="$CSI_ADDONS_CACHE/node-kubernetes-$KUBERNETES_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-cni-$CNI_PLUGINS_VERSION"
mkdir -p "$node"
for b in kubelet kube-scheduler kube-proxy; do ln -sf "$kube_dir/$b" "$node/$b"; done
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "$containerd_dir/$b" "$node/$b"; done
ln -sf "$runc_dir/runc" "$node/runc"
for b in bridge host-local loopback portmap; do ln -sf "$cni_dir/$b" "$node/$b"; done
ln -sf "$registry" "$node/registry"
ln -sf "$crane" "$node/crane"
ln -sf "$coredns" "$node/coredns"
ln -sf "$pause_dir/pause" "$node/pause"
echo "$node"
