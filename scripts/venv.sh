# Sourced by scripts/setup.sh and scripts/test_py312.sh: a virtual environment with
# requirements.txt installed under requirements.lock, the package found through a .pth file.
#
#   kiln_locked_venv DIR PYTHON   creates DIR with PYTHON if missing; (re)installs when
#                                 requirements.txt or requirements.lock changed since the last
#                                 install; recreates DIR when its pip cannot start, removes it when an
#                                 install fails; points DIR at client/python. Needs `log` and `root`.

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
    if ! "$dir/bin/python" -m pip install -q -r requirements.txt -c requirements.lock \
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
}
