"""nn.Modules as models are written: submodules, containers iterated in forward, super(),
properties, buffers, self.training branches; one graph per forward (state compared too)."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.testing import CompileCounter

from .harness import Corpus, t

corpus = Corpus()


def module(*specs, **kw):
    """Registers an nn.Module class (built with no arguments) as a program."""
    return corpus(*specs, **kw)


@module((4, 8), frames=1)
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


@module((2, 3, 8, 8), frames=1)
class ConvBnReluEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.eval()

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


@module((2, 3, 8, 8), frames=1)
class ConvBnTrainingUpdatesRunningStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)).mean()


@module((2, 5, 8), frames=1)
class PreNormResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.ff = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.ff(self.norm(x))


@module(lambda: torch.randint(0, 10, (2, 5)), frames=1)
class EmbeddingBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, ids):
        return self.out(self.emb(ids).mean(1))


@module((3, 4), frames=1)
class ModuleListLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


# transformers' decoders loop over `self.layers[: config.num_hidden_layers]`.
@module((3, 4), frames=1, breaks=0)
class ModuleListSliceLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.stages = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        for layer in self.layers[:3]:
            x = torch.tanh(layer(x))
        head = self.stages[1:]
        return self.layers[::2][1](x), head[1](self.stages[0](x)), len(self.layers[1:])


def test_a_parameter_added_after_compiling_is_in_the_next_walk():
    m = DtypeOfFirstParameter().eval()
    cnt = CompileCounter()
    opt = kiln.compile(m, backend=cnt)
    x = torch.randn(2, 4)
    first = opt(x)
    assert cnt.frame_count == 1 and "extra" not in first[1]
    m.extra = nn.Parameter(torch.ones(4))  # the walk now yields one more: a guard fails
    got, want = opt(x), m(x)
    assert cnt.frame_count == 2 and got[1] == want[1] and "extra" in got[1]
    torch.testing.assert_close(got[0], want[0])


def test_returned_module_list_slice_is_a_new_module_list():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
            self.seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

        def forward(self, x):
            return self.layers[1:], self.seq[1:], x + 1

    net = Net()
    layers, seq, _ = kiln.compile(net, backend=CompileCounter(), fullgraph=True)(torch.randn(2))
    want_layers, want_seq, _ = net(torch.randn(2))
    assert type(layers) is nn.ModuleList and list(layers) == list(want_layers)
    assert type(seq) is nn.Sequential and list(seq._modules.items()) == list(want_seq._modules.items())


@module((3, 4), frames=1)
class ModuleDictItems(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        return {name: head(x) for name, head in self.heads.items()}


@module((3, 4), frames=1)
class SequentialIteratedWithSkips(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        skips = []
        for block in self.blocks:
            x = block(x)
            if isinstance(block, nn.ReLU):
                skips.append(x)
        return x + sum(skips)


class _Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


@module((2, 4), frames=1)
class SuperForwardInSubclass(_Base):
    def forward(self, x):
        return super().forward(x).sigmoid() * 2


@module((2, 4), frames=1)
class PropertyInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.heads = 2

    @property
    def head_dim(self):
        return self.lin.out_features // self.heads

    def forward(self, x):
        return self.lin(x).view(x.shape[0], self.heads, self.head_dim)


@module((4, 6), frames=1)
class DropoutRespectsTrainingFlagEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)
        self.eval()

    def forward(self, x):
        x = self.lin(x)
        if self.training:
            x = self.drop(x)
        return x


@module((4, 6), frames=1)
class TrainingBranchAddsNoiseFreeTerm(nn.Module):
    def forward(self, x):
        if self.training:
            return x * 2
        return x


@module((2, 4), frames=1)
class BufferUsedInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 4))

    def forward(self, x):
        return x * self.scale


@module((2, 4), frames=1)
class RawParameterMatmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))
        self.bias = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return x @ self.weight + self.bias


@module((2, 5, 8), frames=1)
class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)
        self.heads = 2

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, n, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, n, d)
        return self.proj(y)


@module((2, 4), frames=1)
class OptionalProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.proj = None

    def forward(self, x):
        y = self.lin(x)
        if self.proj is not None:
            y = self.proj(y)
        return y


@module((3, 4), frames=1)
class NestedSubmodules(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.decoder = MLP()

    def forward(self, x):
        return self.decoder(self.encoder(x))


@module((3, 4), frames=1)
class ForwardCallsHelperMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def _act(self, x, slope=0.1):
        return F.leaky_relu(x, slope)

    def forward(self, x):
        return self._act(self.lin(x)) + self._act(x, slope=0.3)


@module((2, 4), frames=1)
class ConstantAttributes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 0.5
        self.use_bias = True

    def forward(self, x):
        y = self.lin(x) * self.scale
        return y + 1 if self.use_bias else y


@module((2, 4), frames=1)
class ZipTwoModuleLists(nn.Module):
    def __init__(self):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.norms = nn.ModuleList([nn.LayerNorm(4) for _ in range(2)])

    def forward(self, x):
        for lin, norm in zip(self.lins, self.norms):
            x = norm(x + lin(x))
        return x


@module((2, 4), frames=1)
class GetattrLayerByName(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer0 = nn.Linear(4, 4)
        self.layer1 = nn.Linear(4, 4)

    def forward(self, x):
        for i in range(2):
            x = getattr(self, f"layer{i}")(x)
        return x


@module((2, 4), frames=1)
class ModuleListIndexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, x):
        x = self.layers[0](x)
        return self.layers[-1](x) + self.layers[len(self.layers) // 2](x)


@module((2, 4), frames=1, breaks=0)
class ModuleListSliceThenIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers[:2]:
            x = layer(x)
        return self.layers[-1](x)


@module((2, 1, 8, 8), frames=1)
class SmallCNNClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return F.log_softmax(self.fc(self.features(x)), dim=-1)


@module((2, 4), frames=1)
class WeightTying(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, h):
        return self.head(h)


@module((3, 8), frames=1)
class SwiGLUFeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 16, bias=False)
        self.w3 = nn.Linear(8, 16, bias=False)
        self.w2 = nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@module((3, 8), frames=1)
class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.eps = 1e-6
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x):
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return norm * self.weight


@module((3, 4), frames=1)
class IdentityAndSoftmaxModules(nn.Module):
    def __init__(self):
        super().__init__()
        self.id = nn.Identity()
        self.sm = nn.Softmax(dim=-1)

    def forward(self, x):
        return self.sm(self.id(x))


@module((2, 4), frames=1)
class ParametersIteratedForPenalty(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        out = self.b(self.a(x))
        penalty = self.a.weight.pow(2).sum() + self.b.weight.pow(2).sum()
        return out, penalty


@module((2, 4), frames=1)
class SharedChildCalledTwice(nn.Module):
    """Calls the same child twice (shared weights)."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        return self.shared(self.shared(x))


@module((1, 2, 4, 4), frames=1)
class InterpolateAndPad(nn.Module):
    def forward(self, x):
        y = F.interpolate(x, scale_factor=2, mode="nearest")
        return F.pad(y, (1, 1, 1, 1))


# torch.nn's own larger modules, called from a user module.


@module((2, 5, 8), frames=1)
class MultiheadSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, weights = self.attn(x, x, x, need_weights=True)
        return out, weights


@module((2, 5, 8), frames=1)
class TransformerEncoderLayerTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


@module((3, 4), (3, 6), frames=1)
class GRUCellStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4, 6)

    def forward(self, x, h):
        for _ in range(2):
            h = self.cell(x, h)
        return h


@module((2, 4, 6), frames=1)
class GroupNormThenConvTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)
        self.up = nn.ConvTranspose1d(4, 2, 3, stride=2)

    def forward(self, x):
        return self.up(self.norm(x))


@module((2, 2, 6, 6), frames=1)
class InplaceReluBetweenConvAndNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(inplace=True), nn.BatchNorm2d(3))

    def forward(self, x):
        return self.body(x)


@module(lambda: torch.tensor([[0, 3], [5, 0]]), frames=1)
class PaddedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1)
        return (self.emb(ids) * mask).sum(1) / mask.sum(1).clamp(min=1)


@module((1, 8, 3, 3), frames=1)
class UpsampleAndPixelShuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.shuffle = nn.PixelShuffle(2)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)

    def forward(self, x):
        return self.up(self.shuffle(x))


@module((2, 4, 5), frames=1)
class InstanceNormTrackingStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(4, track_running_stats=True)

    def forward(self, x):
        return self.norm(x)


# Module.parameters() and kin, as models use them in forward: walked at trace time, as torch
# walks them (shared modules and parameters once), every registry guarded.

@module((2, 4), frames=1, breaks=0)
class DtypeOfFirstParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.shared = self.a  # one module under two names: walked once
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        ones = torch.ones(4, dtype=next(self.parameters()).dtype)
        total = sum(p.sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        kids = [type(c).__name__ for c in self.children()]
        frozen = not any(p.requires_grad for p in self.parameters(recurse=False))
        return (self.b(x * ones) + total * self.scale, names, len(list(self.buffers())), kids,
                [n for n, _ in self.named_modules()], frozen, dict(self.named_buffers())["scale"])


@module((3, 4), frames=1, breaks=0)
class ParametersOfASubmoduleAndTheirCount(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x) * len(list(block.parameters()))
        return x, sum(1 for _ in self.blocks.modules())


@module((2, 4), frames=2)  # eagerly, only the Linear's own frame would be a graph: one
class CountsItsCalls(nn.Module):
    """A plain attribute assigned in forward (Module.__setattr__ stores it as is): read back in
    the trace, replayed after the graph; each new count is another guard value."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0
        self.cache = None

    def forward(self, x):
        self.calls += 1
        y = self.lin(x) * self.calls
        self.cache = y.detach()
        return y

    def __eq__(self, other):
        return self.calls == other.calls and torch.equal(self.cache, other.cache)

    __hash__ = nn.Module.__hash__


@module((3, 2), frames=1, breaks=0)
class ModuleDictMembershipAndEllipsis(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"a": nn.Linear(2, 2)})

    def forward(self, x):
        if "a" in self.layers:  # the dict's keys are guarded
            x = self.layers["a"](x)
        if "b" in self.layers:
            x = x * 100
        return x[..., 0], x[Ellipsis, 1]


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
