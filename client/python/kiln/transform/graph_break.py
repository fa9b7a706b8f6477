"""The code that finishes a frame after its graph when the graph broke: the one instruction the
capture could not model runs in Python, then a resume function continues the frame.

A break inside `with` blocks (the executor allows no other handler there) runs its instruction
in the grad mode the program has there (convert_frame sets it), inside a try that calls each
block's __exit__, innermost first, on an exception and raises it again, as the blocks' own
handlers would; the resume function,
whose code keeps the exception table, takes each __exit__ as the stack value it is and leaves
the block as the program does. Only an __exit__ that is rebuilt and never suppresses an
exception qualifies (a grad-mode block's)."""
import inspect
import sys

from kiln import _C
from kiln.capture.code_layout import inside_loop, live_locals
from kiln.capture.skip_files import skip_code
from kiln.exc import Unsupported
from kiln.transform.resume import resume_origin, resume_params, shared_resume, with_cells


def break_body(func, code, gb, rebuild, consts):
    """Statements that finish the frame after its graph: run the breaking instruction in
    Python, then return what a resume function computes from there. In a resume function, the
    rest is a resume function of the code that one continues (resume_origin): the stack values
    it took as parameters are dead locals by now."""
    inst = gb.inst
    ckpt = gb.checkpoint
    stack = list(ckpt.stack)
    guarded = _open_blocks(code, inst, stack, rebuild)
    code, shift = resume_origin(code)
    varnames = resume_params(code)  # cell variables are the frame's locals too
    next_offset = inst.next_offset
    in_loop = inside_loop(code, inst.offset - shift)
    body = []
    resumes = []

    def resume_call(target_offset, stack_vts):
        """A call of a new resume function; `stack_vts` holds trackers, or expressions (str).
        It takes the locals live there (a dead one is unbound: not rebuilt, not guarded)."""
        is_null = [not isinstance(v, str) and v.is_null for v in stack_vts]
        target_offset -= shift
        live = live_locals(code, target_offset)
        unbound = [n for n in varnames if n not in ckpt.locals or
                   (n not in live and n not in code.co_cellvars)]
        local_exprs = ["None" if n in unbound else rebuild(ckpt.locals[n]) for n in varnames]
        try:
            fn = shared_resume(code, func.__globals__, target_offset, tuple(is_null),
                               tuple(unbound))
        except ValueError as e:
            raise Unsupported(f"no resume function for {code.co_qualname}: {e}") from None
        resumes.append(fn.__code__)
        if in_loop:
            # The rest of a loop a graph break interrupts runs as Python (what it calls is
            # captured as usual): captured, it would be one graph per turn of the loop, each
            # guarded on how far the loop got, until cache_size_limit.
            skip_code(fn)
        args = local_exprs + [v if isinstance(v, str) else rebuild(v)
                              for v in stack_vts if isinstance(v, str) or not v.is_null]
        callee = consts.ref(fn)
        if code.co_freevars:  # over this frame's cells, which a lambda here closes over
            cells = f"lambda: ({', '.join(code.co_freevars)},)"
            callee = f"{consts.ref(with_cells)}({callee}, {cells})"
        return f"{callee}({', '.join(args)})"

    if inst.opname == "CALL":
        argc = inst.arg
        kw_names = ckpt.kw_names or ()
        args = stack[len(stack) - argc:]
        fn = stack[len(stack) - argc - 1]
        below = stack[len(stack) - argc - 2]
        rest = stack[:len(stack) - argc - 2]
        if not below.is_null:  # [callable, self, args...]
            args = [fn, *args]
            fn = below
        if _reads_the_frame(fn, len(args)):
            raise Unsupported("a graph break at a call that reads the frame itself (locals(), "
                              "eval, sys._getframe): the transformed code's frame is another")
        npos = len(args) - len(kw_names)
        parts = [rebuild(a) for a in args[:npos]]
        parts += [f"{k}={rebuild(v)}" for k, v in zip(kw_names, args[npos:])]
        body += guarded(f"__kiln_r = {rebuild(fn)}({', '.join(parts)})")
        body.append(f"return {resume_call(next_offset, rest + ['__kiln_r'])}")
    elif inst.opname == "CALL_FUNCTION_EX":
        kwargs_vt = stack[-1] if inst.arg & 1 else None
        rest = stack[:-1] if kwargs_vt is not None else stack
        args_vt, fn, below, rest = rest[-1], rest[-2], rest[-3], rest[:-3]
        call = f"{rebuild(fn)}(*{rebuild(args_vt)}"
        if kwargs_vt is not None:
            call += f", **{rebuild(kwargs_vt)}"
        if not below.is_null:
            raise Unsupported("CALL_FUNCTION_EX without NULL")
        body += guarded(f"__kiln_r = {call})")
        body.append(f"return {resume_call(next_offset, rest + ['__kiln_r'])}")
    elif inst.opname == "BINARY_SUBSCR":
        # x[mask] and other indexing whose result the trace cannot know (its size is the data's).
        body += guarded(f"__kiln_r = {rebuild(stack[-2])}[{rebuild(stack[-1])}]")
        body.append(f"return {resume_call(next_offset, stack[:-2] + ['__kiln_r'])}")
    elif inst.opname.startswith("POP_JUMP"):
        cond = stack[-1]
        rest = stack[:-1]
        jump_if_true = "IF_TRUE" in inst.opname
        taken = resume_call(inst.argval, rest)
        fallthrough = resume_call(next_offset, rest)
        body += guarded(f"__kiln_t = True if {rebuild(cond)} else False")
        body.append("if __kiln_t:")
        body.append(f"    return {taken if jump_if_true else fallthrough}")
        body.append(f"return {fallthrough if jump_if_true else taken}")
    elif inst.opname in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"):
        # `a and b`, `a or b`: the jump keeps the value on the stack, falling through pops it.
        rest = stack[:-1]
        body.append(f"__kiln_c = {rebuild(stack[-1])}")
        body += guarded("__kiln_t = True if __kiln_c else False")
        taken = resume_call(inst.argval, rest + ["__kiln_c"])
        fallthrough = resume_call(next_offset, rest)
        body.append("if __kiln_t:")
        body.append(f"    return {taken if 'IF_TRUE' in inst.opname else fallthrough}")
        body.append(f"return {fallthrough if 'IF_TRUE' in inst.opname else taken}")
    else:
        raise Unsupported(f"no graph break at {inst.opname}")
    return body, resumes


def _open_blocks(code, inst, stack, rebuild):
    """The `with` blocks open at the break: a function that wraps the breaking instruction's
    statement in the code that leaves them on an exception (the transformed code has set the
    grad mode the program has there: convert_frame)."""
    exits = []
    for position in _C.with_exits(code, inst.offset) or ():
        exit_vt = stack[position] if 0 <= position < len(stack) else None
        if not getattr(exit_vt, "never_suppresses", False):
            raise Unsupported(f"a graph break inside a `with` whose __exit__ kiln cannot call "
                              f"for the program ({exit_vt})")
        exits.append(rebuild(exit_vt))
    if not exits:
        return lambda statement: [statement]

    def guarded(statement):
        lines = [statement]
        for exit_expr in exits:  # innermost first: each block's handler sees what the inner one
            lines = (["try:"] + ["    " + line for line in lines] +
                     ["except BaseException as __kiln_e:",
                      f"    {exit_expr}(type(__kiln_e), __kiln_e, __kiln_e.__traceback__)",
                      "    raise"])
        return lines
    return guarded


def _reads_the_frame(fn, nargs: int) -> bool:
    """Whether calling `fn` (a tracker) with `nargs` arguments reads the calling frame: its
    locals (locals(), vars() and dir() without arguments, eval and exec without a namespace) or
    the frame object."""
    try:
        value = fn.as_python_constant()
    except Unsupported:
        return False
    try:
        if value in (locals, sys._getframe, inspect.currentframe):
            return True
        return (value in (vars, dir) and nargs == 0) or (value in (eval, exec) and nargs == 1)
    except TypeError:  # an unhashable, uncomparable object
        return False
