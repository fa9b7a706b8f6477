"""In-place tensor ops and mutation of input tensors (through views, containers and modules):
the compiled program must leave its inputs exactly as eager does, in one graph."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import Corpus, t

corpus = Corpus()


@corpus((4,), frames=1)
def add_underscore_on_input(x):
    x.add_(1)
    return x * 2


@corpus((4,), (4,), frames=1)
def augmented_assignment_on_input(x, y):
    x += y
    x *= 2
    return x


@corpus((3, 3), frames=1)
def setitem_row_to_zero(x):
    x[0] = 0
    return x.sum()


@corpus((3, 3), frames=1)
def setitem_column_plus_equals(x):
    x[:, 1] += 1
    return x


@corpus((4, 4), frames=1)
def boolean_mask_assignment(x):
    x[x < 0] = 0
    return x.mean()


@corpus((4,), (4,), frames=1)
def copy_into_output_argument(out, y):
    out.copy_(y * 3)
    return None


@corpus((3,), frames=1)
def zero_fill_clamp_relu_in_place(x):
    y = x.clone()
    y.clamp_(-0.5, 0.5)
    z = x.clone().relu_()
    w = torch.empty(3).fill_(7.0)
    return y, z, w


@corpus((3,), frames=1)
def functional_relu_inplace_on_input(x):
    F.relu(x, inplace=True)
    return x + 1


@corpus((3, 4), frames=1)
def mutate_through_a_view(x):
    v = x[1]
    v.mul_(10)
    return x


@corpus((2, 3), frames=1)
def alias_then_inplace(x):
    y = x
    y += 1
    return x, y


@corpus(lambda: [t(3), t(3)], frames=1)
def mutate_tensor_in_list_argument(xs):
    xs[0].sub_(xs[1])
    return xs[0] * 2


@corpus(lambda: {"h": t(3), "c": t(3)}, frames=1)
def mutate_tensor_in_dict_argument(state):
    state["c"].mul_(0.5).add_(state["h"])
    return state["c"].tanh()


@corpus((5, 3), lambda: torch.tensor([0, 2, 0]), (3, 3), frames=1)
def index_add_accumulates(dst, idx, src):
    dst.index_add_(0, idx, src)
    return dst.sum(0)


@corpus((3, 5), frames=1)
def scatter_one_hot_in_place(x):
    idx = x.argmax(1, keepdim=True)
    out = torch.zeros_like(x)
    out.scatter_(1, idx, 1.0)
    return out


@corpus((4,), lambda: torch.tensor([True, False, True, False]), frames=1)
def masked_fill_underscore_on_input(x, mask):
    x.masked_fill_(mask, -1.0)
    return x


@corpus((3, 4), frames=1)
def normalize_rows_in_place(x):
    x.sub_(x.mean(dim=1, keepdim=True))
    x.div_(x.std(dim=1, keepdim=True) + 1e-5)
    return x


@corpus(lambda: torch.randn(3, requires_grad=True), (3,), frames=1)
def sgd_step_under_no_grad(w, g):
    with torch.no_grad():
        w -= 0.1 * g
    return w.detach() * 1


@corpus((4,), frames=1)
def inplace_then_later_use_sees_new_value(x):
    a = x * 1
    x.mul_(3)
    b = x * 1
    return a, b


@corpus((2, 3), frames=1)
def inplace_on_intermediate_only(x):
    y = x.exp()
    y.log_()
    y.add_(x, alpha=-1)
    return y


@corpus((3,), frames=1)
def unsqueeze_underscore_metadata_mutation(x):
    y = x.clone()
    y.unsqueeze_(0)
    return y.shape, y


@corpus((3, 3), frames=1)
def torch_function_inplace_variants(x):
    torch.sigmoid_(x)
    torch.mul(x, 2, out=None)
    return x


@corpus((4,), (4,), frames=1)
def lerp_inplace_ema(avg, x):
    avg.lerp_(x, 0.1)
    return avg


@corpus((3, 4), frames=1)
def setitem_with_ellipsis_and_tensor_value(x):
    x[..., 0] = x[..., 1] * 2
    return x


@corpus((4, 4), frames=1)
def fill_diagonal(x):
    x.fill_diagonal_(0.0)
    return x.sum(1)


class CountingModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


corpus((2, 3), frames=1)(CountingModule)


class RunningMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return x - self.mean


corpus((5, 4), frames=1)(RunningMean)


class BatchNormTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x) * 2


corpus((6, 4), frames=1)(BatchNormTraining)


@corpus((3, 3), frames=1)
def inplace_on_transposed_input_view(x):
    x.t().add_(torch.arange(3.0))
    return x


@corpus((2, 4), frames=1)
def clamp_min_inplace_then_return_input(x):
    x.clamp_min_(0.0)
    return x is not None


@corpus((6,), frames=1)
def slice_assign_from_another_slice(x):
    x[3:] = x[:3].flip(0)
    return x


@corpus((2, 2), frames=1)
def setitem_through_view_of_argument(x):
    v = x.view(4)
    v[0] = 100.0
    return x, v


@corpus((2, 3), frames=1)
def transpose_underscore_on_argument(x):
    x.t_()
    return x


@corpus((3,), frames=1)
def copy_into_float64_buffer(x):
    out = torch.empty(3, dtype=torch.float64)
    out.copy_(x)
    return out


@corpus((3,), frames=1)
def out_keyword_argument(x):
    out = torch.empty(3)
    torch.add(x, 1, out=out)
    return out


@corpus((3,), frames=1)
def inplace_add_of_int_tensor_into_float(x):
    f = torch.zeros(3)
    f += torch.arange(3)
    return f + x


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
