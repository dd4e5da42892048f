#!/usr/bin/env bash
# Installs (once) the Debian packages the one-node cluster needs and no Go module provides:
#   libseccomp-dev   runc's seccomp support, linked statically
#   iptables         kube-proxy's Service rules and the bridge plugin's masquerade (nft backend)
#   conntrack        kube-proxy clears stale UDP entries with it (DNS through a Service)
#   busybox-static   the shell and httpd of the cluster's check Pods, one static binary
#   buildah          builds the product's images from its Dockerfiles with no container daemon
#   debootstrap      makes the reference driver image's Debian root filesystem (no Docker Hub here)
# A new machine starts without them; .ci/run calls this.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
packages=(libseccomp-dev iptables conntrack busybox-static buildah debootstrap)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
log "installing ${missing[*]} from Debian (once per machine)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
