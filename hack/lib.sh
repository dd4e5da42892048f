#!/usr/bin/env bash
# Shared helpers for the hack/ scripts: where Go-built test peers are cached and how they are built.
# Test peers are built from the Go module proxy into a cache outside the clone, keyed by version.

CSI_ADDONS_CACHE="${CSI_ADDONS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-addons-rs}"

# Versions of every Go-built peer. Changing one rebuilds only that peer.
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.34.2}"

# The one-node cluster's registry (hack/cluster.sh): on the node's address inside the cluster's network
# namespace, so containerd and Pods reach it by the same name.
CLUSTER_REGISTRY=10.250.0.1:5000

log() { printf '[hack] %s\n' "$*" >&2; }

# go_module_dir MODULE@VERSION
# Downloads the module through the Go module proxy into the Go module cache (once) and prints the
# directory it is unpacked in.
go_module_dir() {
  local dir
  dir=$(go_download_field "$1" Dir)
  [ -d "$dir" ] || { log "go mod download $1 gave no directory"; return 1; }
  echo "$dir"
}

# go_mod_file MODULE@VERSION: the path of the module's go.mod, as the proxy serves it.
go_mod_file() { go_download_field "$1" GoMod; }

# go_download_field MODULE@VERSION FIELD: one field of `go mod download -json` for the module.
go_download_field() {
  local scratch value
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-gomod.XXXXXX")
  value=$(cd "$scratch" && go mod init local/module >/dev/null 2>&1 && go mod download -json "$1" \
    | sed -n "s/^\s*\"$2\": \"\(.*\)\",\?\$/\1/p")
  rm -rf "$scratch"
  echo "$value"
}

# go_wrapper_build OUTDIR MODULE@VERSION [LDFLAGS] PACKAGE...
# Builds PACKAGEs from a throwaway wrapper module (`go install MOD@VER` is refused by the proxy here:
# it asks for the version list). Extra `go mod edit` arguments come from GO_MOD_EDITS (an array),
# build tags from GO_BUILD_TAGS. GO_CGO=1 builds with cgo (runc's seccomp needs libseccomp).
go_wrapper_build() {
  local outdir=$1 modver=$2 ldflags=$3; shift 3
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-gobuild.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  (
    set -euo pipefail
    cd "$work"
    go mod init local/peer >/dev/null 2>&1
    for edit in "${GO_MOD_EDITS[@]:-}"; do
      [ -n "$edit" ] && go mod edit "$edit"
    done
    go get "$modver" >&2
    mkdir -p "$outdir.partial"
    for pkg in "$@"; do
      log "building $pkg ($modver)"
      local t0=$SECONDS
      CGO_ENABLED="${GO_CGO:-0}" go build -mod=mod -trimpath -tags "${GO_BUILD_TAGS:-}" -ldflags "$ldflags" -o "$outdir.partial/$(basename "$pkg")" "$pkg"
      log "built $(basename "$pkg") in $(( SECONDS - t0 )) s"
    done
  ) || { rm -rf "$outdir.partial"; return 1; }
  rm -rf "$outdir"
  mv "$outdir.partial" "$outdir"
}

# kubernetes_build OUTDIR PACKAGE...
# Builds k8s.io/kubernetes commands at KUBERNETES_VERSION. The staging modules are nested modules
# absent from the k8s.io/kubernetes zip: each is replaced with its published tag, the list read from
# the go.mod the proxy serves. The version ldflags make the binaries report KUBERNETES_VERSION.
kubernetes_build() {
  local outdir=$1; shift
  local staging="v0.${KUBERNETES_VERSION#v1.}" minor="${KUBERNETES_VERSION#v1.}" gomod m ldf
  minor="${minor%%.*}"
  gomod=$(go_mod_file "k8s.io/kubernetes@$KUBERNETES_VERSION")
  GO_MOD_EDITS=()
  for m in $(sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod"); do
    GO_MOD_EDITS+=("-replace=$m=$m@$staging")
  done
  ldf="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ldf="$ldf -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
  ldf="$ldf -X k8s.io/component-base/version.gitTreeState=clean"
  go_wrapper_build "$outdir" "k8s.io/kubernetes@$KUBERNETES_VERSION" "$ldf" "$@"
}

# cached_go_tool NAME VERSION MODULE PACKAGE ABOUT [LDFLAGS]
# Builds PACKAGE of MODULE@VERSION once into the cache (the binary named NAME), under a lock so
# parallel callers wait for one build, and prints its path. ABOUT says how long it takes; LDFLAGS
# are added to "-s -w". With GO_TOOL_REPLACES=1 the module's own `replace` lines are repeated.
cached_go_tool() {
  local name=$1 version=$2 module=$3 package=$4 about=$5 ldflags=${6:-}
  command -v go >/dev/null || { log "Go is needed to build $name"; return 1; }
  mkdir -p "$CSI_ADDONS_CACHE"
  exec 9>"$CSI_ADDONS_CACHE/.$name.lock"
  flock 9
  local dir="$CSI_ADDONS_CACHE/$name-$version"
  if [ ! -x "$dir/$name" ]; then
    log "building $name $version into $dir ($about, once)"
    GO_MOD_EDITS=()
    [ "${GO_TOOL_REPLACES:-}" = 1 ] && mapfile -t GO_MOD_EDITS < <(module_replaces "$module@$version")
    go_wrapper_build "$dir" "$module@$version" "-s -w $ldflags" "$package"
    local built
    built=$(basename "$package")
    # go build names the binary after the package's last element (kustomize's is "v5").
    [ "$built" = "$name" ] || mv "$dir/$built" "$dir/$name"
  fi
  echo "$dir/$name"
}


# module_replaces MODULE@VERSION
# Prints the module's own go.mod `replace` lines (those naming a version) as `go mod edit` arguments:
# a wrapper module must repeat them, or `go get` resolves other versions than the module was built with.
module_replaces() {
  local gomod
  gomod=$(go_mod_file "$1")
  sed -e 's#\s*//.*$##' "$gomod" | sed -n 's#^\(replace \)\?\s*\([^ ]*\) => \([^ .][^ ]*\) \(v[^ ]*\)$#-replace=\2=\3@\4#p'
}

# opm (operator-registry) at OPM_VERSION, built once with its replace line and without gpgme; its path.
OPM_VERSION="${OPM_VERSION:-v1.55.0}"
opm_tool() {
  GO_TOOL_REPLACES=1 GO_BUILD_TAGS=containers_image_openpgp cached_go_tool opm "$OPM_VERSION" \
    github.com/operator-framework/operator-registry github.com/operator-framework/operator-registry/cmd/opm "about 1 min"
}
