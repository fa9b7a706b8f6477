"""kiln's images (docker/): docker/build.sh builds kilnd's image and the client layer; started
with a socket volume and a cache volume, kilnd serves kiln's client through the socket as uid
10001, builds a graph's kernels with the image's g++, and exits cleanly on SIGTERM. The client
layer's context is an importable kiln. Tests that need a container runtime skip, saying why,
where none can build or run containers here."""
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

import kiln
from kiln.daemon.client import DaemonClient, DaemonUnavailable

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "docker" / "build.sh"
BASE = "kiln/kilnd-base:bookworm"
KILND_UID = 10001


def _kilnd_binary():
    for candidate in (os.environ.get("KILN_KILND"), ROOT / "build" / "daemon" / "kilnd"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def _runtime():
    """The runtime build.sh picks (KILN_CONTAINER_RUNTIME, else docker, else podman), or None
    and why none answers."""
    why = []
    for name in os.environ.get("KILN_CONTAINER_RUNTIME", "docker podman").split():
        if shutil.which(name) is None:
            why.append(f"{name}: not installed")
            continue
        done = subprocess.run([name, "info"], capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return name, ""
        lines = [l for l in done.stderr.splitlines() if l.strip()]
        why.append(f"{name}: {lines[-1] if lines else f'exit {done.returncode}'}")
    return None, "; ".join(why)


def _run(*args, **kwargs):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """(runtime, run command, kilnd image, client image) built by docker/build.sh."""
    runtime, why = _runtime()
    if runtime is None:
        pytest.skip(f"no container runtime can build here ({why})")
    if os.geteuid() != 0:
        pytest.skip("the socket volume is handed to kilnd's uid 10001 with chown: needs root")
    kilnd = _kilnd_binary()
    if kilnd is None:
        pytest.skip("kilnd is not built on this machine")
    if _run(runtime, "image", "inspect", BASE).returncode != 0 and not shutil.which("debootstrap"):
        pytest.skip(f"no {BASE} in {runtime}'s images and no debootstrap to make it")
    context = tmp_path_factory.mktemp("docker-context")
    version = f"test-{uuid.uuid4().hex[:8]}"
    # The first build makes the base image (debootstrap: a few minutes); later ones reuse it.
    done = subprocess.run([str(BUILD), "--kilnd", kilnd, "--version", version, "--context",
                           str(context), "--client-base", BASE, "--python", sys.executable],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "KILN_CONTAINER_RUNTIME": runtime})
    if done.returncode == 3:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr
    kilnd_image, client_image = f"kiln/kilnd:{version}", f"kiln/client:{version}"
    try:
        if not (context / "run-command").exists():
            log = (context / "run.log").read_text().strip().splitlines()
            pytest.skip(f"images build, but no container runs here: {log[-1] if log else '?'}")
        run = (context / "run-command").read_text().split("\n")[:-1]
        yield runtime, run + ["--no-healthcheck"], kilnd_image, client_image
    finally:
        _run(runtime, "rmi", "-f", kilnd_image, client_image)


@pytest.fixture
def kilnd_container(images, tmp_path):
    """kilnd's image running with its socket's directory bound from here (0700, uid 10001) and
    its cache in a new named volume; yields (runtime, container, socket directory)."""
    runtime, run, image, _ = images
    sockets = tmp_path / "run"
    sockets.mkdir(mode=0o700)
    os.chown(sockets, KILND_UID, KILND_UID)
    name = f"kiln-test-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-cache"
    assert _run(runtime, "volume", "create", volume).returncode == 0
    try:
        done = _run(*run, "-d", "--name", name, "--network", "none", "-v",
                    f"{sockets}:/run/kiln", "-v", f"{volume}:/var/cache/kiln", image)
        assert done.returncode == 0, done.stderr
        yield runtime, name, sockets
    finally:
        _run(runtime, "rm", "-f", name)
        _run(runtime, "volume", "rm", "-f", volume)


def _healthy_client(socket: Path, runtime, name, seconds=30.0):
    client = DaemonClient(f"unix://{socket}", autostart=False)
    deadline = time.monotonic() + seconds
    while True:
        try:
            return client, client.health(timeout=2.0)
        except DaemonUnavailable:
            if time.monotonic() > deadline:
                logs = _run(runtime, "logs", name)
                pytest.fail(f"kilnd's container does not answer: {logs.stdout}{logs.stderr}")
            time.sleep(0.2)


def test_kilnd_image_serves_health_on_the_socket_volume_as_non_root(kilnd_container):
    runtime, name, sockets = kilnd_container
    client, health = _healthy_client(sockets / "kilnd.sock", runtime, name)
    try:
        assert health.state == health.STATE_SERVING
        assert client.stats().compiles == 0
    finally:
        client.close()
    st = os.stat(sockets / "kilnd.sock")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (KILND_UID, 0o600)
    assert _run(runtime, "exec", name, "id", "-u").stdout.strip() == str(KILND_UID)
    # The cache (RocksDB and the MAC key) is on the volume; the image's own kilnd --stats
    # (the Kubernetes probe) finds the daemon.
    cache = _run(runtime, "exec", name, "ls", "/var/cache/kiln").stdout.split()
    assert {"artifacts", "mac.key"} <= set(cache)
    assert _run(runtime, "exec", name, "kilnd", "--stats").returncode == 0


def test_kilnd_image_compiles_a_graph_for_a_client_of_the_socket(kilnd_container, monkeypatch,
                                                                    tmp_path):
    runtime, name, sockets = kilnd_container
    _healthy_client(sockets / "kilnd.sock", runtime, name)[0].close()
    # The client verifies artifacts with kilnd's key: a copy of its own, as a client container
    # given the key's volume would read it.
    key = subprocess.run([runtime, "exec", name, "cat", "/var/cache/kiln/mac.key"],
                         capture_output=True, timeout=60, check=True).stdout
    key_file = tmp_path / "mac.key"
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    monkeypatch.setenv("KILN_DAEMON", f"unix://{sockets / 'kilnd.sock'}")
    monkeypatch.setenv("KILN_MAC_KEY_FILE", str(key_file))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "client-cache"))
    kiln.reset()

    def f(x, y):
        return torch.relu(x * 2.0 + y) - torch.sigmoid(x)

    x, y = torch.randn(16, 9), torch.randn(9)
    with torch.no_grad():
        out = kiln.compile(f, backend="kiln")(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert kiln.debug.artifact(f) is not None, "kilnd's container did not compile the graph"


def test_kilnd_container_drains_and_exits_on_sigterm(kilnd_container):
    runtime, name, sockets = kilnd_container
    _healthy_client(sockets / "kilnd.sock", runtime, name)[0].close()
    start = time.monotonic()
    assert _run(runtime, "stop", "-t", "60", name).returncode == 0
    # kilnd is PID 1: it must handle SIGTERM itself, not wait for the runtime's SIGKILL.
    assert time.monotonic() - start < 30
    state = _run(runtime, "inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    assert state == "0"


def test_client_layer_puts_kiln_on_the_serving_image(images):
    runtime, run, _, client_image = images
    done = _run(*run, "--rm", "--network", "none", "--entrypoint", "/bin/sh", client_image, "-c",
                'ls /opt/kiln/python/kiln/_C*.so /opt/kiln/python/kiln/v1/service_pb2.py '
                '/opt/kiln/python/grpc/__init__.py && echo "$PYTHONPATH $KILN_DAEMON"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["/opt/kiln/python", "unix:///run/kiln/kilnd.sock"]


def test_client_layer_context_is_an_importable_kiln(tmp_path):
    """Needs no runtime: the context build.sh assembles for the client layer imports kiln, its
    extension and its kiln.v1 messages from there alone."""
    if not list((ROOT / "client" / "python" / "kiln").glob("_C*.so")):
        pytest.skip("kiln._C is not built in this tree")
    bundle = tmp_path / "bundle"  # any bundle: the kilnd part is not what this test looks at
    (bundle / "lib").mkdir(parents=True)
    (bundle / "kilnd").write_text("#!/bin/sh\n")
    (bundle / "kilnd").chmod(0o755)
    context = tmp_path / "context"
    done = subprocess.run([str(BUILD), "--bundle", str(bundle), "--context", str(context),
                           "--context-only", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    python = context / "client" / "python"
    done = subprocess.run(
        [sys.executable, "-c", "import kiln, grpc; from kiln.daemon import protocol; "
         "protocol.messages(); print(kiln.__file__); print(grpc.__file__)"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(python)})
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split():
        assert Path(line).is_relative_to(python), line
