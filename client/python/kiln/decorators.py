"""What a program tells the capture about its own functions, as torch._dynamo's decorators do:

    kiln.graph_break()                 ends the graph here (a no-op when run)
    kiln.disallow_in_graph(fn)         every call of fn is a graph break
    kiln.allow_in_graph(fn)            a call of fn is one node of the graph, not traced into
    kiln.assume_constant_result(fn)    fn runs once at capture; its result is a constant

(kiln.disable(fn, recursive=False), which leaves fn's own frame to CPython, is
capture.skip_files.skip_code: the frame hook and the executor's inlining both ask there.)

Programs written for torch.compile keep their markings: torch.compiler.assume_constant_result,
and torch._dynamo's allow_in_graph, disallow_in_graph and graph_break once the program has
imported torch._dynamo (kiln never imports it to find out).
"""
import sys
import types
import weakref

ALLOW = "allow_in_graph"
DISALLOW = "disallow_in_graph"
CONSTANT = "assume_constant_result"

# id(callable) -> (marking, the callable where it cannot be weakly referenced). A weakly
# referenced callable leaves the table when it dies (its id may then be reused); any other is
# held, so that its id stays its own.
_marked = {}


def _mark(fn, how: str):
    if isinstance(fn, (list, tuple)):
        return [_mark(f, how) for f in fn]
    if not callable(fn):
        raise TypeError(f"kiln.{how} expects a callable, got {type(fn).__name__}")
    key = id(fn)
    try:
        weakref.finalize(fn, _marked.pop, key, None)
        _marked[key] = (how, None)
    except TypeError:  # builtins and other objects with no weak references
        _marked[key] = (how, fn)
    return fn


def allow_in_graph(fn):
    """Calls of `fn` become one node of the graph, run on fake tensors at capture instead of
    traced into: `fn` must be a function of its tensor arguments with no effect elsewhere (the
    backend traces it when it compiles the graph). Returns `fn`."""
    return _mark(fn, ALLOW)


def disallow_in_graph(fn):
    """Every call of `fn` (a torch op too, such as torch.sub) is a graph break: it runs
    between two graphs (a Python function's own frame is then captured like any other; with
    disable(fn, recursive=False) it is not). Returns `fn`."""
    return _mark(fn, DISALLOW)


def assume_constant_result(fn):
    """`fn`'s result is taken as a constant: a call runs once at capture, and the graph and its
    guards hold the value it returned (a tensor as a constant of the graph). Tensor arguments
    are given as the program has them at that point: a graph input's own tensor, or what the
    graph so far computes from the real inputs (run on copies of them). The program promises
    the result does not change: nothing checks it again, and later calls with other tensor
    values get the same one (as under torch.compile and its export). Returns `fn`."""
    return _mark(fn, CONSTANT)


def unmark(fn) -> None:
    """Forgets what allow_in_graph, disallow_in_graph or assume_constant_result said of `fn`
    (torch's own markings are torch's to undo)."""
    _marked.pop(id(fn), None)


def graph_break(msg: str = "") -> None:
    """Ends the graph where it is called (under fullgraph=True, an error naming this line)."""


_mark(graph_break, DISALLOW)


def marking(fn):
    """How the capture treats a call of `fn`: ALLOW, DISALLOW, CONSTANT, or None (as usual)."""
    entry = _marked.get(id(fn))
    if entry is not None:
        return entry[0]
    func = getattr(fn, "__func__", fn) if isinstance(fn, types.MethodType) else fn
    if isinstance(func, types.FunctionType) and \
            func.__dict__.get("_dynamo_marked_constant") is True:
        return CONSTANT  # torch.compiler.assume_constant_result
    return _torch_marking(fn)


def _torch_marking(fn):
    """torch._dynamo's own markings, when the program imported it: its disallow_in_graph (and
    graph_break), and its allow_in_graph of functions outside torch (torch's own functions are
    graph ops or traced into as they are)."""
    rules = sys.modules.get("torch._dynamo.trace_rules")
    if rules is None:
        return None
    try:
        if rules.is_callable_disallowed(fn):
            return DISALLOW
        module = getattr(fn, "__module__", None) or ""
        if not module.startswith("torch") and rules.is_callable_allowed(fn):
            return ALLOW
    except Exception:  # another torch's private API: its markings are not read
        return None
    return None
