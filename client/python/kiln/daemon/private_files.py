"""Files kiln keeps in its private cache directory, written so that a reader sees the old
content or the new, never a part: a temporary file beside the target, then a rename."""
import os
import tempfile
from pathlib import Path


def write_private(path: Path, data: bytes) -> bool:
    """Writes `data` to `path` atomically, making its directory (mode 0700) if needed. False
    when it could not be written: what these files hold is an optimisation or a copy, and the
    caller goes on without it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True
