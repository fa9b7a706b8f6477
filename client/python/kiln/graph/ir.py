"""The kiln.v1 IR of an ATen-level graph (to_ir): its values and their metadata, each node's op
and arguments, the schema of every op it calls (which kilnd reads to admit an op outside its
allowlist, and the runtime checks against its dispatcher), and the graph's in-place updates of
its inputs (kiln.graph.input_updates). Part of the "kiln" backend's lowering (kiln.graph.lowering
makes the ATen graph)."""
import operator
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from kiln.graph.aten_nodes import LoweringError, _bound_arguments  # noqa: F401
from kiln.graph.symbolic_ir import SizeSymbols, is_symbolic, static_value

aten = torch.ops.aten


def _contiguous(shape) -> Tuple[int, ...]:
    return tuple(torch._prims_common.make_contiguous_strides_for(tuple(shape)))


# kiln's ops that are aten's under another name (lowering's _attention_op and _metadata_ops): the
# op the IR names, whose schema it declares.
_AS_ATEN = {"kiln::attention": ("scaled_dot_product_attention", "default"),
            "kiln::batch_norm_eval": ("_native_batch_norm_legit_no_training", "default"),
            "kiln::hardswish": ("hardswish", "default")}


def _layer_norm_stats_dtype(input) -> torch.dtype:
    """The dtype of layer norm's mean and rstd as lowering's _layer_norm_as_traced computes them."""
    if input.device.type in ("cpu", "mtia"):
        return input.dtype
    return torch.float32


def _pb():
    from kiln.daemon import protocol

    return protocol.messages()


_DTYPES = {
    torch.float32: "DTYPE_FLOAT32", torch.float64: "DTYPE_FLOAT64", torch.float16: "DTYPE_FLOAT16",
    torch.bfloat16: "DTYPE_BFLOAT16", torch.int8: "DTYPE_INT8", torch.int16: "DTYPE_INT16",
    torch.int32: "DTYPE_INT32", torch.int64: "DTYPE_INT64", torch.uint8: "DTYPE_UINT8",
    torch.bool: "DTYPE_BOOL", torch.complex64: "DTYPE_COMPLEX64",
    torch.complex128: "DTYPE_COMPLEX128", torch.uint64: "DTYPE_UINT64",
}
_DTYPE_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}
_MEMORY_FORMATS = {
    torch.contiguous_format: "MEMORY_FORMAT_CONTIGUOUS",
    torch.preserve_format: "MEMORY_FORMAT_PRESERVE",
    torch.channels_last: "MEMORY_FORMAT_CHANNELS_LAST",
    torch.channels_last_3d: "MEMORY_FORMAT_CHANNELS_LAST_3D",
}


def dtype_to_pb(dtype: torch.dtype) -> int:
    pb = _pb()
    try:
        return pb.graph.DType.Value(_DTYPES[dtype])
    except KeyError:
        raise LoweringError(f"dtype {dtype} has no kiln.v1 encoding") from None


def dtype_from_pb(value: int) -> torch.dtype:
    return _DTYPE_BY_NAME[_pb().graph.DType.Name(value)]


def device_from_pb(device) -> torch.device:
    kind = "cpu" if device.kind == _pb().graph.DEVICE_KIND_CPU else "cuda"
    return torch.device(kind) if kind == "cpu" else torch.device(kind, device.index)


def memory_format_from_pb(value: int) -> torch.memory_format:
    name = _pb().graph.MemoryFormat.Name(value)
    return next(fmt for fmt, n in _MEMORY_FORMATS.items() if n == name)


def _device_to_pb(device: torch.device, out) -> None:
    pb = _pb()
    if device.type == "cpu":
        out.kind = pb.graph.DEVICE_KIND_CPU
    elif device.type == "cuda":
        out.kind = pb.graph.DEVICE_KIND_CUDA
    else:
        raise LoweringError(f"device {device} has no kiln.v1 encoding")
    out.index = device.index or 0


def meta_to_pb(t: torch.Tensor, out, symbols: Optional[SizeSymbols] = None) -> None:
    """`t`'s metadata; with `symbols` (a graph with size symbols), a symbolic size, stride or
    storage offset is -1 / 0 / 0 and its expression is written beside (kiln.graph.symbolic_ir)."""
    if symbols is None:
        out.sizes.extend(int(s) for s in t.shape)
        out.strides.extend(int(s) for s in t.stride())
    else:
        out.sizes.extend(-1 if is_symbolic(s) else int(s) for s in t.shape)
        out.strides.extend(0 if is_symbolic(s) else int(s) for s in t.stride())
        symbols.meta(t, out)
    out.dtype = dtype_to_pb(t.dtype)
    _device_to_pb(t.device, out.device)
    offset = t.storage_offset()
    out.storage_offset = 0 if symbols is not None and is_symbolic(offset) else int(offset)
    out.requires_grad = bool(t.requires_grad)


def op_name(target) -> str:
    schema = target._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


class _Value(int):
    """The id of a value _Builder made with no FX node of its own (an expansion's), as an
    argument of the next call it writes."""


@dataclass(frozen=True)
class _Meta:
    """The metadata of an expansion's value, read as meta_to_pb reads a tensor's."""
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool = False
    offset: int = 0

    @staticmethod
    def contiguous(shape, dtype, device) -> "_Meta":
        return _Meta(tuple(shape), _contiguous(shape), dtype, device)

    def stride(self) -> Tuple[int, ...]:
        return self.strides

    def storage_offset(self) -> int:
        return self.offset


@dataclass(frozen=True)
class _Size:
    """A node of a graph with size symbols that computes a size (a SymInt), not a tensor."""
    value: torch.SymInt


@dataclass(frozen=True)
class _Number:
    """A result of a node that is not a tensor (the int sizes CUDA's fused attention returns
    beside its tensors): no IR value stands for it, and nothing the IR holds may read it."""
    op: str
    index: int
    value: object


class _Builder:
    def __init__(self, symbols: Optional[SizeSymbols] = None):
        self.symbols = symbols  # a graph with size symbols (kiln.graph.symbolic_ir)
        self.pb = _pb()
        self.graph = self.pb.graph.Graph()
        self.ids: Dict[torch.fx.Node, object] = {}  # node -> id, or tuple of ids (and _Numbers)
        self.next_id = 0
        self.ops: Dict[str, torch._ops.OpOverload] = {}  # IR op name -> the op it declares

    def new_value(self, fake, out) -> int:
        if not isinstance(fake, (torch.Tensor, _Meta)):
            raise LoweringError(f"a non-tensor value ({type(fake).__name__}) in the ATen graph")
        out.id = self.next_id
        self.next_id += 1
        meta_to_pb(fake, out.meta, self.symbols)
        return out.id

    def _size(self, value):
        """A size argument's value: an int, a SymInt, or a node computing one (make_fx's
        sym_size and the arithmetic over it), as the SymInt it is; None when `value` is none
        of these. Only a graph with size symbols has them."""
        if isinstance(value, torch.fx.Node) and isinstance(self.ids.get(value), _Size):
            return self.ids[value].value
        if isinstance(value, torch.SymInt):
            return value
        return None

    def argument(self, arg, value, schema_arg) -> None:
        size = self._size(value) if self.symbols is not None else None
        if size is not None:
            if static_value(size) is not None:
                arg.int_value = static_value(size)
            else:
                self.symbols.expr(size, arg.sym_int_value, f"argument {schema_arg}")
            return
        sizes = [self._size(v) for v in value] if self.symbols is not None and \
            isinstance(value, (list, tuple)) else []
        if any(v is not None for v in sizes):
            sizes = [v if size is None else size for v, size in zip(value, sizes)]
            if any(static_value(v) is None and not isinstance(v, torch.SymInt) for v in sizes):
                raise LoweringError(f"unsupported list argument {value!r} of {schema_arg}")
            if all(static_value(v) is not None for v in sizes):
                arg.int_list.values.extend(static_value(v) for v in sizes)
            else:
                for v in sizes:
                    self.symbols.expr(v, arg.sym_int_list.values.add(), f"argument {schema_arg}")
            return
        if isinstance(value, _Value):
            arg.value = int(value)
        elif isinstance(value, torch.fx.Node):
            vid = self.ids[value]
            if isinstance(vid, tuple):
                raise LoweringError(f"tuple-valued node {value} used as one value")
            if isinstance(vid, _Number):
                raise LoweringError(f"{schema_arg} reads result {vid.index} of {vid.op}, a "
                                    f"{type(vid.value).__name__}: the IR carries tensors only")
            arg.value = vid
        elif isinstance(value, bool):
            arg.bool_value = value
        elif isinstance(value, int):
            arg.int_value = value
        elif isinstance(value, float):
            arg.float_value = value
        elif value is None:
            arg.none.SetInParent()
        elif isinstance(value, str):
            arg.string_value = value
        elif isinstance(value, torch.dtype):
            arg.dtype_value = dtype_to_pb(value)
        elif isinstance(value, torch.device):
            _device_to_pb(value, arg.device_value)
        elif isinstance(value, torch.memory_format):
            arg.memory_format_value = self.pb.graph.MemoryFormat.Value(_MEMORY_FORMATS[value])
        elif isinstance(value, torch.layout):
            if value != torch.strided:
                raise LoweringError(f"layout {value} is not supported")
            arg.layout_value = self.pb.graph.LAYOUT_STRIDED
        elif isinstance(value, (list, tuple)):
            if all(isinstance(v, torch.fx.Node) for v in value) and value:
                ids = [self.ids[v] for v in value]
                if any(isinstance(i, (tuple, _Number)) for i in ids):
                    raise LoweringError("a tuple-valued or number node inside a tensor list")
                arg.value_list.ids.extend(ids)
            elif all(isinstance(v, bool) for v in value) and value:
                # A bool[] (convolution_backward's output_mask) travels as 0/1: the runtime
                # binds an int list to the schema's bool[].
                arg.int_list.values.extend(int(v) for v in value)
            elif all(isinstance(v, int) for v in value):
                arg.int_list.values.extend(value)
            else:
                raise LoweringError(f"unsupported list argument {value!r} of {schema_arg}")
        else:
            raise LoweringError(f"unsupported argument {value!r} ({type(value).__name__})")

    def node(self, n: torch.fx.Node) -> None:
        if n.target is operator.getitem:
            base, index = n.args
            self.ids[n] = self.ids[base][index]
            return
        if self.symbols is not None and isinstance(n.meta.get("val"), torch.SymInt):
            # A size the graph computes (sym_size, s0 * 768): no node of the IR; the calls
            # that take it get its expression.
            self.ids[n] = _Size(n.meta["val"])
            return
        if not isinstance(n.target, torch._ops.OpOverload):
            raise LoweringError(f"non-ATen call {n.target}")
        expand = self._EXPANDED.get(op_name(n.target))
        if expand is not None:
            expand(self, n)
            return
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            self.ids[n], = self.call(n.target, n.args, n.kwargs, [val])
            return
        if not isinstance(val, (list, tuple)) or \
                not any(isinstance(v, torch.Tensor) for v in val) or \
                not all(isinstance(v, (torch.Tensor, *_NUMBERS)) or v is None for v in val):
            raise LoweringError(f"{op_name(n.target)} returns {_describe(val)}, not tensors")
        # Each tensor result is a value, in order (the plan's library call binds them so). One
        # the call leaves undefined (None: a gradient its output_mask did not ask for, CUDA
        # attention's sequence offsets) is a value nothing reads as a tensor; the runtime holds
        # an undefined tensor there. Numbers beside them (CUDA attention's sizes) are no value.
        like = next(v for v in val if isinstance(v, torch.Tensor))
        outs = [v if v is not None else _Meta.contiguous((0,), like.dtype, like.device)
                for v in val if not isinstance(v, _NUMBERS)]
        ids = iter(self.call(n.target, n.args, n.kwargs, outs))
        self.ids[n] = tuple(_Number(op_name(n.target), i, v) if isinstance(v, _NUMBERS)
                            else next(ids) for i, v in enumerate(val))

    def call(self, target, args, kwargs, outs) -> List[_Value]:
        """Writes the node calling `target` over `args` and `kwargs` (FX nodes, _Values or
        constants), with one output per entry of `outs` (their metadata); its outputs' ids."""
        schema = target._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            raise LoweringError(f"{op_name(target)} mutates its input")
        node = self.graph.nodes.add()
        # kiln::attention has scaled_dot_product_attention's schema and is that op (see
        # _attention_op): the plan calls aten's, which picks its kernel for the real inputs.
        name = op_name(target)
        if name in _AS_ATEN:
            packet, overload = _AS_ATEN[name]
            target = getattr(getattr(aten, packet), overload)
        node.op = op_name(target)
        self.ops.setdefault(node.op, target)
        for value, sarg in zip(args, schema.arguments):
            self.argument(node.args.add(), value, sarg.name)
        by_name = {a.name: a for a in schema.arguments}
        for name, value in kwargs.items():
            if name not in by_name:
                raise LoweringError(f"unknown argument {name} of {node.op}")
            arg = node.args.add()
            arg.name = name
            self.argument(arg, value, name)
        return [_Value(self.new_value(out, node.outputs.add())) for out in outs]

    def expand_layer_norm(self, n: torch.fx.Node) -> None:
        """kiln::layer_norm as the calls _layer_norm_as_traced makes for it, less those whose
        results nothing reads (as the trace's dead code elimination leaves them)."""
        input, shape, weight, bias, eps = n.args
        x = input.meta["val"]
        used = set()  # which of (out, mean, rstd) are read
        for u in n.users:
            used |= {u.args[1]} if u.target is operator.getitem else {0, 1, 2}
        dims = list(range(x.dim() - len(shape), x.dim()))
        f32 = torch.float32
        full = _Meta.contiguous(x.shape, f32, x.device)
        stats = _Meta.contiguous(n.meta["val"][1].shape, f32, x.device)
        x32 = input
        if x.dtype != f32:
            x32, = self.call(aten._to_copy.default, (input,), {"dtype": f32}, [full])
        var, mean = self.call(aten.var_mean.correction, (x32, dims),
                              {"correction": 0, "keepdim": True}, [stats, stats])
        out = rstd = None
        if used & {0, 2}:
            shifted, = self.call(aten.add.Tensor, (var, eps), {}, [stats])
            rstd, = self.call(aten.rsqrt.default, (shifted,), {}, [stats])
        if 0 in used:
            out, = self.call(aten.sub.Tensor, (x32, mean), {}, [full])
            out, = self.call(aten.mul.Tensor, (out, rstd), {}, [full])
            out, = self.call(aten.mul.Tensor, (out, weight), {}, [full])
            out, = self.call(aten.add.Tensor, (out, bias), {}, [full])
            if x.dtype != f32:
                out, = self.call(aten._to_copy.default, (out,), {"dtype": x.dtype},
                                 [_Meta.contiguous(x.shape, x.dtype, x.device)])
        if _layer_norm_stats_dtype(x) != f32:
            low = _Meta.contiguous(stats.shape, x.dtype, x.device)
            if 1 in used:
                mean, = self.call(aten._to_copy.default, (mean,), {"dtype": x.dtype}, [low])
            if 2 in used:
                rstd, = self.call(aten._to_copy.default, (rstd,), {"dtype": x.dtype}, [low])
        self.ids[n] = (out, mean, rstd)

    def expand_addmm(self, n: torch.fx.Node) -> None:
        """kiln::addmm as the calls _addmm_in_its_dtype makes for it."""
        bound = _bound_arguments(n)
        bias, mat1, mat2 = bound["self"], bound["mat1"], bound["mat2"]
        val = n.meta["val"]
        product = _Meta.contiguous(val.shape, val.dtype, val.device)
        b = bias.meta["val"]
        out, = self.call(aten.mm.default, (mat1, mat2), {}, [product])
        out, = self.call(aten.mul.Tensor, (out, bound["alpha"]), {}, [product])
        scaled, = self.call(aten.mul.Tensor, (bias, bound["beta"]), {},
                            [_Meta.contiguous(b.shape, b.dtype, b.device)])
        self.ids[n], = self.call(aten.add.Tensor, (out, scaled), {}, [product])

    _EXPANDED = {"kiln::layer_norm": expand_layer_norm, "kiln::addmm": expand_addmm}

    def declare_schemas(self) -> None:
        """The schema and tags of every op the nodes call (kiln.v1.OpSchema), by op name."""
        for name in sorted(self.ops):
            target = self.ops[name]
            declared = self.graph.schemas.add()
            declared.op = name
            declared.schema = str(target._schema)
            declared.tags.extend(sorted(tag.name for tag in target.tags))


_NUMBERS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _describe(val) -> str:
    if isinstance(val, (list, tuple)):
        return f"({', '.join(type(v).__name__ for v in val)})"
    return type(val).__name__


def to_ir(aten_gm: torch.fx.GraphModule, num_bound: Optional[int] = None):
    """The kiln.v1.Graph of an ATen-level graph module (placeholders in order are its inputs; the
    values after its own outputs are its input updates, see kiln.graph.input_updates). With
    `num_bound` (how many leading inputs are bound parameters), a graph traced over symbolic
    sizes: its size symbols are the per-call inputs' (kiln.graph.symbolic_ir)."""
    from kiln.graph.input_updates import outputs_and_updates

    b = _Builder(SizeSymbols() if num_bound is not None else None)
    if b.symbols is not None:
        placeholders = [n.meta["val"] for n in aten_gm.graph.nodes if n.op == "placeholder"]
        for index in range(num_bound, len(placeholders)):
            if isinstance(placeholders[index], torch.Tensor):  # new_value refuses the others
                b.symbols.bind(index, placeholders[index])
    inputs, n_inputs = [], []
    for n in aten_gm.graph.nodes:
        if n.op == "placeholder":
            b.ids[n] = b.new_value(n.meta["val"], b.graph.inputs.add())
            inputs.append(b.ids[n])
            n_inputs.append(n)
        elif n.op == "get_attr":
            real = operator.attrgetter(n.target)(aten_gm)
            if not isinstance(real, torch.Tensor):
                raise LoweringError(f"non-tensor attribute {n.target}")
            const = b.graph.constants.add()
            dense = real.detach().contiguous()
            b.ids[n] = b.new_value(dense, const.value)
            host = dense.cpu()  # a constant of a GPU graph: its bytes, read once at lowering
            if dense.dtype == torch.bfloat16 or dense.dtype == torch.float16:
                const.data = host.view(torch.int16).numpy().tobytes()
            elif dense.dtype == torch.bool:
                const.data = host.view(torch.uint8).numpy().tobytes()
            else:
                const.data = host.numpy().tobytes()
        elif n.op == "call_function":
            b.node(n)
        elif n.op == "output":
            returned, updates = outputs_and_updates(
                aten_gm, torch.utils._pytree.tree_leaves(n.args[0]))
            for out in returned:
                b.graph.outputs.append(_tensor_id(b, out))
            for update, value in updates:
                written = b.graph.input_updates.add()
                written.input = inputs[update.input]
                written.value = _tensor_id(b, value)
                if update.new_layout is not None:
                    sizes, strides, offset = update.new_layout
                    old = n_inputs[update.input].meta["val"]
                    meta_to_pb(_Meta(sizes, strides, old.dtype, old.device, offset=offset),
                               written.new_meta)
        else:
            raise LoweringError(f"unexpected node kind {n.op}")
    b.declare_schemas()
    if b.symbols is not None:
        if any(u.HasField("new_meta") for u in b.graph.input_updates):
            # The plan writes an input's elements per call; a new layout would be sizes of the
            # call that the update's metadata cannot spell.
            from kiln.graph.symbolic_ir import NotSymbolic
            raise NotSymbolic("a graph with symbolic sizes changes an input's layout in place")
        b.symbols.write(b.graph, inputs)
    return b.graph


def _tensor_id(b: _Builder, out) -> int:
    vid = b.ids.get(out) if isinstance(out, torch.fx.Node) else None
    if not isinstance(vid, int):
        raise LoweringError(f"graph output {out!r} is not a tensor")
    return vid
