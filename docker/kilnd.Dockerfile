# kilnd, the kiln compile daemon. Built by docker/build.sh from a context it assembles: the
# relocatable bundle of scripts/kilnd_bundle.sh (kilnd and its shared libraries) copied onto a
# base that brings glibc, /bin/sh and the g++ that builds CPU kernels (docker/base.sh). Nothing
# is downloaded while the image builds.
#
# Serves on the Unix socket /run/kiln/kilnd.sock (mode 0600: clients run as uid 10001 too), with
# its cache (RocksDB, the MAC key) in /var/cache/kiln: mount volumes on both. TCP (TLS and a
# bearer token, which kilnd requires) and every other setting: a config file or flags after the
# image's name (docker/README.md).
ARG BASE_IMAGE=kiln/kilnd-base:bookworm
FROM ${BASE_IMAGE}
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kilnd" \
      org.opencontainers.image.description="kiln's compile daemon" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

COPY opt/kiln/ /opt/kiln/
COPY kilnd.conf /etc/kiln/kilnd.conf
# The socket's and the cache's directories, kilnd's own and writable by no one else: kilnd refuses
# a cache directory of another user and a socket directory that others may write. A new named
# volume takes them over as they are. (One COPY each: a COPY into / would give kilnd /run and
# /var too.)
COPY --chown=10001:10001 dirs/run/kiln/ /run/kiln/
COPY --chown=10001:10001 dirs/var/cache/kiln/ /var/cache/kiln/

# kilnd's own defaults (daemon/paths.h) name these directories too, so that `kilnd --stats` or
# `kilnd --stop` in the container find the daemon without flags.
ENV PATH=/opt/kiln:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    XDG_CACHE_HOME=/var/cache \
    XDG_RUNTIME_DIR=/run \
    HOME=/var/cache/kiln
USER 10001:10001
VOLUME ["/var/cache/kiln", "/run/kiln"]
# 7341: the TCP listener, where the configuration turns it on. 9464: Prometheus metrics, where
# kilnd is given metrics_listen.
EXPOSE 7341 9464
# Stats over the socket: exit 0 while kilnd answers.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD ["/opt/kiln/kilnd", "--stats", "--socket", "/run/kiln/kilnd.sock"]
# In the foreground (logs on stderr), as PID 1: SIGTERM drains compiles in flight
# (drain_seconds, 30 by default) before it exits; give `docker stop` a longer --time.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/kiln/kilnd", "--foreground"]
CMD ["--config", "/etc/kiln/kilnd.conf"]
