#!/usr/bin/env bash
# The reference driver image's root filesystem, made with debootstrap from Debian's packages (these
# machines cannot reach Docker Hub): bookworm's minimal base plus the tools the driver runs (losetup,
# blkid, fstrim from util-linux and mount; mkfs.ext4, e2fsck, resize2fs from e2fsprogs), without
# documentation or package caches. Cached outside the clone; prints the tarball's path.
#   DEBIAN_MIRROR   where the packages come from (default http://deb.debian.org/debian)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
SUITE=bookworm
PACKAGES=e2fsprogs,mount,util-linux
out="$CSI_ADDONS_CACHE/driver-base-$SUITE-${PACKAGES//,/-}"
if [ ! -f "$out/rootfs.tar" ]; then
  "$here/packages.sh"
  log "making the driver's Debian $SUITE root filesystem with debootstrap (once; about 30 s)"
  work=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-driver-base.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" \
    "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/log" 2>&1 || { tail -n 20 "$work/log" >&2; exit 1; }
  rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/* \
    "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/* "$work/root"/usr/share/locale/*
  mkdir -p "$out"
  tar -C "$work/root" --numeric-owner -cf "$out/rootfs.tar.part" .
  mv "$out/rootfs.tar.part" "$out/rootfs.tar"
fi
echo "$out/rootfs.tar"
