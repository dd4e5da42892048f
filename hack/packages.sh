#!/usr/bin/env bash
# Installs (once per machine, in one apt-get call) the Debian packages that some suite needs and no
# Go module or crate provides; .ci/run calls it before the first build, the scripts that need one of
# them call it with the one they lack (`hack/packages.sh musl-tools`):
#   musl-tools       musl-gcc, for the shipped static builds' C and assembly (hack/static-target.sh)
#   libseccomp-dev   runc's seccomp support, linked statically (hack/node-peers.sh)
#   iptables         kube-proxy's Service rules and the bridge plugin's masquerade (nft backend)
#   conntrack        kube-proxy clears stale UDP entries with it (DNS through a Service)
#   busybox-static   the shell and httpd of the cluster's check Pods, one static binary
#   buildah          builds the product's images from its Dockerfiles with no container daemon
#   debootstrap      makes the reference driver image's Debian root filesystem (no Docker Hub here)
#   logrotate        rotates the sidecar's --log_file as the projects that run it do (copytruncate)
# Debian's Prometheus is downloaded, not installed (hack/prometheus-deb.sh): installing it would
# start a server on the host's interfaces.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
packages=(musl-tools libseccomp-dev iptables conntrack busybox-static buildah debootstrap logrotate)
if [ $# -gt 0 ]; then
  for p in "$@"; do
    [[ " ${packages[*]} " == *" $p "* ]] || { log "$p is not one of the project's packages (${packages[*]})"; exit 2; }
  done
  packages=("$@")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
log "installing ${missing[*]} from Debian (once per machine)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
