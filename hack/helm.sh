#!/usr/bin/env bash
# Builds (once) and prints the path of helm, for rendering charts/csi-addons, from the Go module proxy
# into the cache outside the clone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
version="${HELM_VERSION:-v3.19.0}"
# Without the Kubernetes version ldflags (helm's own Makefile sets them) `helm template` assumes
# Kubernetes v1.20 and refuses the chart's kubeVersion; 1.34 is the client-go helm v3.19 is built with.
k8s_flags=""
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  k8s_flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=34"
done
cached_go_tool helm "$version" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "about 2 min" \
  "-X helm.sh/helm/v3/internal/version.version=$version$k8s_flags"
