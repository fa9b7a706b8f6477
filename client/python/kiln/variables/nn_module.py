"""nn.Module instances: attribute reads resolve to submodules, parameters (lifted into the graph
as attributes of the compiled graph module), buffers and guarded constants; calls inline
`forward`."""
import collections
import inspect
import types

import torch

from kiln import config
from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import (AttrSource, InstanceAttrSource, InstanceDictSource,
                                ItemSource, ModuleMemberSource, ObjectSource, TypeSource)
from kiln.variables.base import VariableTracker
from kiln.variables.class_attr import class_source, guard_class_member
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import (ConstDictVariable, ListIteratorVariable, ListVariable,
                                       TupleVariable)
from kiln.variables.functions import UserFunctionVariable, UserMethodVariable
from kiln.variables.side_effects import mutations_of

_nn_hooks = torch.nn.modules.module


_MISSING = object()


def _class_attr_or_missing(cls, name):
    """`name` as found in cls.__mro__'s dicts (no instance, no __getattr__), or _MISSING."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


def _is_torch_nn_class(cls) -> bool:
    return cls.__module__.startswith("torch.nn.")


class NNModuleVariable(VariableTracker):
    """A module from outside the frame. Specialized (the default): guarded by identity, its
    parameters and buffers are attributes of the graph module (the plan may fold them). Not
    specialized (OutputGraph.unspecialized_modules: the code runs for several instances of one
    class): guarded by type and by everything the trace reads of it (every constant attribute,
    each registry's keys, each child's type), its parameters and buffers graph inputs: one
    entry serves every instance with that structure."""

    def __init__(self, module: torch.nn.Module, source=None, specialized: bool = True):
        super().__init__(source)
        self.module = module
        self.specialized = specialized
        self.identity_pinned = specialized

    def python_type(self):
        return type(self.module)

    def as_python_constant(self):
        return self.module

    def identity(self, tx):
        return self if self.fresh_object else self.module

    def _child(self, tx, name, registry):
        value = self.module.__dict__[registry][name]
        source = ModuleMemberSource(self.source, name, registry) if self.source else None
        if isinstance(value, torch.Tensor):
            if not self.specialized:
                return tx.wrap(value, source)  # a graph input, TENSOR_MATCH guarded
            # The graph holds this very tensor: replacing it (m.weight = Parameter(...))
            # must recompile.
            if source is not None:
                tx.output.guards.add(source, "ID_MATCH", value)
            return tx.output.add_attr(value, source)
        if value is None:
            if source is not None:
                tx.output.guards.add(source, "ID_MATCH", None)
            return ConstantVariable(None)
        return tx.wrap(value, source)

    def _guard_registry_keys(self, tx, registry):
        """Iterating over children depends on which there are (Sequential.append...)."""
        if self.source is not None:
            src = InstanceAttrSource(self.source, registry)
            tx.output.guards.add(src, "DICT_KEYS", tuple(self.module.__dict__[registry]))

    def var_getattr(self, tx, name):
        """`module.name` in the order Python finds it: a data descriptor of the class (a
        property), then the instance __dict__, then any other class attribute (a method shadows
        a submodule of the same name), then Module.__getattr__'s parameters, buffers and
        submodules."""
        mod = self.module
        cls = type(mod)
        if name == "__class__":
            # The module's identity is guarded (ID_MATCH), and with it its class.
            return tx.wrap(cls, None)
        pending = mutations_of(tx.output).load(mod, name)
        if pending is not None:  # the frame assigned it (store_attr): what it reads back
            return pending
        if inspect.getattr_static(cls, "__getattribute__") is not object.__getattribute__:
            raise Unsupported(f"{cls.__name__} has its own __getattribute__")
        static = _class_attr_or_missing(cls, name)
        if static is not _MISSING and hasattr(type(static), "__set__"):
            return self._class_attr(tx, name, static)
        d = mod.__dict__
        if name in d:
            value = d[name]
            source = InstanceAttrSource(self.source, name) if self.source else None
            if type(value) is int and source is not None and \
                    tx.output.symbolic.assigned_int_is_symbol(value, source):
                # An attribute the frame itself assigns (`self.calls += 1`): a symbol.
                tx.output.guards.add(source, "TYPE_MATCH", int)
                return tx.output.add_int_input(value, source)
            if is_guardable_constant(value) or (isinstance(value, tuple) and all(
                    is_guardable_constant(v) for v in value)):
                guard = name == "training" or config.guard_nn_module_constants or (
                    not _is_torch_nn_class(cls)) or not self.specialized
                if guard and source is not None:
                    tx.output.guards.add(source, "CONSTANT_MATCH", value)
                return ConstantVariable(value)
            return tx.wrap(value, source)
        if static is not _MISSING:
            return self._class_attr(tx, name, static)
        if inspect.getattr_static(cls, "__getattr__") is not torch.nn.Module.__getattr__:
            raise Unsupported(f"{cls.__name__} has its own __getattr__")
        for registry in ("_parameters", "_buffers", "_modules"):
            if name in d.get(registry, ()):
                return self._child(tx, name, registry)
        raise Unsupported(f"{cls.__name__} has no attribute {name!r}")

    def store_attr(self, tx, name, value):
        """`module.name = value` for a plain attribute (a counter, a flag, a cached tensor): a
        store held pending and replayed after the graph (side_effects). Where Module.__setattr__
        would do more (register a parameter, a buffer or a submodule, or a property's setter
        runs), the frame breaks instead."""
        mod = self.module
        cls = type(mod)
        if inspect.getattr_static(cls, "__setattr__") is not torch.nn.Module.__setattr__:
            raise Unsupported(f"assignment to an attribute of {cls.__name__}, which has its own "
                              "__setattr__")
        cls_of_value = value.python_type()
        if isinstance(value, NNModuleVariable) or (
                isinstance(cls_of_value, type) and issubclass(cls_of_value, torch.nn.Parameter)):
            raise Unsupported(f"assignment of a module or parameter to {cls.__name__}.{name}")
        static = _class_attr_or_missing(cls, name)
        if static is not _MISSING and hasattr(type(static), "__set__"):
            raise Unsupported(f"assignment to {cls.__name__}.{name} through a descriptor")
        if self.source is None:
            raise Unsupported(f"assignment to an attribute of a module made in the frame")
        for registry in ("_parameters", "_buffers", "_modules"):
            if name in mod.__dict__[registry]:
                raise Unsupported(f"assignment to {cls.__name__}.{name}, one of its {registry}")
            # Still a plain attribute when the store is replayed.
            tx.output.guards.add(InstanceAttrSource(self.source, registry), "NO_ITEM", name)
        self._guard_class_member(tx, "__setattr__", torch.nn.Module.__setattr__, always=False)
        mutations_of(tx.output).store(mod, self.source, name, value)

    def _class_attr(self, tx, name, static):
        mod = self.module
        self._guard_class_member(tx, name, static, always=False)
        if _MEMBER_GENERATORS.get(name) is static:
            return ModuleMembersMethod(self, name)
        if isinstance(static, staticmethod):
            return UserFunctionVariable(static.__func__)
        if isinstance(static, classmethod):
            return UserMethodVariable(static.__func__, tx.wrap(type(mod), None))
        if isinstance(static, types.FunctionType):
            return UserMethodVariable(static, self)
        if isinstance(static, property):
            if static.fget is None:
                raise Unsupported(f"property {type(mod).__name__}.{name} has no getter")
            return tx.inline_call(static.fget, [self], {}, fn_source=None)
        if is_guardable_constant(static):
            if self.source is not None and not _is_torch_nn_class(type(mod)):
                tx.output.guards.add(AttrSource(TypeSource(self.source), name),
                                     "CONSTANT_MATCH", static)
            return ConstantVariable(static)
        raise Unsupported(f"attribute {type(mod).__name__}.{name} of kind "
                          f"{type(static).__name__}")

    def call_function(self, tx, args, kwargs):
        m = self.module
        if m._backward_hooks or getattr(m, "_backward_pre_hooks", None) or \
                _nn_hooks._global_forward_hooks or _nn_hooks._global_forward_pre_hooks or \
                _nn_hooks._global_backward_hooks:
            raise Unsupported(f"call of {type(m).__name__} with backward or global hooks")
        for name, hooks in (("forward hooks", _nn_hooks._global_forward_hooks),
                            ("forward pre-hooks", _nn_hooks._global_forward_pre_hooks)):
            tx.output.guards.add(ObjectSource(hooks, f"<global {name}>"), "LEN_MATCH", 0)
        if not (m._forward_hooks or m._forward_pre_hooks):
            if self.source is not None:
                # A hook registered later must not be skipped by the compiled graph.
                for hooks in ("_forward_hooks", "_forward_pre_hooks"):
                    tx.output.guards.add(InstanceAttrSource(self.source, hooks), "LEN_MATCH", 0)
            return self._call_forward(tx, args, kwargs)
        # Forward hooks and pre-hooks (Python functions): called around forward as
        # Module._call_impl calls them, each inlined.
        pre = self._hooks(tx, "_forward_pre_hooks")
        pre_kwargs = set(m._forward_pre_hooks_with_kwargs)
        # One kwargs dict, as _call_impl has: what a hook changes in it in place, forward and
        # the later hooks see.
        args, kw = list(args), ConstDictVariable(dict(kwargs))
        for hook_id, hook in pre:
            if hook_id in pre_kwargs:
                result = hook.call_function(tx, [self, TupleVariable(args), kw], {})
                if not (result.is_python_constant() and result.as_python_constant() is None):
                    new_args, new_kwargs = result.unpack(tx)
                    if not isinstance(new_kwargs, ConstDictVariable):
                        raise Unsupported("a forward pre-hook returned kwargs that are no dict")
                    args, kw = new_args.unpack(tx), new_kwargs
            else:
                result = hook.call_function(tx, [self, TupleVariable(args)], {})
                if not (result.is_python_constant() and result.as_python_constant() is None):
                    args = result.unpack(tx) if issubclass(result.python_type(), tuple) \
                        else [result]
        out = self._call_forward(tx, args, dict(kw.items))
        post_kwargs = set(m._forward_hooks_with_kwargs)
        for hook_id, hook in self._hooks(tx, "_forward_hooks"):
            if hook_id in post_kwargs:
                result = hook.call_function(tx, [self, TupleVariable(args), kw, out], {})
            else:
                result = hook.call_function(tx, [self, TupleVariable(args), out], {})
            if not (result.is_python_constant() and result.as_python_constant() is None):
                out = result
        return out

    def _hooks(self, tx, registry):
        """(id, tracker) of the hooks in the module's `registry` dict, keys and hooks guarded
        (with the registries saying which take keyword arguments)."""
        hooks = self.module.__dict__[registry]
        if self.source is None:
            raise Unsupported(f"hooks of a module with no source")
        src = InstanceAttrSource(self.source, registry)
        tx.output.guards.add(src, "TYPE_MATCH", type(hooks))
        tx.output.guards.add(src, "DICT_KEYS", tuple(hooks))
        for also in ("_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                     "_forward_hooks_always_called"):
            if also in self.module.__dict__:
                tx.output.guards.add(InstanceAttrSource(self.source, also), "DICT_KEYS",
                                     tuple(self.module.__dict__[also]))
        return [(k, tx.wrap(h, ItemSource(src, k))) for k, h in hooks.items()]

    def _call_forward(self, tx, args, kwargs):
        if "forward" in self.module.__dict__:
            # An instance's own forward (a hook library's wrapper): Module.__call__ calls it as
            # it is, without self.
            forward = self.var_getattr(tx, "forward")
            return forward.call_function(tx, args, kwargs)
        forward = _class_attr_or_missing(type(self.module), "forward")
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(self.module).__name__}.forward is not a Python function")
        self._guard_class_member(tx, "forward", forward)
        return tx.inline_call(forward, [self, *args], kwargs, fn_source=None)

    def _guard_class_member(self, tx, name, static, always=True):
        """Guards a method or property found on the module's class: the class still has it, and
        the instance has not gained an attribute of that name that would come first (a
        non-data descriptor). `always=False` leaves torch.nn's own classes unguarded."""
        if self.source is None or (not always and _is_torch_nn_class(type(self.module))):
            return
        guard_class_member(tx, class_source(type(self.module)), name, static)
        if not hasattr(type(static), "__set__"):
            tx.output.guards.add(InstanceDictSource(self.source), "NO_ITEM", name)

    # Module.parameters(), named_modules() and kin, walked as torch walks them.
    def named_modules(self, tx, memo: set, prefix: str, remove_duplicate: bool) -> list:
        """(name, tracker) of this module and each submodule in Module.named_modules' order,
        guarding every `_modules` registry walked (its keys, each child's identity)."""
        if id(self.module) in memo:
            return []
        if remove_duplicate:
            memo.add(id(self.module))
        out = [(prefix, self)]
        for name, child in zip(self.module._modules, self._children(tx)):
            if isinstance(child, NNModuleVariable):
                out += child.named_modules(tx, memo, prefix + ("." if prefix else "") + name,
                                           remove_duplicate)
        return out

    def named_members(self, tx, registry: str, prefix: str, recurse: bool,
                      remove_duplicate: bool) -> list:
        """(name, tracker) of the tensors in `registry` (_parameters, _buffers) of this module
        (and its submodules with `recurse`), in Module._named_members' order, guarded as read."""
        modules = self.named_modules(tx, set(), prefix, remove_duplicate) if recurse \
            else [(prefix, self)]
        seen, out = set(), []
        for module_prefix, module in modules:
            module._guard_registry_keys(tx, registry)
            for key in module.module.__dict__[registry]:
                vt = module._child(tx, key, registry)
                real = module.module.__dict__[registry][key]
                if real is None or id(real) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(real))
                out.append((module_prefix + ("." if module_prefix else "") + key, vt))
        return out

    def named_children(self, tx) -> list:
        seen, out = set(), []
        for name, child in zip(self.module._modules, self._children(tx)):
            if isinstance(child, NNModuleVariable) and id(child.module) not in seen:
                seen.add(id(child.module))
                out.append((name, child))
        return out

    # Containers: Sequential, ModuleList, ModuleDict.
    def _children(self, tx):
        self._guard_registry_keys(tx, "_modules")
        return [self._child(tx, name, "_modules") for name in self.module._modules]

    def unpack(self, tx):
        if isinstance(self.module, (torch.nn.Sequential, torch.nn.ModuleList)):
            return self._children(tx)
        if isinstance(self.module, torch.nn.ModuleDict):
            return [ConstantVariable(k) for k in self.module._modules]
        if isinstance(self.module, torch.nn.ParameterList):
            self._guard_registry_keys(tx, "_parameters")
            return [self._child(tx, name, "_parameters") for name in self.module._parameters]
        raise Unsupported(f"iteration over {type(self.module).__name__}")

    def getitem(self, tx, index):
        key = index.as_python_constant()
        mod = self.module
        if isinstance(mod, (torch.nn.Sequential, torch.nn.ModuleList)):
            children = self._children(tx)
            if isinstance(key, slice):
                if type(mod) not in (torch.nn.Sequential, torch.nn.ModuleList):
                    raise Unsupported(f"slicing a {type(mod).__name__}")
                names = list(mod._modules)[key]
                return ModuleContainerSliceVariable(type(mod), names, children[key])
            return children[key]
        if isinstance(mod, torch.nn.ModuleDict):
            return self._child(tx, key, "_modules")
        if isinstance(mod, torch.nn.ParameterList):
            return self._child(tx, str(key % len(mod)), "_parameters")
        raise Unsupported(f"indexing {type(mod).__name__}")

    def length(self, tx=None):
        if tx is not None:
            self._guard_registry_keys(tx, "_modules")
        return len(self.module)

    def contains(self, tx, item):
        """`key in module_dict`: whether a submodule of that name is there (its keys guarded)."""
        if not isinstance(self.module, torch.nn.ModuleDict) or not item.is_python_constant():
            raise Unsupported(f"`in` on {self}")
        self._guard_registry_keys(tx, "_modules")
        return ConstantVariable(item.as_python_constant() in self.module._modules)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name in ("items", "keys", "values") and isinstance(self.module, torch.nn.ModuleDict):
            names = list(self.module._modules)
            if name == "keys":
                return ListVariable([ConstantVariable(k) for k in names])
            children = self._children(tx)
            if name == "values":
                return ListVariable(children)
            return ListVariable([TupleVariable([ConstantVariable(k), c])
                                 for k, c in zip(names, children)])
        raise Unsupported(f"{type(self.module).__name__}.{name}()")

    def __repr__(self):
        return f"NNModuleVariable({type(self.module).__name__})"


# torch.nn.Module's generator methods over its members, modelled by ModuleMembersMethod (a class
# that overrides one is inlined as any method is).
_MEMBER_GENERATORS = {name: torch.nn.Module.__dict__[name] for name in (
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "modules", "named_modules")}


def _bound(fn, args, kwargs) -> dict:
    """The call's constant arguments bound to `fn`'s parameters (self given), defaults applied."""
    try:
        values = [a.as_python_constant() for a in args]
        kw = {k: v.as_python_constant() for k, v in kwargs.items()}
    except Unsupported:
        raise Unsupported(f"Module.{fn.__name__}() with non-constant arguments") from None
    bound = inspect.signature(fn).bind(None, *values, **kw)
    bound.apply_defaults()
    return dict(bound.arguments)


class ModuleMembersMethod(VariableTracker):
    """`module.parameters` and kin (torch.nn.Module's own): a call yields what Module's generator
    would, read at trace time through the module's registries, every one of them guarded."""

    def __init__(self, module: NNModuleVariable, name: str):
        super().__init__(None)
        self.module = module
        self.name = name

    def call_function(self, tx, args, kwargs):
        a = _bound(_MEMBER_GENERATORS[self.name], args, kwargs)
        mod = self.module
        if self.name in ("parameters", "named_parameters", "buffers", "named_buffers"):
            registry = "_parameters" if "parameters" in self.name else "_buffers"
            pairs = mod.named_members(tx, registry, a.get("prefix", ""), a["recurse"],
                                      a.get("remove_duplicate", True))
        elif self.name in ("children", "named_children"):
            pairs = mod.named_children(tx)
        else:
            if a.get("memo") is not None:
                raise Unsupported("Module.named_modules() with a memo")
            pairs = mod.named_modules(tx, set(), a.get("prefix", ""),
                                      a.get("remove_duplicate", True))
        call = (mod, self.name, a)
        if self.name.startswith("named_"):
            return ModuleMembersVariable([TupleVariable([ConstantVariable(n), v])
                                          for n, v in pairs], call)
        return ModuleMembersVariable([v for _, v in pairs], call)

    def __repr__(self):
        return f"ModuleMembersMethod({self.name})"


class ModuleMembersVariable(ListIteratorVariable):
    """The generator a ModuleMembersMethod call returns, as the items it will yield (next(), a
    loop, list() use them up in the graph). Where it outlives the graph (passed to a call that
    breaks it: `torch.autograd.grad(loss, net.parameters())`), the transformed code calls the
    module's method again and advances the new generator as far as the frame had: the module's
    registries are guarded as read, and the graph changes none of them, so it yields what the
    frame's would have."""

    def __init__(self, items, call):
        super().__init__(items)
        self.call = call  # (the module's tracker, the method's name, its bound arguments)

    def python_type(self):
        return types.GeneratorType

    def reconstruct(self, codegen) -> str:
        self._check_not_drained()
        module, name, bound = self.call
        kwargs = {k: v for k, v in bound.items() if k != "self"}
        return codegen.temp(self, lambda: f"{codegen.constant(members_at)}({codegen(module)}, "
                                          f"{name!r}, {codegen.constant(kwargs)}, {self.index})")


def members_at(module, name: str, kwargs: dict, index: int):
    """`module.<name>(**kwargs)` (parameters(), named_modules()...) advanced by `index` items:
    how the transformed code rebuilds such a generator that outlives the graph."""
    generator = _MEMBER_GENERATORS[name](module, **kwargs)
    for _ in range(index):
        next(generator)
    return generator


def construct_module(tx, cls, args, kwargs) -> "FreshModuleVariable":
    """`cls(*args, **kwargs)` for a torch.nn module class built inside the frame (a loss, an
    activation: `nn.CrossEntropyLoss()(pred, y)`). The module is built at trace time from the
    constant arguments: torch.nn's constructors are plain functions of them, so that object is
    exactly what each call builds. Only modules with no parameters and no tensor buffers are
    modelled: those would be new tensors each call (random weights, fresh running stats)."""
    if not _is_torch_nn_class(cls):
        raise Unsupported(f"constructing {cls.__qualname__} inside a compiled frame")
    try:
        const_args = [a.as_python_constant() for a in args]
        const_kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
    except Unsupported:
        const_args = None
    if const_args is None or not all(map(_is_value, [*const_args, *const_kwargs.values()])):
        # A container or a module among the arguments is an object the module would hold
        # (ModuleDict(od), Sequential(relu)): rebuilt from trace-time copies of them, it would
        # hold the same objects on every call, and not the frame's own.
        raise Unsupported(f"constructing {cls.__qualname__} from arguments that are not "
                          "immutable constants")
    # Built here only to see what it holds: a constructor that draws random weights must leave
    # the random state as it was (the transformed code builds the module again, or the frame
    # breaks at the call and Python does).
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else ()
    try:
        with torch.random.fork_rng(devices=cuda):
            module = cls(*const_args, **const_kwargs)
    except Exception as e:
        raise Unsupported(f"{cls.__qualname__}() raised {type(e).__name__}: {e}") from None
    if any(True for _ in module.parameters()) or any(
            b is not None for _, b in module.named_buffers()):
        raise Unsupported(f"constructing {cls.__qualname__} (it has parameters or buffers) "
                          "inside a compiled frame")
    return FreshModuleVariable(module, tuple(const_args), const_kwargs)


def _is_value(value) -> bool:
    """Whether `value` is an immutable constant all the way down (nothing in it has an identity
    the frame could see)."""
    if type(value) in (tuple, frozenset, torch.Size):
        return all(map(_is_value, value))
    return is_guardable_constant(value) or type(value) in (complex, slice, type(Ellipsis))


class FreshModuleVariable(NNModuleVariable):
    """A torch.nn module made in the frame (see construct_module): no source, no guards on its
    state, and rebuilt by calling its class again where the frame hands it out."""

    def __init__(self, module, args: tuple, kwargs: dict):
        super().__init__(module, None)
        self.args = args
        self.kwargs = kwargs
        self.fresh_object = True  # made in the frame: the tracker is its identity

    def reconstruct(self, codegen) -> str:
        # Built once however often the frame hands it out: each place holds the one module.
        return codegen.temp(self, lambda: f"{codegen.constant(type(self.module))}("
                                          f"*{codegen.constant(self.args)}, "
                                          f"**{codegen.constant(self.kwargs)})")

    def __repr__(self):
        return f"FreshModuleVariable({type(self.module).__name__})"


class ModuleContainerSliceVariable(VariableTracker):
    """`seq[a:b]` of a Sequential or ModuleList: eager makes a new container of the same
    children each time. Iterating, indexing and len() see the children; the container itself
    is built after the graph only where the frame hands it out."""

    def __init__(self, container_type, names, children):
        super().__init__(None)
        self.container_type = container_type
        self.names = names  # the children's keys in the original (Sequential keeps them)
        self.items = children
        self.fresh_object = True

    def python_type(self):
        return self.container_type

    def unpack(self, tx):
        return list(self.items)

    def length(self, tx=None):
        return len(self.items)

    def truth(self, tx):
        return len(self.items) > 0

    def getitem(self, tx, index):
        key = index.as_python_constant()
        if isinstance(key, slice):
            return ModuleContainerSliceVariable(self.container_type, self.names[key],
                                                self.items[key])
        return self.items[key]

    def reconstruct(self, codegen) -> str:
        children = ", ".join(codegen(c) for c in self.items)
        if self.container_type is torch.nn.ModuleList:
            return f"{codegen.constant(torch.nn.ModuleList)}([{children}])"
        pairs = ", ".join(f"({n!r}, {codegen(c)})" for n, c in zip(self.names, self.items))
        return (f"{codegen.constant(torch.nn.Sequential)}"
                f"({codegen.constant(collections.OrderedDict)}([{pairs}]))")

    def __repr__(self):
        return f"ModuleContainerSliceVariable({self.container_type.__name__}, {self.names})"
