#!/usr/bin/env bash
# The Prometheus Operator in the one-node cluster (hack/cluster.sh), the way users run it, built here
# from the Go module proxy (once, into the cache outside the clone):
#   hack/prometheus.sh up         # push the images, install the operator's CRDs, the operator and a
#                                 # Prometheus, and wait until that Prometheus is Available
#   hack/prometheus.sh images     # only build and push the images
#   hack/prometheus.sh manifests  # print what `up` installs after the CRDs
#
# Images, each pushed to the cluster's registry under the name the operator's own manifests use:
#   quay.io/prometheus-operator/prometheus-operator:v0.85.0         the operator
#   quay.io/prometheus-operator/prometheus-config-reloader:v0.85.0  the reloader it puts beside Prometheus
#   quay.io/prometheus/prometheus:v3.5.0    Prometheus 3.5.0 (module version v0.305.0, the one the
#                                           operator is built with and defaults to), built here without
#                                           its web UI's assets; Debian's 2.42 cannot be used: it is built
#                                           without Kubernetes service discovery, which ServiceMonitors need
# The operator runs in the namespace `monitoring` from the RBAC and Deployment its module ships under
# example/rbac/prometheus-operator, with the images above and no kubelet Service to manage; then
# hack/cluster/prometheus.yaml, the Prometheus it manages.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=image-root.sh
. "$here/image-root.sh"

PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v3.5.0}"
# Prometheus's Go module numbers its releases differently: v3.5.0 is v0.305.0.
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.305.0}"
PROMETHEUS_IMAGE=quay.io/prometheus/prometheus:$PROMETHEUS_VERSION
MODULE=github.com/prometheus-operator/prometheus-operator
OPERATOR_IMAGE=quay.io/prometheus-operator/prometheus-operator:$PROMETHEUS_OPERATOR_VERSION
RELOADER_IMAGE=quay.io/prometheus-operator/prometheus-config-reloader:$PROMETHEUS_OPERATOR_VERSION
kubectl() { "$here/cluster.sh" exec kubectl "$@"; }
crane() { "$here/cluster.sh" exec crane "$@"; }

# operator_binaries: the operator and its config reloader; prints their directory.
operator_binaries() {
  local dir="$CSI_ADDONS_CACHE/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  mkdir -p "$CSI_ADDONS_CACHE"
  exec 8>"$CSI_ADDONS_CACHE/.prometheus-operator.lock"
  flock 8
  if [ ! -x "$dir/prometheus-config-reloader" ]; then
    log "building the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION into $dir (about 3 min, once)"
    GO_MOD_EDITS=()
    go_wrapper_build "$dir" "$MODULE@$PROMETHEUS_OPERATOR_VERSION" \
      "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" \
      "$MODULE/cmd/operator" "$MODULE/cmd/prometheus-config-reloader"
  fi
  echo "$dir"
}

# prometheus_server: Prometheus itself, with its module's own `replace` line; prints its path.
prometheus_server() {
  GO_TOOL_REPLACES=1 cached_go_tool prometheus "$PROMETHEUS_MODULE_VERSION" github.com/prometheus/prometheus \
    github.com/prometheus/prometheus/cmd/prometheus "about 2 min" \
    "-X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v} -X github.com/prometheus/common/version.Branch=HEAD"
}

images() {
  local bin server root
  bin=$(operator_binaries)
  server=$(prometheus_server)
  root=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" RETURN
  mkdir -p "$root/operator/bin" "$root/reloader/bin" "$root/prometheus/bin"
  cp "$bin/operator" "$root/operator/bin/"
  push_root "$OPERATOR_IMAGE" "$root/operator" 65534 /bin/operator ""
  cp "$bin/prometheus-config-reloader" "$root/reloader/bin/"
  push_root "$RELOADER_IMAGE" "$root/reloader" 65534 /bin/prometheus-config-reloader ""
  cp "$server" "$root/prometheus/bin/"
  push_root "$PROMETHEUS_IMAGE" "$root/prometheus" 65534 /bin/prometheus ""
  log "images in $CLUSTER_REGISTRY: $OPERATOR_IMAGE, $RELOADER_IMAGE, $PROMETHEUS_IMAGE"
}

# The operator's manifests from its module, in `monitoring`, with its flags for this cluster; then
# the discovery RBAC of its example Prometheus and hack/cluster/prometheus.yaml.
manifests() {
  local example; example=$(go_module_dir "$MODULE@$PROMETHEUS_OPERATOR_VERSION")/example/rbac
  local file
  for file in prometheus-operator/prometheus-operator-{service-account,cluster-role,cluster-role-binding,deployment} \
    prometheus/prometheus-{service-account,cluster-role,cluster-role-binding}; do
    echo "---"
    # The example Prometheus's role also grants GET /metrics: dropped, so the scrape of the manager is
    # allowed by binding csi-addons-metrics-reader and by nothing else.
    sed -e 's/namespace: default/namespace: monitoring/' -e '/^- nonResourceURLs: \["\/metrics"\]/,+1d' \
      -e "s#image: quay.io/prometheus-operator/prometheus-operator:.*#image: $OPERATOR_IMAGE#" \
      -e "s#--prometheus-config-reloader=.*#--prometheus-config-reloader=$RELOADER_IMAGE#" \
      -e '/--kubelet-service=/d' -e '/--kubelet-endpoints=/d' -e '/--kubelet-endpointslice=/d' \
      "$example/$file.yaml"
    # The example Prometheus's ServiceAccount names no namespace.
    [ "$file" != prometheus/prometheus-service-account ] || echo "  namespace: monitoring"
  done
}

up() {
  images
  local crds; crds=$(go_module_dir "$MODULE@$PROMETHEUS_OPERATOR_VERSION")/example/prometheus-operator-crd
  kubectl apply --server-side -f "$crds" >/dev/null
  kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
  kubectl create namespace monitoring --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  manifests | kubectl apply --server-side -f - >/dev/null
  kubectl -n monitoring rollout status deployment/prometheus-operator --timeout=180s >&2
  kubectl apply --server-side -f "$here/cluster/prometheus.yaml" >/dev/null
  kubectl -n monitoring wait --for=condition=Available prometheus/cluster --timeout=180s >/dev/null
  log "Prometheus Operator $PROMETHEUS_OPERATOR_VERSION up in namespace monitoring, its Prometheus monitoring/cluster Available"
}

case "${1:-}" in
  up) up ;;
  images) images ;;
  manifests) manifests ;;
  binaries) operator_binaries ;;
  *) log "usage: hack/prometheus.sh up|images|manifests|binaries"; exit 2 ;;
esac
