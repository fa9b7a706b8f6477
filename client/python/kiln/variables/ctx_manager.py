"""Context managers the executor models. `with` is BEFORE_WITH (enter_context: the __exit__ to
call, what __enter__ returned), the block, then a call of that __exit__ with three Nones.

- torch.no_grad() and torch.enable_grad(): entering and leaving record
  torch._C._set_grad_enabled into the graph, so the compiled graph switches grad mode exactly
  where the program did, and switch it during capture too, so fake values get the
  requires_grad eager would give them.
- torch.autocast(...) (torch.amp.autocast, torch.cpu.amp.autocast, torch.cuda.amp.autocast),
  made in the frame or read from outside it: entering and leaving record
  torch.amp._enter_autocast / _exit_autocast nodes, as TorchDynamo's graphs have them (running
  the graph runs them; AOT autograd's tracing runs them, so its graphs hold the casts), and
  switch autocast during capture too, so fake values get the dtypes eager gives.
- an object of a class whose __enter__ and __exit__ are Python functions (a user's class,
  contextlib.nullcontext; not torch's own, whose state switches the trace does not see as such):
  __enter__ inlined at the start, __exit__(None, None, None) at the end.

An exception inside the block, which __exit__ would see, is not modelled (the executor's
WITH_EXCEPT_START is Unsupported). A graph break inside a grad-mode block resumes inside it: its
__exit__ is a GradModeRestore there (kiln.transform.graph_break)."""
import contextlib
import inspect
import threading
import types

import torch

from kiln.exc import Unsupported
from kiln.graph import stand_in
from kiln.variables.base import VariableTracker, constant_args
from kiln.variables.class_attr import class_attr, class_source
from kiln.variables.constant import ConstantVariable


def enter_context(tx, ctx: VariableTracker):
    """BEFORE_WITH over `ctx`: (the bound __exit__, what __enter__ returned), both trackers. A
    tracker that models its own `with` overrides enter; an object whose class has Python
    __enter__ and __exit__ has them inlined, an autocast object from outside becomes an
    AutocastVariable."""
    if type(ctx).enter is not VariableTracker.enter:
        return ctx.enter(tx)
    try:
        cls = ctx.python_type()
    except Unsupported:
        raise Unsupported(f"`with` over {ctx}") from None
    if cls in _AUTOCAST_CLASSES:
        return AutocastVariable.read(tx, ctx).enter(tx)
    if (getattr(cls, "__module__", None) or "").split(".")[0] == "torch":
        # torch's own switch process state through functions the trace takes for graph ops or
        # constants (torch.cuda.device would switch devices only while tracing): each is
        # modelled by a tracker of its own, or not at all.
        raise Unsupported(f"`with` over a {cls.__module__}.{cls.__qualname__}")
    # Python looks both methods up on the class, never the instance.
    enter_fn = inspect.getattr_static(cls, "__enter__", None)
    exit_fn = inspect.getattr_static(cls, "__exit__", None)
    if not (isinstance(enter_fn, types.FunctionType) and isinstance(exit_fn, types.FunctionType)):
        raise Unsupported(f"`with` over a {cls.__qualname__} (its __enter__ and __exit__ are not "
                          "both Python functions)")
    # The class is pinned by the object's guards; its methods are guarded through it.
    exit_method = class_attr(tx, cls, "__exit__", ctx, cls_source=class_source(cls))
    entered = class_attr(tx, cls, "__enter__", ctx, cls_source=class_source(cls))
    return exit_method, entered.call_function(tx, [], {})


def context_manager(tx, cls, args, kwargs) -> VariableTracker:
    """`cls(*args, **kwargs)` for one of torch's context-manager classes in
    CONTEXT_MANAGER_CLASSES."""
    if cls in (torch.no_grad, torch.enable_grad):
        if args or kwargs:
            raise Unsupported(f"torch.{cls.__name__} with arguments")
        return GradModeVariable(cls is torch.enable_grad)
    if cls is torch.set_grad_enabled:
        return SetGradEnabledVariable.construct(tx, args, kwargs)
    return AutocastVariable.construct(tx, cls, args, kwargs)


# -- grad mode ---------------------------------------------------------------------------------


class GradModeVariable(VariableTracker):
    def __init__(self, enabled: bool):
        super().__init__(None)
        self.enabled = enabled

    def python_type(self):
        return torch.no_grad if not self.enabled else torch.enable_grad

    def enter(self, tx):
        prior = torch.is_grad_enabled()
        set_grad_mode(tx, self.enabled)
        return GradModeExitVariable(prior), ConstantVariable(None)


class GradModeExitVariable(VariableTracker):
    """The bound __exit__ that BEFORE_WITH leaves on the stack. Across a graph break inside the
    block it is a GradModeRestore (the stack value the resume function takes): it never
    suppresses an exception, so the transformed code may call it on the way out of the
    breaking instruction (kiln.transform.graph_break)."""

    never_suppresses = True

    def __init__(self, prior: bool, source=None):
        super().__init__(source)
        self.prior = prior

    def call_function(self, tx, args, kwargs):
        set_grad_mode(tx, self.prior)
        return ConstantVariable(None)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        return codegen.constant(GradModeRestore.TO[self.prior])


class GradModeRestore:
    """The __exit__ of a grad-mode `with` (torch.no_grad(), enable_grad(), set_grad_enabled())
    open at a graph break, as the transformed code and the resume function hold it: sets the
    mode the block found, as torch's __exit__ does, and returns None. One per mode."""

    __slots__ = ("prior",)
    TO: dict = {}

    def __init__(self, prior: bool):
        self.prior = prior

    def __call__(self, exc_type=None, exc=None, traceback=None):
        torch._C._set_grad_enabled(self.prior)

    def __repr__(self):
        return f"<kiln: restore grad mode {self.prior}>"


GradModeRestore.TO.update({mode: GradModeRestore(mode) for mode in (False, True)})


class SetGradEnabledVariable(VariableTracker):
    """torch.set_grad_enabled(mode): switches grad mode when made, as its constructor does
    (entered by a `with`, it restores the mode it found on exit). Called as a plain statement
    it leaves the mode switched: the trace goes on in that mode, and the transformed code sets
    the mode the program has where the graph ends (kiln.convert_frame)."""

    def __init__(self, prior: bool):
        super().__init__(None)
        self.prior = prior

    @classmethod
    def construct(cls, tx, args, kwargs):
        const = constant_args(args, kwargs)
        if const is None or len(const[0]) + len(const[1]) != 1 or set(const[1]) - {"mode"}:
            raise Unsupported("torch.set_grad_enabled with other than one constant argument")
        mode = (const[0] or list(const[1].values()))[0]
        if type(mode) is not bool:  # torch's raises TypeError
            raise Unsupported(f"torch.set_grad_enabled({mode!r}), which is not a bool")
        made = cls(torch.is_grad_enabled())
        set_grad_mode(tx, mode)
        return made

    def python_type(self):
        return torch.set_grad_enabled

    def enter(self, tx):
        return GradModeExitVariable(self.prior), ConstantVariable(None)



def set_grad_mode(tx, enabled: bool):
    """Grad mode switched at this point of the trace (a node of the graph, and the mode the
    rest of the trace runs under)."""
    tx.output.call("call_function", torch._C._set_grad_enabled, (ConstantVariable(enabled),), {})


# -- autocast ----------------------------------------------------------------------------------

# The autocast classes whose __enter__ and __exit__ are torch.amp.autocast's, with the device a
# class fixes (None: its first argument).
_AUTOCAST_CLASSES = {torch.amp.autocast: None, torch.cpu.amp.autocast: "cpu",
                     torch.cuda.amp.autocast: "cuda"}

CONTEXT_MANAGER_CLASSES = frozenset({torch.no_grad, torch.enable_grad, torch.set_grad_enabled,
                                     *_AUTOCAST_CLASSES})


class AutocastVariable(VariableTracker):
    """An autocast object: its device, dtype, enabled and cache_enabled as its constructor
    resolved them (the device's default dtype, a dtype the device does not take disabling it),
    which is what torch.amp._enter_autocast is given in the graph."""

    def __init__(self, cls, args: tuple):
        super().__init__(None)
        self.cls = cls
        self.args = args  # (device_type, dtype, enabled, cache_enabled)
        self.entered = False
        self.outside = None  # the tracker of the object, where it was read from outside

    @property
    def fresh_object(self):
        return self.outside is None  # made in the frame: the tracker is its identity

    @classmethod
    def construct(cls, tx, autocast_cls, args, kwargs) -> "AutocastVariable":
        """`autocast_cls(*args, **kwargs)` in the frame, from constant arguments."""
        const = constant_args(args, kwargs)
        if const is None:
            raise Unsupported(f"{autocast_cls.__qualname__} with arguments that are not "
                              "constants")
        try:
            bound = inspect.signature(autocast_cls.__init__).bind(None, *const[0], **const[1])
        except TypeError as e:
            raise Unsupported(f"{autocast_cls.__qualname__}(): {e}") from None
        bound.apply_defaults()
        a = bound.arguments
        device = _AUTOCAST_CLASSES[autocast_cls] or a["device_type"]
        tx.output.guards.add(None, "GLOBAL_STATE")  # the defaults read autocast's settings
        return cls(autocast_cls, _resolved(device, a["dtype"], a["enabled"], a["cache_enabled"]))

    @classmethod
    def read(cls, tx, obj: VariableTracker) -> "AutocastVariable":
        """An autocast object from outside the frame (a decorator's, an attribute), its settings
        read through its tracker, and so guarded."""
        values = []
        for name in ("device", "fast_dtype", "_enabled", "_cache_enabled"):
            try:
                vt = obj.var_getattr(tx, name)
                values.append(vt.as_python_constant())
            except Unsupported:  # a TracedException too: `with` itself raises nothing here
                raise Unsupported(f"an autocast object whose {name} is not a constant") from None
        vt = cls(obj.python_type(), tuple(values))
        vt.outside = obj
        return vt

    def python_type(self):
        return self.cls

    def identity(self, tx):
        return self.outside.identity(tx) if self.outside is not None else self

    def enter(self, tx):
        mode = torch.amp.autocast(*self.args)
        mode.__enter__()  # during capture too: fake values get the dtypes eager gives
        _trace_time_modes().append(mode)
        node = _record(tx, torch.amp._enter_autocast, self.args)
        self.entered = True
        return AutocastExitVariable(mode, node), self

    def reconstruct(self, codegen) -> str:
        if self.outside is not None:
            return codegen(self.outside)
        if self.entered:
            raise Unsupported("kiln cannot rebuild an autocast object the frame entered")
        device, dtype, enabled, cache_enabled = self.args
        return (f"{codegen.constant(torch.amp.autocast)}({codegen.constant(device)}, "
                f"{codegen.constant(dtype)}, {enabled!r}, {cache_enabled!r})")

    def __repr__(self):
        return f"AutocastVariable{self.args!r}"


class AutocastExitVariable(VariableTracker):
    """The bound __exit__ of an autocast object BEFORE_WITH entered."""

    def __init__(self, mode, enter_node):
        super().__init__(None)
        self.mode = mode
        self.enter_node = enter_node

    def call_function(self, tx, args, kwargs):
        _record(tx, torch.amp._exit_autocast, (self.enter_node,))
        modes = _trace_time_modes()
        if not modes or modes[-1] is not self.mode:
            raise Unsupported("autocast regions left out of order")
        modes.pop().__exit__(None, None, None)
        return ConstantVariable(False)


def _resolved(device, dtype, enabled, cache_enabled) -> tuple:
    """(device_type, dtype, enabled, cache_enabled) as torch.amp.autocast's constructor resolves
    them, or Unsupported where it raises."""
    if not isinstance(device, str):
        raise Unsupported(f"autocast over device {device!r}")
    if device != "cpu" and stand_in.target() is not None:
        # Standing in for a GPU: this machine's CUDA state would decide the settings.
        raise Unsupported(f"autocast over {device!r} while capturing for {stand_in.target()}")
    try:
        mode = torch.amp.autocast(device, dtype=dtype, enabled=enabled,
                                  cache_enabled=cache_enabled)
    except Exception as e:  # an unknown device, bfloat16 on a GPU without it
        raise Unsupported(f"torch.autocast({device!r}) raised {type(e).__name__}: {e}") from None
    return mode.device, mode.fast_dtype, mode._enabled, mode._cache_enabled


def _record(tx, target, args: tuple):
    """A node calling `target(*args)` for its effect on autocast (its result, the autocast
    object, is no value the trace reads): recorded as it stands, not run on fake values."""
    output = tx.output
    node = output.graph.create_node("call_function", target, args, {},
                                    name=output.unique_name(target.__name__.lstrip("_")))
    node.meta["example_value"] = None
    return node


# The autocast objects entered during the capture in progress (per thread, as autocast's state
# is), outermost first: a capture that ends inside a region (a break, Unsupported) leaves it
# through unwind_autocast.
_local = threading.local()


def _trace_time_modes() -> list:
    modes = getattr(_local, "modes", None)
    if modes is None:
        modes = _local.modes = []
    return modes


def autocast_mark() -> int:
    """Where the capture starting now begins in the list of entered autocast regions."""
    return len(_trace_time_modes())


def unwind_autocast(mark: int) -> None:
    """Leaves the autocast regions the capture entered after `mark` and did not leave."""
    modes = _trace_time_modes()
    while len(modes) > mark:
        modes.pop().__exit__(None, None, None)
