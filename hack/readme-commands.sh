#!/usr/bin/env bash
# Prints the commands of one install path of README.md ("OLM", "Helm" or "Plain YAML"): the lines after
# its `# <path>` comment in the first sh block of "Installing in a cluster", up to a blank line, one
# command per line (continuation lines joined). The cluster suites run exactly these.
#   hack/readme-commands.sh "Plain YAML"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
awk -v path="# ${1:?usage: hack/readme-commands.sh PATH}" '
  /^## Installing in a cluster/ { section = 1; next }
  section && /^```sh/ && !done { block = 1; next }
  block && /^```/ { block = 0; done = 1; taking = 0; next }
  block && index($0, path) == 1 { taking = 1; next }
  taking && (/^[[:space:]]*$/ || /^#/) { taking = 0 }
  taking {
    line = $0; sub(/^[[:space:]]+/, "", line)
    if (sub(/[[:space:]]*\\$/, " ", line)) { pending = pending line; next }
    print pending line; pending = ""
  }' "$root/README.md"
