"""Tensors: a graph node plus the fake tensor that carries its metadata."""
import inspect
import operator
import types

import torch

from kiln import config
from kiln.exc import Unsupported
from kiln.graph.symbolic_shapes import contains_symbol
from kiln.guards.builder import is_guardable_constant
from kiln.variables.base import VariableTracker
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import ListVariable, NamedTupleVariable, TupleVariable
from kiln.variables import sym_node, torch_function

# Tensor attributes that are plain metadata: answered from the fake value, no graph node.
_META_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_sparse",
               "layout", "is_leaf", "is_quantized", "is_meta", "is_nested", "itemsize", "nbytes"}
# Tensor attributes that are new tensors (views): recorded as getattr nodes.
_TENSOR_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
# Methods whose effect escapes the graph.
_UNSUPPORTED_METHODS = {"register_hook", "retain_grad", "requires_grad_", "backward", "numpy",
                        "item", "tolist", "data_ptr", "untyped_storage", "storage", "__bool__",
                        "set_", "resize_", "share_memory_", "pin_memory"}


class TensorVariable(VariableTracker):
    def __init__(self, node, example, source=None):
        super().__init__(source)
        self.node = node
        self.example = example
        # The tracker of the tensor object this one is, where an op returned one of its inputs
        # (x.add_(1) returns x itself): `y is x` holds, as in eager.
        self.alias_of = None
        # The tensor's Python class: a graph input's or attribute's own (an nn.Parameter; its
        # TENSOR_MATCH guard pins it), torch.Tensor for what an op computes.
        self.python_class = torch.Tensor

    def same_object(self) -> "TensorVariable":
        """The first tracker of the tensor object this one stands for."""
        vt = self
        while vt.alias_of is not None:
            vt = vt.alias_of
        return vt

    # TENSOR_MATCH does not pin which tensor object it is.
    identity_pinned = False

    def python_type(self):
        return self.same_object().python_class

    def truth(self, tx):
        raise Unsupported("data-dependent branch on a tensor's value")

    def as_python_constant(self):
        raise Unsupported("a tensor is not a Python constant")

    def identity(self, tx):
        vt = self.same_object()
        if vt.source is not None:
            real = tx.output.real_tensor(vt)
            if real is not None:
                return real
        return vt  # a tensor the graph computes: no other tracker stands for it

    def contains_tensor(self) -> bool:
        return True

    def overrides_torch_function(self) -> bool:
        return torch_function.overrides_torch_function(self.python_type())

    def as_subclass(self, cls) -> "TensorVariable":
        """`Tensor.as_subclass(self, cls)`: a new object of class `cls` over this tensor."""
        vt = TensorVariable(self.node, self.example)
        vt.python_class = cls
        return vt

    def as_fx_arg(self):
        return self.node

    def as_fake_arg(self):
        return self.example

    def unpack(self, tx):
        if self.example.dim() == 0:
            raise Unsupported("iteration over a 0-d tensor")
        return [tx.output.call("call_function", operator.getitem, (self, ConstantVariable(i)), {})
                for i in range(self.example.shape[0])]

    def length(self, tx):
        if self.example.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return self.example.shape[0]

    def getitem(self, tx, index):
        return tx.output.call("call_function", operator.getitem, (self, index), {})

    def setitem(self, tx, index, value):
        tx.output.call("call_function", operator.setitem, (self, index, value), {})

    def contains(self, tx, item):
        return tx.output.call("call_method", "__contains__", (self, item), {})

    def has_attr(self, tx, name):
        # Attributes of a tensor are its class's (instance attributes are not modelled).
        return hasattr(torch.Tensor, name)

    def reconstruct(self, codegen) -> str:
        vt = self.same_object()
        if not vt.overrides_torch_function():
            return codegen.tensor(self)
        # The graph has plain tensors: an input is the object the frame read, what the graph
        # computed an object of the class over the graph's output, one per tracker.
        if vt.source is not None and vt.node.op == "placeholder":
            return codegen.source(vt.source)
        return codegen.temp(vt, lambda: f"{codegen.constant(torch.Tensor.as_subclass)}("
                                        f"{codegen.tensor(vt)}, "
                                        f"{codegen.constant(vt.python_class)})")

    def var_getattr(self, tx, name):
        if name != "__class__" and self.overrides_torch_function() and \
                tx.output.torch_function_enabled and not _is_method(name) and \
                not torch_function.is_default_torch_function(inspect.getattr_static(
                    self.python_type(), "__torch_function__").__func__):
            # Reading a tensor's property goes through its class's override.
            raise Unsupported(f"attribute .{name} of a {self.python_type().__qualname__}, "
                              "whose __torch_function__ would see the read")
        if name == "shape" and contains_symbol(self.example.shape):
            return self.sizes(tx)
        if name in _META_ATTRS:
            value = getattr(self.example, name)
            if name == "device":
                value = self.example.device
            return ConstantVariable(sym_node.specialised(value))
        if name in _TENSOR_ATTRS:
            return tx.output.call("call_function", getattr, (self, ConstantVariable(name)), {})
        if name == "__class__":  # pinned by TENSOR_MATCH (a graph op's result: a Tensor)
            return tx.wrap(self.python_type(), None)
        if name == "grad" and self.source is not None and \
                tx.output.real_tensor(self) is not None:
            # A graph input's gradient, as it is when the frame runs: an input itself (or None),
            # guarded where it is read.
            from kiln.guards.source import AttrSource

            return tx.wrap(tx.output.real_tensor(self).grad, AttrSource(self.source, "grad"))
        if name in ("grad", "data", "_base", "grad_fn"):
            raise Unsupported(f"tensor attribute .{name}")
        if not hasattr(torch.Tensor, name):
            raise Unsupported(f"tensor has no attribute {name!r}")
        return TensorMethodVariable(self, name)

    def size_of(self, tx, kind: str, dim: int):
        """The tracker of size (or stride, `kind`) `dim`: a constant, or a node reading it where
        it is a symbol."""
        value = getattr(self.example, kind)(dim)
        if not sym_node.is_symbolic(value):
            return ConstantVariable(value)
        return tx.output.call("call_method", kind, (self, ConstantVariable(dim)), {})

    def sizes(self, tx, kind: str = "size"):
        """The tensor's torch.Size (or strides tuple), one tracker per dimension."""
        items = [self.size_of(tx, kind, d) for d in range(self.example.dim())]
        return sym_node.SizeVariable(items) if kind == "size" else TupleVariable(items)

    def __repr__(self):
        ex = self.example
        return f"TensorVariable({self.node.name}: {ex.dtype} {tuple(ex.shape)})"


class TensorMethodVariable(VariableTracker):
    """`tensor.method`, not yet called."""

    def __init__(self, tensor: TensorVariable, name: str):
        super().__init__(None)
        self.tensor = tensor
        self.name = name

    def call_function(self, tx, args, kwargs):
        if tx.output.torch_function_enabled and self.tensor.overrides_torch_function():
            method = getattr(torch.Tensor, self.name)
            if isinstance(method, types.FunctionType):  # its own has_torch_function dispatches
                return tx.inline_call(method, [self.tensor, *args], kwargs)
            if not torch_function.is_tensor_method_descriptor(method):
                raise Unsupported(f"Tensor.{self.name} of a tensor whose class overrides "
                                  "__torch_function__")
            return torch_function.dispatch(
                tx, torch_function.TensorMethodDescriptorVariable(method),
                [self.tensor, *args, *kwargs.values()], [self.tensor, *args], kwargs,
                from_python=False)
        if self.name == "item" and not args and not kwargs and config.capture_scalar_outputs:
            dtype = self.tensor.example.dtype
            kind = bool if dtype is torch.bool else (
                float if dtype.is_floating_point else int if not dtype.is_complex else None)
            if kind is not None and self.tensor.example.numel() == 1:
                return tx.output.record_scalar("call_method", "item", (self.tensor,), kind)
        if self.name in _UNSUPPORTED_METHODS:
            # Raised at the call, not the attribute load, so the graph can break at the call.
            raise Unsupported(f"Tensor.{self.name}() needs the tensor's data")
        if self.name in ("size", "stride") and not kwargs:
            # Static sizes are constants guarded by the tensor's TENSOR_MATCH; symbolic ones
            # are read by the graph.
            dims = [a.as_python_constant() for a in args]
            if len(dims) == 1 and isinstance(dims[0], int):
                d = dims[0]
                return self.tensor.size_of(tx, self.name, d + self.tensor.example.dim()
                                           if d < 0 else d)
            value = getattr(self.tensor.example, self.name)(*dims)
            if not dims and contains_symbol(value):
                return self.tensor.sizes(tx, self.name)
            return ConstantVariable(tuple(value) if self.name == "stride" and not args
                                    else value)
        return tx.output.call("call_method", self.name, (self.tensor, *args), kwargs)

    def reconstruct(self, codegen) -> str:
        return f"{codegen(self.tensor)}.{self.name}"

    def __repr__(self):
        return f"TensorMethodVariable({self.name})"


def _is_method(name: str) -> bool:
    """Whether torch.Tensor's `name` is a method (its lookup runs no __torch_function__; a
    property's read does)."""
    return _is_c_method(name) or isinstance(inspect.getattr_static(torch.Tensor, name, None),
                                            types.FunctionType)


def _is_c_method(name: str) -> bool:
    """Whether torch.Tensor's `name` is a method written in C (its call dispatches to
    __torch_function__ with that method as the function)."""
    return torch_function.is_tensor_method_descriptor(
        inspect.getattr_static(torch.Tensor, name, None))


# What a graph-computed number stands for while fakes run (Tensor.item() under
# capture_scalar_outputs): only ops whose result's metadata does not depend on it may take it.
_SCALAR_STAND_INS = {bool: True, int: 1, float: 1.0}


class ScalarVariable(VariableTracker):
    """A Python number the graph computes (`t.item()` with config.capture_scalar_outputs): an
    operand of tensor arithmetic and of other such numbers, or a graph output; its value is
    unknown at trace time, so branching on it is a graph break."""

    def __init__(self, node, kind: type):
        super().__init__(None)
        self.node = node
        self.kind = kind

    def python_type(self):
        return self.kind

    def as_fx_arg(self):
        return self.node

    def as_fake_arg(self):
        return _SCALAR_STAND_INS[self.kind]

    def truth(self, tx):
        raise Unsupported("data-dependent branch on a value Tensor.item() read")

    def reconstruct(self, codegen) -> str:
        return codegen.tensor(self)  # one of the graph's outputs

    def __repr__(self):
        return f"ScalarVariable({self.node.name}: {self.kind.__name__})"


def wrap_op_result(output, node, result, same_as=None):
    """The tracker of a graph op's result: tensors become graph values (the items of a tuple of
    them, getitem nodes), the rest constants. `same_as`: the tracker of the argument the op
    returned itself (an in-place op)."""
    if result is None:
        return ConstantVariable(None)
    if isinstance(result, torch.Tensor):
        vt = TensorVariable(node, result)
        vt.alias_of = same_as
        return vt
    if sym_node.is_symbolic(result) and node is not None:
        return sym_node.SymNodeVariable(node, result)
    if isinstance(result, (tuple, list)) and node is not None:
        items = []
        tuple_type = type(result) if type(result) not in (tuple, list) else None
        for i, item in enumerate(result):
            if isinstance(item, torch.Tensor):
                items.append(TensorVariable(output.getitem_node(node, i, item), item))
            elif sym_node.is_symbolic(item):
                items.append(sym_node.SymNodeVariable(output.getitem_node(node, i, item), item))
            elif isinstance(item, (tuple, list)):
                raise Unsupported("nested sequences of tensors from one op")
            else:
                items.append(ConstantVariable(item))
        if type(result) is list:
            return ListVariable(items)
        if type(result) is torch.Size:
            return sym_node.SizeVariable(items)
        if tuple_type is not None:
            return NamedTupleVariable(items, tuple_type)
        return TupleVariable(items)
    if type(result) is torch.Size or is_guardable_constant(result) or isinstance(
            result, (tuple, list)):
        return ConstantVariable(result)
    raise Unsupported(f"an op returned a {type(result).__name__}")

