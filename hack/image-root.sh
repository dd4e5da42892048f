#!/usr/bin/env bash
# Images of a directory, for the test peers built here (hack/olm.sh, hack/prometheus.sh): sourced
# after lib.sh, with crane() reaching the cluster's registry (hack/cluster.sh exec crane).

# busybox_into ROOT APPLET...: Debian's static busybox at ROOT/bin/busybox, with the APPLETs linked.
busybox_into() {
  local root=$1 applet; shift
  mkdir -p "$root/bin"
  cp /bin/busybox "$root/bin/busybox"
  for applet in "$@"; do ln -sf busybox "$root/bin/$applet"; done
}

# push_root REF ROOT USER ENTRYPOINT CMD [LABEL=VALUE...]: an image of the directory ROOT, pushed to the
# cluster's registry under REF's mirrored name.
push_root() {
  local ref=$1 root=$2 user=$3 entrypoint=$4 cmd=$5 layer label out labels=(); shift 5
  for label in "$@"; do labels+=(--label "$label"); done
  layer=$(mktemp)
  tar -C "$root" --owner=0 --group=0 -cf "$layer" .
  # crane logs every blob it pushes: shown only when it fails.
  out=$(crane append --insecure --oci-empty-base -f "$layer" -t "$CLUSTER_REGISTRY/$ref.base" 2>&1) || { log "$out"; return 1; }
  rm -f "$layer"
  out=$(crane mutate --insecure --set-platform linux/amd64 --env PATH=/bin --user "$user" \
    ${entrypoint:+--entrypoint "$entrypoint"} ${cmd:+--cmd "$cmd"} "${labels[@]}" \
    -t "$CLUSTER_REGISTRY/$ref" "$CLUSTER_REGISTRY/$ref.base" 2>&1) || { log "$out"; return 1; }
}
