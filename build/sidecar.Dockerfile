# csi-addons-sidecar and the csi-addons CLI: static (musl) binaries on scratch, run as a non-root
# user (the sidecar needs only the driver's socket, shared through the Pod's volume).
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
COPY --from=binaries /out/csi-addons-sidecar /csi-addons-sidecar
COPY --from=binaries /out/csi-addons /csi-addons
USER 65532:65532
ENTRYPOINT ["/csi-addons-sidecar"]
