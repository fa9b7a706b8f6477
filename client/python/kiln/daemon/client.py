"""The client side of kilnd: a gRPC channel to the daemon its settings name (KILN_DAEMON or the
per-user Unix socket: kiln.daemon.settings), and starting a local kilnd when none answers (as
sccache's client starts its server). Every failure is a DaemonUnavailable; callers run eagerly
instead. The process's client is kiln's process state's (STATE.daemon.client())."""
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

from kiln.daemon.settings import DaemonSettings

log = logging.getLogger("kiln")



def _kilnd_environment(settings) -> dict:
    """The environment of a kilnd this client starts: ours, with the NVRTC this Python found
    (torch's CUDA wheels) named for kilnd, which cannot look into Python's packages itself."""
    env = dict(os.environ)
    if settings.nvrtc and not env.get("KILN_NVRTC"):
        env["KILN_NVRTC"] = settings.nvrtc
    return env

class DaemonUnavailable(RuntimeError):
    """No daemon answered, or it failed the request."""


class DaemonRefused(DaemonUnavailable):
    """The daemon answered and refused the request (invalid graph, queue full, frozen miss)."""


class DaemonHung(DaemonUnavailable):
    """The daemon did not answer in time: something holds its socket and says nothing."""


def read_mac_key(path: Path) -> bytes:
    """The artifact MAC key in `path` (the settings' mac_key_file). Refuses a key that others may
    read or write, as kilnd does."""
    path = Path(path)
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


# What a client waits for, at most, before it decides that kilnd is not answering.
PROBE_SECONDS = 1.5          # one Health call
WATCH_SECONDS = 0.5          # how often a call in flight checks that kilnd still answers
# How long a client leaves a daemon alone after it failed, before trying again (doubling, up
# to the second figure, while it keeps failing). A daemon that died is restarted at once.
HUNG_BACKOFF = (5.0, 60.0)
START_BACKOFF = (30.0, 300.0)
# The daemon sends artifacts of any size up to gRPC's limit (kilnd: SetMaxSendMessageSize(INT_MAX)).
MAX_RECEIVE_BYTES = 2**31 - 1


class DaemonClient:
    """One channel to one daemon. `address` is "unix:///path" or "dns:///host:port" (TLS with
    the settings' ca_file as the root certificate and the bearer token in their token_file);
    default: the settings' address ($KILN_DAEMON), else their local socket, started on demand.
    The process's client is made with the process's settings (STATE.daemon.client()); without
    `settings` a client reads the environment as it is now.

    Waits are bounded: a daemon that does not answer is given up on within PROBE_SECONDS (a
    call in flight within WATCH_SECONDS + PROBE_SECONDS), a daemon that died is restarted by the
    next call, and one that hangs or cannot start is remembered, with its reason, for a back-off
    during which calls fail at once (callers run eagerly)."""

    def __init__(self, address: Optional[str] = None, *,
                 settings: Optional[DaemonSettings] = None, timeout: float = 120.0,
                 autostart: bool = True):
        from kiln.daemon import protocol

        import grpc

        settings = settings if settings is not None else DaemonSettings.from_env()
        self.settings = settings
        self.pb = protocol.messages()
        self._service = protocol.stubs()
        self._grpc = grpc
        address = address or settings.address
        self.local = address is None
        self.autostart = autostart and self.local
        self.timeout = timeout
        self.metadata = ()
        self._credentials = None
        if address is None:
            self.socket = settings.socket
            target = f"unix://{self.socket}"
        elif address.startswith("unix://"):
            self.socket = Path(address[len("unix://"):])
            target = address
        elif address.startswith("dns:///"):
            self.socket = None
            target = address
            ca, token_file = settings.ca_file, settings.token_file
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
        self._ready = False
        self._retry_at = 0.0          # monotonic time before which calls fail at once
        self._down_reason = ""
        self._backoff = 0.0           # the last back-off given, doubled on a repeat
        self.compiler_version: Optional[str] = None  # the daemon's, from its Health answer
        self._kind_versions: dict = {}  # device kind -> the version its artifacts carry
        self._lock = threading.Lock()

    def _open_channel(self) -> None:
        grpc = self._grpc
        options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                   # A restarted daemon is found at once, not after gRPC's reconnect back-off.
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if self._credentials is None:
            self._channel = grpc.insecure_channel(self.target, options=options)
        else:
            self._channel = grpc.secure_channel(self.target, self._credentials, options=options)
        self._stub = self._service.KilnServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    # -- calls -------------------------------------------------------------------------------

    def _error(self, method: str, e) -> DaemonUnavailable:
        code = e.code()
        codes = self._grpc.StatusCode
        if code == codes.DEADLINE_EXCEEDED:
            error = DaemonHung
        elif code in (codes.UNAVAILABLE, codes.CANCELLED, codes.UNKNOWN):
            error = DaemonUnavailable
        else:
            error = DaemonRefused
        return error(f"{method} on {self.target}: {code.name}: {e.details()}")

    def _call(self, method: str, request, timeout: float):
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self.metadata)
        except self._grpc.RpcError as e:
            raise self._error(method, e) from e

    def _watched_call(self, method: str, request, timeout: float):
        """`method` with the daemon watched while it runs: a compile may take minutes, but a
        daemon that stops answering Health (stopped, hung, its machine gone) is given up on
        within WATCH_SECONDS + PROBE_SECONDS, and one that died mid-call is restarted by the
        next call."""
        call = getattr(self._stub, method).future(request, timeout=timeout,
                                                  metadata=self.metadata)
        while True:
            try:
                return call.result(timeout=WATCH_SECONDS)
            except self._grpc.FutureTimeoutError:
                pass
            except self._grpc.RpcError as e:
                error = self._error(method, e)
                if not isinstance(error, DaemonRefused):
                    self._ready = False  # died (or drained): the next call starts it again
                raise error from e
            try:
                self.health(timeout=PROBE_SECONDS)
            except DaemonHung as e:
                call.cancel()
                self._give_up(f"kilnd stopped answering during {method} ({e})", HUNG_BACKOFF)
                raise DaemonHung(self._down_reason) from None
            except DaemonUnavailable as e:
                call.cancel()  # it died: the next call (or this one's retry) starts another
                self._ready = False
                raise DaemonUnavailable(f"kilnd went away during {method} ({e})") from None

    def health(self, timeout: float = PROBE_SECONDS):
        return self._call("Health", self.pb.service.HealthRequest(), timeout)

    def stats(self, timeout: float = 5.0):
        return self._call("Stats", self.pb.service.StatsRequest(), timeout)

    def compile(self, request, timeout: Optional[float] = None):
        return self._call_running("Compile", request, timeout or self.timeout)

    def lookup_key(self, key: str, timeout: float = 10.0):
        return self._call_running("Lookup", self.pb.service.LookupRequest(key=key), timeout)

    def put_captures(self, key: str, record: bytes, timeout: float = 5.0):
        """Stores a signed stored-capture record (kiln.daemon.capture_store) in the daemon's
        tiers, where other processes and machines find it."""
        self.ensure_running()
        return self._call("PutCaptures", self.pb.service.PutCapturesRequest(
            key=key, record=record), timeout)

    def get_captures(self, key: str, timeout: float = 5.0) -> Optional[bytes]:
        """The signed stored-capture record the daemon's tiers hold for `key`, or None."""
        self.ensure_running()
        response = self._call("GetCaptures", self.pb.service.GetCapturesRequest(key=key),
                              timeout)
        return response.record if response.found else None

    def _call_running(self, method: str, request, timeout: float):
        """A watched call on a running daemon. A local daemon found dead (killed, crashed, idle
        exit) is started again and the call made once more, so the graph is still compiled."""
        self.ensure_running()
        try:
            return self._watched_call(method, request, timeout)
        except (DaemonHung, DaemonRefused):
            raise
        except DaemonUnavailable as e:
            if not self.autostart:
                raise
            log.debug("kiln: %s; starting kilnd again", e)
        self.ensure_running()
        return self._watched_call(method, request, timeout)

    # -- the daemon's state ------------------------------------------------------------------

    def _give_up(self, reason: str, backoff) -> None:
        """Remembers that the daemon is not usable, and why, for a back-off."""
        first, most = backoff
        self._backoff = min(most, self._backoff * 2) if self._backoff else first
        self._retry_at = time.monotonic() + self._backoff
        self._down_reason = reason
        self._ready = False
        log.debug("kiln: %s; not trying kilnd again for %.0f s", reason, self._backoff)

    def down_state(self):
        """What this client knows of a kilnd that is down (for assume_down), or None."""
        with self._lock:
            if time.monotonic() >= self._retry_at:
                return None
            return self._retry_at, self._backoff, self._down_reason

    def assume_down(self, state) -> None:
        """Takes another client's down_state: calls fail at once until its back-off ends."""
        with self._lock:
            self._retry_at, self._backoff, self._down_reason = state
            self._ready = False

    def answered(self) -> bool:
        """Whether the daemon answered Health and no call since found it gone."""
        return self._ready

    def ensure_running(self) -> None:
        """Returns when the daemon answers Health (its compiler_version is then known); starts
        a local kilnd first if allowed. Fails at once while a failure is remembered."""
        with self._lock:
            if self._ready:
                return
            if time.monotonic() < self._retry_at:
                raise DaemonUnavailable(f"{self._down_reason} (not retried for "
                                        f"{self._retry_at - time.monotonic():.0f} s)")
            try:
                health = self.health()
            except DaemonUnavailable as e:
                if isinstance(e, DaemonHung):
                    # Something holds the socket and does not answer: starting another daemon
                    # there would fail on its lock; leave it be for a while.
                    self._give_up(f"kilnd on {self.target} does not answer ({e})", HUNG_BACKOFF)
                    raise DaemonUnavailable(self._down_reason) from None
                if not self.autostart:
                    self._give_up(str(e), HUNG_BACKOFF)
                    raise
                health = self._start_local()
            self.compiler_version = health.compiler_version
            self._kind_versions = {v.device_kind: v.version for v in health.compiler_versions}
            self._ready = True
            self._backoff = 0.0

    def compiler_version_for(self, device_kind: int) -> Optional[str]:
        """The compiler_version of the daemon's artifacts for `device_kind` (kiln.v1.DeviceKind):
        their keys are made with it. A daemon that reports no per-kind versions builds every
        kind with its one compiler."""
        return self._kind_versions.get(device_kind, self.compiler_version)

    def _reconnect(self) -> None:
        # A channel whose connect failed waits out gRPC's reconnect backoff before it tries
        # again; a new channel connects at once.
        self._channel.close()
        self._open_channel()

    def _start_local(self):
        settings = self.settings
        binary = settings.kilnd
        if binary is None:
            self._give_up("no daemon answers and no kilnd binary was found (build it, put it on "
                          "PATH or set KILN_KILND)", START_BACKOFF)
            raise DaemonUnavailable(self._down_reason)
        # The key too: the kilnd started here signs with the key this client verifies with.
        args = [binary, "--socket", str(self.socket), "--cache-dir", str(settings.cache_dir),
                "--mac-key-file", str(settings.mac_key_file), "--idle-exit", settings.idle_exit]
        log.info("kiln: starting %s", " ".join(args))
        # kilnd detaches and returns once it serves, or exits 1 and prints why it cannot.
        start_timeout = settings.start_timeout
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=start_timeout,
                                  stdin=subprocess.DEVNULL, env=_kilnd_environment(settings))
        except subprocess.TimeoutExpired:
            # It goes on starting (a large cache is checked first); later graphs will find it.
            self._give_up(f"kilnd did not report ready within {start_timeout:.0f} s",
                          HUNG_BACKOFF)
            raise DaemonUnavailable(self._down_reason) from None
        except OSError as e:
            self._give_up(f"cannot start kilnd: {e}", START_BACKOFF)
            raise DaemonUnavailable(self._down_reason) from e
        why = (done.stderr or done.stdout).strip()
        if done.returncode != 0 and "another kilnd is serving" not in why:
            self._give_up(f"kilnd cannot start: {why or f'exit status {done.returncode}'}",
                          START_BACKOFF)
            raise DaemonUnavailable(self._down_reason)
        # Ours serves, or another process's won the race to start it: either answers now.
        deadline = time.monotonic() + 2 * PROBE_SECONDS
        while True:
            self._reconnect()
            try:
                health = self.health()
            except DaemonUnavailable as e:
                if time.monotonic() > deadline:
                    self._give_up(f"kilnd started but does not answer ({e}; {why})",
                                  HUNG_BACKOFF)
                    raise DaemonUnavailable(self._down_reason) from None
                time.sleep(0.05)
                continue
            if done.returncode == 0:  # this binary, started here: its artifacts may be kept
                from kiln.daemon.local_artifacts import LocalArtifacts

                LocalArtifacts(settings, mac_key=None).record_started_kilnd(health)
            return health
