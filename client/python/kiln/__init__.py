"""kiln: a just-in-time compiler for unmodified PyTorch programs.

    import kiln
    fast = kiln.compile(model)            # like torch.compile
    @kiln.optimize(my_backend)            # like torch._dynamo.optimize
    def f(x, y): ...
"""
from kiln import config, exc
from kiln.backends import list_backends, register_backend
from kiln.decorators import (allow_in_graph, assume_constant_result, disallow_in_graph,
                             graph_break)
from kiln.eval_frame import (compile, disable, optimize, reset, run, set_stance,
                              wait_for_compiles)
from kiln.explain import explain
from kiln.export import export
from kiln import debug
from kiln.shape_marks import mark_dynamic, mark_static, mark_unbacked, maybe_mark_dynamic
from kiln.state import counters

__all__ = ["compile", "optimize", "disable", "reset", "run", "set_stance", "wait_for_compiles",
           "explain", "export", "list_backends", "register_backend", "config", "exc", "debug",
           "allow_in_graph", "disallow_in_graph", "graph_break", "assume_constant_result",
           "counters", "mark_dynamic", "maybe_mark_dynamic", "mark_static", "mark_unbacked"]
