"""What kiln.debug.format_artifact and KILN_LOG=codegen show of a compile: the IR after each of
kilnd's passes, one node per line, before the plan and the generated C++."""
import dataclasses
import re

import pytest
import torch

import kiln
from kiln.state import STATE

pytestmark = pytest.mark.skipif(STATE.daemon.settings.kilnd is None,
                                reason="kilnd is not built on this machine")

NODE_LINE = re.compile(r"^    %\d+(, %\d+)* = [a-z_]+::[\w.]+\(.*\)  [a-z0-9]+\[[\d, ]*\]")


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


class ConvBnRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def compiled_conv_bn_relu():
    m = ConvBnRelu().eval()
    with torch.no_grad():
        m.bn.running_var.uniform_(0.5, 2)
        x = torch.randn(2, 3, 8, 8)
        torch.testing.assert_close(kiln.compile(m, backend="kiln")(x), m(x),
                                   rtol=1e-4, atol=1e-4)
    arts = kiln.debug.artifacts(m)
    assert len(arts) == 1
    return arts[0]


def sections(text):
    """The printout's pass sections as {pass: [lines]}, in order, and the text after them."""
    passes, current = {}, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^  after (.+?): (unchanged|\d+ nodes)$", line)
        if m:
            current = f"{len(passes)} {m.group(1)}"
            passes[current] = [] if m.group(2) != "unchanged" else None
        elif line.startswith("  plan: "):
            return passes, "\n".join(lines[i:])
        elif current is not None and passes[current] is not None:
            passes[current].append(line)
    raise AssertionError("no plan after the pass sections:\n" + text)


def test_format_artifact_shows_the_ir_after_each_pass_before_the_plan():
    a = compiled_conv_bn_relu()
    passes, rest = sections(kiln.debug.format_artifact(a))
    names = [key.split(" ", 1)[1] for key in passes]
    assert names[:3] == ["received", "batch norm decomposed", "simplify views"], names
    fold = names.index("fold convolution affine")
    assert names.index("common subexpressions") < fold < len(names) - 1
    assert names[-1] == "bound nodes first", names
    assert len(names) == len(kiln.debug.pass_snapshots(a.body))

    received = passes["0 received"]
    assert any(re.match(r"^    %\d+ = bound input  f32\[8, 3, 3, 3\]$", l) for l in received)
    assert any(re.match(r"^    %\d+ = input  f32\[2, 3, 8, 8\]", l) for l in received)
    nodes = [l for l in received if NODE_LINE.match(l)]
    # convolution, the eval batch norm node (kilnd decomposes it), relu
    assert len(nodes) == len(kiln.debug.pass_snapshots(a.body)[0].graph.nodes) == 3, received
    assert any("aten::_native_batch_norm_legit_no_training(" in l for l in nodes), received
    conv = next(l for l in nodes if "aten::convolution(" in l)
    assert conv.endswith("f32[2, 8, 8, 8]") or " f32[2, 8, 8, 8] stride " in conv, conv
    assert re.search(r"aten::convolution\(%\d+, %\d+, %\d+, \[1, 1\], \[1, 1\], \[1, 1\], "
                     r"False, \[0, 0\], 1\)", conv), conv
    assert received[-1].startswith("    return %")

    # The batch norm computes on the activation until folding moves it into the weights: then
    # the convolution is the only [2, 8, 8, 8] op before the relu.
    def activation_ops(lines):
        return [re.search(r"= ([\w:.]+)\(", l).group(1) for l in lines
                if NODE_LINE.match(l) and "f32[2, 8, 8, 8]" in l]

    last_graph = None
    for key, lines in passes.items():
        if lines is not None:
            last_graph = lines
        if key.endswith(" fold convolution affine"):
            assert lines is not None, "folding changed nothing"
            break
        before_fold = last_graph
    assert len(activation_ops(before_fold)) > 2, before_fold
    assert activation_ops(last_graph) == ["aten::convolution", "aten::relu"], last_graph

    # Then the plan and the C++, as before.
    assert "prologue" in rest and "library " in rest


def test_artifact_without_readable_snapshots_still_prints_its_plan():
    a = compiled_conv_bn_relu()
    body = type(a.body)()
    body.CopyFrom(a.body)
    body.ClearField("pass_snapshots")
    text = kiln.debug.format_artifact(dataclasses.replace(a, body=body))
    assert "  (no pass snapshots in this artifact)" in text
    assert "after received" not in text
    assert "  plan: inputs " in text

    body.pass_snapshots = b"not zlib"
    text = kiln.debug.format_artifact(dataclasses.replace(a, body=body))
    assert "  (pass snapshots unreadable: " in text
    assert "  plan: inputs " in text


def test_kiln_log_codegen_prints_the_passes(capsys):
    kiln.config.log = frozenset({"codegen"})

    def f(x):
        return torch.sigmoid(x * 2) + x

    with torch.no_grad():
        kiln.compile(f, backend="kiln")(torch.randn(4, 16))
    out = capsys.readouterr().out
    assert "  after received: 3 nodes" in out, out
    assert re.search(r"^    %\d+ = aten::mul\.Tensor\(%0, 2\)  f32\[4, 16\]$", out, re.M), out
    assert re.search(r"^    %\d+ = aten::sigmoid\(%\d+\)  f32\[4, 16\]$", out, re.M), out
    assert out.index("after received") < out.index("  plan: ") < out.index("generated C++")
