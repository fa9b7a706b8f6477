# The kiln client on a PyTorch serving image: the kiln package (its kiln._C extension and the
# generated kiln.v1 messages included) and the gRPC and protobuf packages it talks to kilnd
# with, in /opt/kiln/python, ahead of the image's own packages. Built by docker/build.sh
# (--client-base IMAGE); nothing is downloaded or run while it builds.
#
# kiln._C is built for one CPython and one torch (build.sh prints them; they are labels of the
# image): BASE_IMAGE must have the same ones.
#
# kilnd is reached through the socket volume shared with the kilnd container (mounted at
# /run/kiln; the serving process runs as uid 10001, the socket being 0600), with kilnd's MAC
# key read from its cache volume (mounted read-only at /var/cache/kiln). For a kilnd on another
# host, set KILN_DAEMON=dns:///HOST:7341, KILN_DAEMON_CA and KILN_DAEMON_TOKEN_FILE, and
# KILN_MAC_KEY_FILE to the fleet's key (docker/README.md).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG KILN_PYTHON=unknown
ARG KILN_TORCH=unknown
ARG VERSION=unknown
LABEL org.opencontainers.image.version="${VERSION}" \
      org.kiln.client.python="${KILN_PYTHON}" \
      org.kiln.client.torch="${KILN_TORCH}"
COPY python/ /opt/kiln/python/
# KILN_CACHE_DIR holds the client's graph index (which artifact a captured graph maps to), so
# that a warm process skips lowering; mount a volume there to keep it across restarts.
ENV PYTHONPATH=/opt/kiln/python${PYTHONPATH:+:${PYTHONPATH}} \
    KILN_DAEMON=unix:///run/kiln/kilnd.sock \
    KILN_MAC_KEY_FILE=/var/cache/kiln/mac.key \
    KILN_CACHE_DIR=/tmp/kiln-client
