"""The client's index from a captured graph's structure key (lowering.structure_key) to the
daemon's cache key, so a warm process skips lowering and fetches the artifact by key. Files
live in the private cache directory; a missing, unreadable or malformed entry is a miss."""
import os
import re
import tempfile
from pathlib import Path
from typing import Optional

_HEX64 = re.compile(r"[0-9a-f]{64}")


class GraphIndex:
    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, structure_key: str) -> Path:
        return self.root / structure_key[:2] / structure_key

    def get(self, structure_key: str) -> Optional[str]:
        try:
            key = self._path(structure_key).read_text().strip()
        except OSError:
            return None
        return key if _HEX64.fullmatch(key) else None

    def put(self, structure_key: str, key: str) -> None:
        if not _HEX64.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        path = self._path(structure_key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                f.write(key)
            os.replace(tmp, path)  # atomic: readers see the old entry or the new one
        except OSError:
            pass  # the index is an optimisation; the next process lowers again
