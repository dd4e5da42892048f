#!/usr/bin/env bash
# Installs the product into the running one-node cluster (hack/cluster.sh), with the images of
# hack/images.sh from the cluster's registry:
#   hack/cluster-install.sh controller   # deploy/controller/ into csi-addons-system (Pod Security: restricted)
#   hack/cluster-install.sh driver       # deploy/reference-driver/ with the sidecars at their shipped defaults
#   hack/cluster-install.sh driver-operator  # deploy/driver-operator/ (the driver comes from a ReferenceCSIDriver)
#   hack/cluster-install.sh driver-from-operator  # the operator's sample ReferenceCSIDriver, waited for
#   hack/cluster-install.sh remove-driver    # the tests' workloads (their volumes deleted by the driver), then
#                                            # deploy/reference-driver/, so the driver operator can install it
#   hack/cluster-install.sh second-driver    # tests/cluster/second-driver/: a second reference driver beside the
#                                            # first (the network-partition fault); remove-second-driver removes it
# The shipped YAMLs are applied as users get them: the cluster's containerd takes ghcr.io/csi-addons-rs/…
# and registry.k8s.io/sig-storage/… from its own registry, where hack/images.sh pushed them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
what=${1:-}
kubectl() { "$here/cluster.sh" exec kubectl "$@"; }
case "$what" in
  controller)
    # The README's own commands, word for word, from the repository root.
    while read -r line; do
      log "\$ $line"
      (cd "$root" && "$here/cluster.sh" exec sh -c "$line" </dev/null >/dev/null)
    done < <("$here/readme-commands.sh" "Plain YAML")
    kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
    kubectl -n csi-addons-system rollout status deployment/csi-addons-controller-manager --timeout=180s >&2
    ;;
  driver)
    # A certificates Job of an earlier install, finished less than its ten minutes ago, would not
    # run again, while the Secrets it made may be gone (removing a ReferenceCSIDriver deletes them):
    # the sidecars would wait for them for ever. Deleted first, the Job runs again.
    kubectl -n csi-addons-reference delete job reference-driver-certificates --ignore-not-found >/dev/null
    "$(KUSTOMIZE_QUIET=1 "$here/kustomize.sh")" build "$root/deploy/reference-driver" | kubectl apply --server-side -f - >/dev/null
    kubectl -n csi-addons-reference rollout status daemonset/reference-driver-node --timeout=180s >&2
    kubectl -n csi-addons-reference rollout status statefulset/reference-driver-controller --timeout=180s >&2
    ;;
  driver-operator)
    kubectl apply --server-side -f - <"$root/deploy/driver-operator/driver-operator.yaml" >/dev/null
    kubectl -n reference-driver-operator rollout status deployment/reference-driver-operator --timeout=180s >&2
    ;;
  driver-from-operator)
    # The operator's sample: the driver, its StorageClasses and, once its sidecars advertise them,
    # the CSI-Addons classes the story uses.
    kubectl apply --server-side -f - <"$root/driver-operator/config/samples/driver_v1alpha1_referencecsidriver.yaml" >/dev/null
    kubectl wait --for=condition=Available referencecsidriver/reference.csi-addons-rs.io --timeout=300s >&2
    for class in networkfenceclass/reference-csi-fence volumereplicationclass/reference-csi-replication \
      storageclass/reference-csi-filesystem; do
      kubectl wait --for=create "$class" --timeout=180s >&2
    done
    ;;
  remove-driver)
    # Volumes first, while the driver that deletes them still runs: the PVCs go with their namespace,
    # and their PVs (reclaim policy Delete) once the driver has deleted the volumes.
    kubectl delete namespace workloads --ignore-not-found --timeout=180s >/dev/null
    for _ in $(seq 90); do
      [ -z "$(kubectl get pv -o name)" ] && break
      sleep 2
    done
    [ -z "$(kubectl get pv -o name)" ] || { log "PVs left after the workloads went: $(kubectl get pv -o name)"; exit 1; }
    # The driver's Pods next, while their RBAC still holds: a sidecar shutting down still releases its
    # Lease and says goodbye to the API server.
    kubectl -n csi-addons-reference delete statefulset,daemonset,cronjob,job --all --cascade=foreground \
      --ignore-not-found --timeout=180s >/dev/null
    "$(KUSTOMIZE_QUIET=1 "$here/kustomize.sh")" build "$root/deploy/reference-driver" \
      | kubectl delete --ignore-not-found --timeout=180s -f - >/dev/null
    ;;
  second-driver)
    "$(KUSTOMIZE_QUIET=1 "$here/kustomize.sh")" build "$root/tests/cluster/second-driver" | kubectl apply --server-side -f - >/dev/null
    kubectl -n csi-addons-reference-second rollout status statefulset/second-reference-driver-controller --timeout=180s >&2
    ;;
  remove-second-driver)
    # Its Pod first, while its RBAC still holds (as remove-driver); its volumes are gone already.
    kubectl -n csi-addons-reference-second delete statefulset --all --cascade=foreground --ignore-not-found \
      --timeout=180s >/dev/null
    "$(KUSTOMIZE_QUIET=1 "$here/kustomize.sh")" build "$root/tests/cluster/second-driver" \
      | kubectl delete --ignore-not-found --timeout=180s -f - >/dev/null
    # Its state, in a directory of the first driver's disk (see tests/cluster/second-driver/).
    rm -rf /var/lib/csi-addons-reference/second-driver
    ;;
  *) log "usage: hack/cluster-install.sh controller|driver|driver-operator|driver-from-operator|remove-driver|second-driver|remove-second-driver"; exit 2 ;;
esac
