"""The client side of kilnd: where the daemon is (KILN_DAEMON or the per-user Unix socket), a
gRPC channel to it, and starting a local kilnd when none answers (as sccache's client starts
its server). Every failure is a DaemonUnavailable; callers run eagerly instead."""
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger("kiln")


class DaemonUnavailable(RuntimeError):
    """No daemon answered, or it failed the request."""


class DaemonRefused(DaemonUnavailable):
    """The daemon answered and refused the request (invalid graph, queue full, frozen miss)."""


def cache_dir() -> Path:
    """kilnd's default --cache-dir: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
    ~/.cache/kiln (the same rule as kilnd's)."""
    if os.environ.get("KILN_CACHE_DIR"):
        return Path(os.environ["KILN_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "kiln"
    return Path(os.environ.get("HOME", "/tmp")) / ".cache" / "kiln"


def default_socket() -> Path:
    """kilnd's default --socket: $XDG_RUNTIME_DIR/kiln/kilnd.sock, else <cache dir>/kilnd.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and not os.environ.get("KILN_CACHE_DIR"):
        return Path(runtime) / "kiln" / "kilnd.sock"
    return cache_dir() / "kilnd.sock"


def mac_key_file() -> Path:
    return Path(os.environ.get("KILN_MAC_KEY_FILE") or cache_dir() / "mac.key")


def read_mac_key(path: Optional[Path] = None) -> bytes:
    """The artifact MAC key. Refuses a key that others may read or write, as kilnd does."""
    path = Path(path or mac_key_file())
    try:
        st = path.stat()
        if st.st_mode & 0o077:
            raise DaemonUnavailable(f"refusing MAC key {path}: group or others may access it")
        if st.st_uid != os.getuid():
            raise DaemonUnavailable(f"refusing MAC key {path}: owned by another user")
        key = path.read_bytes()
    except OSError as e:
        raise DaemonUnavailable(f"cannot read MAC key {path}: {e}") from e
    if len(key) != 32:
        raise DaemonUnavailable(f"MAC key {path} has {len(key)} bytes, not 32")
    return key


def kilnd_binary() -> Optional[str]:
    """$KILN_KILND, else the build tree's kilnd, else kilnd on PATH."""
    if os.environ.get("KILN_KILND"):
        return os.environ["KILN_KILND"]
    built = Path(__file__).resolve().parents[4] / "build" / "daemon" / "kilnd"
    if built.exists():
        return str(built)
    return shutil.which("kilnd")


class DaemonClient:
    """One channel to one daemon. `address` is "unix:///path" or "dns:///host:port" (TLS with
    $KILN_DAEMON_CA as the root certificate and the bearer token in $KILN_DAEMON_TOKEN_FILE);
    default: $KILN_DAEMON, else the local per-user socket, started on demand."""

    def __init__(self, address: Optional[str] = None, *, timeout: float = 120.0,
                 autostart: bool = True):
        from kiln.daemon import protocol

        import grpc

        self.pb = protocol.messages()
        self._grpc = grpc
        address = address or os.environ.get("KILN_DAEMON")
        self.local = address is None
        self.autostart = autostart and self.local
        self.timeout = timeout
        self.metadata = ()
        self._credentials = None
        if address is None:
            self.socket = default_socket()
            target = f"unix://{self.socket}"
        elif address.startswith("unix://"):
            self.socket = Path(address[len("unix://"):])
            target = address
        elif address.startswith("dns:///"):
            self.socket = None
            target = address
            ca = os.environ.get("KILN_DAEMON_CA")
            token_file = os.environ.get("KILN_DAEMON_TOKEN_FILE")
            if not ca or not token_file:
                raise DaemonUnavailable(
                    f"{address}: a TCP daemon needs KILN_DAEMON_CA and KILN_DAEMON_TOKEN_FILE")
            try:
                root = Path(ca).read_bytes()
                token = Path(token_file).read_text().strip()
            except OSError as e:
                raise DaemonUnavailable(f"{address}: {e}") from e
            self._credentials = grpc.ssl_channel_credentials(root)
            self.metadata = (("authorization", f"Bearer {token}"),)
        else:
            raise DaemonUnavailable(
                f"KILN_DAEMON={address!r}: expected unix:///path or dns:///host:port")
        self.target = target
        self._open_channel()
        self._started = False
        self.compiler_version: Optional[str] = None  # the daemon's, from its Health answer
        self._lock = threading.Lock()

    def _open_channel(self) -> None:
        grpc = self._grpc
        if self._credentials is None:
            self._channel = grpc.insecure_channel(self.target)
        else:
            self._channel = grpc.secure_channel(self.target, self._credentials)
        self._stub = self.pb.service_grpc.KilnServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    # -- calls -------------------------------------------------------------------------------

    def _call(self, method: str, request, timeout: float):
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self.metadata)
        except self._grpc.RpcError as e:
            code = e.code()
            gone = code in (self._grpc.StatusCode.UNAVAILABLE,
                            self._grpc.StatusCode.DEADLINE_EXCEEDED,
                            self._grpc.StatusCode.CANCELLED, self._grpc.StatusCode.UNKNOWN)
            error = DaemonUnavailable if gone else DaemonRefused
            raise error(f"{method} on {self.target}: {code.name}: {e.details()}") from e

    def health(self, timeout: float = 2.0):
        return self._call("Health", self.pb.service.HealthRequest(), timeout)

    def stats(self, timeout: float = 5.0):
        return self._call("Stats", self.pb.service.StatsRequest(), timeout)

    def compile(self, request, timeout: Optional[float] = None):
        self.ensure_running()
        return self._call("Compile", request, timeout or self.timeout)

    def lookup_key(self, key: str, timeout: float = 10.0):
        self.ensure_running()
        return self._call("Lookup", self.pb.service.LookupRequest(key=key), timeout)

    # -- the local daemon --------------------------------------------------------------------

    def ensure_running(self) -> None:
        """Returns when the daemon answers Health (its compiler_version is then known); starts
        a local kilnd first if allowed."""
        with self._lock:
            if self._started:
                return
            try:
                health = self.health(timeout=1.0)
            except DaemonUnavailable:
                if not self.autostart:
                    raise
                health = self._start_local()
            self.compiler_version = health.compiler_version
            self._started = True

    def _start_local(self):
        binary = kilnd_binary()
        if binary is None:
            raise DaemonUnavailable("no daemon answers and no kilnd binary was found "
                                    "(build it, put it on PATH or set KILN_KILND)")
        args = [binary, "--socket", str(self.socket), "--cache-dir", str(cache_dir()),
                "--idle-exit", os.environ.get("KILN_DAEMON_IDLE_EXIT", "3600")]
        log.info("kiln: starting %s", " ".join(args))
        # kilnd detaches and returns once it serves (or prints why it cannot).
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DaemonUnavailable(f"cannot start kilnd: {e}") from e
        deadline = time.monotonic() + 10
        while True:
            # A channel whose connect failed waits out gRPC's reconnect backoff (about a
            # second) before it tries again; a new channel connects at once.
            self._channel.close()
            self._open_channel()
            try:
                return self.health(timeout=1.0)
            except DaemonUnavailable:
                if time.monotonic() > deadline:
                    # Another process may have won the race to start it: that is fine if it
                    # answers; otherwise report why ours did not start.
                    raise DaemonUnavailable(
                        f"kilnd did not start: {(done.stderr or done.stdout).strip()}") from None
                time.sleep(0.05)


_client: Optional[DaemonClient] = None
_client_lock = threading.Lock()


def shared_client() -> DaemonClient:
    """The process's client (one channel, made on first use)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = DaemonClient()
        return _client


def reset_shared_client() -> None:
    global _client
    with _client_lock:
        if _client is not None:
            _client.close()
        _client = None
