#!/usr/bin/env bash
# Builds (once) operator-sdk and the scorecard-test binary from the Go module proxy into the cache
# outside the clone, and prints the directory holding both.
# v1.42.2 is pinned because v1.42.3 does not build from the proxy (its ansible-operator-plugins
# v1.42.3 is not served). The tag drops gpgme (cgo), as operator-sdk's own release build does.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
version="${OPERATOR_SDK_VERSION:-v1.42.2}"
module=github.com/operator-framework/operator-sdk
command -v go >/dev/null || { log "Go is needed to build operator-sdk"; exit 1; }
mkdir -p "$CSI_ADDONS_CACHE"
exec 9>"$CSI_ADDONS_CACHE/.operator-sdk.lock"
flock 9
dir="$CSI_ADDONS_CACHE/operator-sdk-$version"
if [ ! -x "$dir/operator-sdk" ] || [ ! -x "$dir/scorecard-test" ]; then
  log "building operator-sdk and scorecard-test $version into $dir (about 2.5 min, once)"
  GO_MOD_EDITS=()
  GO_BUILD_TAGS=containers_image_openpgp
  # The version ldflag makes `operator-sdk version` and the bundle's metrics.builder name it.
  go_wrapper_build "$dir" "$module@$version" "-s -w -X $module/internal/version.Version=$version -X $module/internal/version.GitVersion=$version" \
    "$module/cmd/operator-sdk" "$module/images/scorecard-test"
fi
echo "$dir"
