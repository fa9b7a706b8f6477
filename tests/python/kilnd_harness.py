"""Real processes for the fault-injection tests and the soak: kilnd (the shipped one, or
kilnd_for_tests with its instant deterministic compiler), redis-server on a private Unix socket,
and ways to damage what they keep on disk or stop them mid-flight."""
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[2]
KILND_FOR_TESTS = REPO / "build" / "tests" / "cpp" / "kilnd_for_tests"
REDIS_SERVER = shutil.which("redis-server")


def short_tmpdir(prefix: str) -> Path:
    """A fresh private folder with a short path: Unix socket paths stay under 100 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def flip_byte(path: Path, fraction: float) -> int:
    """Flips one bit of the byte at `fraction` of the file; returns its offset."""
    data = bytearray(Path(path).read_bytes())
    offset = int(len(data) * fraction)
    data[offset] ^= 0x10
    Path(path).write_bytes(bytes(data))
    return offset


def largest_file(folder: Path, suffix: str) -> Path:
    files = [p for p in Path(folder).iterdir() if p.name.endswith(suffix) and p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def redis_command(socket_path: Path, *args: bytes):
    """One command to Redis over its Unix socket (RESP); the reply as bytes, an int, None or a
    list of those."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(socket_path))
        s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a)
                                                    for a in args))
        reader = s.makefile("rb")

        def reply():
            line = reader.readline()[:-2]
            kind, rest = line[:1], line[1:]
            if kind in (b"+", b"-"):
                return rest
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else reader.read(n + 2)[:-2]
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [reply() for _ in range(n)]
            raise RuntimeError(f"unexpected reply {line!r}")

        return reply()


def signal_ours(pid: int, sig: int, marker: str) -> None:
    """Sends `sig` to `pid` only while it is the process the caller means (its command line names
    `marker`: our socket or our output folder), never to another that took a reused pid.
    ProcessLookupError when it is gone."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        raise ProcessLookupError(pid) from None
    if marker not in cmdline:
        raise ProcessLookupError(pid)
    os.kill(pid, sig)


class Redis:
    """redis-server without persistence, on a Unix socket in `folder` only (no TCP port)."""

    def __init__(self, folder: Path, *extra: str):
        self.socket = Path(folder) / "redis.sock"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm",
             "700", "--save", "", "--appendonly", "no", "--dir", str(folder), "--loglevel",
             "warning", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


class Kilnd:
    """A detached kilnd on `socket` with `cache_dir` (started by `kilnd ...`, which returns once
    it serves), as a service manager or a client would start it."""

    def __init__(self, binary: Path, socket: Path, cache_dir: Path, *extra: str,
                 env: Optional[dict] = None):
        self.binary, self.socket, self.cache_dir = str(binary), Path(socket), Path(cache_dir)
        self.extra: List[str] = list(extra)
        self.env = env
        self.start()

    def start(self) -> subprocess.CompletedProcess:
        done = subprocess.run([self.binary, "--socket", str(self.socket), "--cache-dir",
                               str(self.cache_dir), "--idle-exit", "600", *self.extra],
                              capture_output=True, text=True, timeout=60, env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"kilnd did not start: {done.stderr.strip()}")
        return done

    def client(self):
        from kiln.daemon.client import DaemonClient

        return DaemonClient(f"unix://{self.socket}", autostart=False)

    def pid(self) -> int:
        client = self.client()
        try:
            return client.health().pid
        finally:
            client.close()

    def stats(self):
        client = self.client()
        try:
            return client.stats()
        finally:
            client.close()

    def stop(self) -> None:
        subprocess.run([self.binary, "--stop", "--socket", str(self.socket)],
                       capture_output=True, timeout=60)


def stop_any_kilnd(binary, socket: Path) -> None:
    """Stops whatever kilnd serves `socket` (a SIGSTOPped one is continued first)."""
    subprocess.run([str(binary), "--stop", "--socket", str(socket)], capture_output=True,
                   timeout=60)
