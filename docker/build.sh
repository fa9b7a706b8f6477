#!/usr/bin/env bash
# Builds kiln's images with whichever container runtime works here (docker, else podman):
#   kiln/kilnd:VERSION   kilnd (scripts/kilnd_bundle.sh's bundle) on a base with glibc and g++
#   kiln/client:VERSION  the kiln package on a PyTorch serving image (--client-base IMAGE)
# It first assembles the build context (CONTEXT, default build/docker); when no runtime can
# build, it says so and exits 3 with the context ready for another machine's runtime.
# Nothing is downloaded while an image builds. The default base, kiln/kilnd-base:bookworm, is
# made once by docker/base.sh (debootstrap from Debian's mirror) when the runtime lacks it.
#
# Usage: docker/build.sh [options]
#   --version V          the images' tag (default: git describe of the tree)
#   --kilnd BINARY       bundle this kilnd (default: build/daemon/kilnd, built first)
#   --bundle DIR         use a bundle scripts/kilnd_bundle.sh made, as it is
#   --nvrtc LIBNVRTC     put this libnvrtc.so.* (and its libnvrtc-builtins) in kilnd's image,
#                        so that it builds CUDA kernels (default: none; CUDA requests answer
#                        UNIMPLEMENTED and GPU clients run those graphs eagerly)
#   --base IMAGE         kilnd's base (default kiln/kilnd-base:bookworm)
#   --client-base IMAGE  also build kiln/client on this serving image (its CPython and torch
#                        must be those kiln._C was built for: .venv's)
#   --python PYTHON      the Python whose kiln package goes into the client layer (default .venv's)
#   --context DIR        where the context is assembled (default build/docker)
#   --context-only       assemble the context, build nothing
#   --save DIR           also write each image built to DIR as an OCI archive (podman) or a
#                        docker archive (docker), for `load` on machines without a registry
# KILN_CONTAINER_RUNTIME=podman (or docker) picks the runtime. After a build, CONTEXT/run-command
# holds the command (one word a line) that ran kilnd's image here: a runtime that needs flags on
# this host (another OCI runtime, lower ulimits) is found once, and tests reuse it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '[docker] %s\n' "$*" >&2; }
die() { printf 'docker/build.sh: %s\n' "$*" >&2; exit 1; }
abs() { (mkdir -p "$(dirname "$1")" && cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")"); }

version="" kilnd="" bundle="" nvrtc="" base=kiln/kilnd-base:bookworm client_base=""
python=$root/.venv/bin/python context=$root/build/docker context_only=0 save=""
while [ $# -gt 0 ]; do
  case $1 in
    --version) version=$2; shift 2 ;;
    --kilnd) kilnd=$(abs "$2"); shift 2 ;;
    --bundle) bundle=$(abs "$2"); shift 2 ;;
    --nvrtc) nvrtc=$(abs "$2"); shift 2 ;;
    --base) base=$2; shift 2 ;;
    --client-base) client_base=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --context) context=$(abs "$2"); shift 2 ;;
    --context-only) context_only=1; shift ;;
    --save) save=$(abs "$2"); shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (--help for usage)" ;;
  esac
done
cd "$root"
version=${version:-$(git describe --always --dirty 2>/dev/null || echo dev)}

# 1. kilnd's context: the bundle, the configuration, the directories kilnd owns. A context is
# made anew each time; a folder that is not one of ours is never removed.
if [ -e "$context" ] && [ ! -f "$context/.kiln-docker-context" ] &&
  [ -n "$(ls -A "$context" 2>/dev/null)" ]; then
  die "refusing to replace $context: not a context made by docker/build.sh"
fi
rm -rf "$context"
mkdir -p "$context/kilnd/dirs/run/kiln" "$context/kilnd/dirs/var/cache/kiln"
touch "$context/.kiln-docker-context"
opt=$context/kilnd/opt/kiln
if [ -n "$bundle" ]; then
  [ -x "$bundle/kilnd" ] || die "$bundle is not a kilnd bundle (scripts/kilnd_bundle.sh)"
  mkdir -p "$(dirname "$opt")"
  cp -a "$bundle" "$opt"
elif [ -n "$kilnd" ]; then
  scripts/kilnd_bundle.sh --kilnd "$kilnd" "$opt"
else
  scripts/kilnd_bundle.sh "$opt"
fi
if [ -n "$nvrtc" ]; then
  [ -f "$nvrtc" ] || die "no NVRTC at $nvrtc"
  # kilnd opens libnvrtc.so.13 (or .12) by name: the bundle's lib/ is its loader's path.
  soname=$(objdump -p "$nvrtc" | sed -n 's/^ *SONAME *//p')
  cp -L "$nvrtc" "$opt/lib/${soname:-$(basename "$nvrtc")}"
  cp -L "$(dirname "$nvrtc")"/libnvrtc-builtins.so.* "$opt/lib/"
fi
cp docker/kilnd.Dockerfile "$context/kilnd/Dockerfile"
cp docker/kilnd.conf "$context/kilnd/kilnd.conf"
log "kilnd context: $context/kilnd ($(du -sh "$opt" | cut -f1) bundle)"

# 2. The client layer's context: this tree's kiln package (kiln._C, kiln.v1 generated if stale)
# and PYTHON's grpcio, protobuf and tabulate (kiln._C is built for PYTHON), files as installed.
client_args=()
if [ -n "$client_base" ] || [ "$context_only" = 1 ]; then
  if [ ! -x "$python" ] && ! command -v "$python" >/dev/null; then
    [ -n "$client_base" ] && die "no Python at $python for the client layer (--python)"
    log "no Python at $python: the client layer's context is not assembled"
  else
    mkdir -p "$context/client/python"
    cp docker/client.Dockerfile "$context/client/Dockerfile"
    PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}" \
      "$python" - "$context/client" <<'EOF'
import shutil, sys
from importlib import metadata
from pathlib import Path

import torch
import kiln
from kiln.daemon import protocol

protocol.ensure_generated()
out = Path(sys.argv[1])
package = Path(kiln.__file__).parent
if not list(package.glob("_C*.so")):
    sys.exit(f"docker/build.sh: {package} has no built kiln._C (scripts/setup.sh builds it)")
shutil.copytree(package, out / "python" / "kiln",
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
for name in ("grpcio", "protobuf", "tabulate"):
    dist = metadata.distribution(name)
    for f in dist.files or ():
        src = Path(dist.locate_file(f)).resolve()
        if f.parts[0] == ".." or "__pycache__" in f.parts or not src.is_file():
            continue  # scripts installed outside site-packages, bytecode
        dst = out / "python" / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
(out / "build-args").write_text(f"KILN_PYTHON={tag}\nKILN_TORCH={torch.__version__}\n")
EOF
    while read -r arg; do client_args+=(--build-arg "$arg"); done <"$context/client/build-args"
    log "client context: $context/client (kiln._C for $(tr '\n' ' ' <"$context/client/build-args"))"
  fi
fi
if [ "$context_only" = 1 ]; then
  log "context ready in $context (nothing built: --context-only)"
  exit 0
fi

# 3. A runtime that builds: the first of KILN_CONTAINER_RUNTIME, docker, podman whose daemon or
# storage answers.
runtime="" why=()
for candidate in ${KILN_CONTAINER_RUNTIME:-docker podman}; do
  if ! command -v "$candidate" >/dev/null; then
    why+=("$candidate: not installed")
  elif out=$("$candidate" info 2>&1 >/dev/null); then
    runtime=$candidate
    break
  else
    why+=("$candidate: $(echo "$out" | grep -v '^ *$' | tail -1)")
  fi
done
if [ -z "$runtime" ]; then
  log "no container runtime can build here ($(IFS=';'; echo "${why[*]:-none tried}")); the" \
    "context is ready, for a base with glibc and g++ (docker/base.sh makes one):"
  log "  docker build -t kiln/kilnd:$version --build-arg BASE_IMAGE=$base $context/kilnd"
  exit 3
fi
build_flags=(--network none)
[ "$runtime" = podman ] && build_flags+=(--format docker)  # keeps HEALTHCHECK

if ! "$runtime" image inspect "$base" >/dev/null 2>&1; then
  if [ "$base" != kiln/kilnd-base:bookworm ]; then
    die "the base image $base is not among $runtime's images (pull or load it first)"
  fi
  docker/base.sh "$runtime" "$base"
fi
image=kiln/kilnd:$version
log "building $image with $runtime on $base"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
"$runtime" build -q "${build_flags[@]}" -t "$image" --build-arg BASE_IMAGE="$base" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" "$context/kilnd" >/dev/null

# 4. Run it once (kilnd --help), finding the flags this host needs: some refuse the ulimits a
# runtime sets by default (no CAP_SYS_RESOURCE), some have cgroups crun does not drive (runc).
cap() { local v; v=$(ulimit "$1"); [ "$v" = unlimited ] && v=$2; echo $((v < $2 ? v : $2)); }
nofile=$(cap -n 65536) nproc=$(cap -u 4096)
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
commands=("$runtime run" "$runtime run ${limits[*]}")
if [ "$runtime" = podman ] && command -v runc >/dev/null; then
  commands+=("podman --runtime runc run" "podman --runtime runc run ${limits[*]}")
fi
rm -f "$context/run-command"
for command in "${commands[@]}"; do
  read -r -a words <<<"$command"
  if "${words[@]}" --rm --network none "$image" --help >/dev/null 2>"$context/run.log"; then
    printf '%s\n' "${words[@]}" >"$context/run-command"
    break
  fi
done
if [ -f "$context/run-command" ]; then
  log "$image runs here with: $(tr '\n' ' ' <"$context/run-command")"
else
  log "$image is built, but no container runs on this host: $(tail -1 "$context/run.log")"
fi

built=("$image")
if [ -n "$client_base" ]; then
  client_image=kiln/client:$version
  log "building $client_image on $client_base"
  "$runtime" build -q "${build_flags[@]}" -t "$client_image" --build-arg BASE_IMAGE="$client_base" \
    --build-arg VERSION="$version" "${client_args[@]}" "$context/client" >/dev/null
  built+=("$client_image")
fi
if [ -n "$save" ]; then
  mkdir -p "$save"
  for name in "${built[@]}"; do
    file=$save/$(echo "$name" | tr '/:' '--').tar
    if [ "$runtime" = podman ]; then
      podman save -q --format oci-archive -o "$file" "$name"
    else
      docker save -o "$file" "$name"
    fi
    log "saved $file"
  done
fi
log "built: ${built[*]}"
