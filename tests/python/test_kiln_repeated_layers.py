"""Repeated layers in the "kiln" backend: a model's identical blocks (same sizes, weights of
their own) fuse into the same kernels, which kilnd builds once: every layer's steps call one
function, and each layer still computes with its own weights (against eager, on random inputs)."""
import re

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.fc(x)) + x)


def layers(depth=4, width=96):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(width) for _ in range(depth)]).eval()
    for p in model.parameters():  # layers that differ: a shared function must read its operands
        p.data.uniform_(-0.5, 0.5)
    return model


def kernel_symbols(art):
    return [s.kernel.symbol for s in art.body.plan.steps if s.WhichOneof("kind") == "kernel"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_layer_calls_the_first_layers_kernels_and_matches_eager(dtype):
    model = layers().to(dtype)
    x = torch.randn(8, 96).to(dtype)
    with torch.no_grad():
        expected = model(x)
        got = kiln.compile(model, backend="kiln")(x)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, **tol)
    art = kiln.debug.artifact(model)
    assert art is not None, "the graph ran eagerly instead of through kilnd"
    symbols = kernel_symbols(art)
    distinct = set(symbols)
    assert len(symbols) >= 4 and len(distinct) <= len(symbols) // 4 + 1, symbols
    exported = set(re.findall(r'extern "C" void (kiln_kernel_\d+)\(', art.body.kernel_source))
    assert exported == distinct


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_cuda_layers_launch_one_function_per_distinct_kernel_and_match_eager(dtype):
    model = layers().to("cuda", dtype)
    x = torch.randn(8, 96, device="cuda").to(dtype)
    with torch.no_grad():
        expected = model(x)
        compiled = kiln.compile(model, backend="kiln")
        got = compiled(x)
        x2 = torch.randn(8, 96, device="cuda").to(dtype)  # a replay on other values
        got2, expected2 = compiled(x2), model(x2)
        torch.cuda.synchronize()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, expected, **tol)
    torch.testing.assert_close(got2, expected2, **tol)
    art = kiln.debug.artifact(model)
    assert art is not None and art.body.kernel_ptx, "the graph ran eagerly instead of through kilnd"
    symbols = kernel_symbols(art)
    distinct = set(symbols)
    assert len(symbols) >= 4 and len(distinct) <= len(symbols) // 4 + 1, symbols
    exported = set(re.findall(r'__global__ void (?:__launch_bounds__\(\d+\) )?(kiln_kernel_\d+)\(',
                              art.body.kernel_source))
    assert exported == distinct
