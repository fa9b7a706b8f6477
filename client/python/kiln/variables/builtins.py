"""Python builtins (len, isinstance, getattr, min, ...), the operator module and math."""
import abc
import builtins
import functools
import inspect
import itertools
import math
import operator
import types

import torch

from kiln.exc import TracedException, Unsupported
from kiln.variables.base import VariableTracker, any_tensor, constant_args, same_object
from kiln.variables.constant import PURE_OPERATORS, ConstantVariable
from kiln.variables.containers import (BaseListVariable, ConstDictVariable, ListIteratorVariable,
                                       ListVariable, ReversedListIterator, SliceVariable,
                                       TupleVariable, note_mutation)
from kiln.variables.exceptions import check_attribute_error
from kiln.variables.sym_node import SYMBOLIC_OPERATORS, SymNodeVariable, symbolic_operator
from kiln.variables.tensor import ScalarVariable, TensorVariable

_TENSOR_OPERATORS = PURE_OPERATORS - {operator.is_, operator.is_not, operator.contains,
                                      operator.truth, operator.index, operator.not_}


# In-place operators and the binary operator Python falls back to when the left operand has no
# in-place method of its own (`n += t` with n an int is `n = n + t`).
_BINARY_OF_INPLACE = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
    operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
    operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
}


def apply_operator(tx, fn, args):
    """`fn(*args)` for an operator-module function, folded, structural or a graph node."""
    binary = _BINARY_OF_INPLACE.get(fn)
    if binary is not None and args[0].is_python_constant():
        # A number (or None, a string...) has no in-place method: Python runs the binary
        # operator, whose result is a new value (a tensor where the right operand is one).
        dunder = f"__{fn.__name__}__"
        if not hasattr(type(args[0].as_python_constant()), dunder):
            fn = binary
    if fn in (operator.is_, operator.is_not):
        same = same_object(tx, *args)
        return ConstantVariable(same if fn is operator.is_ else not same)
    if fn is operator.not_:
        return ConstantVariable(not args[0].truth(tx))
    if fn is operator.truth:
        return ConstantVariable(args[0].truth(tx))
    if fn is operator.getitem:
        return getitem(tx, args[0], args[1])
    if fn is operator.contains:
        container, item = args
        return container.contains(tx, item)
    dispatched = _user_operator(tx, fn, args)
    if dispatched is not None:
        return dispatched
    if any(isinstance(a, ScalarVariable) for a in args) and \
            not any(isinstance(a, TensorVariable) for a in args):
        # Arithmetic on a number the graph computes (Tensor.item()): a node of its own, whose
        # Python type is the operator's on stand-ins of the operands' types.
        if fn not in _TENSOR_OPERATORS or not all(
                isinstance(a, ScalarVariable) or a.is_python_constant() for a in args):
            raise Unsupported(f"{fn.__name__} of a value Tensor.item() read")
        if fn in (operator.pow, operator.ipow) and all(
                type(a.as_fake_arg()) in (int, bool) for a in args):
            # int ** int is an int or a float by the exponent's sign, which the stand-in hides.
            raise Unsupported(f"{fn.__name__} of ints Tensor.item() read")
        try:
            kind = type(fn(*(a.as_fake_arg() for a in args)))
        except Exception as e:
            raise Unsupported(f"{fn.__name__} of a value Tensor.item() read: {e}") from None
        if kind not in (bool, int, float):
            raise Unsupported(f"{fn.__name__} of a value Tensor.item() read")
        return tx.output.record_scalar("call_function", fn, tuple(args), kind)
    if any(isinstance(a, SymNodeVariable) for a in args) and fn in SYMBOLIC_OPERATORS and \
            not any(isinstance(a, TensorVariable) for a in args) and all(
                isinstance(a, SymNodeVariable) or type(a.as_python_constant()) in (
                    int, float, bool) for a in args if not isinstance(a, SymNodeVariable)):
        return symbolic_operator(tx, fn, args)
    if any(isinstance(a, TensorVariable) for a in args):
        # A tensor operand makes it a tensor op; tensors inside a tuple or list operand do not
        # (`t += (x,)` concatenates).
        if fn not in _TENSOR_OPERATORS:
            raise Unsupported(f"{fn.__name__} on tensors")
        return tx.output.call("call_function", fn, tuple(args), {})
    const = constant_args(args, {})
    if const is not None:
        try:
            return ConstantVariable(fn(*const[0]))
        except Exception as e:
            raise Unsupported(f"{fn.__name__} raised {type(e).__name__} at trace time") from None
    if fn in (operator.add, operator.iadd, operator.mul, operator.imul):
        # A constant tuple or list concatenated with one holding tensors: () + (x, y).
        args = [_as_sequence(a) if any(isinstance(o, BaseListVariable) for o in args) else a
                for a in args]
    if fn in (operator.add, operator.iadd) and all(isinstance(a, BaseListVariable) for a in args):
        a, b = args
        if fn is operator.iadd and isinstance(a, ListVariable):
            a._check_mutable()
            a.items.extend(b.items)
            return a
        return type(a)(a.items + b.items)
    if fn is operator.imul and isinstance(args[0], ListVariable):  # in place, as list.__imul__
        args[0]._check_mutable()
        args[0].items[:] = args[0].items * args[1].as_python_constant()
        return args[0]
    if fn in (operator.mul, operator.imul) and isinstance(args[0], BaseListVariable):
        return type(args[0])(args[0].items * args[1].as_python_constant())
    if fn is operator.mul and isinstance(args[1], BaseListVariable):  # 2 * (x,)
        return type(args[1])(args[1].items * args[0].as_python_constant())
    if fn in (operator.eq, operator.ne) and any(not a.is_python_constant() for a in args):
        for a in args:
            if a.is_python_constant() or not _compares_by_value(a.python_type()):
                continue
            if a.fresh_object:
                return _fresh_object_compare(tx, fn, args)
            # An object from outside with a comparison of its own: identity would not answer.
            raise Unsupported(f"{fn.__name__} of a {a.python_type().__qualname__}, which "
                              "compares by value")
        try:
            same = same_object(tx, args[0], args[1])
        except Unsupported:
            raise Unsupported(f"{fn.__name__} of {args[0]} and {args[1]}") from None
        return ConstantVariable(same if fn is operator.eq else not same)
    raise Unsupported(f"{fn.__name__} of {', '.join(map(repr, args))}")


# Binary operators and their special methods: (method, reflected method).
_DUNDERS = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
    operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
    operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
    operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"),
    operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
    operator.rshift: ("__rshift__", "__rrshift__"),
    operator.lt: ("__lt__", "__gt__"), operator.le: ("__le__", "__ge__"),
    operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__"),
}


_COMPARISONS = {operator.lt, operator.le, operator.gt, operator.ge}


def _python_dunder(vt, name):
    """The Python function `name` of the class of a user object (one kiln does not model as a
    tensor, container or constant), or None."""
    if isinstance(vt, (TensorVariable, ConstantVariable, BaseListVariable, ConstDictVariable)):
        return None
    try:
        cls = vt.python_type()
    except Unsupported:
        return None
    if not isinstance(cls, type) or cls.__module__ == "builtins":
        return None
    fn = inspect.getattr_static(cls, name, None)
    return fn if isinstance(fn, types.FunctionType) else None


def _user_operator(tx, fn, args):
    """`a op b` where an operand's class defines the operator in Python: its method inlined in
    Python's order (the right operand's reflected method first when its class is a proper
    subclass of the left one's, and in turn when one returns NotImplemented). None where no
    operand has one."""
    names = _DUNDERS.get(fn)
    if names is None:
        names = _DUNDERS.get(_BINARY_OF_INPLACE.get(fn))
        if names is None:
            return None
        inplace = _python_dunder(args[0], f"__i{names[0][2:]}")
        if inplace is not None:
            result = tx.inline_call(inplace, list(args), {})
            if not (result.is_python_constant() and
                    result.as_python_constant() is NotImplemented):
                return result
    if len(args) != 2:
        return None
    a, b = args
    forward, reflected = _python_dunder(a, names[0]), _python_dunder(b, names[1])
    if forward is None and reflected is None:
        return None
    order = [(forward, a, b), (reflected, b, a)]
    try:
        ta, tb = a.python_type(), b.python_type()
    except Unsupported:
        ta = tb = None
    if ta is not None and ta is tb and fn not in _COMPARISONS:
        order.pop()  # an arithmetic operator of two objects of one class: no reflected call
    elif reflected is not None and ta is not None and ta is not tb and \
            issubclass(tb, ta) and inspect.getattr_static(tb, names[1], None) is not \
            inspect.getattr_static(ta, names[1], None):
        # The right operand's class, a subclass, overrides the reflected method: it goes first.
        order.reverse()
    for method, left, right in order:
        if method is None:
            continue
        result = tx.inline_call(method, [left, right], {})
        if not (result.is_python_constant() and result.as_python_constant() is NotImplemented):
            return result
    raise Unsupported(f"{fn.__name__} of {a} and {b}: the special methods return NotImplemented")


def _as_sequence(vt):
    """A constant tuple or list as the tracker of a tuple or list of constants; anything else as
    it is."""
    if isinstance(vt, ConstantVariable) and type(vt.value) in (tuple, list):
        items = [ConstantVariable(v) for v in vt.value]
        return TupleVariable(items) if type(vt.value) is tuple else ListVariable(items)
    return vt


def _compares_by_value(cls) -> bool:
    return cls.__eq__ is not object.__eq__ or cls.__ne__ is not object.__ne__


def _fresh_object_compare(tx, fn, args):
    """`a == b` / `a != b` where an object the frame made has a comparison of its own (a
    dataclass's __eq__): the left operand's Python method inlined, else Unsupported."""
    a, b = args
    cls = a.python_type() if a.fresh_object else None
    name = "__eq__" if fn is operator.eq else "__ne__"
    method = inspect.getattr_static(cls, name, None) if cls is not None else None
    if fn is operator.ne and method is object.__ne__:
        equal = _fresh_object_compare(tx, operator.eq, args).truth(tx)
        return ConstantVariable(not equal)
    if not isinstance(method, types.FunctionType):
        raise Unsupported(f"{fn.__name__} of {a} and {b}")
    result = tx.inline_call(method, [a, b], {})
    if result.is_python_constant() and result.as_python_constant() is NotImplemented:
        raise Unsupported(f"{cls.__qualname__}.{name} returned NotImplemented")
    return result


def getitem(tx, obj, index):
    return obj.getitem(tx, index)


def length(tx, obj) -> int:
    return obj.length(tx)


# Metaclass instance checks that answer from the object's class alone: isinstance(obj, cls) is
# issubclass(type(obj), cls) (for an ABC, through its registry and __subclasshook__).
_CLASS_ONLY_CHECKS = (type.__instancecheck__, abc.ABCMeta.__instancecheck__)


def _classes(cls):
    """The classes an isinstance() second argument names (a class, a tuple, a union)."""
    if isinstance(cls, tuple):
        return [c for item in cls for c in _classes(item)]
    if isinstance(cls, types.UnionType):
        return list(cls.__args__)
    return [cls]


def _isinstance(tx, obj, classes):
    cls = classes.as_python_constant()
    if isinstance(obj, ConstantVariable):  # a literal: its value is all there is to look at
        return ConstantVariable(isinstance(obj.value, cls))
    for c in _classes(cls):
        if c is torch.nn.Parameter and isinstance(obj, TensorVariable):
            # Parameter's metaclass also accepts a tensor flagged _is_param (a custom tensor
            # class made into a parameter); kiln's graph values are plain tensors or parameters.
            real = tx.output.real_tensor(obj.same_object())
            if real is not None and getattr(real, "_is_param", False) and \
                    not isinstance(real, torch.nn.Parameter):
                raise Unsupported("isinstance(..., Parameter) of a tensor flagged _is_param")
        elif type(c).__instancecheck__ not in _CLASS_ONLY_CHECKS:
            # torch.BoolStorage's metaclass asks the storage's dtype, a runtime-checkable
            # Protocol the object's attributes: not what the object's class says.
            raise Unsupported(f"isinstance(..., {getattr(c, '__qualname__', c)}), whose "
                              "metaclass looks at the object itself")
    return ConstantVariable(issubclass(obj.python_type(), cls))


class BuiltinVariable(VariableTracker):
    def __init__(self, fn, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def identity(self, tx):
        return self.fn

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        handler = _HANDLERS.get(fn)
        if handler is not None:
            return handler(tx, *args, **kwargs)
        if fn in PURE_OPERATORS and not kwargs:
            return apply_operator(tx, fn, args)
        const = constant_args(args, kwargs)
        if const is not None and fn in _PURE_BUILTINS:
            try:
                return ConstantVariable(fn(*const[0], **const[1]))
            except Exception as e:
                raise Unsupported(f"{fn.__name__} raised {type(e).__name__} at trace time") from e
        raise Unsupported(f"call of builtin {getattr(fn, '__qualname__', fn)}")

    def __repr__(self):
        return f"BuiltinVariable({getattr(self.fn, '__name__', self.fn)})"


def _len(tx, obj):
    if isinstance(obj, TensorVariable) and obj.example.dim() > 0:
        return obj.size_of(tx, "size", 0)  # a symbol where the first dimension is one
    return ConstantVariable(length(tx, obj))


def _getattr(tx, obj, name, default=None):
    """getattr(obj, name[, default]): LOAD_ATTR's lookup, and its AttributeError as LOAD_ATTR
    has it (check_attribute_error: a class's __getattr__ would run first)."""
    try:
        return obj.var_getattr(tx, name.as_python_constant())
    except TracedException as e:
        check_attribute_error(obj, e)
        if default is not None and issubclass(e.value.python_type(), AttributeError):
            return default
        raise
    except Unsupported:
        if default is not None and not obj.has_attr(tx, name.as_python_constant()):
            return default
        raise


def _hasattr(tx, obj, name):
    return ConstantVariable(obj.has_attr(tx, name.as_python_constant()))


def _setattr(tx, obj, name, value):
    """setattr(obj, name, value): what `obj.name = value` (STORE_ATTR) does."""
    obj.store_attr(tx, name.as_python_constant(), value)
    return ConstantVariable(None)


def _delattr(tx, obj, name):
    obj.del_attr(tx, name.as_python_constant())
    return ConstantVariable(None)


def _minmax(fn):
    def handler(tx, *args, **kwargs):
        items = args[0].unpack(tx) if len(args) == 1 else list(args)
        if any_tensor(items):
            raise Unsupported(f"{fn.__name__}() over tensors compares their values")
        if not kwargs and len(items) > 1 and any(isinstance(v, SymNodeVariable) for v in items) \
                and all(v.python_type() is int for v in items):
            # Of ints some of which are symbolic sizes: torch.sym_max / sym_min nodes, so that
            # `w = max(w, 1)` keeps w a symbol instead of specialising the graph to its value.
            sym = torch.sym_max if fn is max else torch.sym_min
            result = items[0]
            for v in items[1:]:
                result = tx.output.call("call_function", sym, (result, v), {})
            return result
        const = constant_args(items, kwargs)
        if const is None:
            raise Unsupported(f"{fn.__name__}() of non-constants")
        return ConstantVariable(fn(const[0], **const[1]))

    return handler


def _abs(tx, x):
    return apply_operator(tx, operator.abs, [x])


def _sequence(kind):
    def handler(tx, obj=None):
        items = [] if obj is None else obj.unpack(tx)
        return kind(items)

    return handler


def _dict(tx, *args, **kwargs):
    return construct_dict(tx, dict, args, kwargs)


def construct_dict(tx, cls, args, kwargs):
    """dict(...) or collections.OrderedDict(...) made in the frame (a detection model's
    feature maps): a dict tracker of that class."""
    made = ConstDictVariable({}, user_type=cls)
    if args:
        src = args[0]
        if isinstance(src, ConstDictVariable):
            made.update_from(tx, src)
        else:
            for pair in src.unpack(tx):
                k, v = pair.unpack(tx)
                made.map_add(tx, k, v)
    made.items.update(kwargs)
    return made


def _lazily(tx, iterable, by: str):
    """The items of an argument that `by` (a lazy builtin) takes one by one in eager: an
    iterator's are all taken now, and the iterator cannot be used again in the graph."""
    if isinstance(iterable, ListIteratorVariable):
        return iterable.taken_lazily(tx, by)
    return iterable.unpack(tx)


def _enumerate(tx, obj, start=None):
    first = start.as_python_constant() if start is not None else 0
    return ListIteratorVariable([TupleVariable([ConstantVariable(first + i), v])
                                 for i, v in enumerate(_lazily(tx, obj, "enumerate()"))],
                                over=(obj,))


def _zip(tx, *iterables, **kwargs):
    columns = [_lazily(tx, it, "zip()") for it in iterables]
    return ListIteratorVariable([TupleVariable(list(row)) for row in zip(*columns)],
                                over=iterables)


def _reversed(tx, obj):
    if type(obj) is ListVariable and getattr(obj, "view_of", None) is None:
        return ReversedListIterator(obj)  # eager's reads the list live
    return ListIteratorVariable(list(reversed(obj.unpack(tx))), over=(obj,))


def _calls_without_effects(tx, fn, rows):
    """[fn(*row) for row in rows], where calling fn changes nothing the program could see in
    between (no container mutated, no attribute stored): map() and filter() call it lazily, as
    their items are taken, and here it runs when they are made."""
    from kiln.variables.containers import counting_every_mutation, mutation_count
    from kiln.variables.side_effects import mutations_of

    stores = mutations_of(tx.output)
    with counting_every_mutation():
        before = (mutation_count(), stores.checkpoint())
        try:
            results = [fn.call_function(tx, list(row), {}) for row in rows]
        except TracedException as e:
            # Eager raises it when the item is taken, maybe outside a try around map() here.
            raise Unsupported(f"map()/filter() over a function that raises ({e})") from None
        after = (mutation_count(), stores.checkpoint())
    if before[0] != after[0] or before[1].keys() != after[1].keys() or any(
            after[1][k] is not v for k, v in before[1].items()):
        raise Unsupported("map()/filter() over a function with effects (eager calls it lazily)")
    return results


def _map(tx, fn, *iterables):
    rows = list(zip(*(_lazily(tx, it, "map()") for it in iterables)))
    return ListIteratorVariable(_calls_without_effects(tx, fn, rows), over=iterables)


def _filter(tx, fn, iterable):
    items = _lazily(tx, iterable, "filter()")
    if fn.is_python_constant() and fn.as_python_constant() is None:
        keep = [v.truth(tx) for v in items]
    else:
        keep = [r.truth(tx) for r in _calls_without_effects(tx, fn, [[v] for v in items])]
    return ListIteratorVariable([v for v, k in zip(items, keep) if k], over=(iterable,))


def _starmap(tx, fn, iterable):
    rows = [row.unpack(tx) for row in _lazily(tx, iterable, "starmap()")]
    return ListIteratorVariable(_calls_without_effects(tx, fn, rows), over=(iterable,))


def _chain(tx, *iterables):
    return ListIteratorVariable([v for it in iterables for v in _lazily(tx, it, "chain()")],
                                over=iterables)


def _repeat(tx, obj, times=None):
    """itertools.repeat(obj, times): `obj` itself, `times` times (never an infinite one)."""
    if times is None:
        raise Unsupported("itertools.repeat() without a count (it never ends)")
    try:
        count = operator.index(times.as_python_constant())
    except (Unsupported, TypeError):
        raise Unsupported("itertools.repeat() with a count that is not a constant int") from None
    return _RepeatIterator(obj, max(count, 0))


class _RepeatIterator(ListIteratorVariable):
    """A repeat the frame made: its items are the one object; what outlives the graph is a
    repeat of that object again, for the times it has left."""

    def __init__(self, obj, times):
        super().__init__([obj] * times)
        self.obj = obj

    def python_type(self):
        return itertools.repeat

    def reconstruct(self, codegen) -> str:
        self._check_not_drained()
        left = len(self.items) - self.index
        return codegen.temp(self, lambda: f"{codegen.constant(itertools.repeat)}("
                                          f"{codegen(self.obj)}, {left})")


def _islice(tx, iterable, *bounds):
    """itertools.islice(iterable, [start,] stop[, step]): of a list, tuple or other container
    the items it yields; of an iterator a lazy one (_IsliceIterator)."""
    try:
        spec = slice(*[b.as_python_constant() for b in bounds])
    except Unsupported:
        raise Unsupported("islice() with bounds that are not constants") from None
    start, stop, step = spec.start or 0, spec.stop, spec.step or 1
    if start < 0 or (stop is not None and stop < 0) or step < 1:
        raise Unsupported("islice() with bounds Python refuses")
    if isinstance(iterable, ListIteratorVariable):
        return _IsliceIterator(iterable, start, stop, step)
    items = iterable.unpack(tx)
    return ListIteratorVariable(items[start:stop:step], over=(iterable,))


class _IsliceIterator(ListIteratorVariable):
    """islice over an iterator: takes the inner iterator's items only as its own are taken, as
    CPython's islice does (it never reads past what it yields, nor past `stop`)."""

    def __init__(self, inner, start, stop, step):
        super().__init__([])
        self.inner, self.stop, self.step = inner, stop, step
        self.read = 0  # items taken from `inner`
        self.next_at = start  # index of the next item to yield

    def next_item(self):
        note_mutation(self.serial)  # its position is state, as a list iterator's
        while self.read < self.next_at:
            if self.inner.next_item() is None:
                return None
            self.read += 1
        if self.stop is not None and self.read >= self.stop:
            return None
        item = self.inner.next_item()
        if item is None:
            return None
        self.read += 1
        self.next_at += self.step
        if self.stop is not None and self.next_at > self.stop:
            self.next_at = self.stop
        return item

    def unpack(self, tx):
        return self.items_one_by_one()

    def reconstruct(self, codegen) -> str:
        raise Unsupported("an islice() over an iterator outliving the graph")


def _reduce(tx, fn, iterable, *initial):
    items = iterable.unpack(tx)
    if initial:
        acc, rest = initial[0], items
    elif items:
        acc, rest = items[0], items[1:]
    else:
        raise Unsupported("reduce() of an empty sequence raises TypeError")
    for item in rest:
        acc = fn.call_function(tx, [acc, item], {})
    return acc


def _partial(tx, func, *args, **keywords):
    from kiln.variables.functions import PartialVariable

    return PartialVariable(func, args, keywords)


def _iter(tx, obj):
    return ListIteratorVariable.of(tx, obj)


def _next(tx, it, default=None):
    if not isinstance(it, ListIteratorVariable):
        raise Unsupported(f"next() of {it}")
    item = it.next_item()
    if item is not None:
        return item
    if default is None:
        raise Unsupported("next() raised StopIteration")
    return default


def _sum(tx, obj, start=None):
    acc = start if start is not None else ConstantVariable(0)
    for item in obj.unpack(tx):
        acc = apply_operator(tx, operator.add, [acc, item])
    return acc


def _type(tx, obj):
    return tx.wrap(obj.python_type(), None)


def _all_any(fn):
    def handler(tx, obj):
        return ConstantVariable(fn(v.truth(tx) for v in _lazily(tx, obj, f"{fn.__name__}()")))

    return handler


def _bool(tx, obj=None):
    return ConstantVariable(False if obj is None else obj.truth(tx))


def _slice(tx, *parts):
    return SliceVariable(list(parts))


def _sorted(tx, obj, **kwargs):
    const = constant_args(obj.unpack(tx), kwargs)
    if const is None:
        raise Unsupported("sorted() of non-constants")
    return ListVariable([ConstantVariable(v) for v in sorted(const[0], **const[1])])


def _callable(tx, obj):
    # callable(x) asks whether type(x) has __call__.
    return ConstantVariable(hasattr(obj.python_type(), "__call__"))


def _super(tx, *args):
    return tx.make_super(args)


def _locals(tx):
    """locals(): a dict of the traced function's bound locals in CPython's order (its variables
    in co_varnames order). A resume function's stack parameters are not the program's locals.
    Code with cell or free variables (whose values live in cells) is refused: so is a graph
    break at the call (kiln.transform.graph_break), which would run it in another frame."""
    code = tx.code
    if code.co_cellvars or code.co_freevars:
        raise Unsupported("locals() in a function with cell or free variables")
    bound = tx.symbolic_locals
    return ConstDictVariable({name: tx.local(name) for name in code.co_varnames
                              if name in bound and not name.startswith("__kiln_stack_")})


_HANDLERS = {
    len: _len,
    isinstance: lambda tx, obj, classes: _isinstance(tx, obj, classes),
    getattr: _getattr,
    hasattr: _hasattr,
    setattr: _setattr,
    delattr: _delattr,
    min: _minmax(min),
    max: _minmax(max),
    abs: _abs,
    tuple: _sequence(TupleVariable),
    list: _sequence(ListVariable),
    dict: _dict,
    enumerate: _enumerate,
    zip: _zip,
    reversed: _reversed,
    iter: _iter,
    next: _next,
    sum: _sum,
    type: _type,
    all: _all_any(all),
    any: _all_any(any),
    bool: _bool,
    slice: _slice,
    callable: _callable,
    sorted: _sorted,
    super: _super,
    locals: _locals,
    map: _map,
    filter: _filter,
    itertools.starmap: _starmap,
    itertools.chain: _chain,
    itertools.repeat: _repeat,
    itertools.islice: _islice,
    functools.reduce: _reduce,
    functools.partial: _partial,
}

_PURE_BUILTINS = {int, float, str, repr, round, divmod, pow, range, chr, ord, hex, oct, bin,
                  format, frozenset, sorted, hash, isinstance, issubclass, id, set}
_PURE_BUILTINS |= {getattr(math, name) for name in dir(math) if callable(getattr(math, name))}
# A function's signature is fixed by the function object, whose identity the trace guards.
_PURE_BUILTINS |= {inspect.signature}

# Builtins the executor models; everything else in `builtins` is unsupported.
KNOWN_BUILTINS = set(_HANDLERS) | _PURE_BUILTINS | {print}
BUILTIN_MODULE = builtins
