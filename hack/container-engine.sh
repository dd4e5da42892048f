#!/usr/bin/env bash
# Prints the engine that builds images from the Dockerfiles here: CONTAINER_ENGINE if set, else
# docker when its daemon answers (a docker client alone is not enough), else podman, else buildah
# (daemon-less, from Debian). Each takes `build -f FILE -t TAG [--build-arg …] CONTEXT`.
set -euo pipefail
if [ -n "${CONTAINER_ENGINE:-}" ]; then
  echo "$CONTAINER_ENGINE"
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  echo docker
elif command -v podman >/dev/null 2>&1; then
  echo podman
elif command -v buildah >/dev/null 2>&1; then
  echo buildah
else
  echo "no container engine: install docker, podman or buildah (hack/packages.sh installs buildah), or set CONTAINER_ENGINE" >&2
  exit 1
fi
