#!/usr/bin/env bash
# Makes kilnd's base image without a container registry: a Debian 12 root file system from
# Debian's package mirror (debootstrap), with what kilnd runs besides its bundle: glibc, /bin/sh
# and coreutils (the bundle's wrapper, Kubernetes' init step), g++ and libc6-dev (kilnd builds
# the CPU kernels with them; their version is part of every CPU artifact's key, so every
# daemon of a fleet runs one base) and CA certificates (TLS to Redis); and the user kiln
# (uid/gid 10001) that kilnd runs as. Imported into the runtime's local images.
# Usage: docker/base.sh RUNTIME IMAGE   (RUNTIME: docker or podman; needs root and debootstrap)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: docker/base.sh RUNTIME IMAGE" >&2
  exit 2
fi
runtime=$1 image=$2
suite=bookworm
packages=g++,libc6-dev,ca-certificates
log() { printf '[base] %s\n' "$*" >&2; }

if ! command -v debootstrap >/dev/null; then
  echo "base: debootstrap is not installed (apt-get install debootstrap); or give" \
    "docker/build.sh --base IMAGE, a Debian 12 image with g++ and libc6-dev" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "base: debootstrap needs root" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
log "debootstrap $suite ($packages), a few minutes"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" \
  ${KILN_DEBIAN_MIRROR:-} >"$work/debootstrap.log" 2>&1; then
  tail -20 "$work/debootstrap.log" >&2
  echo "base: debootstrap failed (a Debian mirror must be reachable; KILN_DEBIAN_MIRROR names" \
    "another)" >&2
  exit 1
fi
# What an image does not need: package caches and lists, documentation, translations.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/info \
  "$rootfs"/usr/share/locale "$rootfs"/var/log/*
echo 'kiln:x:10001:10001:kiln:/var/cache/kiln:/usr/sbin/nologin' >>"$rootfs/etc/passwd"
echo 'kiln:x:10001:' >>"$rootfs/etc/group"
echo 'kiln:!:19000::::::' >>"$rootfs/etc/shadow"
log "importing as $image"
if ! tar -C "$rootfs" --numeric-owner -c . | "$runtime" import --change 'CMD ["/bin/sh"]' \
  --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null 2>"$work/import.log"; then
  cat "$work/import.log" >&2
  exit 1
fi
"$runtime" image inspect "$image" >/dev/null
