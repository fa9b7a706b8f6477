"""The daemon client's settings, read from the environment in this one place: which daemon
(KILN_DAEMON, else the per-user socket), the TLS root and token of a TCP daemon, the cache
directory and MAC key, the kilnd binary, and what a kilnd the client starts is given.

The paths come from kiln._C.default_paths, which runs kilnd's own code (daemon/paths.h): the
client looks for kilnd where kilnd puts itself, and `kilnd --print-paths` shows the same paths.
The process's settings live in kiln's process state (STATE.daemon): read on first use, and read
again after kiln.reset()."""
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

log = logging.getLogger("kiln")


@dataclass(frozen=True)
class DaemonSettings:
    address: Optional[str]     # KILN_DAEMON: unix:///path or dns:///host:port; None: `socket`
    ca_file: Optional[str]     # KILN_DAEMON_CA: root certificate of a TCP daemon
    token_file: Optional[str]  # KILN_DAEMON_TOKEN_FILE: the bearer token for a TCP daemon
    cache_dir: Path            # KILN_CACHE_DIR, XDG_CACHE_HOME, HOME (daemon/paths.h)
    socket: Path               # the local kilnd's socket (XDG_RUNTIME_DIR, KILN_CACHE_DIR)
    mac_key_file: Path         # KILN_MAC_KEY_FILE, else <cache_dir>/mac.key
    kilnd: Optional[str]       # KILN_KILND, else the build tree's kilnd, else kilnd on PATH
    # KILN_NVRTC, else the libnvrtc of this Python's CUDA wheels or of /usr/local/cuda: what a
    # kilnd the client starts builds CUDA kernels with (None: kilnd searches the loader's path).
    nvrtc: Optional[str] = None
    start_timeout: float = 10.0  # KILN_DAEMON_START_TIMEOUT: longest wait for a kilnd we start
    idle_exit: str = "3600"      # KILN_DAEMON_IDLE_EXIT: that kilnd's --idle-exit
    # KILN_LOCAL_ARTIFACT_BYTES: the most bytes of artifacts from kilnd kept in cache_dir for
    # later processes (kiln.daemon.local_artifacts); 0 keeps none.
    local_artifact_bytes: int = 1 << 30

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "DaemonSettings":
        """The settings `environ` (default: os.environ) gives; an empty variable is an unset
        one. Never raises: a timeout or size that is not a number is warned about and left at
        its default."""
        from kiln import _C

        env = os.environ if environ is None else environ
        paths = _C.default_paths(env)
        return cls(address=env.get("KILN_DAEMON") or None,
                   ca_file=env.get("KILN_DAEMON_CA") or None,
                   token_file=env.get("KILN_DAEMON_TOKEN_FILE") or None,
                   cache_dir=Path(paths["cache_dir"]),
                   socket=Path(paths["socket"]),
                   mac_key_file=Path(paths["mac_key_file"]),
                   kilnd=env.get("KILN_KILND") or _found_kilnd(),
                   nvrtc=env.get("KILN_NVRTC") or _found_nvrtc(),
                   start_timeout=_seconds(env, "KILN_DAEMON_START_TIMEOUT", cls.start_timeout),
                   idle_exit=env.get("KILN_DAEMON_IDLE_EXIT") or cls.idle_exit,
                   local_artifact_bytes=_bytes(env, "KILN_LOCAL_ARTIFACT_BYTES",
                                               cls.local_artifact_bytes))


def _found_kilnd() -> Optional[str]:
    built = Path(__file__).resolve().parents[4] / "build" / "daemon" / "kilnd"
    if built.exists():
        return str(built)
    return shutil.which("kilnd")


def _found_nvrtc() -> Optional[str]:
    """NVRTC where torch's CUDA wheels put it (nvidia-cuda-nvrtc: nvidia/cu13/lib for CUDA 13,
    nvidia/cuda_nvrtc/lib before), else in the CUDA toolkit. Only a path is looked for: nothing
    is loaded here."""
    import glob
    import sys

    roots = [os.path.join(p, "nvidia", sub, "lib") for p in sys.path if p
             for sub in ("cu13", "cuda_nvrtc")] + ["/usr/local/cuda/lib64"]
    for root in roots:
        for name in ("libnvrtc.so.13", "libnvrtc.so.12"):
            path = os.path.join(root, name)
            if os.path.exists(path):
                return path
        found = sorted(glob.glob(os.path.join(root, "libnvrtc.so.*[0-9]")))
        if found:
            return found[-1]
    return None


def _bytes(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    try:
        value = int(text)
        if value < 0:
            raise ValueError(text)
        return value
    except ValueError:
        log.warning("kiln: %s=%r is not a number of bytes; using %s", name, text, default)
        return default


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        log.warning("kiln: %s=%r is not a number of seconds; using %s", name, text, default)
        return default
