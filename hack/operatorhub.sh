#!/usr/bin/env bash
# Writes the bundle in the layout of the community-operators repositories (OperatorHub.io):
#   OUT/operators/<package>/<version>/manifests/   the bundle's manifests
#   OUT/operators/<package>/<version>/metadata/    its annotations
#   OUT/operators/<package>/ci.yaml                how the repository builds the upgrade graph
# and runs operator-sdk's validators on it: the operatorframework suite and the community one, each
# failing on any error or warning but the community validator's notice that it is deprecated.
#   hack/operatorhub.sh OUT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=$(realpath -m "${1:?usage: hack/operatorhub.sh OUT}")
sdk="$("$here/operator-sdk.sh")/operator-sdk"
annotations="$root/bundle/metadata/annotations.yaml"
package=$(sed -n 's/^\s*operators.operatorframework.io.bundle.package.v1: *//p' "$annotations")
version=$(sed -n 's/^  version: *//p' "$root"/bundle/manifests/*.clusterserviceversion.yaml)
dir="$out/operators/$package/$version"
rm -rf "$dir"
mkdir -p "$dir"
cp -r "$root/bundle/manifests" "$root/bundle/metadata" "$dir/"
# Each CSV names the one it replaces (spec.replaces), so the graph follows those.
printf 'updateGraphMode: replaces-mode\n' >"$out/operators/$package/ci.yaml"
for suite in suite=operatorframework name=community; do
  result=$("$sdk" bundle validate "$dir" -b none --select-optional "$suite" 2>&1)
  echo "$result"
  if grep -v 'Community Operator bundle validator is deprecated' <<<"$result" | grep -qiE 'level=(warning|error)'; then
    echo "operatorhub: the $suite validators reported warnings or errors" >&2
    exit 1
  fi
done
echo "$dir"
