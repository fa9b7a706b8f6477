"""Writes seeds/compile_request/lowered_*.textproto: the CompileRequests kiln's own lowering
makes for a few tiny models, so the fuzzer starts from what real clients send.

Run again when the lowering or the IR changes:
    PYTHONPATH=client/python .venv/bin/python tests/fuzz/seeds/lower_models.py
"""
import pathlib

import torch
import torch.nn.functional as F
from google.protobuf import text_format

from kiln.daemon import artifact, protocol
from kiln.graph import lowering


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.ln = torch.nn.LayerNorm(3)

    def forward(self, x):
        return F.gelu(self.ln(self.fc(x))).softmax(-1)


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(2)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1)


def views(x, y):
    z = torch.cat([x, y], dim=0).transpose(0, 1)
    return (z.sum(dim=1, keepdim=True) * 2 + z[:, 1:3].mean()).to(torch.float64), z.argmax(dim=0)


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v).reshape(2, -1)


def main():
    torch.manual_seed(0)
    pb = protocol.messages()
    out = pathlib.Path(__file__).parent / "compile_request"
    cases = {
        "mlp_linear_layernorm_gelu_softmax": (Mlp().eval(), [torch.randn(2, 4)]),
        "conv_batchnorm_relu_maxpool": (Conv().eval(), [torch.randn(1, 2, 4, 4)]),
        "cat_transpose_reduce_cast": (views, [torch.randn(2, 4), torch.randn(3, 4)]),
        "scaled_dot_product_attention": (attention, [torch.randn(1, 2, 3, 4)] * 3),
    }
    for name, (fn, inputs) in cases.items():
        with torch.no_grad():
            lowered = lowering.lower(torch.fx.symbolic_trace(fn), inputs)
        request = pb.service.CompileRequest(graph=lowered.graph, target=artifact.cpu_target())
        header = (f"# A real CompileRequest: kiln's lowering of `{name}` (seeds/lower_models.py).\n"
                  "# Regenerate with that script rather than editing by hand.\n")
        (out / f"lowered_{name}.textproto").write_text(header + text_format.MessageToString(request))


if __name__ == "__main__":
    main()
