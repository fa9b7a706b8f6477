"""What a program tells the capture about its tensors' sizes, as torch._dynamo's marks do:

    kiln.mark_dynamic(t, dim, min=None, max=None)  dim is a symbol from the first compile (an
                                                   error if the program needs it constant)
    kiln.maybe_mark_dynamic(t, dim)                dim is a symbol unless the program needs it
                                                   constant
    kiln.mark_static(t, dim=None)                  dim (every dim) stays static, even under
                                                   kiln.compile(dynamic=True)
    kiln.mark_unbacked(t, dim)                     dim is a symbol (as maybe_mark_dynamic: a
                                                   size of 0 or 1 is still specialised)

The marks are torch._dynamo's own attributes on the tensor, so a program written for
torch.compile (torch._dynamo.mark_dynamic) is compiled by kiln with its marks, and kiln's marks
mean the same to torch.compile. kiln.graph.symbolic_shapes reads them.
"""
from dataclasses import dataclass
from typing import Iterable, Optional, Union

import torch


@dataclass(frozen=True)
class DimRange:
    """The range mark_dynamic gave a dimension (torch._dynamo's _DimRange has these fields)."""
    dim: int
    min: Optional[int]
    max: Optional[int]


def _dims(t, index) -> list:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    dims = list(index) if isinstance(index, (list, tuple)) else [index]
    for d in dims:
        if type(d) is not int:
            raise TypeError(f"a dimension is an int, got {type(d).__name__}")
        if not -t.dim() <= d < t.dim():
            raise IndexError(f"dimension {d} out of range for a tensor of {t.dim()} dims")
    return [d % t.dim() for d in dims]


def _add(t, attr: str, dims: Iterable[int]) -> None:
    marks = t.__dict__.get(attr)
    if marks is None:
        marks = set()
        setattr(t, attr, marks)
    marks.update(dims)


def mark_dynamic(t: torch.Tensor, index: Union[int, list], *, min: Optional[int] = None,
                 max: Optional[int] = None) -> None:
    dims = _dims(t, index)
    if (min is not None or max is not None) and len(dims) != 1:
        raise ValueError("min and max are for one dimension at a time")
    if min is not None and max is not None and min > max:
        raise ValueError(f"min {min} > max {max}")
    _add(t, "_dynamo_dynamic_indices", dims)
    if min is not None or max is not None:
        _add(t, "_dynamo_dynamic_range", [DimRange(dims[0], min, max)])


def maybe_mark_dynamic(t: torch.Tensor, index: Union[int, list]) -> None:
    _add(t, "_dynamo_weak_dynamic_indices", _dims(t, index))


def mark_unbacked(t: torch.Tensor, index: Union[int, list]) -> None:
    _add(t, "_dynamo_unbacked_indices", _dims(t, index))


def mark_static(t: torch.Tensor, index: Optional[Union[int, list]] = None) -> None:
    dims = list(range(t.dim())) if index is None and isinstance(t, torch.Tensor) \
        else _dims(t, index)
    _add(t, "_dynamo_static_indices", dims)
