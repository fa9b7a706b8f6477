# Sourced by scripts/setup.sh and scripts/test_py312.sh: a virtual environment with
# requirements.txt installed under requirements.lock, the package found through a .pth file and
# described by its distribution metadata. scripts/deps.sh and scripts/gpu_check.sh use
# kiln_dist_info for their own environments.
#
#   kiln_locked_venv DIR PYTHON   creates DIR with PYTHON if missing; (re)installs when
#                                 requirements.txt or requirements.lock changed since the last
#                                 install; recreates DIR when its pip cannot start, removes it when an
#                                 install fails; points DIR at client/python and writes the
#                                 package's metadata beside. Needs `log` and `root`.
#   kiln_dist_info SITE           writes SITE/kiln-0+dev.dist-info, replacing any other kiln
#                                 metadata there. Needs `root`.

kiln_locked_venv() {
  local dir=$1 py=$2
  # An install killed part-way can leave pip itself unable to start: such a venv is made anew.
  if [ -x "$dir/bin/python" ] && ! "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
    log "$dir has a broken pip (an install was interrupted?): recreating it"
    rm -rf "$dir"
  fi
  if [ ! -x "$dir/bin/python" ]; then
    log "creating $dir with $("$py" --version)"
    "$py" -m venv "$dir"
  fi
  local stamp=$dir/.kiln-requirements
  if ! cat requirements.txt requirements.lock | cmp -s - "$stamp"; then
    log "installing Python packages in $dir (requirements.txt under requirements.lock)"
    # This machine's pip index lists folders it does not have; those warnings are noise.
    "$dir/bin/python" -m pip install -q -c requirements.lock pip setuptools 2>&1 \
      | grep -v "WARNING: Location" || true
    # --no-cache-dir: torch's CUDA libraries are GBs that a cache would hold a second copy of.
    if ! "$dir/bin/python" -m pip install -q --no-cache-dir -r requirements.txt -c requirements.lock \
      2> >(grep -v "WARNING: Location" >&2); then
      # A failed or interrupted install can leave pip itself broken: the next setup starts over.
      log "installing into $dir failed; removing it so that the next setup makes it anew"
      rm -rf "$dir"
      return 1
    fi
    cat requirements.txt requirements.lock > "$stamp"
  fi
  local site
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$root/client/python" > "$site/kiln-dev.pth"
  kiln_dist_info "$site"
}

# The metadata of an install of client/python, for the interpreters that have SITE on their path:
# its entry point is how torch.compile(backend="kiln") finds kiln in a program that never imports
# it (torch reads the `torch_dynamo_backends` group through importlib.metadata). The package's
# files stay where they are (kiln-dev.pth or PYTHONPATH finds them); direct_url.json marks the
# install as editable from the tree, so that `pip freeze --exclude-editable` (scripts/deps.sh
# lock) leaves it out, and RECORD lets `pip uninstall kiln` remove this metadata and no more.
kiln_dist_info() {
  local site=${1:?} name=kiln-0+dev.dist-info
  mkdir -p "$site"
  rm -rf "$site"/kiln-*.dist-info
  mkdir "$site/$name"
  printf '%s\n' "Metadata-Version: 2.1" "Name: kiln" "Version: 0+dev" \
    "Summary: A just-in-time compiler for unmodified PyTorch programs (from $root)" \
    >"$site/$name/METADATA"
  printf '%s\n' "[torch_dynamo_backends]" "kiln = kiln.backends.torch_compile:backend" \
    >"$site/$name/entry_points.txt"
  printf '{"url": "file://%s/client/python", "dir_info": {"editable": true}}\n' "$root" \
    >"$site/$name/direct_url.json"
  echo "kiln-setup" >"$site/$name/INSTALLER"
  local f
  for f in METADATA entry_points.txt direct_url.json INSTALLER RECORD; do
    echo "$name/$f,,"
  done >"$site/$name/RECORD"
}
