"""The daemon client's settings: the client's paths are the ones `kilnd --print-paths` prints
(one implementation, daemon/paths.h, under kiln._C.default_paths) whatever the environment
says; the process reads the settings once, and again after kiln.reset()."""
import os
import subprocess

import pytest

import kiln
from kiln import _C
from kiln.daemon import protocol
from kiln.daemon.settings import DaemonSettings
from kiln.state import STATE

KILND = STATE.daemon.settings.kilnd

# The variables that move kiln's paths; each case sets some (relative to a private folder) and
# unsets the others. HOME is always a private folder: nothing here names the user's own.
MOVERS = ("KILN_CACHE_DIR", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "KILN_MAC_KEY_FILE", "HOME")
CASES = {
    "neither": ({}, {"cache-dir": "home/.cache/kiln", "socket": "home/.cache/kiln/kilnd.sock"}),
    "XDG_RUNTIME_DIR": ({"XDG_RUNTIME_DIR": "run"},
                        {"cache-dir": "home/.cache/kiln", "socket": "run/kiln/kilnd.sock"}),
    "KILN_CACHE_DIR": ({"KILN_CACHE_DIR": "private", "XDG_RUNTIME_DIR": "run"},
                       {"cache-dir": "private", "socket": "private/kilnd.sock"}),
    "XDG_CACHE_HOME and KILN_MAC_KEY_FILE": (
        {"XDG_CACHE_HOME": "xdg", "KILN_MAC_KEY_FILE": "keys/mac.key"},
        {"cache-dir": "xdg/kiln", "socket": "xdg/kiln/kilnd.sock", "mac-key-file": "keys/mac.key"}),
}


def environment(root, values):
    env = {k: v for k, v in os.environ.items() if k not in MOVERS}
    env["HOME"] = str(root / "home")
    env.update({k: str(root / v) for k, v in values.items()})
    return env


def kilnd_paths(env):
    done = subprocess.run([KILND, "--print-paths"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


@pytest.mark.skipif(KILND is None, reason="kilnd is not built on this machine")
@pytest.mark.parametrize("case", CASES)
def test_client_paths_are_the_ones_kilnd_prints(tmp_path, case):
    values, expected = CASES[case]
    env = environment(tmp_path, values)
    printed = kilnd_paths(env)
    settings = DaemonSettings.from_env(env)
    client = {"cache-dir": str(settings.cache_dir), "socket": str(settings.socket),
              "mac-key-file": str(settings.mac_key_file),
              "log-file": _C.default_paths(env)["log_file"]}
    assert client == printed
    expected = {"mac-key-file": expected["cache-dir"] + "/mac.key",
                "log-file": expected["cache-dir"] + "/kilnd.log", **expected}
    assert printed == {k: str(tmp_path / v) for k, v in expected.items()}
    assert not (tmp_path / "home").exists()  # printing creates nothing


def test_settings_are_read_once_and_again_after_reset(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("KILN_DAEMON_START_TIMEOUT", "2.5")
    kiln.reset()
    assert STATE.daemon.settings.cache_dir == tmp_path / "a"
    assert STATE.daemon.settings.start_timeout == 2.5
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "b"))
    assert STATE.daemon.settings.cache_dir == tmp_path / "a"
    kiln.reset()
    assert STATE.daemon.settings.cache_dir == tmp_path / "b"
    assert STATE.daemon.settings.socket == tmp_path / "b" / "kilnd.sock"


def test_a_timeout_that_is_not_a_number_keeps_its_default(caplog):
    settings = DaemonSettings.from_env({"HOME": "/h", "KILN_DAEMON_START_TIMEOUT": "soon",
                                        "KILN_DAEMON": ""})
    assert settings.start_timeout == 10.0 and settings.address is None
    assert "KILN_DAEMON_START_TIMEOUT" in caplog.text


@pytest.mark.skipif(not protocol.available(), reason="grpcio-tools/protobuf missing")
def test_reset_keeps_the_daemon_client_unless_its_settings_changed(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_DAEMON", f"unix://{tmp_path}/a.sock")
    kiln.reset()
    client = STATE.daemon.client()  # a channel; nothing is asked of a daemon
    kiln.reset()
    assert STATE.daemon.client() is client  # its channel and back-off state too
    monkeypatch.setenv("KILN_DAEMON", f"unix://{tmp_path}/b.sock")
    kiln.reset()
    assert STATE.daemon.client() is not client
    assert STATE.daemon.client().target == f"unix://{tmp_path}/b.sock"
    STATE.daemon.close()
    assert STATE.daemon._client is None


def test_a_started_kilnd_is_told_where_nvrtc_is(tmp_path):
    from kiln.daemon.client import _kilnd_environment

    lib = tmp_path / "libnvrtc.so.13"
    lib.write_bytes(b"")
    named = DaemonSettings.from_env({"KILN_NVRTC": str(lib)})
    assert named.nvrtc == str(lib)
    env = _kilnd_environment(named)
    assert env["KILN_NVRTC"] == str(lib)
    # Without KILN_NVRTC the client names the NVRTC of this Python's CUDA wheels, where it has
    # one (torch's CUDA builds bring it); kilnd cannot look into Python's packages itself.
    found = DaemonSettings.from_env({}).nvrtc
    if found is not None:
        assert os.path.basename(found).startswith("libnvrtc.so.") and os.path.exists(found)
