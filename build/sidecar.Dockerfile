# csi-addons-sidecar and the csi-addons CLI: static (musl) binaries on scratch, where upstream's image
# has them (/usr/sbin/csi-addons-sidecar, /usr/bin/csi-addons), so a Pod spec written for upstream's
# image runs this one unchanged.
# It runs as root, as upstream's does: CSI drivers create their sockets as root with mode 0755, and
# connecting to a Unix socket needs write permission on it. Where a driver's socket allows another
# user, set the container's runAsUser.
#   docker build -f build/sidecar.Dockerfile -t ghcr.io/csi-addons-rs/csi-addons-sidecar:v0.1.0 .
# `--build-arg BINARIES=<image>` takes the binaries from an image holding them in /out instead of
# compiling them (see build/manager.Dockerfile): the final stage is the same.
ARG BINARIES=compiled

FROM docker.io/library/rust:1.95.0-bookworm AS compiled
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --locked --profile ship --target x86_64-unknown-linux-musl -p sidecar --bin csi-addons-sidecar --bin csi-addons \
    && install -D -t /out target/x86_64-unknown-linux-musl/ship/csi-addons-sidecar target/x86_64-unknown-linux-musl/ship/csi-addons

FROM ${BINARIES} AS binaries

FROM scratch
COPY --from=binaries /out/csi-addons-sidecar /usr/sbin/csi-addons-sidecar
COPY --from=binaries /out/csi-addons /usr/bin/csi-addons
ENTRYPOINT ["/usr/sbin/csi-addons-sidecar"]
