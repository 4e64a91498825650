# The `zopu` image built here without a registry or a Rust toolchain in
# Docker: deploy/Dockerfile's runtime stage on a local Debian base
# (debootstrap --variant=minbase bookworm with git, ca-certificates and
# bubblewrap, imported as zopu-base:bookworm) and the zopu binary built on
# the host (the same Debian release, so the same glibc).
# deploy/scripts/build-images.sh builds it from a context holding only that binary.
ARG BASE=zopu-base:bookworm
FROM ${BASE}
RUN groupadd --system --gid 10001 zopu \
    && useradd --system --uid 10001 --gid 10001 --home /var/lib/zopu zopu \
    && install -d -o zopu -g zopu /var/lib/zopu
COPY zopu /usr/local/bin/zopu
USER 10001:10001
ENTRYPOINT []
