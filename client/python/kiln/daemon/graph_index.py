"""The client's index from a captured graph's structure key (lowering.structure_key) to the
daemon's cache key, so a warm process skips lowering and fetches the artifact by key. Files
live in the private cache directory; a missing, unreadable, malformed or unauthenticated entry
is a miss.

An entry is "<cache key> <tag>", tag = HMAC-SHA256(MAC key, structure key | cache key): an entry
that was altered, copied to another structure key or written under another daemon's key never
maps a graph to an artifact compiled for a different graph (whose inputs may look the same)."""
import hashlib
import hmac
import re
from pathlib import Path
from typing import Optional

from kiln.daemon.private_files import write_private

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DOMAIN = b"kiln-graph-index-v1\0"


class GraphIndex:
    def __init__(self, root: Path, mac_key: bytes):
        self.root = Path(root)
        self._mac_key = mac_key

    def _path(self, structure_key: str) -> Path:
        return self.root / structure_key[:2] / structure_key

    def _tag(self, structure_key: str, key: str) -> str:
        msg = _DOMAIN + structure_key.encode() + b"\0" + key.encode()
        return hmac.new(self._mac_key, msg, hashlib.sha256).hexdigest()

    def get(self, structure_key: str) -> Optional[str]:
        try:
            fields = self._path(structure_key).read_text().split()
        except (OSError, UnicodeDecodeError):
            return None
        if len(fields) != 2 or not _HEX64.fullmatch(fields[0]):
            return None
        key, tag = fields
        if not hmac.compare_digest(tag, self._tag(structure_key, key)):
            return None
        return key

    def put(self, structure_key: str, key: str) -> None:
        if not _HEX64.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        # The index is an optimisation: unwritten, the next process lowers again.
        write_private(self._path(structure_key),
                      f"{key} {self._tag(structure_key, key)}\n".encode())
