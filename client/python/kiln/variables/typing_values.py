"""typing's constructs read in a frame (List[torch.Tensor] in torch.jit.annotate(List[torch.Tensor],
[]), Optional[int]): immutable values made of what they are subscripted with, made at capture
as the program's first call makes them (typing caches them) and held as constants."""
from kiln.exc import Unsupported


def is_typing_value(value) -> bool:
    """A typing construct (List, List[Tensor], Optional[int]...)."""
    return type(value).__module__ == "typing"


def _value(tx, vt):
    """What `vt` is, when it is a constant, a class, a typing construct or a tuple of those
    (each object's identity guarded); else None."""
    if vt.is_python_constant():
        return vt.as_python_constant()
    items = getattr(vt, "items", None)
    if vt.python_type() is tuple and isinstance(items, list):
        values = tuple(_value(tx, item) for item in items)
        return None if any(v is None for v in values) else values
    try:
        value = vt.identity(tx)
    except Unsupported:
        return None
    return value if isinstance(value, type) or is_typing_value(value) else None


def arguments(tx, wrapper, args, kwargs):
    """(args, kwargs) of a call of typing's own cache as the objects they are (see _value),
    when `wrapper` is typing's and each one is such an object; else None."""
    if getattr(wrapper, "__module__", None) != "typing":
        return None
    values = [_value(tx, vt) for vt in (*args, *kwargs.values())]
    if any(v is None for v in values):
        return None
    return values[:len(args)], dict(zip(kwargs, values[len(args):]))


def subscript(tx, construct, index):
    """construct[index] made at capture (typing's __getitem__, whose cache differs between
    Python versions, is not traced), or None when the index is not such an object."""
    key = _value(tx, index)
    if key is None:
        return None
    try:
        result = construct[key]
    except Exception as e:
        raise Unsupported(f"{construct!r}[...] raised {type(e).__name__} at capture") from None
    return tx.wrap(result, None, guard=False)
