# reference-driver-operator: a static (musl) binary on scratch, run as a non-root user.
#   docker build -f build/driver-operator.Dockerfile -t ghcr.io/csi-addons-rs/reference-driver-operator:v0.1.0 .
# The `compiled` stage builds the binary from this tree. Where Docker Hub's Rust image is out of
# reach, `--build-arg BINARIES=<image>` takes the binaries from an image holding them in /out (what
# `make images` does with the binaries of `make ship-binaries`): the final stage is the same.
ARG BINARIES=compiled

FROM docker.io/library/rust:1.95.0-bookworm AS compiled
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --locked --profile ship --target x86_64-unknown-linux-musl -p driver-operator --bin reference-driver-operator \
    && install -D -t /out target/x86_64-unknown-linux-musl/ship/reference-driver-operator

FROM ${BINARIES} AS binaries

FROM scratch
COPY --from=binaries /out/reference-driver-operator /reference-driver-operator
USER 65532:65532
ENTRYPOINT ["/reference-driver-operator"]
