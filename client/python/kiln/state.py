"""kiln's state in this process, in one object: the stance compiled functions follow, the code
objects kiln made entries for or gave up on, the warnings already given, and what the "kiln"
backend loaded. kiln.reset() resets it (and the frame hook's entries of those code objects).
Settings the user chooses live in kiln.config; this is what kiln itself accumulates."""
import threading
import weakref
from typing import List

from kiln import _C


class ProcessState:
    STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile")

    def __init__(self):
        self._stance = "default"
        # Every code object kiln made entries for or gave up on, so reset() can forget them.
        self.compiled_codes: "weakref.WeakSet" = weakref.WeakSet()
        # Code objects already warned about reaching the cache size limit.
        self.warned_limit: "weakref.WeakSet" = weakref.WeakSet()
        # Every artifact the "kiln" backend loaded, newest last (kiln.debug.artifacts).
        self.artifacts: List = []
        self._warned = set()
        self._lock = threading.Lock()

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
        self.artifacts.clear()
        with self._lock:
            self._warned.clear()


STATE = ProcessState()
