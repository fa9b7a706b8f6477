"""Stored captures: for a capture key (kiln.stored_names.capture_key), the records of the
entries captured for that code, in the private cache directory every process on the machine
shares, and in kilnd's tiers (its capture store and the shared Redis tier, PutCaptures and
GetCaptures), where the processes of other machines find them. A missing, unreadable, malformed
or unauthenticated record is a miss; a kilnd that is down or answers slowly is a miss too.

A file is "<tag>\\n<payload>", payload = JSON (never pickle: nothing read here is unpickled),
tag = HMAC-SHA256(MAC key, domain | capture key | payload): a record altered, copied under
another key or written with another daemon's key is never installed."""
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
from pathlib import Path
from typing import List, Optional

from kiln.daemon.private_files import write_private

log = logging.getLogger("kiln")

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DOMAIN = b"kiln-stored-capture-v1\0"
# A stored record larger than this is refused unread (a capture of thousands of guards is
# well under a megabyte); kilnd refuses larger ones too (cache/capture_records.h).
MAX_RECORD_BYTES = 4 << 20
# Entries kept per code: the newest, as the frame hook keeps at most cache_size_limit.
MAX_ENTRIES = 8


class CaptureStore:
    """`daemon`: a function returning the kiln.daemon.client.DaemonClient whose tiers back the
    directory, called at each use (the process's client may be closed and made anew between
    uses); None: the directory alone."""

    def __init__(self, root: Path, mac_key: bytes, daemon=None):
        self.root = Path(root)
        self._mac_key = mac_key
        self._daemon = daemon

    def _path(self, key: str) -> Path:
        if not _HEX64.fullmatch(key):
            raise ValueError(f"not a capture key: {key!r}")
        return self.root / key[:2] / key

    def tag(self, key: str, payload: bytes) -> str:
        msg = _DOMAIN + key.encode() + b"\0" + payload
        return hmac.new(self._mac_key, msg, hashlib.sha256).hexdigest()

    def get(self, key: str) -> List[dict]:
        """The entries stored for `key`, newest first: from the directory, else from kilnd (then
        kept in the directory); [] when none verifies under this MAC key."""
        entries = self.get_local(key)
        if entries or self._daemon is None:
            return entries
        data = self._fetch(key)
        entries = self.decode(key, data) if data else []
        if entries:
            write_private(self._path(key), data)
        return entries

    def get_local(self, key: str) -> List[dict]:
        """The entries the directory holds for `key` ([] when none verifies)."""
        try:
            with open(self._path(key), "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
        except OSError:
            data = b""
        return self.decode(key, data)

    def _fetch(self, key: str) -> Optional[bytes]:
        from kiln.daemon.client import DaemonUnavailable

        try:
            return self._daemon().get_captures(key)
        except DaemonUnavailable as e:
            log.debug("kiln: stored captures not fetched from kilnd: %s", e)
            return None

    def decode(self, key: str, data: bytes) -> List[dict]:
        if len(data) > MAX_RECORD_BYTES:
            return []
        tag, sep, payload = data.partition(b"\n")
        if not sep or not hmac.compare_digest(tag, self.tag(key, payload).encode()):
            return []
        try:
            record = json.loads(payload)
        except ValueError:
            return []
        if not isinstance(record, dict) or record.get("key") != key:
            return []
        entries = record.get("entries")
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def encode(self, key: str, entries: List[dict]) -> bytes:
        payload = json.dumps({"key": key, "entries": entries[:MAX_ENTRIES]},
                             separators=(",", ":"), sort_keys=True).encode()
        return self.tag(key, payload).encode() + b"\n" + payload

    def put(self, key: str, entry: dict) -> None:
        """Stores `entry` first among `key`'s entries (see merge)."""
        self.merge(key, [entry])

    def merge(self, key: str, entries: List[dict]) -> None:
        """Stores `entries` first among `key`'s (those of equal ids replaced). Best effort: the
        store is an optimisation, a failure leaves the next process to capture again. The read
        and the write hold the directory's lock: processes storing captures of one code at once
        (two models whose forward is nn.Sequential's, a bundle imported meanwhile) each keep the
        other's."""
        known = None if self._path(key).exists() else self.get(key)  # kilnd's, unlocked
        ids = {e.get("id") for e in entries}
        with self._locked():
            old = self.get_local(key) or known or []
            data = self.encode(key, list(entries) + [e for e in old if e.get("id") not in ids])
            write_private(self._path(key), data)
        self._send(key, data)

    @contextlib.contextmanager
    def _locked(self):
        """An exclusive lock on the directory's lock file (none when it cannot be opened: then
        as before, a concurrent store may lose one of two records, never corrupt one)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _send(self, key: str, data: bytes) -> None:
        if self._daemon is not None:
            from kiln.daemon.client import DaemonUnavailable

            try:
                self._daemon().put_captures(key, data)
            except DaemonUnavailable as e:
                log.debug("kiln: stored captures not sent to kilnd: %s", e)

    def note_location(self, location: str, parts: dict) -> None:
        """Remembers that a capture with key `parts` was stored for the code at `location`
        (kiln.stored_names.location_key): what explain_miss compares a miss with. Only read
        for messages; never decides what runs."""
        known = [p for p in self.locate(location) if p != parts][-(MAX_ENTRIES - 1):]
        write_private(self.root / "locations" / location, json.dumps(known + [parts]).encode())

    def locate(self, location: str) -> List[dict]:
        try:
            with open(self.root / "locations" / location, "rb") as f:
                known = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return []
        return [p for p in known if isinstance(p, dict)] if isinstance(known, list) else []

    def keys(self) -> List[str]:
        """Every key with a file here (for export)."""
        out = []
        try:
            for sub in self.root.iterdir():
                if sub.is_dir() and len(sub.name) == 2:
                    out.extend(p.name for p in sub.iterdir() if _HEX64.fullmatch(p.name))
        except OSError:
            pass
        return sorted(out)

    def read_raw(self, key: str) -> Optional[bytes]:
        try:
            return self._path(key).read_bytes()
        except OSError:
            return None
