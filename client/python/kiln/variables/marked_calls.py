"""Calls of functions the program marked (kiln.decorators): allow_in_graph ones go into the
graph as they are, disallow_in_graph and graph_break ones break, and assume_constant_result ones
run at capture on the values their arguments hold, their result a constant of the graph."""
import torch

from kiln import decorators
from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.variables import containers
from kiln.variables.base import constant_args
from kiln.variables.dict_keys import IdentityKey
from kiln.variables.tensor import TensorVariable


def call_marked(tx, fn, args, kwargs):
    """The result of calling `fn` when the program marked it (kiln.decorators: allow_in_graph,
    assume_constant_result), None when it did not; a graph break (Unsupported) for a function
    marked disallow_in_graph or graph_break. `args` include the bound object of a method."""
    how = decorators.marking(fn)
    if how is None:
        return None
    name = getattr(fn, "__qualname__", None) or repr(fn)
    if how == decorators.DISALLOW:
        raise Unsupported(f"call of {name}, a graph break the program asked for "
                          "(graph_break or disallow_in_graph)")
    if how == decorators.ALLOW:
        return tx.output.call("call_function", fn, tuple(args), dict(kwargs))
    # assume_constant_result: fn runs now, on the values its arguments hold at this point of
    # the program (tensors too: TorchDynamo's invoke_and_store_as_constant), and what it
    # returns stands in the graph as the program promised, read once and not guarded: later
    # calls with other tensor values get this one.
    const = constant_args(args, kwargs)
    if const is None:
        const = _real_arguments(tx, name, args, kwargs)
    value = fn(*const[0], **const[1])
    return _constant_result(tx, name, value)


def _real_arguments(tx, name, args, kwargs):
    """(args, kwargs) as the values the program has at the call: constants as they are, each
    tensor its real value (OutputGraph.real_values: a graph input's own tensor, or what the
    graph so far computes), inside the tuples, lists and dicts that hold them. A tensor
    argument is guarded as any input is (its TENSOR_MATCH): its values are not."""
    tensors = {}  # id(tracker) -> tracker, in the order reached

    def find(vt, seen):
        if isinstance(vt, TensorVariable):
            tensors.setdefault(id(vt), vt)
        elif vt.contains_tensor() and id(vt) not in seen:
            seen.add(id(vt))
            for item in _items(vt, name):
                find(item, seen)

    for vt in (*args, *kwargs.values()):
        find(vt, set())
    reals = dict(zip(tensors, tx.output.real_values([vt.node for vt in tensors.values()])))

    def value(vt):
        if isinstance(vt, TensorVariable):
            return reals[id(vt)]
        if not vt.contains_tensor():
            return vt.as_python_constant()
        if isinstance(vt, containers.ConstDictVariable):
            if any(type(k) is IdentityKey for k in vt.items):
                raise Unsupported("a dict keyed by objects, passed to an "
                                  "assume_constant_result function")
            return vt.user_type((k, value(v)) for k, v in vt.items.items())
        items = [value(v) for v in vt.items]
        if isinstance(vt, containers.NamedTupleVariable):
            return vt.tuple_type._make(items) if vt.is_collections else vt.tuple_type(items)
        return vt.python_type()(items)

    return [value(vt) for vt in args], {k: value(v) for k, v in kwargs.items()}


def _items(vt, name):
    if isinstance(vt, containers.ConstDictVariable):
        return list(vt.items.values())
    if isinstance(vt, containers.BaseListVariable):
        return vt.items
    raise Unsupported(f"{name} is marked assume_constant_result and is called with {vt}, "
                      "whose tensors kiln cannot hand it")


def _constant_result(tx, name, value):
    """The tracker of what an assume_constant_result function returned: a tensor a constant of
    the graph (a get_attr of a copy, which no later write of the program's tensors changes,
    with no gradient through it), tuples, lists and dicts of them the containers of those
    constants, anything else a constant as tx.wrap makes it."""
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            return tx.output.add_constant(value.detach().clone())
    if not _holds_tensor(value):
        return tx.wrap(value, None, guard=False)
    if isinstance(value, tuple) and (hasattr(type(value), "_fields") or
                                     hasattr(type(value), "n_sequence_fields")):
        return containers.NamedTupleVariable([_constant_result(tx, name, v) for v in value],
                                             type(value))
    if type(value) in (tuple, list):
        items = [_constant_result(tx, name, v) for v in value]
        if type(value) is tuple:
            return containers.TupleVariable(items)
        return containers.ListVariable(items)
    if type(value) is dict and all(is_guardable_constant(k) for k in value):
        return containers.ConstDictVariable({k: _constant_result(tx, name, v)
                                             for k, v in value.items()})
    raise Unsupported(f"{name} is marked assume_constant_result and returns a "
                      f"{type(value).__name__} holding tensors, which kiln cannot hold as a "
                      "constant")


def _holds_tensor(value, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth > 32:  # a container that holds itself
        return False
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v, depth + 1) for v in value.values())
    return False
