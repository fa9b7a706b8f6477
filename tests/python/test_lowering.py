"""Lowering for the "kiln" backend: captured FX graph -> ATen graph -> kiln.v1 IR."""
import operator

import pytest
import torch

import kiln
from kiln.daemon import protocol
from kiln.graph import lowering

aten = torch.ops.aten
pytestmark = pytest.mark.skipif(not protocol.available(), reason="grpcio-tools/protobuf missing")


def capture(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    kiln.reset()
    kiln.compile(fn, backend=backend)(*args)
    assert len(graphs) == 1
    return graphs[0]


def test_pointwise_graph_lowers_to_aten_ops_with_metadata():
    gm, ex = capture(lambda x, y: torch.relu(x * 2 + y), torch.randn(4, 5), torch.randn(5))
    lo = lowering.lower(gm, ex)
    ops = [n.op for n in lo.graph.nodes]
    assert ops == ["aten::mul.Tensor", "aten::add.Tensor", "aten::relu"]
    assert [list(v.meta.sizes) for v in lo.graph.inputs] == [[4, 5], [5]]
    assert list(lo.graph.inputs[0].meta.strides) == [5, 1]
    out = lo.graph.nodes[-1].outputs[0]
    assert list(lo.graph.outputs) == [out.id]
    assert lo.params == [] and lo.num_user_inputs == 2


def test_parameters_become_leading_inputs_not_constants():
    lin = torch.nn.Linear(8, 3).eval()
    with torch.no_grad():
        gm, ex = capture(lin, torch.randn(2, 8))
        lo = lowering.lower(gm, ex)
    assert len(lo.graph.constants) == 0
    assert len(lo.graph.inputs) == 3
    assert {p.data_ptr() for p in lo.params} == {lin.weight.data_ptr(), lin.bias.data_ptr()}
    assert [list(v.meta.sizes) for v in lo.graph.inputs][2] == [2, 8]
    assert "aten::mm" in [n.op for n in lo.graph.nodes]


def test_batch_norm_in_eval_is_one_node_that_kilnd_decomposes():
    # One traced node whatever op the trace met (kilnd decomposes it into the form it folds
    # into the convolution: compiler/passes/conv_folding.h).
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    m.eval()
    with torch.no_grad():
        gm, ex = capture(m, torch.randn(1, 3, 8, 8))
        lo = lowering.lower(gm, ex)
    ops = [n.op for n in lo.graph.nodes]
    assert "aten::convolution" in ops
    assert ops.count("aten::_native_batch_norm_legit_no_training") == 1, ops
    assert not {"aten::rsqrt", "aten::sqrt", "aten::reciprocal", "aten::sub.Tensor"} & set(ops)
    with torch.no_grad():
        out = lo.aten_graph(*lo.params, *ex)
        torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, m(*ex))


def test_multi_output_ops_bind_each_output():
    def f(x):
        v, m = torch.var_mean(x, dim=-1, keepdim=True)
        return (x - m) * torch.rsqrt(v + 1e-5)

    gm, ex = capture(f, torch.randn(3, 6))
    lo = lowering.lower(gm, ex)
    vm = next(n for n in lo.graph.nodes if n.op == "aten::var_mean.correction")
    assert len(vm.outputs) == 2
    used = {a.value for n in lo.graph.nodes for a in n.args if a.WhichOneof("kind") == "value"}
    assert {o.id for o in vm.outputs} <= used


def test_scalar_and_list_arguments_keep_their_kinds():
    gm, ex = capture(lambda x: x.permute(1, 0).sum(dim=0, keepdim=True) * 0.5, torch.randn(3, 4))
    lo = lowering.lower(gm, ex)
    perm = next(n for n in lo.graph.nodes if n.op == "aten::permute")
    assert perm.args[1].WhichOneof("kind") == "int_list"
    assert list(perm.args[1].int_list.values) == [1, 0]
    mul = next(n for n in lo.graph.nodes if n.op.startswith("aten::mul"))
    assert any(a.WhichOneof("kind") == "float_value" and a.float_value == 0.5 for a in mul.args)


def test_an_input_updated_in_place_is_an_input_update_not_a_node_that_writes():
    def f(x, y):
        x.add_(1)
        return x * y

    gm, ex = capture(f, torch.randn(3), torch.randn(3))
    lo = lowering.lower(gm, [t.clone() for t in ex])
    assert not [n.op for n in lo.graph.nodes if n.op.endswith("_")]
    (update,) = lo.graph.input_updates
    assert update.input == lo.graph.inputs[0].id and not update.HasField("new_meta")
    writer = next(n for n in lo.graph.nodes if n.outputs[0].id == update.value)
    assert writer.op == "aten::add.Tensor"
    assert list(lo.graph.outputs) != [update.value]  # x * y is returned, x + 1 written


def test_an_input_whose_layout_changes_in_place_carries_its_new_metadata():
    def f(x):
        x.t_()
        return x

    gm, _ = capture(f, torch.randn(3, 4))  # (its example input is transposed by then)
    lo = lowering.lower(gm, [torch.randn(3, 4)])
    (update,) = lo.graph.input_updates
    assert list(update.new_meta.sizes) == [4, 3] and list(update.new_meta.strides) == [1, 4]
    # The program returns x itself: the plan returns the caller's tensor, updated.
    assert list(lo.graph.outputs) == [lo.graph.inputs[0].id]


def test_a_view_of_an_updated_input_is_returned_as_a_view_of_the_input():
    def f(x):
        x.mul_(2)
        return x[1]

    gm, ex = capture(f, torch.randn(3, 4))
    lo = lowering.lower(gm, [t.clone() for t in ex])
    (out,) = lo.graph.outputs
    select = next(n for n in lo.graph.nodes if n.outputs[0].id == out)
    assert select.op == "aten::select.int" and select.args[0].value == lo.graph.inputs[0].id


def test_every_op_of_the_ir_declares_its_schema_and_tags():
    def f(x, y):
        loss = torch.nn.functional.cross_entropy(x, y)
        return loss, aten.native_dropout(x, 0.5, True)[0]

    gm, ex = capture(f, torch.randn(4, 5), torch.randint(0, 5, (4,)))
    lo = lowering.lower(gm, ex)
    declared = {s.op: s for s in lo.graph.schemas}
    assert {n.op for n in lo.graph.nodes} == set(declared)
    nll = declared["aten::nll_loss_forward"]
    assert nll.schema == str(torch.ops.aten.nll_loss_forward.default._schema)
    assert "nondeterministic_seeded" in declared["aten::native_dropout"].tags
    forward = next(n for n in lo.graph.nodes if n.op == "aten::nll_loss_forward")
    assert len(forward.outputs) == 2  # (output, total_weight), bound in order


def test_dropout_lowers_to_the_ops_eager_draws_with():
    # AOT autograd's forward graphs call native_dropout: it stays that op (torch's decomposition
    # would draw with rand_like, other numbers than eager's bernoulli). The numbers themselves
    # are compared with eager's in test_kiln_training_ops.py.
    gm, ex = capture(lambda x: aten.native_dropout(x, 0.3, True)[0] * 2, torch.randn(8, 8))
    ops = [n.op for n in lowering.lower(gm, ex).graph.nodes]
    assert "aten::native_dropout" in ops and not [op for op in ops if "rand" in op]
    # Dropout in a no_grad graph is eager's own CPU path: bernoulli of a tensor of x's shape.
    gm, ex = capture(lambda x: torch.nn.functional.dropout(x, 0.3, training=True) * 2,
                     torch.randn(8, 8))
    ops = [n.op for n in lowering.lower(gm, ex).graph.nodes]
    assert "aten::bernoulli.p" in ops and not [op for op in ops if "rand" in op]


def test_a_number_result_beside_tensors_is_no_value_and_reading_it_is_refused():
    from kiln.graph import ir

    # An op returning an int between two tensors, as CUDA's fused attention kernels do.
    lib = torch.library.Library("kiln_test", "FRAGMENT")
    lib.define("pair(Tensor x) -> (Tensor, int, Tensor)")
    lib.impl("pair", lambda x: (x + 1, 3, x * 2), "CompositeExplicitAutograd")
    torch.library.register_fake("kiln_test::pair", lambda x: (x.new_empty(x.shape), 3,
                                                            x.new_empty(x.shape)), lib=lib)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pair = graph.call_function(torch.ops.kiln_test.pair.default, (x,))
    first = graph.call_function(operator.getitem, (pair, 0))
    last = graph.call_function(operator.getitem, (pair, 2))
    graph.output((first, last))
    gm = torch.fx.GraphModule({}, graph)
    t = torch.randn(3)
    x.meta["val"], pair.meta["val"] = t, (t, 3, t)
    first.meta["val"] = last.meta["val"] = t
    ir_graph = ir.to_ir(gm)
    (node,) = ir_graph.nodes
    assert len(node.outputs) == 2 and list(ir_graph.outputs) == [o.id for o in node.outputs]

    number = graph.call_function(operator.getitem, (pair, 1))
    use = graph.call_function(torch.ops.aten.add.Tensor, (first, number))
    use.meta["val"] = t
    graph.erase_node(next(n for n in graph.nodes if n.op == "output"))
    graph.output((use,))
    with pytest.raises(lowering.LoweringError, match="reads result 1 of kiln_test::pair"):
        ir.to_ir(torch.fx.GraphModule({}, graph))


def test_autograd_graphs_are_detected():
    gm, ex = capture(lambda x: x * 2, torch.randn(3, requires_grad=True))
    assert lowering.needs_autograd(gm, ex)
    with torch.no_grad():
        assert not lowering.needs_autograd(gm, ex)


def test_structure_key_changes_with_input_metadata_and_code():
    gm, ex = capture(lambda x: x * 2, torch.randn(3, 4))
    k = lowering.structure_key(gm, ex)
    assert k == lowering.structure_key(gm, [torch.randn(3, 4)])
    assert k != lowering.structure_key(gm, [torch.randn(4, 3)])
    assert k != lowering.structure_key(gm, [torch.randn(3, 4, dtype=torch.float64)])
    assert k != lowering.structure_key(gm, [torch.randn(4, 3).t()])
    gm2, _ = capture(lambda x: x * 3, torch.randn(3, 4))
    assert k != lowering.structure_key(gm2, ex)


def test_structure_key_tells_targets_arguments_and_keywords_apart():
    x = torch.randn(3, 4)
    keys = {}
    programs = {
        "add": lambda x: torch.add(x, 1),
        "sub": lambda x: torch.sub(x, 1),
        "method_add": lambda x: x.add(1),
        "add_alpha": lambda x: torch.add(x, 1, alpha=2),
        "sum0": lambda x: torch.sum(x, dim=0),
        "sum1": lambda x: torch.sum(x, dim=1),
        "sum1_keepdim": lambda x: torch.sum(x, dim=1, keepdim=True),
        "swapped": lambda x: x.t() - x.t().cos(),
        "swapped_back": lambda x: x.t().cos() - x.t(),
    }
    for name, fn in programs.items():
        gm, ex = capture(fn, x)
        keys[name] = lowering.structure_key(gm, ex)
        assert keys[name] is not None, name
        # A second capture of the same program (new nodes, new module) has the same key.
        gm2, ex2 = capture(fn, torch.randn(3, 4))
        assert lowering.structure_key(gm2, ex2) == keys[name], name
    assert len(set(keys.values())) == len(programs)


def test_backends_get_lazy_graph_modules_and_run_the_real_forward():
    seen = []

    def backend(gm, example_inputs):
        # Nothing read the code yet: a backend that never does, pays nothing for it.
        seen.append("_code" not in gm.__dict__)
        return gm.forward

    kiln.reset()
    fn = kiln.compile(lambda x: torch.relu(x) * 3, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(fn(x), torch.relu(x) * 3)
    torch.testing.assert_close(fn(x), torch.relu(x) * 3)
    assert seen == [True]
    (entry,) = kiln.debug.cache_entries(fn)
    compiled = entry.info.compiled_fn
    # What runs on each call is the generated forward, not a wrapper that checks for code.
    assert compiled.__func__ is type(compiled.__self__).forward
    assert "_code" in compiled.__self__.__dict__


def test_a_linear_under_autocast_multiplies_in_the_autocast_dtype():
    # torch's addmm decomposition computes in float32; a bfloat16 region's matrix product must
    # stay a bfloat16 one, as eager's is, and the result is eager's within bfloat16's precision.
    lin = torch.nn.Linear(64, 32).eval()
    x = torch.randn(8, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        gm, ex = capture(lin, x)
        lo = lowering.lower(gm, ex)
        expected = lin(x)
        out = kiln.compile(lin, backend="kiln")(x)
    mm = [n for n in lo.graph.nodes if n.op == "aten::mm"]
    assert len(mm) == 1
    bf16 = lowering.dtype_to_pb(torch.bfloat16)
    assert mm[0].outputs[0].meta.dtype == bf16
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=1.6e-2, atol=1e-2)


LAYER_NORMS = {
    "affine": lambda x, w, b: torch.nn.functional.layer_norm(x, (24,), w, b, 1e-5),
    "two dims": lambda x, w, b: torch.nn.functional.layer_norm(
        x.view(3, 2, 4, 6), (4, 6), w.view(4, 6), b.view(4, 6), 1e-3),
    "no weight": lambda x, w, b: torch.nn.functional.layer_norm(x, (24,), None, b),
    "no affine": lambda x, w, b: torch.nn.functional.layer_norm(x, (24,)),
    "transposed input": lambda x, w, b: torch.nn.functional.layer_norm(
        x.t().contiguous().t(), (24,), w, b),
    "strided weight": lambda x, w, b: torch.nn.functional.layer_norm(
        x, (24,), torch.cat([w, w])[::2], b),
    "float32 weight": lambda x, w, b: torch.nn.functional.layer_norm(
        x, (24,), w.float(), b.float()),
}


def against_eager(fn, *args, rtol, atol):
    """fn compiled by kiln (a fresh capture) returns what eager returns on args."""
    with torch.no_grad():
        expected = fn(*args)
        kiln.reset()
        out = kiln.compile(fn, backend="kiln")(*args)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    return out


@pytest.mark.parametrize("case,dtype", [
    (case, dtype) for case in LAYER_NORMS
    for dtype in (torch.float32, torch.bfloat16, torch.float16)
    if not (case == "float32 weight" and dtype == torch.float32)], ids=str)
def test_layer_norm_lowers_to_what_eager_computes_in_every_form(case, dtype, kilnd_cache):
    # The common form is traced as ATen calls directly, the others through torch's reference:
    # each against eager, on random inputs.
    x = torch.randn(6, 24).to(dtype)
    w, b = torch.randn(24).to(dtype), torch.randn(24).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    against_eager(LAYER_NORMS[case], x, w, b, rtol=tol, atol=tol)
    assert kiln.debug.artifact(LAYER_NORMS[case]) is not None, \
        "the graph ran eagerly instead of through kilnd"


def test_native_layer_norm_statistics_take_the_dtypes_of_torchs_reference():
    # mean and rstd: float32 for a float32 input; on the CPU, the input's dtype otherwise.
    for dtype in (torch.float32, torch.bfloat16):
        def fn(x, w, b):
            return torch.ops.aten.native_layer_norm(x, [24], w, b, 1e-5)

        x, w, b = torch.randn(6, 24).to(dtype), torch.randn(24).to(dtype), torch.randn(24).to(dtype)
        gm, ex = capture(fn, x, w, b)
        lo = lowering.lower(gm, ex)
        expected = fn(x, w, b)
        outs = {v: n for n in lo.graph.nodes for v in [o.id for o in n.outputs]}
        for value, want in zip(lo.graph.outputs, expected):
            assert outs[value].outputs[0].meta.dtype == lowering.dtype_to_pb(want.dtype)


@pytest.mark.parametrize("alpha,beta,dtype", [
    (alpha, beta, dtype) for alpha, beta in [(1, 1), (0.5, 2.0), (1, 0)]
    for dtype in (torch.float32, torch.bfloat16, torch.int64)
    if dtype.is_floating_point or alpha == int(alpha)], ids=str)
def test_addmm_lowers_to_what_eager_computes(alpha, beta, dtype, kilnd_cache):
    def fn(bias, a, b):
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha)

    def rand(*shape):
        t = torch.randn(shape) * 4
        return t.to(dtype) if dtype.is_floating_point else t.round().to(dtype)

    tol = dict(rtol=2e-2, atol=1e-1) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    assert against_eager(fn, rand(12), rand(5, 7), rand(7, 12), **tol).is_contiguous()


ONE_NODE_CASES = {
    # name: (function of (x [6, 24], w [24], b [24], m [5, 24]), the kiln op it is traced as)
    "layer norm": (lambda x, w, b, m: LAYER_NORMS["affine"](x, w, b), "layer_norm"),
    "layer norm over two dims": (lambda x, w, b, m: LAYER_NORMS["two dims"](x, w, b),
                                 "layer_norm"),
    "layer norm's statistics read": (
        lambda x, w, b, m: torch.ops.aten.native_layer_norm(x, [24], w, b, 1e-5), "layer_norm"),
    "layer norm's statistics only": (
        lambda x, w, b, m: torch.ops.aten.native_layer_norm(x, [24], w, b, 1e-5)[1:],
        "layer_norm"),
    "linear": (lambda x, w, b, m: torch.nn.functional.linear(x, m, b[:5]), "addmm"),
    "addmm, scalars": (lambda x, w, b, m: torch.addmm(b[:5], x, m.t(), beta=0.5, alpha=2),
                       "addmm"),
    "addmm, row bias": (lambda x, w, b, m: torch.addmm(b[:5].view(1, 5), x, m.t()), "addmm"),
    "addmm, full bias": (lambda x, w, b, m: torch.addmm(x[:, :5].contiguous(), x, m.t()),
                         "addmm"),
    "addmm, column bias": (lambda x, w, b, m: torch.addmm(b[:6].view(6, 1), x, m.t()[:, :1]),
                           "addmm"),
    # Outside what the one node covers: traced as before.
    "addmm, beta 0": (lambda x, w, b, m: torch.addmm(b[:5], x, m.t(), beta=0), None),
    "addmm, strided bias": (
        lambda x, w, b, m: torch.addmm(torch.cat([b, b])[::2][:5], x, m.t()), None),
    "layer norm, transposed input": (
        lambda x, w, b, m: LAYER_NORMS["transposed input"](x, w, b), None),
}


def _one_node_args(device, dtype):
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(6, 24, generator=g), torch.randn(24, generator=g),
            torch.randn(24, generator=g), torch.randn(5, 24, generator=g)]
    return [a.to(dtype) for a in args]


def _lowered_ir(fn, args, device):
    """fn's IR: captured on the CPU, lowered over fakes of `device` (CUDA: an sm_90 GPU's, with
    or without one); its serialization, and the ops of the traced ATen graph."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.no_grad():
        gm, example = capture(fn, *args)
        params = None
        if device == "cuda":
            mode = FakeTensorMode()

            def fake(t):
                with mode:
                    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")

            params = [fake(t) for t in lowering.attr_tensors(gm).values()]
            example = [fake(t) for t in example]
        lo = lowering.lower(gm, example, params)
    traced = {str(n.target) for n in lo.aten_graph.graph.nodes if n.op == "call_function"}
    return lo.graph.SerializeToString(deterministic=True), traced


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(ONE_NODE_CASES))
def test_layer_norms_and_linears_traced_as_one_node_lower_to_their_decompositions_ir(
        case, dtype, device, monkeypatch):
    # kiln::layer_norm and kiln::addmm (lowering._metadata_ops) are each one traced node that
    # to_ir writes as the ATen calls their decompositions trace: the IR must be the very one
    # tracing those calls gives, byte for byte, where the one node applies; elsewhere the
    # decomposition is traced as before.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    fn, op = ONE_NODE_CASES[case]
    args = _one_node_args(device, dtype)
    ir, traced = _lowered_ir(fn, args, device)
    if op is not None:
        assert f"kiln.{op}.default" in traced, traced
    else:
        assert not any(t.startswith("kiln.") for t in traced), traced
    monkeypatch.setattr(lowering, "_layer_norm_simple", lambda input: False)
    monkeypatch.setattr(lowering, "_addmm_simple", lambda *a: False)
    ir_decomposed, traced = _lowered_ir(fn, args, device)
    assert not any(t.startswith("kiln.") for t in traced), traced
    assert ir == ir_decomposed


@pytest.mark.parametrize("case", [c for c, (_, op) in ONE_NODE_CASES.items() if op])
def test_layer_norms_and_linears_traced_as_one_node_compute_what_eager_does(case, kilnd_cache):
    fn, _ = ONE_NODE_CASES[case]
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        against_eager(fn, *_one_node_args("cpu", dtype), rtol=tol, atol=tol * 10)
        assert kiln.debug.artifact(fn) is not None, "the graph ran eagerly instead of through kilnd"


def test_cudnn_batch_norm_lowers_as_the_eval_batch_norm_node():
    # What batch_norm dispatches to on a CUDA device; traced here on CPU fakes.
    def f(x, w, b, rm, rv):
        return torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)[0]

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3), torch.randn(3),
            torch.rand(3) + 0.5]
    lo = lowering.lower(gm, args)
    ops = [n.op for n in lo.graph.nodes]
    assert ops.count("aten::_native_batch_norm_legit_no_training") == 1, ops
    assert "aten::cudnn_batch_norm" not in ops
    with torch.no_grad():
        expected = torch.nn.functional.batch_norm(args[0], args[3], args[4], args[1], args[2],
                                                  training=False, eps=1e-5)
        out = lo.aten_graph(*lo.params, *args)
        torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, expected)


def test_attention_of_a_gpu_graph_is_traced_as_aten_attention():
    # On CUDA, scaled_dot_product_attention would be traced as the kernel torch picks for the
    # fakes (flash, efficient, cuDNN); kiln traces it whole. Checked here on the rewrite itself.
    def f(q, k, v, m):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m).relu()

    gm = torch.fx.symbolic_trace(f)
    lowering._attention_as_leaf(gm)
    args = [torch.randn(2, 4, 8, 16) for _ in range(3)] + [torch.randn(2, 1, 8, 8)]
    torch.testing.assert_close(gm(*args), f(*args))
    aten_gm, _ = lowering.to_aten(gm, args)
    ops = [n.op for n in lowering.to_ir(aten_gm).nodes]
    assert ops == ["aten::scaled_dot_product_attention", "aten::relu"]


class FusedAttention(torch.nn.Module):
    """Each fused attention kernel scaled_dot_product_attention picks on CUDA, called as a trace
    records it when it meets attention inside a function it enters."""

    def __init__(self, kind, read_logsumexp=False, dropout_p=0.0, causal=False):
        super().__init__()
        self.kind, self.read_logsumexp, self.dropout_p = kind, read_logsumexp, dropout_p
        self.causal = causal

    def forward(self, q, k, v, bias):
        if self.kind == "cudnn":
            r = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, self.read_logsumexp,
                                                         self.dropout_p, scale=0.25)
        elif self.kind == "efficient":
            r = aten._scaled_dot_product_efficient_attention(q, k, v, bias, self.read_logsumexp,
                                                             self.dropout_p, self.causal)
        else:
            r = aten._scaled_dot_product_flash_attention(q, k, v, self.dropout_p, self.causal,
                                                         scale=0.25)
        out = r[0].relu()
        return out + r[1].sum() if self.read_logsumexp else out


def fake_cuda_attention_inputs(monkeypatch, dtype=torch.bfloat16):
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    with FakeTensorMode():
        qkv = [torch.empty(2, 4, 8, 16, device="cuda", dtype=dtype) for _ in range(3)]
        bias = torch.empty(2, 4, 8, 8, device="cuda", dtype=dtype)
    return qkv + [bias]


@pytest.mark.parametrize("kind", ["cudnn", "efficient", "flash"])
def test_a_fused_attention_kernel_in_a_gpu_trace_lowers_to_aten_attention(kind, monkeypatch):
    # Compile-free, on fake CUDA tensors: the kernel's own arguments (mask, causal flag, scale)
    # become scaled_dot_product_attention's, whose kernel the plan picks for the real inputs.
    args = fake_cuda_attention_inputs(monkeypatch)
    causal = kind == "flash"
    lo = lowering.lower(torch.fx.symbolic_trace(FusedAttention(kind, causal=causal)), args)
    ops = [n.op for n in lo.graph.nodes]
    assert ops == ["aten::scaled_dot_product_attention", "aten::relu"]
    attention = lo.graph.nodes[0]
    ids = [a.value for a in attention.args[:3]]
    assert ids == [lo.graph.inputs[i].id for i in range(3)]
    named = {a.name: a for a in attention.args if a.name}
    if kind == "efficient":
        assert named["scale"].WhichOneof("kind") == "none"
    else:
        assert named["scale"].float_value == 0.25
    mask, _, causal = attention.args[3:6]
    if kind == "flash":
        assert mask.WhichOneof("kind") == "none"
    else:
        assert mask.value == lo.graph.inputs[3].id
    assert causal.bool_value == (kind == "flash")


@pytest.mark.parametrize("variant", [dict(read_logsumexp=True), dict(dropout_p=0.1),
                                     dict(causal=True)],
                         ids=["logsumexp-read", "dropout", "mask-and-causal"])
def test_a_fused_attention_kernel_whose_other_results_matter_is_not_rewritten(variant,
                                                                                monkeypatch):
    # The log-sum-exp read, or dropout's random state: not what scaled_dot_product_attention
    # returns; a mask with the causal flag: what it refuses. The kernel stays as it is (a library
    # call of the plan) rather than being computed otherwise.
    args = fake_cuda_attention_inputs(monkeypatch)
    lo = lowering.lower(torch.fx.symbolic_trace(FusedAttention("efficient", **variant)), args)
    ops = [n.op for n in lo.graph.nodes]
    assert "aten::_scaled_dot_product_efficient_attention" in ops
    assert "aten::scaled_dot_product_attention" not in ops


@pytest.mark.parametrize("kind", ["cudnn", "efficient", "flash"])
def test_a_training_graphs_fused_attention_lowers_with_every_tensor_result(kind, monkeypatch):
    # AOT autograd's forward graph of attention on a GPU keeps the kernel: its log-sum-exp and
    # random state are saved for the backward. Each tensor result is a value (the flash kernel's
    # seed and offset uint64 ones), its int sizes none.
    args = fake_cuda_attention_inputs(monkeypatch)
    lo = lowering.lower(torch.fx.symbolic_trace(FusedAttention(kind, read_logsumexp=True)), args)
    node = lo.graph.nodes[0]
    schema = getattr(aten, f"_scaled_dot_product_{kind}_attention").default._schema
    tensors = [r for r in schema.returns if isinstance(r.type, torch.TensorType)]
    assert node.op == schema.name and len(node.outputs) == len(tensors)
    dtypes = {protocol.messages().graph.DType.Name(o.meta.dtype) for o in node.outputs}
    if kind == "flash":
        assert "DTYPE_UINT64" in dtypes
    declared = {s.op: s for s in lo.graph.schemas}[node.op]
    assert "nondeterministic_seeded" in declared.tags


def _bn_inputs(device, dtype, layout, affine=True):
    x = torch.randn(4, 6, 5, 7, device=device).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(2, 3)
    elif layout == "sliced":
        x = x[:, :, 1:]
    elif layout == "2d":
        x = x[:, :, 0, 0].contiguous()
    stats = [torch.randn(6, device=device), torch.randn(6, device=device),
             torch.randn(6, device=device), torch.rand(6, device=device) + 0.5]
    if not affine:
        stats[0] = stats[1] = None
    return x, stats


def _meta(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


LAYOUTS = ["contiguous", "channels_last", "transposed", "sliced", "2d"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_quick_batch_norm_and_hardswish_fakes_give_atens_metadata(device, dtype, layout):
    # kiln::batch_norm_eval and kiln::hardswish (lowering._metadata_ops) stand in for aten's ops
    # in traces: their fakes must give the metadata torch's own fake computation gives, on every
    # input they are used for (the others trace aten's op).
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = lowering._metadata_ops()
    with FakeTensorMode():
        for affine in (True, False):
            x, (w, b, rm, rv) = _bn_inputs(device, dtype, layout, affine)
            if lowering._batch_norm_simple(x, w, b, rm, rv):
                want = aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)
                got = ops["batch_norm_eval"](x, w, b, rm, rv, 0.1, 1e-5)
                assert [_meta(t) for t in got] == [_meta(t) for t in want]
            else:
                assert layout == "sliced"
        if lowering._dense(x):
            assert _meta(ops["hardswish"](x)) == _meta(aten.hardswish(x))
        else:
            assert layout == "sliced"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_quick_batch_norm_and_hardswish_ops_compute_atens_results(layout):
    ops = lowering._metadata_ops()
    x, (w, b, rm, rv) = _bn_inputs("cpu", torch.float32, layout)
    for got, want in zip(ops["batch_norm_eval"](x, w, b, rm, rv, 0.1, 1e-5),
                         aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(ops["hardswish"](x), aten.hardswish(x), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
def test_hardswish_and_batch_norm_lower_under_atens_names(layout, kilnd_cache):
    # Traced as kiln's quick ops where they apply; the IR names aten's ops either way, and the
    # compiled graph computes what eager does (inplace hardswish as MobileNetV3 calls it).
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.BatchNorm2d(6),
                            torch.nn.Hardswish(inplace=True)).eval()
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2.0)

    def fn(x):
        y = m(x)
        return torch.nn.functional.hardswish(y[:, :, 1:] if layout == "sliced" else y)

    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        gm, ex = capture(fn, x)
        ops = [n.op for n in lowering.lower(gm, ex).graph.nodes]
    assert not any(op.startswith("kiln::") for op in ops), ops
    assert ops.count("aten::_native_batch_norm_legit_no_training") == 1
    assert ops.count("aten::hardswish") == (2 if layout == "contiguous" else 1), ops
    against_eager(fn, x, rtol=1e-5, atol=1e-5)
