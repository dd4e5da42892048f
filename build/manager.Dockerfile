# csi-addons-manager: a static (musl) binary on scratch, run as a non-root user.
# docker build -f build/manager.Dockerfile -t ghcr.io/csi-addons-rs/csi-addons-manager:v0.1.0 .
FROM docker.io/library/rust:1.95.0-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --locked --profile manager -p operator --bin csi-addons-manager --target x86_64-unknown-linux-musl

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-musl/manager/csi-addons-manager /csi-addons-manager
USER 65532:65532
ENTRYPOINT ["/csi-addons-manager"]
