"""A linear's bias and its relu run inside the oneDNN linear (compiler/passes/onednn_passes.h
FuseLinearEpilogues): results equal eager's for 2-D and 3-D inputs and each activation; the plan
has no kernel left for them (a GELU stays a kernel, after the fused bias)."""
import pytest
import torch

import kiln
from kiln.state import STATE

pytestmark = [
    pytest.mark.skipif(STATE.daemon.settings.kilnd is None,
                       reason="kilnd is not built on this machine"),
    pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN"),
    pytest.mark.usefixtures("kilnd_cache"),  # conftest resets kiln around every test
]


class LinearAct(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.lin = torch.nn.Linear(32, 48)
        self.act = act

    def forward(self, x):
        return self.act(self.lin(x))


ACTS = {
    "gelu": torch.nn.GELU(),
    "gelu-tanh": torch.nn.GELU(approximate="tanh"),
    "relu": torch.nn.ReLU(),
    "none": torch.nn.Identity(),
}


def plan(fn):
    arts = kiln.debug.artifacts(fn)
    assert len(arts) == 1, f"expected one artifact, got {len(arts)}"
    return arts[0].body.plan


@pytest.mark.parametrize("shape", [(5, 32), (2, 7, 32)], ids=["2d", "3d"])
@pytest.mark.parametrize("act", list(ACTS))
def test_bias_and_relu_run_in_the_linear(act, shape):
    torch.manual_seed(0)
    m = LinearAct(ACTS[act]).eval()
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    p = plan(m)
    kinds = [s.WhichOneof("kind") for s in p.steps]
    assert kinds.count("kernel") == (1 if act.startswith("gelu") else 0), kinds
    linears = [s.library for s in p.steps
               if s.WhichOneof("kind") == "library" and s.library.op == "mkldnn::_linear_pointwise"]
    assert len(linears) == 1
    args = linears[0].args
    assert args[2].WhichOneof("kind") == "value"  # the bias
    assert args[3].string_value == ("relu" if act == "relu" else "none")


def test_a_product_read_elsewhere_keeps_its_bias_add():
    torch.manual_seed(0)

    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.lin(x)
            return torch.nn.functional.gelu(y), y * 2

    m = Both().eval()
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        x = torch.randn(4, 16)
        for got, want in zip(compiled(x), m(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bert_linears_take_their_biases():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, attn_implementation="sdpa")
    m = transformers.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 9))
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).last_hidden_state, m(ids).last_hidden_state,
                                   rtol=1e-3, atol=1e-3)
    steps = [s for a in kiln.debug.artifacts() for s in a.body.plan.steps]
    biased = [s.library.args[2].WhichOneof("kind") == "value" for s in steps
              if s.WhichOneof("kind") == "library" and s.library.op == "mkldnn::_linear_pointwise"]
    # Per layer: query, key, value, attention output, intermediate, output; then the pooler.
    assert biased.count(True) >= 2 * 6, biased
