"""Python builtins and the math module on trace-time constants, mixed with tensor code."""
import math

import pytest
import torch
import torch.nn as nn

from .harness import Corpus, t

corpus = Corpus()


@corpus((4,), 2, frames=1)
def isinstance_dispatch_on_int(x, y):
    if isinstance(y, torch.Tensor):
        return x + y
    if isinstance(y, (int, float)):
        return x * y
    return x


@corpus((4,), (4,), frames=1)
def isinstance_dispatch_on_tensor(x, y):
    if isinstance(y, torch.Tensor):
        return x + y
    return x * y


@corpus((5, 2), frames=1)
def len_of_tensor_and_list(x):
    return x * len(x) + len([1, 2, 3])


class _Cfg:
    hidden = 4


@corpus((4,), _Cfg(), frames=1)
def getattr_with_default_on_config(x, cfg):
    h = getattr(cfg, "hidden", 8)
    d = getattr(cfg, "dropout", 0.0)
    return x * h + d


@corpus((4,), _Cfg(), frames=1)
def hasattr_on_config(x, cfg):
    if hasattr(cfg, "hidden") and not hasattr(cfg, "missing"):
        return x + 1
    return x


@corpus((3, 7), frames=1)
def min_max_of_ints(x):
    n = min(x.shape[1], 4)
    m = max(x.shape)
    return x[:, :n] * m


@corpus((4,), frames=1)
def abs_of_tensor_and_int(x):
    return abs(x) + abs(-3)


@corpus((2, 4, 8), frames=1)
def math_sqrt_attention_scale(q):
    scale = 1.0 / math.sqrt(q.size(-1))
    return (q @ q.transpose(-2, -1)) * scale


@corpus((4,), frames=1)
def math_constants_and_log(x):
    return x * math.pi + math.log(2.0) - math.e


@corpus((10,), frames=1)
def math_ceil_floor_for_padding(x):
    pad = math.ceil(x.shape[0] / 4) * 4 - x.shape[0]
    half = math.floor(pad / 2)
    return torch.nn.functional.pad(x, (half, pad - half))


@corpus((3,), frames=1)
def fstring_key_of_dict(x):
    out = {}
    for i in range(3):
        out[f"layer_{i}"] = x * i
    return out


@corpus((3,), frames=1)
def int_float_round_conversions(x):
    a = int(3.7)
    b = float(2)
    c = round(2.567, 1)
    return x * a + b * c


@corpus((7,), frames=1)
def divmod_and_modulo(x):
    q, r = divmod(x.shape[0], 3)
    return x * q + r + (x.shape[0] % 2)


@corpus((3,), frames=1)
def sum_of_ints(x):
    return x * sum([1, 2, 3])


@corpus(lambda: [t(3), t(3), t(3)], frames=1)
def sum_of_tensor_list(xs):
    return sum(xs)


@corpus((3,), frames=1)
def any_all_on_python_bools(x):
    flags = [x.dim() == 1, x.shape[0] == 3]
    if all(flags) and any([False, True]):
        return x * 2
    return x


@corpus((2, 3, 4), frames=1)
def enumerate_shape(x):
    total = 0
    for i, s in enumerate(x.shape):
        total += i * s
    return x + total


@corpus((4, 4), frames=1)
def type_comparison(x):
    if type(x) is torch.Tensor:
        return x.t()
    return x


@corpus((3,), frames=1)
def callable_check(x):
    fn = torch.relu
    if callable(fn):
        return fn(x)
    return x


@corpus((3,), frames=1)
def pow_and_floordiv_of_ints(x):
    return x * (2 ** 3) + (7 // 2)


@corpus((3,), frames=1)
def bool_and_str_builtins(x):
    name = str(3) + "x"
    if bool(len(name)):
        return x + len(name)
    return x


@corpus((4,), frames=1)
def zip_with_strict_lengths(x):
    out = x
    for a, b in zip([1, 2], [3.0, 4.0]):
        out = out * a + b
    return out


@corpus((3, 4), frames=1, xfail="kiln: max(range(n), key=lambda ...) over trace-time constants "
         "runs the whole frame eagerly ('max() of non-constants')")
def max_with_key_on_shapes(x):
    dims = list(x.shape)
    big = max(range(len(dims)), key=lambda i: dims[i])
    return x.sum(big)


@corpus((3,), frames=1)
def sorted_and_reversed_constants(x):
    order = sorted([1, 0, 2], reverse=True)
    return x[order]


@corpus((3,), frames=1)
def math_isclose_on_constants(x):
    if math.isclose(0.1 + 0.2, 0.3):
        return x - 1
    return x + 1


@corpus((3,), frames=1)
def torch_is_tensor_and_numel(x):
    if torch.is_tensor(x) and x.numel() == 3:
        return x * x.numel()
    return x


@corpus((2, 3), frames=1)
def ndim_and_size_method(x):
    return x.view(x.size(0) * x.size(1)) * x.ndim


# A torch.nn module without parameters or buffers built in the frame is built at trace time:
# one graph, no break, reused by every call.
@corpus((3,), frames=1)
def isinstance_of_module_built_in_frame(x):
    m = nn.ReLU()
    if isinstance(m, nn.Module):
        return m(x)
    return x


@corpus((4,), frames=1)
def map_over_constants(x):
    scales = list(map(float, [1, 2, 3]))
    return x * scales[-1]


@corpus((4,), frames=1)
def set_membership_of_string(x):
    allowed = {"mean", "sum"}
    if "sum" in allowed:
        return x.sum()
    return x.mean()


@corpus((3,), frames=1)
def device_type_string_compare(x):
    return x * 2 if x.device.type == "cpu" else x


@corpus((3,), frames=1)
def shape_equals_tuple_and_size(x):
    if x.shape == (3,) and x.size() == torch.Size([3]):
        return x + 1
    return x


@corpus((3,), frames=1)
def dtype_properties(x):
    if x.dtype.is_floating_point and x.is_floating_point():
        return x * 2
    return x


@corpus((3,), frames=1)
def dtype_membership_in_tuple(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x * 3


@corpus((3,), frames=1)
def string_methods_on_constants(x):
    name = "Layer.Norm"
    if name.startswith("Layer"):
        return x * len(name.lower().split("."))
    return x


@corpus((3,), frames=1)
def percent_and_format_strings(x):
    return x * len("%d-%s" % (3, "ab")) + len("{}:{:.1f}".format(1, 2.0)) + len("-".join("ab"))


@corpus((3,), frames=1)
def tuple_ordering_comparison(x):
    return x * 2 if (1, 2) < (1, 3) else x


@corpus((3,), frames=1)
def isinstance_filter_in_list(x):
    vals = [x, 1.0, None, x * 2]
    return [v * 2 for v in vals if isinstance(v, torch.Tensor)]


@corpus((3,), frames=1)
def getattr_of_torch_function_by_name(x):
    return getattr(torch, "tanh")(x) + getattr(x, "sum")(dim=0)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
