"""typing's constructs read in a frame (List[torch.Tensor] in torch.jit.annotate(List[torch.Tensor],
[]), Optional[int]): immutable values made of what they are subscripted with, made at capture
as the program's first call makes them (typing caches them) and held as constants."""
from kiln.exc import Unsupported
from kiln.variables.containers import TupleVariable


def is_typing_value(value) -> bool:
    """A typing construct (List, List[Tensor], Optional[int]...)."""
    return type(value).__module__ == "typing"


_NOT_ONE = object()  # _value's answer for anything else


def _value(tx, vt):
    """What `vt` is, when it is a constant (None included), a class, a typing construct or a
    tuple of those (each object's identity guarded); else _NOT_ONE."""
    if vt.is_python_constant():
        return vt.as_python_constant()
    if isinstance(vt, TupleVariable):
        values = tuple(_value(tx, item) for item in vt.items)
        return _NOT_ONE if any(v is _NOT_ONE for v in values) else values
    try:
        value = vt.identity(tx)
    except Unsupported:
        return _NOT_ONE
    if not (isinstance(value, type) or is_typing_value(value)):
        return _NOT_ONE
    if vt.source is not None and not vt.identity_pinned:  # typing.List and Dict share a type
        tx.output.guards.add(vt.source, "ID_MATCH", value)
    return value


def subscript(tx, construct_vt, index):
    """construct[index] made at capture (typing's __getitem__, whose cache differs between
    Python versions, is not traced), or None when the index is not such an object."""
    key = _value(tx, index)
    construct = _value(tx, construct_vt)
    if key is _NOT_ONE or construct is _NOT_ONE:
        return None
    try:
        result = construct[key]
    except Exception as e:
        raise Unsupported(f"{construct!r}[...] raised {type(e).__name__} at capture") from None
    return tx.wrap(result, None, guard=False)
