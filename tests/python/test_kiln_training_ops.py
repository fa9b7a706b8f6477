"""Training steps whose loss is computed inside the compiled function, through the "kiln" backend
(AOT autograd's forward and backward graphs, each compiled by kilnd): losses (cross entropy, label
smoothing, class weights, MSE), their backward ops, softmax/GELU/SiLU/norm backward, embedding
and attention backward, dropout. Every step's loss, gradients and updated parameters against
eager's on the same inputs (dropout under the same seed), both graphs compiled (no "running the
graph eagerly" warning in kiln's log), and the ops that made the whole graph run eagerly before
(nll_loss_forward, embedding_dense_backward, ...) are the plans' library calls."""
import logging

import pytest
import torch

import kiln

F = torch.nn.functional


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def library_ops(artifacts):
    return {s.library.op for a in artifacts for s in a.body.plan.steps
            if s.WhichOneof("kind") == "library"}


def train_like_eager(caplog, make_model, loss_of, batches, seed=None, rtol=1e-4, atol=1e-5,
                     device="cpu"):
    """Runs a few SGD steps of `loss_of(model, *batch)` eagerly and through kiln.compile (the
    loss and its backward inside the compiled function) from the same weights, checking each
    step's loss and gradients and the final parameters and buffers; returns the library ops of
    the plans. With `seed`, each step draws from a generator seeded alike for both."""
    if device == "cuda":  # TF32 would round eager's and kiln's (other) kernels apart
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            return train_like_eager(caplog, make_model, loss_of, batches, seed, rtol, atol,
                                    "cuda:0")
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    eager = make_model().to(device)
    trained = make_model().to(device)
    trained.load_state_dict(eager.state_dict())
    step = kiln.compile(lambda *batch: loss_of(trained, *batch), backend="kiln")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_k = torch.optim.SGD(trained.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for i, batch in enumerate(batches):
            batch = [t.to(device) for t in batch]
            losses = []
            for run, opt in ((lambda: loss_of(eager, *batch), opt_e),
                             (lambda: step(*batch), opt_k)):
                opt.zero_grad()
                if seed is not None:
                    torch.manual_seed(seed + i)
                loss = run()
                loss.backward()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=rtol, atol=atol)
            for (name, pe), pk in zip(eager.named_parameters(), trained.parameters()):
                torch.testing.assert_close(pk.grad, pe.grad, rtol=rtol, atol=atol,
                                           msg=lambda m, n=name: f"step {i} grad {n}: {m}")
            opt_e.step()
            opt_k.step()
    assert not [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    for pe, pk in zip(eager.parameters(), trained.parameters()):
        torch.testing.assert_close(pk, pe, rtol=rtol, atol=atol)
    for be, bk in zip(eager.buffers(), trained.buffers()):
        torch.testing.assert_close(bk, be, rtol=rtol, atol=atol)
    artifacts = kiln.debug.artifacts()
    assert len(artifacts) == 2, "the forward and the backward graph each compiled once"
    return library_ops(artifacts)


class SmallConvNet(torch.nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.fc = torch.nn.Linear(8, classes)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = torch.relu(self.conv2(x)) + x
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def image_batches(n=3, classes=5):
    return [(torch.randn(4, 3, 12, 12), torch.randint(0, classes, (4,))) for _ in range(n)]


def test_cross_entropy_training_step_of_a_conv_net_compiles_both_graphs(caplog):
    ops = train_like_eager(caplog, SmallConvNet, lambda m, x, y: F.cross_entropy(m(x), y),
                           image_batches())
    # The loss and its gradient are library calls where they made both graphs run eagerly; on
    # the CPU the batch norm's backward is ATen's one kernel, not sums and pointwise ops.
    assert {"aten::nll_loss_forward", "aten::nll_loss_backward",
            "aten::convolution_backward", "aten::native_batch_norm_backward"} <= ops
    assert "aten::sum" not in ops


def test_the_min_cut_partition_saves_fewer_activations_and_matches_eager(caplog, monkeypatch):
    # kiln.config.partition: torch.compile's partition recomputes the GELU and the layer norm's
    # normalisation in the backward instead of saving them.
    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                   torch.nn.LayerNorm(32), torch.nn.Linear(32, 5))

    def loss_of(m, x, y):
        return F.cross_entropy(m(x), y)

    batches = [(torch.randn(8, 16), torch.randint(0, 5, (8,))) for _ in range(3)]
    saved = {}
    for partition in ("default", "min_cut"):
        monkeypatch.setattr(kiln.config, "partition", partition)
        kiln.reset()
        train_like_eager(caplog, mlp, loss_of, batches)
        forward = kiln.debug.artifacts()[0]
        saved[partition] = len(forward.body.plan.outputs)
    assert saved["min_cut"] < saved["default"]


LOSSES = {
    "label_smoothing": lambda m, x, y: F.cross_entropy(m(x), y, label_smoothing=0.1),
    "class_weights": lambda m, x, y: F.cross_entropy(
        m(x), y, weight=torch.linspace(0.5, 2.0, 5, device=x.device)),
    "ignore_index_sum": lambda m, x, y: F.cross_entropy(m(x), y, ignore_index=1,
                                                        reduction="sum") / 4,
    "nll_of_log_softmax": lambda m, x, y: F.nll_loss(F.log_softmax(m(x), dim=1), y),
    "mse": lambda m, x, y: F.mse_loss(m(x), torch.eye(5, device=x.device)[y]),
    "softmax_mse": lambda m, x, y: F.mse_loss(torch.softmax(m(x), dim=1),
                                              torch.eye(5, device=x.device)[y], reduction="sum"),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_training_steps_match_eager(caplog, name):
    ops = train_like_eager(caplog, SmallConvNet, LOSSES[name], image_batches(2))
    if name == "mse":
        assert {"aten::mse_loss", "aten::mse_loss_backward"} <= ops


class Tagger(torch.nn.Module):
    """Embedding (with a padding index) -> layer norm -> GELU (tanh) -> SiLU -> linear."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(30, 16, padding_idx=0)
        self.ln = torch.nn.LayerNorm(16)
        self.l1 = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, tokens):
        h = F.gelu(self.l1(self.ln(self.emb(tokens))), approximate="tanh")
        return self.out(F.silu(h) + h)


def test_embedding_norm_and_activation_backward_match_eager(caplog):
    batches = [(torch.randint(0, 30, (3, 7)), torch.randint(0, 4, (3 * 7,))) for _ in range(3)]
    ops = train_like_eager(caplog, Tagger,
                           lambda m, t, y: F.cross_entropy(m(t).flatten(0, 1), y), batches)
    assert "aten::embedding_dense_backward" in ops


class AttentionBlock(torch.nn.Module):
    def __init__(self, dim=16, heads=2, causal=True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.bn = torch.nn.BatchNorm1d(dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        y = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return self.bn(y.transpose(1, 2)).transpose(1, 2)


def test_attention_forward_and_backward_match_eager(caplog):
    batches = [(torch.randn(2, 8, 16), torch.randn(2, 8, 16)) for _ in range(2)]
    ops = train_like_eager(caplog, AttentionBlock, lambda m, x, t: F.mse_loss(m(x), t), batches)
    if torch.backends.mkldnn.is_available():  # what scaled_dot_product_attention runs on a CPU
        assert {"aten::_scaled_dot_product_flash_attention_for_cpu",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward"} <= ops


class DropoutMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(12, 32)
        self.drop = torch.nn.Dropout(0.3)
        self.l2 = torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.l2(self.drop(torch.relu(self.l1(x))))


def test_dropout_draws_eagers_numbers_under_the_same_seed(caplog):
    batches = [(torch.randn(8, 12), torch.randint(0, 3, (8,))) for _ in range(3)]
    ops = train_like_eager(caplog, DropoutMlp, lambda m, x, y: F.cross_entropy(m(x), y), batches,
                           seed=1234)
    assert "aten::native_dropout" in ops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cross_entropy_training_step_on_a_gpu_compiles_both_graphs(caplog):
    ops = train_like_eager(caplog, SmallConvNet, lambda m, x, y: F.cross_entropy(m(x), y),
                           image_batches(), device="cuda", rtol=1e-3, atol=1e-4)
    assert {"aten::nll_loss_forward", "aten::nll_loss_backward"} <= ops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_training_on_a_gpu_keeps_the_fused_kernels(caplog, dtype):
    # On a GPU the trace keeps the kernel scaled_dot_product_attention picked (flash for
    # bfloat16; memory-efficient or cuDNN for float32), whose log-sum-exp, sizes and random state
    # the backward reads: a library call with several results, some of them numbers.
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    batches = [(torch.randn(2, 64, 64).to(dtype), torch.randn(2, 64, 64).to(dtype))
               for _ in range(2)]
    ops = train_like_eager(caplog, lambda: AttentionBlock(dim=64, heads=2).to(dtype),
                           lambda m, x, t: F.mse_loss(m(x).float(), t.float()), batches,
                           device="cuda", rtol=tol, atol=tol)
    assert [op for op in ops if "_attention" in op and op.endswith("_backward")], ops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_dropout_on_a_gpu_draws_eagers_numbers(caplog):
    batches = [(torch.randn(8, 12), torch.randint(0, 3, (8,))) for _ in range(3)]
    ops = train_like_eager(caplog, DropoutMlp, lambda m, x, y: F.cross_entropy(m(x), y), batches,
                           seed=99, device="cuda", rtol=1e-3, atol=1e-4)
    assert "aten::native_dropout" in ops
