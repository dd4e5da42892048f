# The reference CSI driver and its kubelet registrar (csi-node-registrar), static (musl) binaries on
# a Debian root filesystem: the driver runs losetup, mkfs.ext4, e2fsck, resize2fs, blkid and fstrim,
# so it cannot be FROM scratch. It runs as root in a privileged container (loop devices, mounts).
#   docker build -f build/driver.Dockerfile -t ghcr.io/csi-addons-rs/reference-driver:v0.1.0 .
# `--build-arg BINARIES=<image>` takes the binaries from an image holding them in /out, and
# `--build-arg BASE=<image>` takes a root filesystem with those tools from elsewhere: `make images`
# makes one with debootstrap from Debian's packages (hack/driver-base.sh). The final stage is the same.
ARG BINARIES=compiled
ARG BASE=tools

FROM docker.io/library/rust:1.95.0-bookworm AS compiled
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --locked --profile ship --target x86_64-unknown-linux-musl -p reference-driver --bin reference-driver --bin csi-node-registrar \
    && install -D -t /out target/x86_64-unknown-linux-musl/ship/reference-driver target/x86_64-unknown-linux-musl/ship/csi-node-registrar

FROM docker.io/library/debian:12.12-slim AS tools
RUN apt-get update && apt-get install -y --no-install-recommends e2fsprogs mount util-linux \
    && rm -rf /var/lib/apt/lists/*

FROM ${BINARIES} AS binaries

FROM ${BASE}
COPY --from=binaries /out/reference-driver /usr/local/bin/reference-driver
COPY --from=binaries /out/csi-node-registrar /usr/local/bin/csi-node-registrar
ENTRYPOINT ["/usr/local/bin/reference-driver"]
