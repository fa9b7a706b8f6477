"""From a frame the hook could not answer to a cache entry: capture, call the backend, write
the transformed code, build the guard tree. Also decides which frames kiln never looks at."""
import dis
import io
import logging
import sys
import time
from typing import List

import torch

from kiln import _C, config
from kiln.backends.registry import static_shapes_only, symbolic_compiler
from kiln.backends.specialize import per_signature
from kiln.capture.frame import capture_frame
from kiln.entry import EntryInfo, next_compile_id
from kiln.exc import BackendCompilerFailed, CapturedForAnotherDevice, NothingToCompile
from kiln.graph import stand_in
from kiln.graph.output_graph import plain_alias, realized
from kiln.graph.symbolic_ir import shape_env_state
from kiln.graph.symbolic_shapes import is_input_size_guard, settle_min_max
from kiln.state import STATE
from kiln.transform.codegen import ConstTable, Reconstructor, transformed_code
from kiln.transform.graph_break import break_body
from kiln.transform.resume import resume_origin
from kiln.variables.side_effects import assigned_ints, replay_statements, stores_named

log = logging.getLogger("kiln")

# -- capture -----------------------------------------------------------------------------------

def convert_frame(func, code, slots, backend, backend_name: str, fullgraph: bool = False,
                  stored=None, unspecialized_modules: bool = False, dynamic=None):
    """Captures the frame of `func` about to run with argument `slots`, compiles its graph with
    the backend and writes the transformed code: capture -> backend -> transform -> guards.
    Returns the hook's (guard_manager, transformed_code, info). Raises Unsupported (a frame
    kiln cannot capture even in part, or any break with fullgraph) or BackendCompilerFailed.
    `stored` (kiln.stored_capture.StoredCaptures): where the entry is stored when it can be.
    `unspecialized_modules`: the frame's modules guarded by structure (OutputGraph).
    `dynamic`: kiln.compile's (kiln.graph.symbolic_shapes)."""
    if stored is not None:
        from kiln.graph.lowering import _global_state

        global_state = _global_state()
    else:
        global_state = None
    capture = capture_frame(func, code, slots, may_break=not fullgraph,
                            unspecialized_modules=unspecialized_modules, dynamic=dynamic)
    output = capture.output
    consts = ConstTable()
    op_count = output.count_calls()
    if (op_count == 0 and capture.graph_break is None and not fullgraph
            and not output.attribute_stores and not output.container_stores
            and resume_origin(code)[0] is code):
        # A config's __getattribute__, a dataclass's __setattr__: an entry per argument value
        # would only fill the cache up to its limit. Not a resume function: every break at
        # one place shares it (the last turn of a loop that breaks has no op, the others do).
        raise NothingToCompile(f"{code.co_qualname} runs no torch op: left to Python")
    graph_break = capture.graph_break
    # Values read from sources are read once, before anything the transformed code runs that
    # could change them: the replayed stores, and the instruction a graph break leaves to
    # Python (`value = getattr(obj, k); delattr(obj, k)` breaks at delattr, and the resume
    # function's `value` is what the frame read before it).
    rebuild = Reconstructor(consts, use_graph=op_count > 0, snapshot=bool(
        output.attribute_stores or output.container_stores or graph_break is not None))
    rebuild.root = capture.translator
    rebuild.at_break = graph_break is not None
    if graph_break is None:
        body = [f"return {rebuild(capture.returned)}"]
        resumes = []
    else:
        body, resumes = break_body(func, code, graph_break, rebuild, consts)
    # The frame's attribute assignments, after the graph and before anything else runs.
    stores = replay_statements(output, rebuild)
    if capture.grad_mode[0] != capture.grad_mode[1]:
        # The graph ends in another grad mode than it began in (inside a `with no_grad()`, or
        # in a resume function that starts in one): a backend that takes the graph's switches
        # for its own tracing does not leave the mode switched, the program does.
        stores.insert(0, f"{consts.ref(torch._C._set_grad_enabled)}"
                         f"({capture.grad_mode[1]!r})")
    cells = rebuild.fill_cells()  # after every temporary: a value may be one of them
    body = rebuild.prelude + cells + stores + body
    compile_id = next_compile_id()
    name = f"__compiled_fn_{compile_id}"
    gm = None
    compiled = raw = None
    region = None
    call_expr = ""
    t1 = time.perf_counter()
    if op_count > 0:
        if capture.grad_mode[0] != capture.grad_mode[1]:
            output.end_in_grad_mode(capture.grad_mode[0])
        gm = output.make_graph_module(rebuild.outputs.nodes, name)
        example_inputs = [inp.example for inp in output.inputs]
        env = output.symbolic.shape_env if output.is_dynamic else None
        before = shape_env_state(env) if env is not None else None
        if env is not None and symbolic_compiler(backend) is not None:
            # A plan for every size carries polynomials of the sizes: each min or max of them
            # is guarded to the side this call takes.
            settle_min_max(env, example_inputs + [n.meta.get("example_value")
                                                  for n in gm.graph.nodes])
        try:
            raw = (per_signature(gm, example_inputs, backend, symbolic_compiler(backend))
                   if output.is_dynamic and static_shapes_only(backend)
                   else backend(gm, example_inputs))
        except Exception as e:
            raise BackendCompilerFailed(backend_name, e) from e
        if env is not None and shape_env_state(env) != before:
            # What was learnt of the sizes since the capture wrote its guards (the settled
            # mins and maxes; a backend's own trace of the symbolic graph, as torch.compile's
            # makes): the entry checks that too.
            output.symbolic_guards()
        compiled = realized(raw, gm)
        if not callable(compiled):
            raise BackendCompilerFailed(backend_name, TypeError(
                f"backend returned {type(compiled).__name__}, not a callable"))
        region = _C.FrameRegion(compiled, None)  # what the graph runs is never captured
        args = ", ".join(f"{consts.ref(plain_alias)}({inp.source.expr(consts)})" if inp.plain
                         else inp.source.expr(consts) for inp in output.inputs)
        call_expr = f"{consts.ref(region)}({args})"
    t2 = time.perf_counter()
    new_code, src = transformed_code(code, len(slots), call_expr, body, consts)
    guards = output.guards.describe()
    manager = output.guards.build(guards, code=code)
    info = EntryInfo(compile_id=compile_id, name=name, graph_module=gm, compiled_fn=compiled,
                     guards=guards, original_code=code,
                     transformed_code=new_code, transformed_source=src, op_count=op_count,
                     capture_seconds=capture.seconds, backend_seconds=t2 - t1)
    if graph_break is not None:
        info.break_reason = graph_break.reason
        info.break_where = graph_break.where
        info.resume_codes = resumes
    # What the transformed code assigns beside the graph (export refuses these: its graph
    # cannot make them).
    info.extra["replayed_stores"] = stores_named(output)
    # Which failed guard means "another instance of the same module class" (FrameCallback).
    info.extra["module_identity_guards"] = frozenset(
        text for g, text in zip(output.guards, guards)
        if g.kind == "ID_MATCH" and isinstance(g.value, torch.nn.Module))
    # Which failed guard means "an input's size changed" (automatic dynamic shapes).
    info.extra["input_size_guards"] = frozenset(
        text for g, text in zip(output.guards, guards)
        if is_input_size_guard(g, output.symbolic.object_ints))
    seen = STATE.object_int_values.setdefault(code, {})
    for source, value in output.symbolic.object_ints.items():
        seen.setdefault(source, set()).add(value)
    assigned = assigned_ints(output)
    if assigned:
        STATE.self_assigned_ints[code] = STATE.self_assigned_ints.get(code, frozenset()) | assigned
    shapes = STATE.input_shapes.setdefault(code, {})
    for source, shape in output.symbolic.shapes.items():
        shapes.setdefault(source, set()).add(shape)
    if stored is not None:
        t3 = time.perf_counter()
        _store(stored, code, output, consts, src, region, gm, raw, global_state)
        info.extra["store_seconds"] = time.perf_counter() - t3
    _print_debug(info)
    if stand_in.target() is not None:
        # Captured (and stored) for the GPU its CPU tensors stood for: its graph and transformed
        # code are that GPU's, so the frame runs as written here.
        raise CapturedForAnotherDevice(
            f"captured for {stand_in.target()} and stored; runs eagerly here", manager)
    return manager, new_code, info


def _store(stored, code, output, consts, src, region, gm, compiled, global_state) -> None:
    # `compiled`: what the backend returned (the artifact's plan, or under compile_only the
    # graph module's forward it runs meanwhile; for symbolic sizes, its per-signature compile).
    """Stores the entry for other processes (kiln.stored_capture), when a record can name all
    it holds; otherwise says why at debug level. An entry with symbolic sizes is stored once
    its plan for every size is ready (on kiln's background worker, when it compiles there):
    the record names that plan, which serves another process's calls of every size."""
    from kiln.backends.specialize import PerSignature

    if output.is_dynamic and gm is not None and isinstance(compiled, PerSignature):
        compiled.when_whole(lambda whole: _store_now(stored, code, output, consts, src, region,
                                                     gm, whole, global_state))
        return
    _store_now(stored, code, output, consts, src, region, gm, compiled, global_state)


def _store_now(stored, code, output, consts, src, region, gm, compiled, global_state) -> None:
    from kiln import stored_capture
    from kiln.graph.lowering import attr_tensors

    # Describing a large capture (a transformer: thousands of guards) must not start a full
    # collection on the first call's path.
    with stored_capture.collector_held():
        try:
            graph = None
            size_outputs = int_inputs = None
            floors = ()
            if output.is_dynamic:
                if gm is None:
                    raise stored_capture.NotStorable("the graph has symbolic sizes")
                compiled, size_outputs, int_inputs, floors = \
                    stored_capture.whole_plan_parts(compiled)
            compiled, cpu_scalars = stored_capture.cpu_scalars_of(compiled)
            if any(i.plain for i in output.inputs):
                raise stored_capture.NotStorable("the graph takes a tensor whose class "
                                                 "overrides __torch_function__")
            if gm is not None:
                artifact = next((a for a in reversed(STATE.artifacts) if a.plan is compiled), None)
                if artifact is None:
                    raise stored_capture.NotStorable(
                        "no one kilnd artifact runs the graph (it runs eagerly, or as a "
                        "forward and a backward graph)")
                params = attr_tensors(gm)
                sources = [output.attr_sources[name] for name in params]
                if any(s is None for s in sources):
                    raise stored_capture.NotStorable(
                        "the graph holds a tensor no frame has (an assume_constant_result "
                        "function's result)")
                device = next((stand_in.device_of(t) for t in [*params.values(), *(
                    i.example for i in output.inputs)]), torch.device("cpu"))
                graph = stored_capture.describe_graph(artifact, sources,
                                                      [i.source for i in output.inputs], device,
                                                      stored.cuda_graphs,
                                                      output.unspecialized_modules,
                                                      size_outputs, int_inputs, cpu_scalars,
                                                      floors)
            record = stored_capture.describe_entry(
                code=code, guards=output.guards, global_state=global_state, src=src,
                consts=consts.objects, region=region, graph=graph,
                input_size=[is_input_size_guard(g, output.symbolic.object_ints)
                            for g in output.guards])
            stored.put(code, record)
        except (stored_capture.NotStorable, stand_in.CannotStandIn) as e:
            stored_capture.say("kiln: %s: capture not stored: %s", code.co_qualname, e)
        except Exception as e:  # noqa: a bug of kiln's; the capture runs here all the same
            message = f"{code.co_qualname}: capture not stored ({type(e).__name__}: {e})"
            if STATE.first_warning("stored capture"):
                log.warning("kiln: %s", message)
            else:
                stored_capture.say("kiln: %s", message)


def _print_debug(info: EntryInfo):
    if not (config.logs("graph") or config.logs("bytecode") or config.logs("guards")):
        return
    out = io.StringIO()
    if config.logs("graph"):
        out.write(f"\n{info.name}\n")
        if info.graph_module is not None:
            out.write(format_graph_tabular(info.graph_module.graph) + "\n")
        else:
            out.write("(no ops: nothing to compile)\n")
    if config.logs("bytecode"):
        out.write("\nORIGINAL BYTECODE\n")
        dis.dis(info.original_code, file=out)
        out.write("\nMODIFIED BYTECODE\n")
        dis.dis(info.transformed_code, file=out)
    if config.logs("guards"):
        out.write("\nGUARDS:\n")
        for g in info.guards:
            out.write(f" - {g}\n")
    sys.stderr.write(out.getvalue())


def format_graph_tabular(graph: torch.fx.Graph) -> str:
    """The table print_tabular shows, without its optional dependency."""
    rows = [("opcode", "name", "target", "args", "kwargs")]
    for n in graph.nodes:
        rows.append((n.op, n.name, str(n.target), str(n.args), str(n.kwargs)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(rows[0], widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r in rows[1:]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)
