"""The executor's instruction decoder (client/bytecode) against the interpreter's own `dis`, on
CPython 3.11 and 3.12: every instruction of a few thousand real code objects, with the argument
values the executor reads (names, constants, locals, cells, comparisons, jump targets) and the
lines that start at each offset."""
import dis
import inspect
import types

import pytest
import torch

import kiln
from kiln import _C


def _code_objects():
    """Code objects from torch.nn, torch.nn.functional and kiln, nested ones included."""
    seen = {}

    def visit(code):
        if id(code) in seen:
            return
        seen[id(code)] = code
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                visit(c)

    modules = [torch.nn.functional, torch.nn.modules.conv, torch.nn.modules.activation,
               torch.nn.modules.module, torch.nn.modules.transformer, inspect, dis]
    for mod in modules:
        for obj in vars(mod).values():
            fns = [obj]
            if isinstance(obj, type):
                fns = [getattr(f, "__func__", f) for f in vars(obj).values()]
            for f in fns:
                code = getattr(f, "__code__", None)
                if isinstance(code, types.CodeType):
                    visit(code)
    return list(seen.values())


CODES = _code_objects()


def _same(a, b):
    return a is b or type(a) is type(b) and a == b


def test_decoder_reads_every_instruction_as_dis_does():
    assert len(CODES) > 500
    checked = 0
    for code in CODES:
        ours = _C.instructions(code)
        theirs = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        assert len(ours) == len(theirs), code
        for a, b in zip(ours, theirs):
            where = f"{code.co_qualname} @ {b.offset} {b.opname}"
            assert (a.opname, a.opcode, a.offset, a.arg) == (b.opname, b.opcode, b.offset, b.arg), where
            assert a.starts_line == (b.starts_line or 0), where
            if b.opname == "KW_NAMES":  # dis leaves it <unknown>: the names' tuple constant
                assert a.argval is code.co_consts[b.arg], where
            elif b.opname != "FORMAT_VALUE":  # dis: (converter, has_spec); kiln reads the arg
                assert _same(a.argval, b.argval), f"{where}: {a.argval!r} != {b.argval!r}"
            checked += 1
        for a, b in zip(ours, ours[1:]):
            assert a.next_offset == b.offset
    assert checked > 20000


def test_jump_targets_are_instruction_offsets():
    for code in CODES:
        offsets = {i.offset for i in _C.instructions(code)}
        for i in _C.instructions(code):
            if i.opname in dis.opname and i.opcode in dis.hasjrel + dis.hasjabs:
                assert i.argval in offsets, f"{code.co_qualname}: {i} -> {i.argval}"


def test_extended_arguments_are_folded_in():
    # 300 locals: slots past 255 need an EXTENDED_ARG prefix
    names = [f"v{i}" for i in range(300)]
    src = "def f():\n" + "".join(f"    {n} = {i}\n" for i, n in enumerate(names)) + \
        "    return v299 + v0\n"
    ns = {}
    exec(src, ns)
    insts = _C.instructions(ns["f"].__code__)
    loads = [i for i in insts if i.opname in ("LOAD_FAST", "LOAD_FAST_CHECK")]
    assert [i.argval for i in loads] == ["v299", "v0"]
    assert loads[0].arg == 299
    assert any(i.opname == "EXTENDED_ARG" for i in insts)


def test_decoder_refuses_what_is_not_code():
    with pytest.raises(TypeError, match="code object"):
        _C.instructions(lambda: 0)


def test_extended_argument_frames_capture_like_any_other():
    names = [f"v{i}" for i in range(300)]
    src = ("import torch\ndef f(x):\n" +
           "".join(f"    {n} = x * {i}\n" for i, n in enumerate(names)) +
           "    return torch.sin(v299) + v1\n")
    ns = {}
    exec(src, ns)
    counts = []

    def backend(gm, example_inputs):
        counts.append(len([n for n in gm.graph.nodes if n.op == "call_function"]))
        return gm.forward

    x = torch.randn(5)
    out = kiln.compile(ns["f"], backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(out, ns["f"](x))
    assert counts == [302]
