"""The client's own tier of artifacts (kiln.daemon.local_artifacts): artifacts from the kilnd a
client started are kept in the cache directory and served to later processes without kilnd,
each verified when read, only while the kilnd binary is the one whose compiler built them, and
within a byte limit, least recently used removed first."""
import hashlib
import hmac
import os
import time

import pytest

from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available", allow_module_level=True)

from kiln.daemon.local_artifacts import LocalArtifacts  # noqa: E402
from kiln.daemon.settings import DaemonSettings  # noqa: E402

pb = protocol.messages()
CPU, CUDA = pb.graph.DEVICE_KIND_CPU, pb.graph.DEVICE_KIND_CUDA


def settings_in(root, limit=1 << 20, address=None):
    key = root / "mac.key"
    if not key.exists():
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
    binary = root / "kilnd"
    if not binary.exists():
        binary.write_bytes(b"a kilnd binary")
    return DaemonSettings(address=address, ca_file=None, token_file=None, cache_dir=root,
                          socket=root / "kilnd.sock", mac_key_file=key, kilnd=str(binary),
                          local_artifact_bytes=limit)


def key_of(settings) -> bytes:
    return settings.mac_key_file.read_bytes()


def local(settings) -> LocalArtifacts:
    """The tier as a process of the fleet opens it (with the fleet's MAC key)."""
    return LocalArtifacts(settings, key_of(settings))


def signed(settings, n, version="cpu-1", kind=CPU, size=100):
    """A signed Artifact under the key of `n`, as kilnd answers it, and its body."""
    key = hashlib.sha256(str(n).encode()).hexdigest()
    body = pb.artifact.ArtifactBody(key=key, compiler_version=version,
                                    target=pb.target.Target(device_kind=kind),
                                    kernel_binary=os.urandom(size))
    data = body.SerializeToString()
    mac = hmac.new(key_of(settings), data, hashlib.sha256).digest()
    return pb.artifact.Artifact(body=data, mac=mac), body


def started(settings, cpu="cpu-1", cuda="cuda-1"):
    """What a client records when it has started the settings' kilnd binary."""
    health = pb.service.HealthResponse(compiler_version=cpu, compiler_versions=[
        pb.service.CompilerVersion(device_kind=CPU, version=cpu),
        pb.service.CompilerVersion(device_kind=CUDA, version=cuda)])
    local(settings).record_started_kilnd(health)


def test_an_artifact_from_the_started_kilnd_is_served_to_a_later_process(tmp_path):
    s = settings_in(tmp_path)
    started(s)
    artifact, body = signed(s, 1)
    local(s).keep(artifact, body)
    later = local(s)  # another process: nothing in memory
    got = later.kept(body.key, CPU)
    assert got is not None and got.kernel_binary == body.kernel_binary
    assert later.kept(hashlib.sha256(b"2").hexdigest(), CPU) is None  # never kept


def test_nothing_is_kept_or_served_without_a_record_of_the_kilnd_binary(tmp_path):
    s = settings_in(tmp_path)
    artifact, body = signed(s, 1)
    local(s).keep(artifact, body)  # no client has started this binary
    assert not (tmp_path / "artifacts" / body.key[:2] / body.key).exists()
    started(s)
    local(s).keep(artifact, body)
    remote = settings_in(tmp_path, address="unix:///elsewhere.sock")  # KILN_DAEMON
    assert local(remote).kept(body.key, CPU) is None
    assert local(s).kept(body.key, CPU) is not None


def test_an_upgraded_kilnd_binary_is_not_served_the_old_compilers_artifacts(tmp_path):
    s = settings_in(tmp_path)
    started(s)
    artifact, body = signed(s, 1)
    local(s).keep(artifact, body)
    binary = tmp_path / "kilnd"
    binary.write_bytes(b"a new kilnd binary, another compiler")
    assert local(s).kept(body.key, CPU) is None
    # Started again, the new binary reports its compiler: the old artifact stays unused.
    started(s, cpu="cpu-2")
    assert local(s).kept(body.key, CPU) is None
    newer, newer_body = signed(s, 2, version="cpu-2")
    local(s).keep(newer, newer_body)
    assert local(s).kept(newer_body.key, CPU) is not None


def test_an_artifact_of_another_compiler_or_kind_is_neither_kept_nor_served(tmp_path):
    s = settings_in(tmp_path)
    started(s)
    old, old_body = signed(s, 1, version="cpu-0")
    local(s).keep(old, old_body)
    assert not (tmp_path / "artifacts" / old_body.key[:2] / old_body.key).exists()
    gpu, gpu_body = signed(s, 2, version="cuda-1", kind=CUDA)
    local(s).keep(gpu, gpu_body)
    assert local(s).kept(gpu_body.key, CUDA) is not None
    assert local(s).kept(gpu_body.key, CPU) is None  # the CPU compiler is cpu-1


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-key", "other-name"])
def test_a_damaged_or_misfiled_artifact_is_a_miss(tmp_path, damage):
    s = settings_in(tmp_path)
    started(s)
    artifact, body = signed(s, 1)
    local(s).keep(artifact, body)
    path = tmp_path / "artifacts" / body.key[:2] / body.key
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "other-key":  # validly signed, by another daemon's key
        (tmp_path / "other").mkdir()
        path.write_bytes(signed(settings_in(tmp_path / "other"), 1)[0].SerializeToString())
    else:  # a valid artifact of another key, filed under this one
        path.write_bytes(signed(s, 2)[0].SerializeToString())
    assert local(s).kept(body.key, CPU) is None


def test_kept_artifacts_beyond_the_limit_go_least_recently_used_first(tmp_path):
    s = settings_in(tmp_path)
    size = len(signed(s, 0, size=1000)[0].SerializeToString())
    # Three fit; a fourth goes beyond the limit, and evicting one is enough (within 90% of it).
    s = settings_in(tmp_path, limit=int(3.6 * size))
    started(s)
    tier = local(s)
    bodies = []
    for n in range(3):
        artifact, body = signed(s, n, size=1000)
        tier.keep(artifact, body)
        bodies.append(body)
        time.sleep(0.01)
    assert tier.kept(bodies[0].key, CPU) is not None
    time.sleep(0.01)
    assert tier.kept(bodies[2].key, CPU) is not None  # 1 is now the least recently used
    time.sleep(0.01)
    artifact, body = signed(s, 3, size=1000)
    tier.keep(artifact, body)
    present = [tier.kept(b.key, CPU) is not None for b in bodies + [body]]
    assert present == [True, False, True, True]
    total = sum(p.stat().st_size for p in (tmp_path / "artifacts").glob("??/*"))
    assert total <= s.local_artifact_bytes


def test_a_limit_of_zero_keeps_nothing(tmp_path):
    s = settings_in(tmp_path, limit=0)
    started(s)
    artifact, body = signed(s, 1)
    local(s).keep(artifact, body)
    assert local(s).kept(body.key, CPU) is None


def test_the_limit_is_read_from_the_environment(tmp_path, caplog):
    base = {"KILN_CACHE_DIR": str(tmp_path)}
    assert DaemonSettings.from_env(base).local_artifact_bytes == 1 << 30
    assert DaemonSettings.from_env({**base, "KILN_LOCAL_ARTIFACT_BYTES": "0"}) \
        .local_artifact_bytes == 0
    assert DaemonSettings.from_env({**base, "KILN_LOCAL_ARTIFACT_BYTES": "many"}) \
        .local_artifact_bytes == 1 << 30
    assert "not a number of bytes" in caplog.text
