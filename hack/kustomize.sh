#!/usr/bin/env bash
# Builds (once) and prints the path of kustomize, for rendering config/, from the Go module proxy
# into the cache outside the clone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
cached_go_tool kustomize "${KUSTOMIZE_VERSION:-v5.7.1}" sigs.k8s.io/kustomize/kustomize/v5 \
  sigs.k8s.io/kustomize/kustomize/v5 "about 20 s"
