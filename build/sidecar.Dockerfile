# csi-addons-sidecar and the csi-addons CLI: static (musl) binaries on scratch, run as a non-root
# user (the sidecar needs only the driver's socket, shared through the Pod's volume).
# docker build -f build/sidecar.Dockerfile -t ghcr.io/csi-addons-rs/csi-addons-sidecar:v0.1.0 .
FROM docker.io/library/rust:1.95.0-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --locked --profile sidecar -p sidecar --bin csi-addons-sidecar --bin csi-addons --target x86_64-unknown-linux-musl

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-musl/sidecar/csi-addons-sidecar /csi-addons-sidecar
COPY --from=build /src/target/x86_64-unknown-linux-musl/sidecar/csi-addons /csi-addons
USER 65532:65532
ENTRYPOINT ["/csi-addons-sidecar"]
