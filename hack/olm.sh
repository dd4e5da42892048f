#!/usr/bin/env bash
# Operator Lifecycle Manager in the one-node cluster (hack/cluster.sh), built here from the Go module
# proxy (once, into the cache outside the clone):
#   hack/olm.sh up       # push the images, install OLM, wait until its package server answers
#   hack/olm.sh images   # only build and push the images
#
# Images, each pushed to the cluster's registry under the name users pull it by (containerd mirrors
# quay.io, docker.io, ghcr.io and registry.k8s.io from that registry):
#   quay.io/operator-framework/olm:v0.33.0  olm, catalog, package-server, copy-content, cpb; busybox's
#                                           `cp` at /bin/cp, which the bundle unpack Jobs call
#   quay.io/operator-framework/opm:v1.55.0  opm, grpc_health_probe (the catalog Pods' probes) and
#                                           busybox's shell; labelled as a file-based catalog image, as
#                                           the upstream opm image is, so it serves as an index image
#   quay.io/operator-framework/scorecard-test:v1.42.2  scorecard's test binary (hack/operator-sdk.sh),
#                                           the image the shipped scorecard config names
#   scorecard-untar:busybox                 busybox's tar, no entrypoint: scorecard's untar init
#                                           container (`--untar-image`; its default is pinned by digest)
#   registry.access.redhat.com/ubi9/ubi:9.7 a stand-in of busybox's shell, cat and gzip: all that the
#                                           init container of `operator-sdk run bundle`'s catalog Pod
#                                           runs from the image it names by default (UBI is out of reach)
# The install is rendered from the Helm chart in OLM's module (see manifests below).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=image-root.sh
. "$here/image-root.sh"

OLM_VERSION="${OLM_VERSION:-v0.33.0}"
GRPC_HEALTH_PROBE_VERSION="${GRPC_HEALTH_PROBE_VERSION:-v0.4.62}"
OLM_MODULE=github.com/operator-framework/operator-lifecycle-manager
kubectl() { "$here/cluster.sh" exec kubectl "$@"; }
crane() { "$here/cluster.sh" exec crane "$@"; }

# olm_binaries: OLM's five commands, built with OLM's own go.mod `replace` lines (it builds with no
# others); prints their directory.
olm_binaries() {
  local dir="$CSI_ADDONS_CACHE/olm-$OLM_VERSION" m=$OLM_MODULE
  mkdir -p "$CSI_ADDONS_CACHE"
  exec 8>"$CSI_ADDONS_CACHE/.olm.lock"
  flock 8
  if [ ! -x "$dir/cpb" ]; then
    log "building OLM $OLM_VERSION into $dir (about 5 min, once)"
    mapfile -t GO_MOD_EDITS < <(module_replaces "$m@$OLM_VERSION")
    go_wrapper_build "$dir" "$m@$OLM_VERSION" "-s -w -X $m/pkg/version.OLMVersion=${OLM_VERSION#v}" \
      "$m/cmd/olm" "$m/cmd/catalog" "$m/cmd/package-server" "$m/cmd/copy-content" "$m/util/cpb"
  fi
  echo "$dir"
}

images() {
  local olm opm probe root
  olm=$(olm_binaries)
  opm=$(opm_tool)
  probe=$(cached_go_tool grpc_health_probe "$GRPC_HEALTH_PROBE_VERSION" \
    github.com/grpc-ecosystem/grpc-health-probe github.com/grpc-ecosystem/grpc-health-probe "about 30 s")
  root=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" RETURN
  busybox_into "$root/olm" cp
  cp "$olm"/{olm,catalog,package-server,copy-content,cpb} "$root/olm/bin/"
  push_root "quay.io/operator-framework/olm:$OLM_VERSION" "$root/olm" 1001 /bin/olm ""
  busybox_into "$root/opm" sh cat gzip mkdir ls
  cp "$opm" "$probe" "$root/opm/bin/"
  mkdir -p "$root/opm/configs" "$root/opm/tmp"
  chmod 1777 "$root/opm/tmp"
  push_root "quay.io/operator-framework/opm:$OPM_VERSION" "$root/opm" 1001 /bin/opm "serve,/configs,--cache-dir=/tmp/cache" \
    operators.operatorframework.io.index.configs.v1=/configs
  local sdk; sdk=$("$here/operator-sdk.sh")
  mkdir -p "$root/scorecard/bin"
  cp "$sdk/scorecard-test" "$root/scorecard/bin/"
  push_root "quay.io/operator-framework/scorecard-test:v1.42.2" "$root/scorecard" 1001 /bin/scorecard-test ""
  busybox_into "$root/untar" tar gzip
  push_root "scorecard-untar:busybox" "$root/untar" 1001 "" ""
  busybox_into "$root/decompress" sh cat gzip
  push_root "registry.access.redhat.com/ubi9/ubi:9.7" "$root/decompress" 0 /bin/sh ""
  log "images in $CLUSTER_REGISTRY: quay.io/operator-framework/olm:$OLM_VERSION, quay.io/operator-framework/opm:$OPM_VERSION, registry.access.redhat.com/ubi9/ubi:9.7 (a stand-in)"
}

# OLM's manifests, rendered from the Helm chart its module ships (its deploy/upstream/quickstart is
# older than v0.33.0: no OLMConfig CRD, single-dash flags its commands refuse), with this build's
# images, bundle unpacking by this opm, one package server, and no OperatorHub.io catalog (out of reach).
manifests() {
  local chart; chart=$(go_module_dir "$OLM_MODULE@$OLM_VERSION")/deploy/chart
  local image=quay.io/operator-framework/olm:$OLM_VERSION opm=quay.io/operator-framework/opm:$OPM_VERSION
  "$("$here/helm.sh")" template olm "$chart" --set installType=none \
    --set namespace=olm,catalog_namespace=olm,operator_namespace=operators,package.replicaCount=1 \
    --set "olm.image.ref=$image,catalog.image.ref=$image,package.image.ref=$image" \
    --set "catalog.commandArgs=--configmapServerImage=$opm,catalog.opmImageArgs=--opmImage=$opm"
}

up() {
  images
  local chart; chart=$(go_module_dir "$OLM_MODULE@$OLM_VERSION")/deploy/chart
  kubectl apply --server-side -f "$chart/crds" >/dev/null
  kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
  manifests | kubectl apply --server-side -f - >/dev/null
  kubectl -n olm rollout status deployment/olm-operator --timeout=180s >&2
  kubectl -n olm rollout status deployment/catalog-operator --timeout=180s >&2
  # The package server is installed by OLM itself, from its CSV, and served through the aggregator.
  local i
  for i in $(seq 120); do
    [ "$(kubectl -n olm get csv packageserver -o 'jsonpath={.status.phase}' 2>/dev/null)" = Succeeded ] && break
    sleep 2
  done
  kubectl -n olm wait --for=jsonpath='{.status.phase}'=Succeeded csv/packageserver --timeout=10s >/dev/null
  kubectl wait --for=condition=Available apiservice/v1.packages.operators.coreos.com --timeout=120s >/dev/null
  kubectl get packagemanifests -A >/dev/null
  log "OLM $OLM_VERSION up: olm-operator, catalog-operator, packageserver (CSV Succeeded, APIService Available)"
}

case "${1:-}" in
  up) up ;;
  images) images ;;
  manifests) manifests ;;
  *) log "usage: hack/olm.sh up|images|manifests"; exit 2 ;;
esac
