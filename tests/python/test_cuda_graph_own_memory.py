"""CUDA graphs with memory of their own (client/runtime/cuda_graph_runner.h, LentOutputs): the
forward and backward graphs of a training step lend their outputs instead of copying them and read
their inputs where they are; every answer stays eager's, whatever the caller keeps, resizes or
passes back in. Such a plan runs without its graph for its first two calls (InputPlacement
observes where its inputs are) and captures on the third."""
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import kiln
from kiln import _C
from test_cuda_runtime import cuda_plan, mm_relu_plan
from test_kiln_backend import ConvBnRelu
from test_runtime import library, pb, plan_bytes, pos, value

gpu = pytest.mark.skipif(not torch.cuda.is_available() or not getattr(_C, "HAS_CUDA", False),
                         reason="needs a CUDA GPU")


@pytest.fixture
def pool():
    return _C.CudaGraphPool()


def triple_plan(pool, sizes=(16,), update_input=False):
    """3 * y; with `update_input`, y also takes that value (y.mul_(3) returning it)."""
    spec = pb.artifact.ExecutionPlan()
    spec.ParseFromString(plan_bytes(
        [value(0, list(sizes)), value(1, list(sizes))], [0],
        [library("aten::mul.Tensor", [pos("value", 0), pos("float", 3.0)], [1])], [1]))
    if update_input:
        spec.input_updates.add(input=0, value=1)
    return _C.Plan(spec.SerializeToString(), b"", [], "cuda:0", cuda_graphs=pool,
                   own_graph_memory=True)


def mm_plan(pool):
    """a @ b, both per call."""
    return cuda_plan([value(0, [16, 32]), value(1, [32, 24]), value(2, [16, 24])], [0, 1],
                     [library("aten::mm", [pos("value", 0), pos("value", 1)], [2])], [2],
                     graphs=pool, own_memory=True)


@gpu
def test_outputs_are_lent_without_a_copy_and_inputs_read_where_they_are(pool):
    w, x = torch.randn(32, 24, device="cuda"), torch.randn(16, 32, device="cuda")
    p = mm_relu_plan(w, pool, own_memory=True)
    for _ in range(3):
        out = p(x)[0]
        assert_close(out, torch.relu(x @ w), rtol=1e-3, atol=1e-3)
        del out
    assert p.cuda_graph == "captured"
    out = p(x)[0]
    address = out.data_ptr()
    del out
    out = p(x)[0]
    assert out.data_ptr() == address  # the graph's own memory, lent again: nothing copied
    del out
    x.mul_(-2)  # read in place: the graph sees the caller's tensor as it is now
    assert_close(p(x)[0], torch.relu(x @ w), rtol=1e-3, atol=1e-3)
    assert (p.cuda_graph_captures, p.cuda_graph_moved_outputs) == (1, 0)


@gpu
def test_an_output_still_held_is_moved_before_the_replay_that_would_overwrite_it(pool):
    w, x = torch.randn(32, 24, device="cuda"), torch.randn(16, 32, device="cuda")
    p = mm_relu_plan(w, pool, own_memory=True)
    held, views, want = [], [], []
    for i in range(4):
        x.normal_()
        want.append(torch.relu(x @ w))
        out = p(x)[0]
        held.append(out)
        views.append(out[2:5])  # a view alone keeps the storage too
    for out, view, expected in zip(held, views, want):
        assert_close(out, expected, rtol=1e-3, atol=1e-3)
        assert_close(view, expected[2:5], rtol=1e-3, atol=1e-3)
    # The third call's output (the first lent) moved once before the fourth; copied from then on.
    assert (p.cuda_graph_captures, p.cuda_graph_moved_outputs) == (1, 1)
    assert len({o.data_ptr() for o in held}) == len(held)
    only_view = p(x)[0][1:3]  # the output itself dropped, its view kept
    expected = torch.relu(x @ w)[1:3]
    x.normal_()
    p(x)
    assert_close(only_view, expected, rtol=1e-3, atol=1e-3)


@gpu
def test_an_input_found_elsewhere_is_copied_after_one_more_capture(pool):
    p = mm_plan(pool)
    b = torch.randn(32, 24, device="cuda")
    for i in range(5):
        a = torch.randn(16, 32, device="cuda")  # a new tensor per call, as a batch is
        assert_close(p(a, b)[0], a @ b, rtol=1e-3, atol=1e-3)
    assert p.cuda_graph_captures == 1  # a copied, b read in place
    # Neither read in place nor copyable (a storage offset): that call runs without the graph.
    big = torch.randn(17, 32, device="cuda")
    assert_close(p(big[1:], b)[0], big[1:] @ b, rtol=1e-3, atol=1e-3)
    assert p.cuda_graph_captures == 1
    # b elsewhere: the graph is dropped, the calls observed again, a new one captured.
    for i in range(4):
        a, b = torch.randn(16, 32, device="cuda"), b.clone() if i == 0 else b
        assert_close(p(a, b)[0], a @ b, rtol=1e-3, atol=1e-3)
    assert p.cuda_graph_captures == 2


@gpu
def test_an_output_passed_back_in_is_right_every_call(pool):
    p = triple_plan(pool)
    y = torch.randn(16, device="cuda")
    want = y.clone()
    for _ in range(8):
        y = p(y)[0]
        want = want * 3
        assert_close(y, want)


@gpu
def test_one_graphs_lent_output_is_read_in_place_by_the_next(pool):
    w = torch.randn(32, 24, device="cuda")
    first, second = mm_relu_plan(w, pool, own_memory=True), triple_plan(pool, (16, 24))
    x = torch.randn(16, 32, device="cuda")
    for _ in range(8):
        x.normal_()
        b = second(first(x)[0])[0]
        assert_close(b, 3 * torch.relu(x @ w), rtol=1e-3, atol=1e-3)
        del b
    # The first's output is at the same address every call: the second never captured again.
    assert (first.cuda_graph_captures, second.cuda_graph_captures) == (1, 1)


@gpu
def test_an_input_the_plan_updates_is_updated_once_per_call_where_it_is(pool):
    # x read in place, and updated by the graph itself (the warm-up updates a scratch copy).
    p = triple_plan(pool, update_input=True)
    x = torch.randn(16, device="cuda")
    want = x.clone()
    for _ in range(6):
        out = p(x)[0]
        want = want * 3
        assert_close(x, want)
        assert_close(out, want)
    assert p.cuda_graph_captures == 1


@gpu
def test_a_held_output_that_was_resized_makes_the_graph_capture_again(pool):
    p = triple_plan(pool)
    y = torch.randn(16, device="cuda")
    for _ in range(3):
        out = p(y)[0]
    assert p.cuda_graph_captures == 1
    out.resize_(4096)  # the storage now has memory that is not the graph's
    out.fill_(7)
    for _ in range(4):
        assert_close(p(y)[0], 3 * y)
    assert p.cuda_graph_captures == 2
    assert bool((out == 7).all())


def _pair():
    torch.manual_seed(0)
    eager = ConvBnRelu().cuda()
    trained = ConvBnRelu().cuda()
    trained.load_state_dict(eager.state_dict())
    return eager, trained


@pytest.fixture
def no_tf32():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@gpu
def test_a_training_loop_that_keeps_every_output_matches_eager(kilnd_cache, no_tf32):
    kiln.reset()
    eager, trained = _pair()

    def step(m, x, y):
        logits = m(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        return loss, logits

    compiled = kiln.compile(step)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, trained)]
    x, y = torch.randn(4, 3, 8, 8, device="cuda"), torch.randint(5, (4,), device="cuda")
    kept = {"eager": [], "kiln": []}
    grads = {"eager": [], "kiln": []}
    for i in range(7):
        x.normal_()  # the same tensor every step, new values
        for name, m, run, opt in (("eager", eager, step, opts[0]),
                                  ("kiln", trained, compiled, opts[1])):
            opt.zero_grad(set_to_none=False)  # grads kept between steps, zeroed in place
            kept[name].append(run(m, x, y))
            grads[name].append([p.grad for p in m.parameters()])  # the same tensors each step
            opt.step()
    for (le, oe), (lk, ok) in zip(kept["eager"], kept["kiln"]):
        assert_close(lk, le, rtol=1e-4, atol=1e-5)
        assert_close(ok, oe, rtol=1e-4, atol=1e-5)
    for ge, gk in zip(grads["eager"][-1], grads["kiln"][-1]):
        assert_close(gk, ge, rtol=1e-4, atol=1e-5)
    for pe, pk in zip(eager.state_dict().values(), trained.state_dict().values()):
        assert_close(pk, pe, rtol=1e-4, atol=1e-5)
    plans = [a.plan for a in kiln.debug.artifacts()]
    assert len(plans) == 2 and all(p.cuda_graph == "captured" for p in plans)


@gpu
def test_two_forwards_before_one_backward_match_eager(kilnd_cache, no_tf32):
    # The first forward's saved activations are still held when the second one replays.
    kiln.reset()
    eager, trained = _pair()
    forward = kiln.compile(lambda x: trained(x).square().mean())
    x1, x2 = torch.randn(4, 3, 8, 8, device="cuda"), torch.randn(4, 3, 8, 8, device="cuda")
    for _ in range(6):
        for m in (eager, trained):
            m.zero_grad(set_to_none=True)
        (eager(x1).square().mean() + eager(x2).square().mean()).backward()
        (forward(x1) + forward(x2)).backward()
        for pe, pk in zip(eager.parameters(), trained.parameters()):
            assert_close(pk.grad, pe.grad, rtol=1e-4, atol=1e-5)


@gpu
def test_backward_twice_through_a_retained_graph_matches_eager(kilnd_cache, no_tf32):
    # The second backward reads the same saved activations; its gradients add to the first's,
    # which the parameters hold in the graph's memory by then.
    kiln.reset()
    eager, trained = _pair()
    forward = kiln.compile(lambda x: trained(x).square().mean())
    x = torch.randn(4, 3, 8, 8, device="cuda")
    for _ in range(6):
        x.normal_()
        for m in (eager, trained):
            m.zero_grad(set_to_none=True)
        for loss in (eager(x).square().mean(), forward(x)):
            loss.backward(retain_graph=True)
            loss.backward()
        for pe, pk in zip(eager.parameters(), trained.parameters()):
            assert_close(pk.grad, pe.grad, rtol=1e-4, atol=1e-5)
