#!/usr/bin/env bash
# Validates bundle/ as OperatorHub would: operator-sdk's validators (the operatorframework suite on top
# of the required ones; run from the repository root, so PROJECT is read too), then scorecard's six
# static tests, run by the scorecard-test binary in a chroot that holds bundle/ at /bundle (the path
# it reads; no cluster or image needed). Fails on any error or warning.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tools=$("$here/operator-sdk.sh")
cd "$root"
out=$("$tools/operator-sdk" bundle validate ./bundle -b none --select-optional suite=operatorframework 2>&1)
echo "$out"
if grep -qiE 'level=(warning|error)' <<<"$out"; then
  echo "bundle-validate: operator-sdk reported warnings or errors" >&2
  exit 1
fi

chroot_dir=$(mktemp -d "${TMPDIR:-/tmp}/csi-addons-scorecard.XXXXXX")
trap 'rm -rf "$chroot_dir"' EXIT
cp "$tools/scorecard-test" "$chroot_dir/"
cp -r bundle "$chroot_dir/bundle"
failed=0
for test in basic-check-spec olm-bundle-validation olm-crds-have-validation olm-crds-have-resources \
  olm-spec-descriptors olm-status-descriptors; do
  result=$(chroot "$chroot_dir" /scorecard-test "$test")
  state=$(sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p' <<<"$result" | head -1)
  echo "scorecard $test: $state"
  [ "$state" = pass ] || { echo "$result" >&2; failed=1; }
done
exit "$failed"
