"""Moving a warm cache between machines that share no kilnd: `python -m kiln cache export`
writes the stored captures of a cache directory and the artifacts they name into one signed
bundle; `python -m kiln cache import` checks it and adds both to another cache directory, where
a process installs the captures and loads the artifacts without any kilnd.

A bundle is a tar archive (read in memory, never extracted by its own paths) of
`captures/<key>` (the stored records, each signed as the store signs it), `artifacts/<key>`
(kiln.v1.Artifact messages, signed by the kilnd that built them) and `manifest.json` (every
member's sha256), whose HMAC under the fleet's MAC key is `manifest.tag`. Import refuses a
bundle whose tag or any member fails, and each artifact must verify under that key for the very
key it is filed under. Both machines must hold the fleet's MAC key (KILN_MAC_KEY_FILE): it is
never in the bundle."""
import hashlib
import hmac
import io
import json
import os
import re
import tarfile
import tempfile
import time
from pathlib import Path

from kiln.daemon.local_artifacts import LocalArtifacts

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MEMBER = re.compile(r"(captures|artifacts)/([0-9a-f]{64})")
_DOMAIN = b"kiln-cache-bundle-v1\0"
MAX_BUNDLE_BYTES = 8 << 30


class BundleError(Exception):
    """A bundle that cannot be written or that import refuses."""


def _tag(mac_key: bytes, manifest: bytes) -> str:
    return hmac.new(mac_key, _DOMAIN + manifest, hashlib.sha256).hexdigest()


def _mac_key(settings) -> bytes:
    from kiln.daemon.client import DaemonUnavailable, read_mac_key

    try:
        return read_mac_key(settings.mac_key_file)
    except DaemonUnavailable as e:
        raise BundleError(f"the fleet's MAC key is needed ({e}); set KILN_MAC_KEY_FILE") from e


def _artifact_keys(record_entries) -> set:
    keys = set()
    for entry in record_entries:
        graph = entry.get("graph") if isinstance(entry, dict) else None
        key = graph.get("artifact") if isinstance(graph, dict) else None
        if isinstance(key, str) and _HEX64.fullmatch(key):
            keys.add(key)
    return keys


def export_bundle(settings, out: Path) -> dict:
    """Writes the bundle of `settings.cache_dir`'s stored captures and their artifacts (fetched
    from kilnd, or from artifacts imported earlier) to `out`; returns its counts."""
    from kiln.daemon import artifact as art
    from kiln.daemon.capture_store import CaptureStore
    from kiln.state import STATE

    mac_key = _mac_key(settings)
    store = CaptureStore(settings.cache_dir / "captures", mac_key)
    members = {}
    wanted = set()
    for key in store.keys():
        raw = store.read_raw(key)
        entries = store.decode(key, raw) if raw is not None else []
        if entries:  # only records this store (this MAC key) vouches for
            members[f"captures/{key}"] = raw
            wanted |= _artifact_keys(entries)
    missing = []
    for key in sorted(wanted):
        data = LocalArtifacts(settings, mac_key).imported_raw(key)
        if data is None:
            found = STATE.daemon.client().lookup_key(key)
            if not found.found:
                missing.append(key)
                continue
            art.verify(found.artifact, mac_key, key)
            data = found.artifact.SerializeToString()
        members[f"artifacts/{key}"] = data
    manifest = json.dumps({"format": 1, "made": time.time(),
                           "members": {name: hashlib.sha256(data).hexdigest()
                                       for name, data in sorted(members.items())}},
                          sort_keys=True).encode()
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", prefix=".kiln-")
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w") as tar:
        for name, data in [("manifest.json", manifest),
                           ("manifest.tag", _tag(mac_key, manifest).encode()),
                           *sorted(members.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return {"captures": sum(n.startswith("captures/") for n in members),
            "artifacts": sum(n.startswith("artifacts/") for n in members),
            "missing_artifacts": missing}


def import_bundle(settings, bundle: Path) -> dict:
    """Checks `bundle` and adds its captures and artifacts to `settings.cache_dir`."""
    from kiln.daemon import artifact as art
    from kiln.daemon import protocol
    from kiln.daemon.capture_store import CaptureStore

    mac_key = _mac_key(settings)
    if Path(bundle).stat().st_size > MAX_BUNDLE_BYTES:
        raise BundleError("bundle larger than any kiln writes")
    members = {}
    try:
        with tarfile.open(bundle, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    raise BundleError(f"bundle member {info.name!r} is not a file")
                members[info.name] = tar.extractfile(info).read()
    except (tarfile.TarError, OSError) as e:
        raise BundleError(f"not a kiln cache bundle: {e}") from e
    manifest = members.pop("manifest.json", None)
    tag = members.pop("manifest.tag", b"")
    if manifest is None or not hmac.compare_digest(tag, _tag(mac_key, manifest).encode()):
        raise BundleError("the bundle is not signed with this fleet's MAC key")
    listed = json.loads(manifest).get("members", {})
    if set(listed) != set(members):
        raise BundleError("the bundle's members are not those its manifest lists")
    pb = protocol.messages()
    store = CaptureStore(settings.cache_dir / "captures", mac_key)
    counts = {"captures": 0, "artifacts": 0}
    for name, data in sorted(members.items()):
        m = _MEMBER.fullmatch(name)
        if m is None or hashlib.sha256(data).hexdigest() != listed[name]:
            raise BundleError(f"bundle member {name!r} is damaged or unknown")
        kind, key = m.groups()
        if kind == "captures":
            if not store.decode(key, data):
                raise BundleError(f"stored capture {key[:16]}… does not verify")
            store.merge(key, store.decode(key, data))
        else:
            artifact = pb.artifact.Artifact()
            try:
                artifact.ParseFromString(data)
                art.verify(artifact, mac_key, key)
            except Exception as e:
                raise BundleError(f"artifact {key[:16]}… does not verify: {e}") from e
            if not LocalArtifacts(settings, mac_key).import_bytes(key, data):
                raise BundleError(f"cannot write artifact {key[:16]}… into {settings.cache_dir}")
        counts[kind] += 1
    return counts


