"""deploy/check_manifests.py: kiln's Kubernetes manifests pass it, and each kind of mistake it
exists for, made in a copy of them, fails it with a message that names the mistake."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
CHECKER = ROOT / "deploy" / "check_manifests.py"

_spec = importlib.util.spec_from_file_location("check_manifests", CHECKER)
check_manifests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_manifests)
KILND = check_manifests.find_kilnd(None)


def test_manifests_pass_the_checker():
    done = subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors" in done.stdout


def _edit(directory, file, edit):
    path = directory / file
    docs = list(yaml.safe_load_all(path.read_text()))
    edit(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _kind(docs, kind, name=None):
    return next(d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"]))


def _kilnd_container(docs):
    return _kind(docs, "StatefulSet", "kilnd")["spec"]["template"]["spec"]["containers"][0]


def _set_config(docs, key, value):
    """Sets (or, with value None, removes) one line of kilnd.conf in the ConfigMap."""
    config = _kind(docs, "ConfigMap")
    lines = [l for l in config["data"]["kilnd.conf"].splitlines()
             if not l.startswith(key + " ")]
    if value is not None:
        lines.append(f"{key} = {value}")
    config["data"]["kilnd.conf"] = "\n".join(lines) + "\n"


def _selector(docs):
    _kind(docs, "StatefulSet", "kilnd")["spec"]["selector"]["matchLabels"] = {
        "app.kubernetes.io/name": "kiln-daemon"}


def _drop_mac_key_secret(docs):
    docs.remove(_kind(docs, "Secret", "kiln-mac-key"))


def _real_token(docs):
    _kind(docs, "Secret", "kilnd-token")["stringData"]["token"] = "3f9a" * 16


def _probe_path(docs):
    _kilnd_container(docs)["readinessProbe"]["exec"]["command"][0] = "/usr/local/bin/kilnd"


def _probe_socket(docs):
    _kilnd_container(docs)["livenessProbe"]["exec"]["command"][-1] = "/run/kiln/kilnd.sock"


def _undeclared_volume(docs):
    _kilnd_container(docs)["volumeMounts"][0]["name"] = "caches"


def _writable_root(docs):
    _kilnd_container(docs)["securityContext"]["readOnlyRootFilesystem"] = False


def _service_port(docs):
    _kind(docs, "Service", "kilnd")["spec"]["ports"][0]["targetPort"] = "grpcs"


def _metrics_annotation(docs):
    template = _kind(docs, "StatefulSet", "kilnd")["spec"]["template"]
    template["metadata"]["annotations"]["prometheus.io/port"] = "9090"


BROKEN = {
    "selector": ("kilnd-statefulset.yaml", _selector, "does not select its pods' labels"),
    "missing secret": ("secrets.example.yaml", _drop_mac_key_secret,
                       "names Secret 'kiln-mac-key', which is not in the set"),
    "committed key": ("secrets.example.yaml", _real_token, "token is not a placeholder"),
    "probe binary": ("kilnd-statefulset.yaml", _probe_path, "not the image's kilnd"),
    "probe socket": ("kilnd-statefulset.yaml", _probe_socket, "kilnd serves /run/kiln/sock"),
    "undeclared volume": ("kilnd-statefulset.yaml", _undeclared_volume,
                          "mounts 'caches', which is no volume of the pod"),
    "writable root": ("kilnd-statefulset.yaml", _writable_root, "root file system is writable"),
    "service port": ("kilnd-service.yaml", _service_port, "targets 'grpcs'"),
    "metrics annotation": ("kilnd-statefulset.yaml", _metrics_annotation,
                           "prometheus.io/port is 9090"),
    "unknown config key": ("kilnd-config.yaml", lambda d: _set_config(d, "cache_size", "1"),
                           "cache"),
    "unmounted key file": ("kilnd-config.yaml",
                           lambda d: _set_config(d, "mac_key_file", "/etc/kiln/keys/mac.key"),
                           "mac_key_file /etc/kiln/keys/mac.key is on no volume"),
    "socket on a volume's root": ("kilnd-config.yaml",
                                  lambda d: _set_config(d, "socket", "/run/kiln/kilnd.sock"),
                                  "is a volume's root"),
    "redis service": ("kilnd-config.yaml", lambda d: _set_config(d, "redis", "valkey:6379"),
                      "no Service valkey"),
}


@pytest.mark.parametrize("mistake", sorted(BROKEN))
def test_checker_catches_a_broken_copy(mistake, tmp_path):
    file, edit, expected = BROKEN[mistake]
    copy = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, copy)
    _edit(copy, file, edit)
    report = check_manifests.check(copy)
    assert any(expected in e for e in report.errors), report.errors


@pytest.mark.skipif(KILND is None, reason="kilnd is not built: its parser is not there to ask")
def test_checker_asks_kilnd_about_the_combination_of_settings(tmp_path):
    copy = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, copy)
    _edit(copy, "kilnd-config.yaml", lambda d: _set_config(d, "tls_key", None))
    done = subprocess.run([sys.executable, str(CHECKER), str(copy)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert "refusing a TCP listener without --tls-cert, --tls-key and --token-file" in done.stdout
