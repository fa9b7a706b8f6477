"""Turning values read from outside the frame into trackers, with the guards that make the
trace valid for the next call; and wrapping the results of graph ops."""
import builtins
import collections
import enum
import functools
import os
import sys
import types

import torch

from kiln import _C
from kiln.capture.skip_files import is_torch_file
from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.mutation_guard import built_in_a_region
from kiln.guards.source import (AttrSource, InstanceAttrSource, ItemSource, LocalSource,
                                ObjectSource)
from kiln.variables.autograd_function import AutogradFunctionApplyVariable, has_functions_apply
from kiln.variables.builtins import BuiltinVariable, KNOWN_BUILTINS, _PURE_BUILTINS
from kiln.variables.constant import PURE_OPERATORS, ConstantVariable
from kiln.variables.dict_keys import IdentityKey, outside_key
from kiln.variables.ctx_manager import GradModeExitVariable, GradModeRestore
from kiln.variables.containers import (ConstDictVariable, ListVariable, NamedTupleVariable,
                                       ResumeIterator, ResumeIteratorVariable, TupleVariable)
from kiln.variables.functions import (FrameRegionVariable, LruCacheVariable,
                                      OpaqueCallableVariable, PartialVariable,
                                      UserFunctionVariable, UserMethodVariable)
from kiln.variables.nn_module import NNModuleVariable
from kiln.variables.objects import (EnvironVariable, PythonModuleVariable,
                                    UserDefinedClassVariable, UserDefinedObjectVariable)
from kiln.variables.tensor import TensorVariable
from kiln.variables import torch_function
from kiln.variables.torch import TorchVariable, is_torch_object


def wrap(tx, value, source, guard: bool = True):
    """A tracker for `value`, read from `source`, installing the guards the trace depends on.
    With guard=False (attributes of modules and torch namespaces) only tensors are guarded."""
    out = tx.output
    g = guard and source is not None

    def add(kind, v=None):
        if g:
            out.guards.add(source, kind, v)

    if isinstance(value, torch.Tensor):
        if source is None:
            raise Unsupported("a tensor with no source (not reachable from the frame)")
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            torch_function.check_modelled(type(value))
        return out.add_input(value, source)
    if isinstance(value, enum.Enum):
        add("ID_MATCH", value)  # enum members are singletons
        return ConstantVariable(value, source)
    if value is Ellipsis or value is NotImplemented:  # singletons, as a name (`Ellipsis`)
        add("ID_MATCH", value)
        return ConstantVariable(value, source)
    if is_guardable_constant(value):
        if type(value) is int and g and out.symbolic.int_is_symbol(value, source):
            add("TYPE_MATCH", int)  # the SHAPE guard checks what the graph assumed of it
            return out.add_int_input(value, source)
        if type(value) is int and g and out.symbolic.passed_in(source, True):
            out.symbolic.object_ints[source] = value
        add("CONSTANT_MATCH", value)
        return ConstantVariable(value, source)
    if type(value) is torch.Size:
        add("CONSTANT_MATCH", value)
        return ConstantVariable(value, source)
    if type(value) is frozenset and not any(isinstance(v, torch.Tensor) for v in value):
        # Immutable: its identity pins its members.
        add("ID_MATCH", value)
        return ConstantVariable(value, source)
    if type(value) in (range, slice) and all(
            v is None or is_guardable_constant(v) for v in (value.start, value.stop, value.step)):
        # Immutable: their three parts say all.
        add("TYPE_MATCH", type(value))
        if g:
            for part in ("start", "stop", "step"):
                out.guards.add(AttrSource(source, part), "CONSTANT_MATCH", getattr(value, part))
        return ConstantVariable(value, source)
    if isinstance(value, torch.nn.Module):
        # A module a compiled region built (a deepcopy of the model per call) is new each call:
        # guarded by structure from its first capture, as the frame's modules are once a
        # second instance of their class arrives.
        if g and (out.unspecialized_modules or built_in_a_region(value)) and \
                _from_the_frame(source):
            add("TYPE_MATCH", type(value))
            return NNModuleVariable(value, source, specialized=False)
        add("ID_MATCH", value)
        return NNModuleVariable(value, source)
    is_namedtuple = isinstance(value, tuple) and hasattr(type(value), "_fields")
    if is_namedtuple or type(value) in (tuple, list) or type(value) in _DICT_TYPES:
        # One tracker per container object, whatever the path it is reached by (f(l, l), a list
        # that contains itself): the object's identity and contents are one.
        seen = out.containers.get(value, g)
        if seen is not None:
            if g and seen.source is not None and seen.source != source:
                out.guards.add(source, "ALIAS", seen.source)
            return seen
    if is_namedtuple:
        add("TYPE_MATCH", type(value))
        vt = NamedTupleVariable([], type(value), source)
        out.containers.remember(value, g, vt)
        vt.items = [wrap(tx, v, ItemSource(source, i) if source is not None else None, guard)
                    for i, v in enumerate(value)]
        return vt
    if type(value) in (tuple, list):
        add("TYPE_MATCH", type(value))
        add("LEN_MATCH", len(value))
        vt = (TupleVariable if type(value) is tuple else ListVariable)([], source)
        out.containers.remember(value, g, vt)
        vt.items = [wrap(tx, v, ItemSource(source, i) if source is not None else None, guard)
                    for i, v in enumerate(value)]
        return vt
    if type(value) in _DICT_TYPES:
        return _wrap_dict(tx, value, source, guard)
    if is_torch_object(value):
        add("ID_MATCH", value)
        return TorchVariable(value, source)
    if isinstance(value, types.FunctionType):
        add("ID_MATCH", value)
        inline = value.__dict__.get("__kiln_inline__")
        if inline is not None:  # kiln.run(fn)'s wrapper: traced as fn (see _Stance)
            return wrap(tx, inline, AttrSource(source, "__kiln_inline__")
                        if source is not None else None, guard)
        if _is_modelled_builtin(value):  # Python-level functions run at trace time
            return BuiltinVariable(value, source)
        return UserFunctionVariable(value, source)
    if type(value) is functools.partial and source is not None:
        if not all(isinstance(k, str) for k in value.keywords):
            raise Unsupported("a functools.partial with keywords that are not names")
        add("TYPE_MATCH", functools.partial)
        return PartialVariable(wrap(tx, value.func, AttrSource(source, "func"), guard),
                               wrap(tx, value.args, AttrSource(source, "args"), guard).items,
                               wrap(tx, value.keywords, AttrSource(source, "keywords"),
                                    guard).items, source)
    if isinstance(value, functools._lru_cache_wrapper):
        add("ID_MATCH", value)
        return LruCacheVariable(value, source)
    if type(value) is _C.FrameRegion:
        add("ID_MATCH", value)
        return FrameRegionVariable(value, source)
    if isinstance(value, (types.BuiltinMethodType, types.MethodType)) and \
            value.__name__ == "apply" and has_functions_apply(value.__self__):
        # Fn.apply kept as a value (self.fn = Fn.apply): the Function's apply (a builtin method
        # of the class, or torch's Python classmethod bound to it, by torch's version).
        self_source = AttrSource(source, "__self__") if source is not None else None
        if self_source is not None and g:
            out.guards.add(self_source, "ID_MATCH", value.__self__)
        return AutogradFunctionApplyVariable(value.__self__, self_source)
    if isinstance(value, types.MethodType):
        self_source = AttrSource(source, "__self__") if source is not None else None
        obj = wrap(tx, value.__self__, self_source, guard)
        if type(value.__func__) is _C.FrameRegion:
            if g:
                out.guards.add(AttrSource(source, "__func__"), "ID_MATCH", value.__func__)
            return FrameRegionVariable(value.__func__, None, obj)
        if isinstance(value.__func__, types.FunctionType):
            if g:
                out.guards.add(AttrSource(source, "__func__"), "ID_MATCH", value.__func__)
            return UserMethodVariable(value.__func__, obj)
        raise Unsupported(f"bound method {value!r}")
    if isinstance(value, types.ModuleType):
        if source is None and not is_torch_file(tx.code.co_filename):
            source = _module_source(value)
            if source is not None:
                out.guards.add(source, "ID_MATCH", value)
                return PythonModuleVariable(value, source)
        add("ID_MATCH", value)
        return PythonModuleVariable(value, source)
    if type(value) is ResumeIterator and source is not None:
        add("TYPE_MATCH", ResumeIterator)
        items = wrap(tx, value.items, InstanceAttrSource(source, "items"))
        if not isinstance(items, (ListVariable, TupleVariable)):
            raise Unsupported("a resumed loop over a list or tuple subclass")
        out.guards.add(InstanceAttrSource(source, "index"), "CONSTANT_MATCH", value.index)
        return ResumeIteratorVariable(value, source, items, out)
    if type(value) is GradModeRestore:  # a grad-mode `with` a graph break left open
        add("ID_MATCH", value)
        return GradModeExitVariable(value.prior, source)
    if isinstance(value, types.CodeType):
        add("ID_MATCH", value)  # immutable: its attributes (co_varnames...) are constants
        return ConstantVariable(value, source)
    if isinstance(value, (types.BuiltinFunctionType, type)) and _is_modelled_builtin(value):
        add("ID_MATCH", value)
        return BuiltinVariable(value, source)
    if isinstance(value, type):
        add("ID_MATCH", value)
        return UserDefinedClassVariable(value, source)
    if callable(value) and value in PURE_OPERATORS:
        add("ID_MATCH", value)
        return BuiltinVariable(value, source)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        add("ID_MATCH", value)
        return OpaqueCallableVariable(value, source)
    if torch_function.is_tensor_method_descriptor(value):
        add("ID_MATCH", value)
        return torch_function.TensorMethodDescriptorVariable(value, source)
    add("TYPE_MATCH", type(value))
    if value is os.environ:
        return EnvironVariable(value, source)
    return UserDefinedObjectVariable(value, source)


_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict)


def _wrap_dict(tx, value, source, guard: bool):
    """A dict, OrderedDict or defaultdict read from outside the frame: its keys guarded in its
    own order (one hashed by identity, a tensor or a module, as that very object), its values
    read through their items."""
    out = tx.output
    g = guard and source is not None
    keys = {}
    for i, k in enumerate(value):
        key = outside_key(k, f"{source.name if source is not None else '?'}.keys()[{i}]")
        if key is None:
            raise Unsupported(f"a dict with a {type(k).__name__} key")
        keys[key] = k
    if any(type(key) is IdentityKey for key in keys) and source is None:
        raise Unsupported("a dict keyed by objects, reached by no path of the frame")
    if g:
        out.guards.add(source, "TYPE_MATCH", type(value))
        out.guards.add(source, "DICT_KEYS", tuple(value))  # in an OrderedDict's own order
    factory = None
    if type(value) is collections.defaultdict:
        factory = wrap(tx, value.default_factory,
                       AttrSource(source, "default_factory") if source is not None else None,
                       guard)
    vt = ConstDictVariable({}, type(value), source=source, default_factory=factory)
    out.containers.remember(value, g, vt)
    vt.items = {key: wrap(tx, dict.__getitem__(value, k),
                          ItemSource(source, k) if source is not None else None, guard)
                for key, k in keys.items()}
    return vt


def _module_source(module):
    """Where a module reached by no path of the frame (an import inside it, an attribute of an
    object made there) lives: sys.modules under its name, where an import statement finds it
    again; None when it is not registered there. Without a source its attributes would be read
    unguarded (a constant assigned after the capture kept its old value)."""
    name = getattr(module, "__name__", None)
    if type(name) is not str or sys.modules.get(name) is not module:
        return None
    return ItemSource(AttrSource(ObjectSource(sys, "sys"), "modules"), name)


def _from_the_frame(source) -> bool:
    """Whether `source` is reached from the frame's own arguments (not a global or a cell)."""
    while not isinstance(source, LocalSource):
        source = getattr(source, "base", None)
        if source is None:
            return False
    return True


def _is_modelled_builtin(value) -> bool:
    try:
        return value in KNOWN_BUILTINS or value in _PURE_BUILTINS or value in PURE_OPERATORS
    except TypeError:
        return False
