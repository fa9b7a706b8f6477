"""Errors kiln raises to the user. Plumbing failures never raise: they fall back to eager."""


class KilnError(RuntimeError):
    """Base of every error kiln raises."""


class Unsupported(KilnError):
    """Capture met something it cannot model (raised to the user only with fullgraph=True).
    `located`: the executor has added the user's file and line (the innermost frame's, once)."""

    def __init__(self, msg: str, *, source_line: str = ""):
        self.reason = msg
        self.source_line = source_line
        self.located = bool(source_line)
        super().__init__(f"{msg}\n{source_line}" if source_line else msg)


class TracedException(Unsupported):
    """The traced code raises an exception that the trace knows it raises (the guards make it
    certain): a missing key of a guarded dict, `raise ValueError(...)`. `value` is the tracker of
    the exception object (kiln.variables.exceptions). The executor runs the handler that the
    exception table of the raising frame, or of a caller it inlined that frame into, names for
    the raising instruction; one that no traced frame handles is Unsupported like any other, and
    eager then raises it for real."""

    def __init__(self, value, msg: str, *, source_line: str = ""):
        super().__init__(msg, source_line=source_line)
        self.value = value


class NothingToCompile(Unsupported):
    """The whole frame was captured and it runs no torch op and changes nothing kiln would
    replay: the original code is what a transformed one would run, so the code is left to
    CPython from then on (its callees are still captured), as torch.compile skips such frames.
    Never raised with fullgraph=True."""


class CapturedForAnotherDevice(Unsupported):
    """A frame was captured (and stored) for the GPU its CPU tensors stood for
    (kiln.graph.stand_in): it runs eagerly here while `guards` (the capture's guard tree, over
    this process's CPU tensors) hold."""

    def __init__(self, msg: str, guards):
        super().__init__(msg)
        self.guards = guards


class BackendCompilerFailed(KilnError):
    """The backend raised while compiling a captured graph."""

    def __init__(self, backend_name: str, inner: BaseException):
        self.backend_name = backend_name
        self.inner = inner
        super().__init__(f"backend {backend_name!r} raised {type(inner).__name__}: {inner}")


class RecompileError(KilnError):
    """A compile was needed while the stance forbids it ("fail_on_recompile")."""


class ExportOptionError(ValueError, AssertionError):
    """kiln.export was given options that do not go together (a decomposition table without
    aten_graph, a tracing mode kiln does not export). A ValueError, and the AssertionError that
    torch._dynamo.export raises for them, so that programs written for it catch it."""


class InvalidBackend(KilnError):
    """kiln.compile was given a backend name that is not registered."""
