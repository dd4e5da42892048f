#!/usr/bin/env bash
# Builds (once, into the cache outside the clone) every Go-built peer the core tier's suites use,
# one after another: the control plane, operator-sdk, csi-sanity, Debian's promtool, kustomize, the
# Prometheus Operator's CRDs, helm, csi-provisioner, and upstream's v0.14.0 binaries.
#
# .ci/run starts it in the background as the run begins, so on a new machine these builds (some 40
# minutes beside the Rust builds on two cores, much of it downloading modules) overlap the Rust
# builds and the suites instead of coming before them.
# Each script holds a lock of its own: a suite that asks for a peer still being built waits for that
# build, and a build that failed here is tried again there, where its error fails the suite.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# In the order `make test` reaches them: cargo runs the test binaries in name order, so `checks`
# (operator-sdk) comes before `integration`, whose tests libtest runs in name order too (driver/
# needs csi-sanity, manager/ and packaging/ the Prometheus files, kustomize and helm, stack/
# csi-provisioner); then upstream's, for the interop tier. A cold run found `checks` waiting 344 s
# for operator-sdk when it came seventh.
for script in control-plane.sh operator-sdk.sh csi-sanity.sh prometheus-deb.sh kustomize.sh prometheus-crds.sh \
  helm.sh csi-provisioner.sh upstream-binaries.sh; do
  t0=$SECONDS
  "$here/$script" >/dev/null
  echo "[go-peers] $script ready in $(( SECONDS - t0 )) s" >&2
done
