"""The code that finishes a frame after its graph when the graph broke: the one instruction the
capture could not model runs in Python, then a resume function continues the frame."""
from kiln.capture.code_layout import live_locals
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
    code, shift = resume_origin(code)
    varnames = resume_params(code)  # cell variables are the frame's locals too
    next_offset = inst.next_offset
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
        npos = len(args) - len(kw_names)
        parts = [rebuild(a) for a in args[:npos]]
        parts += [f"{k}={rebuild(v)}" for k, v in zip(kw_names, args[npos:])]
        body.append(f"__kiln_r = {rebuild(fn)}({', '.join(parts)})")
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
        body.append(f"__kiln_r = {call})")
        body.append(f"return {resume_call(next_offset, rest + ['__kiln_r'])}")
    elif inst.opname.startswith("POP_JUMP"):
        cond = stack[-1]
        rest = stack[:-1]
        jump_if_true = "IF_TRUE" in inst.opname
        taken = resume_call(inst.argval, rest)
        fallthrough = resume_call(next_offset, rest)
        body.append(f"if {rebuild(cond)}:")
        body.append(f"    return {taken if jump_if_true else fallthrough}")
        body.append(f"return {fallthrough if jump_if_true else taken}")
    else:
        raise Unsupported(f"no graph break at {inst.opname}")
    return body, resumes
