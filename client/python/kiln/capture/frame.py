"""Capturing one frame: the symbolic executor (kiln._C.Translator) runs the frame's bytecode
with trackers, recording the graph and the guards, and the capture returns one result that the
later stages (the backend, the transformed code's writer) consume. Nothing after this stage
needs the executor or the tracker classes: trackers reach it only as values with the protocol
of kiln.variables.base (reconstruct, is_null)."""
import time
from dataclasses import dataclass
from typing import Optional

import torch

from kiln import _C
from kiln.capture.graph_break import GraphBreak
from kiln.capture.host import HOST
from kiln.graph.output_graph import OutputGraph
from kiln.graph.symbolic_shapes import SymbolicInputs
from kiln.state import STATE
from kiln.variables.ctx_manager import autocast_mark, unwind_autocast
from kiln.variables.side_effects import finish as finish_attribute_stores
from kiln.variables.side_effects import mutations_of
from kiln.variables.tensor import ScalarVariable, TensorVariable, wrap_op_result


@dataclass
class Capture:
    """What capturing a frame produced.

    output: the graph (FX graph, inputs with their sources, attributes) and its guards.
    returned: the tracker of the frame's return value, when the whole frame was captured.
    graph_break: where the graph ended before the frame did (the instruction, the stack and
    locals before it, why), with the graph rolled back to that point; None otherwise.
    seconds: how long the capture took.
    grad_mode: (the grad mode the frame began in, the one the program has where the graph ends:
    at the return, or at the break), which differ where a graph ends inside a `with
    torch.no_grad()` or a resume function starts in one.
    translator: the root frame's executor (what owns the frame's cells, for rebuilding the
    functions the frame made: Reconstructor.cell)."""
    output: OutputGraph
    returned: Optional[object]
    graph_break: Optional[GraphBreak]
    seconds: float
    translator: object = None
    grad_mode: tuple = (True, True)


def capture_frame(func, code, slots, may_break: bool, unspecialized_modules: bool = False,
                  dynamic: Optional[bool] = None) -> Capture:
    """Captures the frame of `func` (code `code`) about to run with argument `slots`. Raises
    kiln.exc.Unsupported when the frame cannot be captured even in part (or breaks while
    `may_break` is False). `unspecialized_modules`: see OutputGraph. `dynamic`: kiln.compile's
    (kiln.graph.symbolic_shapes)."""
    t0 = time.perf_counter()
    output = OutputGraph(TensorVariable, wrap_op_result, ScalarVariable)
    output.unspecialized_modules = unspecialized_modules
    output.symbolic = SymbolicInputs(output.fake_mode, dynamic,
                                     STATE.object_int_values.get(code, {}),
                                     STATE.input_shapes.get(code, {}),
                                     STATE.self_assigned_ints.get(code, frozenset()))
    tx = _C.Translator.root(func, code, slots, output, HOST, may_break=may_break)
    graph_break = None
    returned = None
    grad_enabled = torch.is_grad_enabled()
    autocast = autocast_mark()
    grad_after = None
    try:
        returned = tx.run()
        grad_after = torch.is_grad_enabled()
    except GraphBreak as gb:
        grad_after = gb.checkpoint.grad_enabled
        graph_break = gb
        graph_ckpt, mutations_ckpt = gb.checkpoint.graph
        output.restore(graph_ckpt)
        mutations_of(output).restore(mutations_ckpt)
    finally:
        # `with no_grad()` or `with autocast()` in the trace switched them; a capture that ended
        # inside the block left them so.
        unwind_autocast(autocast)
        torch._C._set_grad_enabled(grad_enabled)
    output.guards.add(None, "GLOBAL_STATE")
    output.guard_distinct_inputs()
    output.symbolic_guards()
    finish_attribute_stores(output)  # held attribute assignments: dropped if net unchanged
    return Capture(output, returned, graph_break, time.perf_counter() - t0, tx,
                   (grad_enabled, grad_after))
