"""The symbolic executor: walks a frame's bytecode with a stack of variable trackers, recording
torch operations into the graph. One handler per opcode, named after it; CPython 3.11 and 3.12.

Anything it cannot model raises Unsupported with the user's file and line.
"""
import dis
import importlib.util
import inspect
import linecache
import operator
import sys
import types
from typing import Dict, List

from kiln.capture.skip_files import is_torch_file, traces_into
from kiln.exc import Unsupported
from kiln.guards.source import ClosureSource, GlobalSource, ItemSource, LocalSource, ObjectSource
from kiln.variables.base import NullVariable, VariableTracker
from kiln.variables.builder import wrap
from kiln.variables.builtins import apply_operator, getitem
from kiln.variables.constant import ConstantVariable
from kiln.transform.resume import can_split, offset_in_exception_table
from kiln.variables.containers import (ConstDictVariable, ListIteratorVariable, ListVariable,
                                       SetVariable, SliceVariable, TupleVariable, mark_checkpoint,
                                       mutation_count)
from kiln.variables.functions import CellVariable, NestedFunctionVariable
from kiln.variables.objects import SuperVariable
from kiln.variables.side_effects import mutations_of
from kiln.variables.tensor import TensorVariable

PY312 = sys.version_info >= (3, 12)
MAX_INLINE_DEPTH = 64

_BINARY_OPS = [  # dis._nb_ops order
    operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul,
    operator.mul, operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub,
    operator.truediv, operator.xor,
    operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
    operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
    operator.itruediv, operator.ixor,
]
_COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
                ">": operator.gt, ">=": operator.ge}

_instructions_cache: Dict[types.CodeType, tuple] = {}


def _instructions(code):
    cached = _instructions_cache.get(code)
    if cached is None:
        insts = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        index = {inst.offset: n for n, inst in enumerate(insts)}
        cached = (insts, index)
        _instructions_cache[code] = cached
    return cached


class _Return(Exception):
    def __init__(self, value):
        self.value = value


# Instructions a root frame can break the graph at: the call (of something kiln cannot trace)
# or the branch (on a tensor's value) runs in Python, the rest of the frame resumes after it.
_BREAKABLE = {"CALL", "CALL_FUNCTION_EX", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_FALSE",
              "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
              "POP_JUMP_BACKWARD_IF_TRUE"}


class Checkpoint:
    """The executor's state before an instruction, to break the graph at it."""

    __slots__ = ("stack", "locals", "kw_names", "graph", "mutations", "lineno")

    def __init__(self, tx):
        self.stack = list(tx.stack)
        self.locals = dict(tx.symbolic_locals)
        self.kw_names = tx.kw_names
        self.graph = (tx.output.checkpoint(), mutations_of(tx.output).checkpoint())
        self.mutations = mutation_count[0]
        self.lineno = tx.lineno
        mark_checkpoint()


class GraphBreak(Exception):
    """Raised out of the root frame's run: compile the graph up to `inst`, run `inst` in
    Python, resume after it."""

    def __init__(self, checkpoint: Checkpoint, inst, reason: str, where: str):
        super().__init__(reason)
        self.checkpoint = checkpoint
        self.inst = inst
        self.reason = reason
        self.where = where


class InstructionTranslatorBase:
    def __init__(self, code, f_globals, symbolic_locals, output, globals_source, depth):
        self.code = code
        self.f_globals = f_globals
        self.f_builtins = f_globals.get("__builtins__", __builtins__)
        if isinstance(self.f_builtins, types.ModuleType):
            self.f_builtins = self.f_builtins.__dict__
        self.symbolic_locals: Dict[str, VariableTracker] = symbolic_locals
        self.output = output
        self.globals_source = globals_source  # callable name -> Source or None
        self.depth = depth
        self.stack: List[VariableTracker] = []
        self.instructions, self.offset_index = _instructions(code)
        self.ip = 0
        self.current = None
        self.kw_names = None
        self.lineno = code.co_firstlineno
        self.generator_items = None  # a list while running a generator's body
        self.may_break = False  # the root frame sets this when graph breaks are allowed

    # -- the loop --------------------------------------------------------------------------------

    def run(self):
        insts = self.instructions
        checkpoint = None
        try:
            while True:
                inst = insts[self.ip]
                self.current = inst
                self.ip += 1
                if inst.starts_line:
                    self.lineno = inst.starts_line if not isinstance(inst.starts_line, bool) \
                        else inst.positions.lineno
                handler = getattr(self, inst.opname, None)
                if handler is None:
                    raise Unsupported(f"opcode {inst.opname}")
                checkpoint = Checkpoint(self) if self.may_break and \
                    inst.opname in _BREAKABLE else None
                handler(inst)
        except _Return as r:
            return r.value
        except Unsupported as e:
            if not getattr(e, "_located", False):
                e._located = True
                e.source_line = self.where()
                e.args = (f"{e.reason}\n{e.source_line}",)
            if checkpoint is not None and self.can_break_at(checkpoint, self.current):
                self.lineno = checkpoint.lineno
                raise GraphBreak(checkpoint, self.current, e.reason, self.where()) from None
            raise

    def can_break_at(self, checkpoint, inst) -> bool:
        return (checkpoint.mutations == mutation_count[0]
                and not offset_in_exception_table(self.code, inst.offset))

    def where(self) -> str:
        line = linecache.getline(self.code.co_filename, self.lineno).strip()
        op = self.current.opname if self.current is not None else "?"
        return (f'  File "{self.code.co_filename}", line {self.lineno}, in '
                f"{self.code.co_name} ({op})\n    {line}")

    def jump(self, inst):
        self.ip = self.offset_index[inst.argval]

    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    # -- calls -----------------------------------------------------------------------------------

    def call_function(self, fn: VariableTracker, args, kwargs):
        return fn.call_function(self, list(args), dict(kwargs))

    def inline_call(self, fn, args, kwargs, fn_source=None, generator=False):
        """Inlines `fn(*args, **kwargs)`. With `generator`, `fn` is a generator function run to
        exhaustion: the result is an iterator over what it yielded."""
        flags = fn.__code__.co_flags
        if flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR) or (
                bool(flags & inspect.CO_GENERATOR) != generator):
            raise Unsupported(f"call of generator function {fn.__qualname__}")
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported("inlining too deep (recursion?)")
        if not traces_into(fn.__code__.co_filename):
            raise Unsupported(f"call of {fn.__module__}.{fn.__qualname__} (kiln calls library "
                              "code such as logging or numpy at a graph break)")
        bound = _bind_code(fn.__code__, args, kwargs, fn.__defaults__ or (),
                           fn.__kwdefaults__ or {}, self._wrap_default)
        globals_source = _globals_source_for(fn.__globals__, self.output.root_globals,
                                             fn.__code__.co_filename)
        cells = {}
        if fn.__closure__:
            for i, (name, cell) in enumerate(zip(fn.__code__.co_freevars, fn.__closure__)):
                cells[name] = (cell, i)
        tx = InliningInstructionTranslator(fn.__code__, fn.__globals__, bound, self.output,
                                           globals_source, self.depth + 1, cells=cells,
                                           fn=fn)
        if generator:
            tx.generator_items = []
            tx.run()
            return ListIteratorVariable(tx.generator_items)
        return tx.run()

    def inline_generator(self, fn, args, kwargs):
        """The items a generator function (a class's __iter__) yields, run at trace time. As
        for generator expressions, only bodies without effects of their own get through."""
        return self.inline_call(fn, args, kwargs, generator=True).unpack(self)

    def inline_nested(self, nested: NestedFunctionVariable, args, kwargs):
        code = nested.code
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported("inlining too deep (recursion?)")
        defaults = tuple(nested.defaults.items) if nested.defaults is not None else ()
        kwdefaults = dict(nested.kwdefaults.items) if nested.kwdefaults is not None else {}
        bound = _bind_code(code, args, kwargs, defaults, kwdefaults, self._wrap_default)
        cells = {}
        if nested.closure:
            for name, cell in zip(code.co_freevars, nested.closure):
                cells[name] = cell
        globals_source = _globals_source_for(nested.f_globals, self.output.root_globals,
                                             code.co_filename)
        tx = InliningInstructionTranslator(code, nested.f_globals, bound, self.output,
                                           globals_source, self.depth + 1, cells=cells, fn=None)
        if code.co_flags & inspect.CO_GENERATOR:
            # Generator expressions run to exhaustion at trace time; their consumer (any, all,
            # tuple, a for loop) then sees the items. Only side-effect-free bodies get here:
            # anything else is Unsupported inside the body.
            tx.generator_items = []
            tx.run()
            return ListIteratorVariable(tx.generator_items)
        return tx.run()

    def _wrap_default(self, value):
        # Defaults belong to the function object, whose identity is guarded (or which is
        # fixed, for functions made in the frame): they need no guards of their own.
        if isinstance(value, VariableTracker):
            return value
        return wrap(self, value, None, guard=False)

    def make_super(self, args):
        if len(args) == 2:
            return SuperVariable(args[0].as_python_constant(), args[1])
        if args:
            raise Unsupported("super() with one argument")
        cls = self.class_cell_value()
        first = self.code.co_varnames[0] if self.code.co_argcount else None
        if cls is None or first is None or first not in self.symbolic_locals:
            raise Unsupported("zero-argument super() outside a method")
        return SuperVariable(cls, self.symbolic_locals[first])

    def class_cell_value(self):
        return None

    # -- loads and stores ------------------------------------------------------------------------

    def load_global(self, name):
        if name in self.f_globals:
            return wrap(self, self.f_globals[name], self.globals_source(name),
                        guard=self.globals_source(name) is not None)
        if name in self.f_builtins:
            value = self.f_builtins[name]
            return wrap(self, value, None, guard=False)
        raise Unsupported(f"NameError: name {name!r} is not defined")

    def RESUME(self, inst):
        pass

    NOP = RESUME
    EXTENDED_ARG = RESUME
    PRECALL = RESUME
    COPY_FREE_VARS = RESUME
    MAKE_CELL = RESUME

    def PUSH_NULL(self, inst):
        self.push(NullVariable())

    def LOAD_CONST(self, inst):
        self.push(ConstantVariable(inst.argval))

    def LOAD_FAST(self, inst):
        name = inst.argval
        if name not in self.symbolic_locals:
            raise Unsupported(f"UnboundLocalError: {name!r} read before assignment")
        self.push(self.symbolic_locals[name])

    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, inst):
        self.push(self.symbolic_locals.pop(inst.argval, NullVariable()))

    def STORE_FAST(self, inst):
        value = self.pop()
        if isinstance(value, NullVariable):
            self.symbolic_locals.pop(inst.argval, None)
        else:
            self.symbolic_locals[inst.argval] = value

    def DELETE_FAST(self, inst):
        self.symbolic_locals.pop(inst.argval, None)

    def LOAD_GLOBAL(self, inst):
        if inst.arg & 1:
            self.push(NullVariable())
        self.push(self.load_global(inst.argval))

    def LOAD_DEREF(self, inst):
        self.push(self.load_deref(inst.argval))

    def STORE_DEREF(self, inst):
        self.store_deref(inst.argval, self.pop())

    def load_deref(self, name):
        if name in self.symbolic_locals:
            return self.symbolic_locals[name]
        raise Unsupported(f"free variable {name!r} is not available")

    def store_deref(self, name, value):
        if name in self.code.co_cellvars:
            self.symbolic_locals[name] = value
            return
        raise Unsupported(f"assignment to free variable {name!r} of an enclosing function")

    def LOAD_CLOSURE(self, inst):
        self.push(CellVariable(self, inst.argval))

    def LOAD_ATTR(self, inst):
        obj = self.pop()
        attr = obj.var_getattr(self, inst.argval)
        if PY312 and inst.arg & 1:
            self.push(NullVariable())
        self.push(attr)

    def LOAD_SUPER_ATTR(self, inst):  # 3.12: super().name with [super, class, self] below
        self_vt = self.pop()
        cls_vt = self.pop()
        self.pop()  # the global `super`
        attr = SuperVariable(cls_vt.as_python_constant(), self_vt).var_getattr(self, inst.argval)
        if inst.arg & 1:
            self.push(NullVariable())
        self.push(attr)

    def LOAD_METHOD(self, inst):  # 3.11
        obj = self.pop()
        self.push(NullVariable())
        self.push(obj.var_getattr(self, inst.argval))

    def STORE_ATTR(self, inst):
        obj = self.pop()
        value = self.pop()
        if not hasattr(obj, "store_attr"):
            raise Unsupported(f"assignment to attribute {inst.argval!r} of {obj}")
        obj.store_attr(self, inst.argval, value)

    def DELETE_ATTR(self, inst):
        obj = self.pop()
        if not hasattr(obj, "del_attr"):
            raise Unsupported(f"del of attribute {inst.argval!r} of {obj}")
        obj.del_attr(self, inst.argval)

    def IMPORT_NAME(self, inst):
        fromlist = self.pop().as_python_constant()
        level = self.pop().as_python_constant()
        name = inst.argval
        if level:
            name = importlib.util.resolve_name("." * level + name,
                                               self.f_globals.get("__package__"))
        if name not in sys.modules:
            raise Unsupported(f"import of {name}, not yet imported (importing has effects)")
        module = sys.modules[name] if fromlist else sys.modules[name.partition(".")[0]]
        self.push(wrap(self, module, None, guard=False))

    def IMPORT_FROM(self, inst):
        self.push(self.stack[-1].var_getattr(self, inst.argval))

    def LOAD_ASSERTION_ERROR(self, inst):
        raise Unsupported("assert failed at trace time")

    def RAISE_VARARGS(self, inst):
        raise Unsupported("raise statement reached at trace time")

    # -- calls -----------------------------------------------------------------------------------

    def KW_NAMES(self, inst):
        self.kw_names = self.code.co_consts[inst.arg]

    def CALL(self, inst):
        argc = inst.arg
        args = self.popn(argc)
        fn = self.pop()
        below = self.pop()
        if not isinstance(below, NullVariable):
            # [callable, self, args...] form
            args = [fn, *args]
            fn = below
        kwargs = {}
        if self.kw_names:
            names = self.kw_names
            kw_values = args[len(args) - len(names):]
            args = args[:len(args) - len(names)]
            kwargs = dict(zip(names, kw_values))
            self.kw_names = None
        self.push(self.call_function(fn, args, kwargs))

    def CALL_FUNCTION_EX(self, inst):
        kwargs_vt = self.pop() if inst.arg & 1 else None
        args_vt = self.pop()
        fn = self.pop()
        below = self.pop()
        if not isinstance(below, NullVariable):
            raise Unsupported("CALL_FUNCTION_EX without NULL")
        args = args_vt.unpack(self)
        kwargs = {}
        if kwargs_vt is not None:
            if not isinstance(kwargs_vt, ConstDictVariable):
                raise Unsupported("** of a non-dict")
            kwargs = dict(kwargs_vt.items)
        self.push(self.call_function(fn, args, kwargs))

    def MAKE_FUNCTION(self, inst):
        flags = inst.arg
        code = self.pop().as_python_constant()  # 3.11+: the qualname comes from the code
        closure = self.pop().items if flags & 0x08 else None
        if flags & 0x04:
            self.pop()  # annotations
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        self.push(NestedFunctionVariable(code, code.co_qualname, defaults, kwdefaults, closure,
                                         self.f_globals))

    def BEFORE_WITH(self, inst):
        from kiln.variables.ctx_manager import GradModeVariable

        ctx = self.pop()
        if not isinstance(ctx, GradModeVariable):
            raise Unsupported(f"`with` over {ctx}")
        self.push(ctx.enter(self))
        self.push(ConstantVariable(None))  # what __enter__ returned

    def RETURN_GENERATOR(self, inst):
        if self.generator_items is None:
            raise Unsupported("generator function")
        self.push(ConstantVariable(None))

    def YIELD_VALUE(self, inst):
        if self.generator_items is None:
            raise Unsupported("yield")
        self.generator_items.append(self.pop())
        self.push(ConstantVariable(None))  # the value sent in

    def RETURN_VALUE(self, inst):
        raise _Return(self.pop())

    def RETURN_CONST(self, inst):
        raise _Return(ConstantVariable(inst.argval))

    # -- stack manipulation ----------------------------------------------------------------------

    def POP_TOP(self, inst):
        self.pop()

    def COPY(self, inst):
        self.push(self.stack[-inst.arg])

    def SWAP(self, inst):
        i = inst.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    # -- operators -------------------------------------------------------------------------------

    def BINARY_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(apply_operator(self, _BINARY_OPS[inst.arg], [a, b]))

    def COMPARE_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(apply_operator(self, _COMPARE_OPS[inst.argval], [a, b]))

    def IS_OP(self, inst):
        b = self.pop()
        a = self.pop()
        self.push(apply_operator(self, operator.is_not if inst.arg else operator.is_, [a, b]))

    def CONTAINS_OP(self, inst):
        container = self.pop()
        item = self.pop()
        result = apply_operator(self, operator.contains, [container, item])
        if inst.arg:
            result = ConstantVariable(not result.as_python_constant())
        self.push(result)

    def _unary(fn):
        def handler(self, inst):
            self.push(apply_operator(self, fn, [self.pop()]))

        return handler

    UNARY_NEGATIVE = _unary(operator.neg)
    UNARY_POSITIVE = _unary(operator.pos)
    UNARY_INVERT = _unary(operator.invert)

    def UNARY_NOT(self, inst):
        self.push(ConstantVariable(not self.pop().truth(self)))

    def CALL_INTRINSIC_1(self, inst):  # 3.12
        if inst.arg == 5:  # INTRINSIC_UNARY_POSITIVE
            self.push(apply_operator(self, operator.pos, [self.pop()]))
        elif inst.arg == 6:  # INTRINSIC_LIST_TO_TUPLE
            self.push(TupleVariable(self.pop().unpack(self)))
        else:
            raise Unsupported(f"CALL_INTRINSIC_1 {inst.argrepr}")

    def BINARY_SUBSCR(self, inst):
        index = self.pop()
        obj = self.pop()
        self.push(getitem(self, obj, index))

    def BINARY_SLICE(self, inst):  # 3.12
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        self.push(getitem(self, obj, SliceVariable([start, end])))

    def STORE_SUBSCR(self, inst):
        index = self.pop()
        obj = self.pop()
        value = self.pop()
        self._setitem(obj, index, value)

    def STORE_SLICE(self, inst):  # 3.12
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        value = self.pop()
        self._setitem(obj, SliceVariable([start, end]), value)

    def _setitem(self, obj, index, value):
        if isinstance(obj, TensorVariable):
            self.output.call("call_function", operator.setitem, (obj, index, value), {})
        elif hasattr(obj, "setitem"):
            obj.setitem(self, index, value)
        else:
            raise Unsupported(f"item assignment on {obj}")

    # -- building --------------------------------------------------------------------------------

    def BUILD_TUPLE(self, inst):
        self.push(TupleVariable(self.popn(inst.arg)))

    def BUILD_LIST(self, inst):
        self.push(ListVariable(self.popn(inst.arg)))

    def BUILD_SET(self, inst):
        items = self.popn(inst.arg)
        self.push(SetVariable({i.as_python_constant() for i in items}))

    def BUILD_MAP(self, inst):
        items = self.popn(inst.arg * 2)
        self.push(ConstDictVariable({items[i].as_python_constant(): items[i + 1]
                                     for i in range(0, len(items), 2)}))

    def BUILD_CONST_KEY_MAP(self, inst):
        keys = self.pop().as_python_constant()
        values = self.popn(inst.arg)
        self.push(ConstDictVariable(dict(zip(keys, values))))

    def BUILD_SLICE(self, inst):
        self.push(SliceVariable(self.popn(inst.arg)))

    def BUILD_STRING(self, inst):
        parts = self.popn(inst.arg)
        self.push(ConstantVariable("".join(p.as_python_constant() for p in parts)))

    def FORMAT_VALUE(self, inst):
        spec = self.pop().as_python_constant() if inst.arg & 0x04 else ""
        value = self.pop().as_python_constant()
        conv = inst.arg & 0x03
        if conv == 1:
            value = str(value)
        elif conv == 2:
            value = repr(value)
        elif conv == 3:
            value = ascii(value)
        self.push(ConstantVariable(format(value, spec)))

    def LIST_APPEND(self, inst):
        value = self.pop()
        self.stack[-inst.arg].items.append(value)

    def LIST_EXTEND(self, inst):
        value = self.pop()
        self.stack[-inst.arg].items.extend(value.unpack(self))

    def LIST_TO_TUPLE(self, inst):
        self.push(TupleVariable(self.pop().unpack(self)))

    def SET_UPDATE(self, inst):
        value = self.pop()
        self.stack[-inst.arg].value.update(value.as_python_constant())

    def MAP_ADD(self, inst):
        value = self.pop()
        key = self.pop()
        self.stack[-inst.arg].items[key.as_python_constant()] = value

    def DICT_UPDATE(self, inst):
        value = self.pop()
        target = self.stack[-inst.arg]
        if not isinstance(value, ConstDictVariable):
            raise Unsupported("dict update from a non-dict")
        target.items.update(value.items)

    DICT_MERGE = DICT_UPDATE

    def UNPACK_SEQUENCE(self, inst):
        items = self.pop().unpack(self)
        if len(items) != inst.arg:
            raise Unsupported(f"unpacking {len(items)} values into {inst.arg}")
        for item in reversed(items):
            self.push(item)

    def UNPACK_EX(self, inst):
        items = self.pop().unpack(self)
        before = inst.arg & 0xFF
        after = inst.arg >> 8
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack")
        head = items[:before]
        middle = items[before:len(items) - after]
        tail = items[len(items) - after:]
        for item in reversed(tail):
            self.push(item)
        self.push(ListVariable(middle))
        for item in reversed(head):
            self.push(item)

    # -- control flow on trace-time constants ----------------------------------------------------

    def _jump_if(truth_wanted, pop_always=True):
        def handler(self, inst):
            value = self.stack[-1]
            if value.truth(self) == truth_wanted:
                if pop_always:
                    self.pop()
                self.jump(inst)
            else:
                self.pop()

        return handler

    POP_JUMP_IF_FALSE = _jump_if(False)
    POP_JUMP_IF_TRUE = _jump_if(True)
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE
    JUMP_IF_FALSE_OR_POP = _jump_if(False, pop_always=False)
    JUMP_IF_TRUE_OR_POP = _jump_if(True, pop_always=False)

    def _jump_if_none(is_none_wanted):
        def handler(self, inst):
            value = self.pop()
            is_none = isinstance(value, ConstantVariable) and value.value is None
            if is_none == is_none_wanted:
                self.jump(inst)

        return handler

    POP_JUMP_IF_NONE = _jump_if_none(True)
    POP_JUMP_IF_NOT_NONE = _jump_if_none(False)
    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE
    POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_FORWARD(self, inst):
        self.jump(inst)

    JUMP_BACKWARD = JUMP_FORWARD
    JUMP_BACKWARD_NO_INTERRUPT = JUMP_FORWARD
    JUMP_ABSOLUTE = JUMP_FORWARD

    def GET_ITER(self, inst):
        obj = self.pop()
        if isinstance(obj, ListIteratorVariable):
            self.push(obj)
        else:
            self.push(ListIteratorVariable(obj.unpack(self)))

    def FOR_ITER(self, inst):
        it = self.stack[-1]
        if not isinstance(it, ListIteratorVariable):
            raise Unsupported(f"iteration over {it}")
        item = it.next_item()
        if item is not None:
            self.push(item)
            return
        self.pop()
        self.jump(inst)
        if PY312 and self.instructions[self.ip].opname == "END_FOR":
            self.ip += 1

    def END_FOR(self, inst):  # reached only by falling through in 3.12
        self.pop()
        self.pop()


def _bind_code(code, args, kwargs, defaults, kwdefaults, as_vt):
    """Maps call arguments to the callee's parameter names, as CPython's call does."""
    nargs = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kw_names = names[nargs:nargs + nkw]
    varargs = bool(code.co_flags & inspect.CO_VARARGS)
    varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound: Dict[str, VariableTracker] = {}
    args = list(args)
    if len(args) > nargs and not varargs:
        raise Unsupported(f"{code.co_name}() takes {nargs} positional arguments but "
                          f"{len(args)} were given")
    for name, value in zip(pos_names, args):
        bound[name] = value
    extra_pos = args[nargs:]
    extra_kw = {}
    posonly = code.co_posonlyargcount
    for key, value in kwargs.items():
        if key in pos_names[posonly:] or key in kw_names:
            if key in bound:
                raise Unsupported(f"{code.co_name}() got multiple values for {key!r}")
            bound[key] = value
        elif varkw:
            extra_kw[key] = value
        else:
            raise Unsupported(f"{code.co_name}() got an unexpected keyword argument {key!r}")
    ndefaults = len(defaults)
    for i, name in enumerate(pos_names):
        if name not in bound:
            j = i - (nargs - ndefaults)
            if j < 0:
                raise Unsupported(f"{code.co_name}() missing argument {name!r}")
            bound[name] = as_vt(defaults[j])
    for name in kw_names:
        if name not in bound:
            if name not in kwdefaults:
                raise Unsupported(f"{code.co_name}() missing keyword-only argument {name!r}")
            bound[name] = as_vt(kwdefaults[name])
    idx = nargs + nkw
    if varargs:
        bound[names[idx]] = TupleVariable(extra_pos)
        idx += 1
    if varkw:
        bound[names[idx]] = ConstDictVariable(extra_kw)
    return bound


def _globals_source_for(f_globals, root_globals, filename):
    if f_globals is root_globals:
        return GlobalSource
    if is_torch_file(filename):
        return lambda name: None  # torch's own module globals are taken as fixed
    label = f"G@{f_globals.get('__name__', '?')}"
    dict_source = ObjectSource(f_globals, label)
    return lambda name: ItemSource(dict_source, name)


class InstructionTranslator(InstructionTranslatorBase):
    """The root: the frame being compiled, its arguments read from their slots."""

    def __init__(self, func, code, slots, output, may_break=False):
        self.func = func
        output.root_globals = func.__globals__
        symbolic_locals = {}
        super().__init__(code, func.__globals__, symbolic_locals, output, GlobalSource, 0)
        self.may_break = may_break and can_split(code)
        names = code.co_varnames
        fresh = code.co_argcount + code.co_kwonlyargcount  # *args, **kwargs: new per call
        for i, value in enumerate(slots):
            vt = wrap(self, value, LocalSource(i, names[i]))
            if i >= fresh and hasattr(vt, "mutable"):
                vt.mutable = True
            symbolic_locals[names[i]] = vt
        self._closure = {}
        if func.__closure__:
            for i, (name, cell) in enumerate(zip(code.co_freevars, func.__closure__)):
                self._closure[name] = (cell, i)

    def load_deref(self, name):
        if name in self._closure:
            cell, i = self._closure[name]
            try:
                value = cell.cell_contents
            except ValueError:
                raise Unsupported(f"free variable {name!r} is empty") from None
            vt = wrap(self, value, ClosureSource(i, name))
            return vt
        return super().load_deref(name)

    def class_cell_value(self):
        if "__class__" in self._closure:
            return self._closure["__class__"][0].cell_contents
        return None


class InliningInstructionTranslator(InstructionTranslatorBase):
    """A called user function, inlined into the caller's graph."""

    def __init__(self, code, f_globals, bound, output, globals_source, depth, cells, fn):
        super().__init__(code, f_globals, bound, output, globals_source, depth)
        self.cells = cells  # name -> (cell, index) or CellVariable
        self.fn = fn

    def load_deref(self, name):
        if name in self.cells:
            cell = self.cells[name]
            if isinstance(cell, CellVariable):
                return cell.get()
            cell_obj = cell[0]
            try:
                value = cell_obj.cell_contents
            except ValueError:
                raise Unsupported(f"free variable {name!r} is empty") from None
            source = None
            if not is_torch_file(self.code.co_filename):
                from kiln.guards.source import AttrSource

                source = AttrSource(ObjectSource(cell_obj, f"cell:{name}"), "cell_contents")
            return wrap(self, value, source, guard=source is not None)
        return super().load_deref(name)

    def store_deref(self, name, value):
        cell = self.cells.get(name)
        if isinstance(cell, CellVariable):
            cell.set(value)
            return
        super().store_deref(name, value)

    def class_cell_value(self):
        cell = self.cells.get("__class__")
        if cell is None:
            return None
        if isinstance(cell, CellVariable):
            return cell.get().as_python_constant()
        return cell[0].cell_contents
