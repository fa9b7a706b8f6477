"""kiln's state in this process, in one object: the stance compiled functions follow, the code
objects kiln made entries for or gave up on, the warnings already given, what the "kiln"
backend loaded, and the daemon client with its settings. kiln.reset() resets it (and the frame
hook's entries of those code objects). Settings the user chooses live in kiln.config; this is
what kiln itself accumulates, and what it read from the environment."""
import collections
import threading
import weakref
from typing import TYPE_CHECKING, List

from kiln import _C, config

if TYPE_CHECKING:
    from kiln.daemon.client import DaemonClient
    from kiln.daemon.settings import DaemonSettings


class DaemonState:
    """The daemon client and the settings it was made with (kiln.daemon.settings), both made on
    first use: `import kiln` reads no daemon setting and imports no grpc.

    After a reset the settings are read again from the environment at their next use; the
    client is replaced only if they changed. A client whose settings did not change keeps its
    channel and what it knows of kilnd (ready, or down and not to be tried again before its
    back-off ends): a reset of kiln's compiled entries is no reason to probe again a daemon
    known to be down."""

    def __init__(self):
        self._settings = None
        self._stale = False
        self._client = None
        self._down = None  # a closed client's knowledge that kilnd is down, for the next one
        self._lock = threading.Lock()

    @property
    def settings(self) -> "DaemonSettings":
        with self._lock:
            return self._current_settings()

    def _current_settings(self):
        if self._settings is None or self._stale:
            from kiln.daemon.settings import DaemonSettings

            settings = DaemonSettings.from_env()
            if settings != self._settings:
                self._down = None
                if self._client is not None:
                    self._client.close()
                    self._client = None
            self._settings, self._stale = settings, False
        return self._settings

    def client(self) -> "DaemonClient":
        """The process's client (one channel, opened on first use). Raises DaemonUnavailable
        when the settings name no usable daemon (a malformed KILN_DAEMON, a TCP daemon without
        its CA or token)."""
        with self._lock:
            settings = self._current_settings()
            if self._client is None:
                from kiln.daemon.client import DaemonClient

                self._client = DaemonClient(settings=settings)
                if self._down is not None:
                    self._client.assume_down(self._down)
                    self._down = None
            return self._client

    def ready(self) -> bool:
        """Whether the client has reached its kilnd and nothing since says it went away (a
        call then starts nothing first). Makes no client."""
        with self._lock:
            return self._client is not None and not self._stale and self._client.answered()

    def has_client(self) -> bool:
        with self._lock:
            return self._client is not None

    def close(self, keep_down: bool = False) -> None:
        """Closes the client: the next use makes a new one that knows nothing of kilnd yet, as a
        new process's would. `keep_down`: unless it knew kilnd to be down (not answering, not
        startable), which the next one then knows for the rest of the back-off, instead of
        waiting on kilnd again."""
        with self._lock:
            client, self._client = self._client, None
            self._down = client.down_state() if keep_down and client is not None else None
        if client is not None:
            client.close()

    def reset(self) -> None:
        with self._lock:
            self._stale = True


class ProcessState:
    STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile",
               "compile_in_background")

    def __init__(self):
        self._stance = "default"
        self.daemon = DaemonState()
        # Every code object kiln made entries for or gave up on, so reset() can forget them.
        self.compiled_codes: "weakref.WeakSet" = weakref.WeakSet()
        # Code objects already warned about reaching the cache size limit.
        self.warned_limit: "weakref.WeakSet" = weakref.WeakSet()
        # Code objects reached through more than one instance of a module class: captured with
        # the frame's modules unspecialised (kiln.variables.nn_module), one entry for all.
        self.shared_module_codes: "weakref.WeakSet" = weakref.WeakSet()
        # Code objects whose inputs changed size between calls: captured with every size of
        # their tensor inputs (but parameters and buffers) a symbol (kiln.graph.symbolic_shapes).
        self.sizes_changed_codes: "weakref.WeakSet" = weakref.WeakSet()
        # Per code object: source -> the values its entries guarded an int attribute of an
        # object it was passed to have; one that took several becomes a symbol (like the sizes).
        self.object_int_values: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # Per code object: the int attributes its captures both read and assigned (a module's
        # `self.calls += 1`): each differs on the next call, so its next capture makes it a
        # symbol rather than capture again for every value until cache_size_limit.
        self.self_assigned_ints: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # Per code object: source -> the shapes its captures saw the tensor input there have; a
        # dimension seen as 1 and as another size is a symbol in the next capture.
        self.input_shapes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # Every artifact the "kiln" backend loaded, newest last (kiln.debug.artifacts).
        self.artifacts: List = []
        # Why a code object's stored captures were not used, the last time one was looked for
        # (kiln.debug.explain_miss).
        self.capture_misses: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._warned = set()
        self._lock = threading.Lock()
        self._cuda_graph_pool = None

    def cuda_graph_pool(self):
        """The one memory pool all CUDA graphs of this process capture into (kiln._C.
        CudaGraphPool, made on first use; kept across reset(): graphs still alive use it), or None
        when kiln._C was built without CUDA."""
        with self._lock:
            if self._cuda_graph_pool is None and getattr(_C, "HAS_CUDA", False):
                pool = _C.CudaGraphPool()
                pool.set_shape_budget(config.cuda_graph_shapes, _shape_graph_bytes())
                self._cuda_graph_pool = pool
            return self._cuda_graph_pool

    @property
    def stance(self) -> str:
        return self._stance

    @stance.setter
    def stance(self, stance: str) -> None:
        """The one place the stance changes: the frame hook's own flag for "force_eager" (read
        in C on every call) follows it here."""
        if stance not in self.STANCES:
            raise ValueError(f"unknown stance {stance!r}; one of {', '.join(self.STANCES)}")
        _C.set_force_eager(stance == "force_eager")
        self._stance = stance

    def first_warning(self, kind: str) -> bool:
        """True the first time a warning of `kind` is given in this process (since reset)."""
        with self._lock:
            if kind in self._warned:
                return False
            self._warned.add(kind)
            return True

    def reset(self) -> None:
        self.compiled_codes = weakref.WeakSet()
        self.warned_limit = weakref.WeakSet()
        self.shared_module_codes = weakref.WeakSet()
        self.sizes_changed_codes = weakref.WeakSet()
        self.object_int_values = weakref.WeakKeyDictionary()
        self.self_assigned_ints = weakref.WeakKeyDictionary()
        self.input_shapes = weakref.WeakKeyDictionary()
        self.artifacts.clear()
        self.capture_misses = weakref.WeakKeyDictionary()
        with self._lock:
            self._warned.clear()
        self.daemon.reset()


STATE = ProcessState()

# Event counts, as torch._dynamo.utils.counters keeps them: counters["frames"]["total"] (frames
# the hook asked kiln to capture) and ["ok"] (those that got an entry). Never reset by kiln.
counters = collections.defaultdict(collections.Counter)


def _shape_graph_bytes() -> int:
    """kiln.config.cuda_graph_shape_memory in bytes: a fraction (<= 1) of the memory free on
    the current GPU when the pool is made (its first CUDA plan: after the model was loaded), or
    a byte count."""
    import torch

    limit = config.cuda_graph_shape_memory
    if 0 < limit <= 1:
        free, _total = torch.cuda.mem_get_info()
        return int(limit * free)
    return int(limit)
