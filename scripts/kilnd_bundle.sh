#!/usr/bin/env bash
# A relocatable kilnd: DEST/bin/kilnd (stripped), DEST/lib/ with every shared library it loads but
# glibc's, and DEST/kilnd, which starts it through the system's loader with DEST/lib as its
# library path. Runs on any Linux whose glibc is at least this machine's (the GPU machine's,
# an image's base). Used by scripts/gpu_bundle.sh and docker/build.sh.
# Usage: scripts/kilnd_bundle.sh [--kilnd BINARY] DEST
#   default: build/daemon/kilnd, built first so that it is current with the tree (needs the
#   build/ of scripts/setup.sh); --kilnd bundles that binary as it is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
binary=""
if [ "${1:-}" = "--kilnd" ]; then
  binary=$(readlink -f "$2")
  shift 2
fi
if [ $# -ne 1 ]; then
  echo "usage: scripts/kilnd_bundle.sh [--kilnd BINARY] DEST" >&2
  exit 2
fi
bundle=$(mkdir -p "$(dirname "$1")" && cd "$(dirname "$1")" && pwd)/$(basename "$1")
cd "$root"

if [ -z "$binary" ]; then
  if ! log=$(cmake --build build -j2 --target kilnd 2>&1); then
    echo "$log" | tail -20 >&2
    echo "kilnd_bundle: kilnd does not build" >&2
    exit 1
  fi
  binary=$root/build/daemon/kilnd
fi

# glibc's libraries stay the system's: they come with the loader, and a machine (or a base
# image) with a glibc at least as new as this one's runs what was linked here.
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
cp "$binary" "$bundle/bin/kilnd"
strip --strip-unneeded "$bundle/bin/kilnd"
interp=$(readelf -l "$bundle/bin/kilnd" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
glibc='^(linux-vdso|ld-linux[^ ]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl)\.so'
ldd "$bundle/bin/kilnd" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
  if [[ ! $name =~ $glibc ]]; then cp -L "$path" "$bundle/lib/$name"; fi
done
if ldd "$bundle/bin/kilnd" | grep -q 'not found'; then
  echo "kilnd_bundle: kilnd needs a library that is not installed here" >&2
  exit 1
fi
# The library path goes to the loader on its command line, not through LD_LIBRARY_PATH: the
# compiler kilnd starts inherits its environment and must load the machine's own libraries.
cat >"$bundle/kilnd" <<EOF
#!/bin/sh
# kilnd with the shared libraries beside it (made by scripts/kilnd_bundle.sh).
d=\$(dirname "\$(readlink -f "\$0")")
exec $interp --library-path "\$d/lib" "\$d/bin/kilnd" "\$@"
EOF
chmod +x "$bundle/kilnd"
env -i "$bundle/kilnd" --help >/dev/null
# Built from the tree: which sources (scripts/gpu_check.sh refuses a bundle of other ones).
if [ "$binary" = "$root/build/daemon/kilnd" ]; then scripts/kilnd_sources.sh >"$bundle/SOURCES"; fi
