"""Shared fixtures: every test starts with no compiled entries and the default config; tests of
the "kiln" backend share one kilnd in a private cache directory (`kilnd_cache`)."""
import os
import subprocess

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh_kiln():
    kiln.reset()
    saved = (kiln.config.debug, kiln.config.cache_size_limit, kiln.config.log)
    torch.manual_seed(0)
    yield
    kiln.config.debug, kiln.config.cache_size_limit, kiln.config.log = saved
    kiln.reset()


@pytest.fixture(scope="session")
def kilnd_cache(tmp_path_factory):
    """A kilnd the client starts on first use, in a private cache directory; stopped at the end.
    Tests that take it skip when kilnd or the kiln.v1 modules are not available."""
    from kiln.daemon import protocol
    from kiln.state import STATE

    kilnd = STATE.daemon.settings.kilnd
    if kilnd is None:
        pytest.skip("kilnd is not built on this machine")
    if not protocol.available():
        pytest.skip("grpcio-tools/protobuf missing")
    root = tmp_path_factory.mktemp("kiln-cache")
    names = ("KILN_CACHE_DIR", "XDG_RUNTIME_DIR", "KILN_DAEMON", "KILN_MAC_KEY_FILE")
    saved = {k: os.environ.get(k) for k in names}
    for k in names:
        os.environ.pop(k, None)
    os.environ["KILN_CACHE_DIR"] = str(root)
    kiln.reset()  # the daemon's settings are read again: a client of this cache directory
    yield root
    kiln.wait_for_compiles(timeout=120)  # a background compile finishes with this daemon
    subprocess.run([kilnd, "--stop", "--socket", str(root / "kilnd.sock")], capture_output=True,
                   timeout=60)
    STATE.daemon.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    kiln.reset()
