#!/usr/bin/env bash
# Builds (once, into the cache outside the clone) every Go-built peer the core tier's suites use,
# one after another: the control plane, csi-sanity, kustomize, helm, operator-sdk, the Prometheus
# Operator's CRDs and Debian's promtool, csi-provisioner, and upstream's v0.14.0 binaries.
#
# .ci/run starts it in the background as the run begins, so on a new machine these builds (about 16
# minutes, much of it downloading modules) overlap the Rust builds instead of coming before them.
# Each script holds a lock of its own: a suite that asks for a peer still being built waits for that
# build, and a build that failed here is tried again there, where its error fails the suite.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for script in control-plane.sh csi-sanity.sh kustomize.sh helm.sh operator-sdk.sh prometheus-crds.sh \
  prometheus-deb.sh csi-provisioner.sh upstream-binaries.sh; do
  t0=$SECONDS
  "$here/$script" >/dev/null
  echo "[go-peers] $script ready in $(( SECONDS - t0 )) s" >&2
done
