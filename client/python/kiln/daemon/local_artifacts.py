"""The client's own tier of artifacts, in its private cache directory, before kilnd: those
imported from a cache bundle (`imported/`, kept), and every artifact this machine's processes
received from the kilnd their client started (`artifacts/`, the least recently used removed
beyond KILN_LOCAL_ARTIFACT_BYTES), as kiln.v1.Artifact bytes. A process that starts on a warm
machine loads its plans from here: no kilnd call, no gRPC import.

Whatever is read here is verified each time: its MAC under the fleet's key and its signed key,
the one asked for. An artifact from kilnd is served only while its compiler is that of the
kilnd binary a client would start now: the versions a client recorded when it started that very
binary (`artifacts/kilnd.json`: the binary's path, size, modification time and inode, and the
compiler versions its Health answer gave). Once kilnd is upgraded the record no longer matches,
and artifacts come from kilnd again, which refuses those of another compiler. A daemon this
client did not start (KILN_DAEMON, another process's service) leaves nothing here: its compiler
may change at any time."""
import json
import logging
import os
import re
from pathlib import Path
from typing import Optional

from kiln.daemon.private_files import write_private

log = logging.getLogger("kiln")

_HEX64 = re.compile(r"[0-9a-f]{64}")
_RECORD = "kilnd.json"
# What eviction leaves of the limit, so that each artifact kept does not evict again.
_AFTER_EVICTION = 0.9


class LocalArtifacts:
    """The tier of one cache directory (`settings`: kiln.daemon.settings.DaemonSettings), read
    with the fleet's MAC key `mac_key` (None: none yet, and nothing here is served)."""

    def __init__(self, settings, mac_key: Optional[bytes]):
        self.settings = settings
        self.root = Path(settings.cache_dir)
        self.limit = settings.local_artifact_bytes
        self._mac_key = mac_key

    # -- reading ---------------------------------------------------------------------------

    def imported(self, key: str):
        """The verified ArtifactBody imported under `key` from a bundle, or None (none imported,
        or one that does not verify: the caller goes to kilnd). Its compiler is the fleet's,
        whatever kilnd this machine runs."""
        return self._verified(self._path("imported", key), key)

    def kept(self, key: str, device_kind: int):
        """The verified ArtifactBody kept under `key` from kilnd, when its compiler is the one
        the kilnd binary a client would start now builds `device_kind` (kiln.v1.DeviceKind)
        with; else None."""
        version = self.compiler_version_for(device_kind)
        if version is None:
            return None
        path = self._path("artifacts", key)
        body = self._verified(path, key)
        if body is None or body.compiler_version != version:
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return body

    def imported_raw(self, key: str) -> Optional[bytes]:
        """The Artifact bytes imported under `key`, unverified (for a bundle, whose reader
        verifies them), or None."""
        return self._read(self._path("imported", key))

    # -- writing ---------------------------------------------------------------------------

    def keep(self, artifact, body) -> None:
        """Keeps `artifact`, received from kilnd and verified (its `body`), when its compiler is
        the one recorded for the kilnd binary a client would start; then removes the least
        recently used kept artifacts beyond the limit. Best effort: a failure leaves the next
        process to ask kilnd."""
        if self.limit <= 0 or body.compiler_version != self.compiler_version_for(
                body.target.device_kind):
            return
        path = self._path("artifacts", body.key)
        if path is None or not write_private(path, artifact.SerializeToString()):
            return
        self._evict(keep=path)

    def import_bytes(self, key: str, data: bytes) -> bool:
        """Adds a bundle's artifact (checked by the caller) under `key`."""
        path = self._path("imported", key)
        return path is not None and write_private(path, data)

    def record_started_kilnd(self, health) -> None:
        """Records the compiler versions of the kilnd binary this client just started (its
        Health answer), for kept artifacts to be served by."""
        identity = self._binary_identity()
        if identity is None:
            return
        record = {"kilnd": identity, "default": health.compiler_version,
                  "kinds": {str(v.device_kind): v.version for v in health.compiler_versions}}
        write_private(self.root / "artifacts" / _RECORD, json.dumps(record).encode())

    def compiler_version_for(self, device_kind: int) -> Optional[str]:
        """The compiler version of `device_kind`'s artifacts built by the kilnd binary a client
        would start now, as recorded when a client started it; None when unknown."""
        if self.settings.address is not None:
            return None  # a daemon named by KILN_DAEMON: not one this client starts
        identity = self._binary_identity()
        data = self._read(self.root / "artifacts" / _RECORD)
        try:
            record = json.loads(data) if data is not None else None
        except ValueError:
            return None
        if not isinstance(record, dict) or identity is None or record.get("kilnd") != identity:
            return None
        kinds = record.get("kinds")
        version = kinds.get(str(device_kind)) if isinstance(kinds, dict) else None
        version = version or record.get("default")
        return version if isinstance(version, str) and version else None

    # -- internals -------------------------------------------------------------------------

    def _binary_identity(self) -> Optional[str]:
        binary = self.settings.kilnd
        if not binary:
            return None
        try:
            path = os.path.realpath(binary)
            st = os.stat(path)
        except OSError:
            return None
        return f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"

    def _path(self, kind: str, key: str) -> Optional[Path]:
        if not isinstance(key, str) or not _HEX64.fullmatch(key):
            return None
        return self.root / kind / key[:2] / key

    @staticmethod
    def _read(path: Optional[Path]) -> Optional[bytes]:
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError:
            return None

    def _verified(self, path: Optional[Path], key: str):
        data = self._read(path)
        if data is None or self._mac_key is None:
            return None
        from kiln.daemon import artifact as art
        from kiln.daemon import protocol

        try:
            artifact = protocol.messages().artifact.Artifact.FromString(data)
            return art.verify(artifact, self._mac_key, key)
        except (art.ArtifactRejected, protocol.ProtocolUnavailable) as e:
            log.debug("kiln: local artifact %s… not used: %s", key[:16], e)
            return None
        except Exception as e:  # google.protobuf's DecodeError: a damaged file
            log.debug("kiln: local artifact %s… does not parse: %s", key[:16], e)
            return None

    def _evict(self, keep: Path) -> None:
        """Removes the least recently used kept artifacts (not `keep`) until their bytes are
        within the limit's share left after an eviction."""
        files = []
        try:
            for sub in os.scandir(self.root / "artifacts"):
                if sub.is_dir(follow_symlinks=False) and len(sub.name) == 2:
                    for entry in os.scandir(sub.path):
                        if _HEX64.fullmatch(entry.name):
                            st = entry.stat(follow_symlinks=False)
                            files.append((st.st_mtime_ns, st.st_size, entry.path))
        except OSError:
            return
        total = sum(size for _, size, _ in files)
        if total <= self.limit:
            return
        for _, size, path in sorted(files):
            if total <= self.limit * _AFTER_EVICTION:
                break
            if path == str(keep):
                continue
            try:
                os.unlink(path)
                total -= size
            except OSError:
                pass
